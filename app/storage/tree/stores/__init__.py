"""The tree's memory-store engine: each store a directory of version records, with its live
memories and its SQLite index derived from them (engine.py builds it from base.py, stores.py,
memories.py and versions.py; retention.py and fsck.py are its part of the sweep and fsck).
The rules and values every backend shares are in core/store_*.py."""
