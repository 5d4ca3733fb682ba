"""Backups: one streamed, checked format (format.py) for every backend, and the tree's
export and import (tree_export.py, tree_import.py)."""
