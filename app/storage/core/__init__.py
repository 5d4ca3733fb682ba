"""Backend-neutral storage: ids and names, errors, models, the rules of each request,
paging and cursors, the clock, the query syntax, the usage, limits and token documents,
the backup archive format and JSON encoding. It imports no backend, and none of sqlite3,
psycopg, boto3 or filelock: both backends build on it, and nothing in it knows where data
is kept."""
