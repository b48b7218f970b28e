"""bench/ingest --profile: py-spy on the service under wrk, and where its time goes."""
