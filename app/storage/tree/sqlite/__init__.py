"""The tree's derived SQLite indexes, each rebuilt from the records by fsck: the listing of a
project (listing*.py, with its usage rows, digest sections and turn search), each store's
index (store_index.py), FTS5 upkeep (fts.py) and the connections they share (db.py)."""
