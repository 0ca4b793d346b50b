"""Verify: reconciliation from independent facts (landed records, table rows, commit sequences). Imports every
stage before it."""
