"""Dagster's side: the code location (`definitions`), deployments, pipeline loading, sensors, the `onceflow`
command line (`cli/`) and the local stack the demo and the chaos harness run on. Imports `assets`, `jobs` and
`resources`; nothing imports it back."""
