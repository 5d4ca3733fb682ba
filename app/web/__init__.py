"""Request plumbing that defines no route: the storage-error → HTTP map, body accounting,
authentication, permissions, rate limits, the request log, traffic counting, metrics and the
JSON provider. Blueprints (app/api/, app/console/) use it; it never names a storage backend."""
