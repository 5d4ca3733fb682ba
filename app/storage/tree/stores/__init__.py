"""The tree's memory-store engine: each store a directory of version records, with its live
memories and its SQLite index derived from them. engine.py is the engine, one class; beside
it files.py (a store's records and live tree), writes.py (the write protocol),
search_upkeep.py (the search index's purge and rebuild), retention.py and fsck.py (its part
of the sweep and of fsck). The rules and values every backend shares are in core/store_*.py."""
