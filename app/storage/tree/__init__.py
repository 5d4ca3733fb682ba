"""The filesystem backend: every record a plain file under one storage root.

``backend.py`` builds it (TreeStorage); the task engine (``tasks.py``), the memory-store
engine (``stores/``) and the operations on the whole tree (digest, search, usage, tokens,
limits, backup, restore, recovery, retention, fsck) sit beside it, on ``fs/`` (layout,
atomic writes, containment, walks, locks, transactions) and ``sqlite/`` (the derived
indexes beside the records)."""
