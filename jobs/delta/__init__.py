"""Delta tables as onceflow commits to them: SetTransaction-idempotent commits, what the log says was committed,
schema evolution, table maintenance, the data files of an append over Spark Connect. Imports `declare`, `dedup` and
`onceflow.resources`."""
