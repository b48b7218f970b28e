"""HTTP routes: ingest, health and admin. They know neither SQL nor retry policy."""
