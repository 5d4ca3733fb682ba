"""The PostgreSQL + S3 backend: records, listings, locks and tokens in PostgreSQL, artifact
bytes in an S3-compatible object store (docs/scaling.md). Imported only when configured."""
