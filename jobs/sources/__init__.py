"""Sources: each source's reader (files, Pub/Sub), batch plans fixed before they are read, checkpoints, the
landing schema and watermarks (the Java `LineOffsets.java`). Imports `declare`, `dedup`, `delta` and
`onceflow.resources`."""
