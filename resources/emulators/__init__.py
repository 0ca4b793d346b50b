"""Local stand-ins for the tests and the demo, each a managed process on loopback: Google's Pub/Sub emulator, a
BigQuery emulator, fake-gcs-server with its shim, a throwaway PostgreSQL. Never used against real services."""
