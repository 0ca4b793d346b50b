"""Delta tables as onceflow commits to them: SetTransaction-idempotent commits, what the log says was committed,
schema evolution, table maintenance (the Java `DeltaCommits.java`). Imports `declare`, `dedup` and
`onceflow.resources`."""
