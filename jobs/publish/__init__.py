"""Publish: a closed pane becomes a commit sequence (Gobblin's CommitStepStore), whose steps put it into files
and BigQuery exactly once. Imports the stages before it (`declare` … `windows`)."""
