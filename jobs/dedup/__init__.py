"""Dedup: which of a batch's record IDs are committed already. The ID filters (DESIGN 4's fast path, with the
Java `NotAmong.java`), where they are kept, and the IDs read straight from a raw table's Delta log.
Imports `declare` and `onceflow.resources`."""
