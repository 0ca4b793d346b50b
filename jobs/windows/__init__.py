"""Windows: a user's transform over one event-time window's pinned raw input, pane closes, the window MERGE and
the facts the window asset checks recompute. Imports the stages before it (`declare` … `ingest`)."""
