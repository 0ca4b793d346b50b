"""The `onceflow` command line (`python -m onceflow`): set-up, demo, dev, engine, status, verify, commits, reset."""
