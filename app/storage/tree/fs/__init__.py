"""The filesystem primitives of the tree backend: every path (layout.py), crash-safe writes
(atomic.py) and when they reach the disk (sync.py), opening and walking without following a
link (beneath.py, walk.py, noatime.py), locks (locks.py) and the write protocol (txn.py)."""
