"""A memory store's search index kept whole: removed text purged from its file, and the index
rebuilt from the records when it is damaged (tree/sqlite/fts.py says how the index itself
marks and purges)."""

from __future__ import annotations

import contextlib
import sqlite3
from collections.abc import Callable
from pathlib import Path

from app.storage.core.background import Later
from app.storage.core.errors import StorageError
from app.storage.core.names import Scope
from app.storage.core.query import SearchBudget
from app.storage.tree.fs.txn import Key, Transactions
from app.storage.tree.stores.files import StoreFiles

# Memories a search rebuild writes per hold of the store's lock.
FILL_BATCH = 200


class SearchUpkeep:
    """The purge and the rebuild of every store's search index."""

    def __init__(self, files: StoreFiles, txns: Transactions) -> None:
        self.files = files
        self.txns = txns
        # Upkeep a request asks for but need not wait for: search index rebuilds.
        self.later = Later()
        # Called after a write changed a store's search text: the embedding queue's drain
        # (tree/embedding.py), when an embedder is configured.
        self.text_written: Callable[[Scope], object] | None = None

    def purge(self, scope: Scope, store_id: str, store_dir: Path) -> None:
        """Removed text leaves the search index's file too (tree/sqlite/fts.py), not only its
        answers. The write is done whatever happens here: an index that cannot be purged now
        stays 'pending' for the next sweep, one the purge found damaged is rebuilt."""
        try:
            self.files.index(store_dir).purge()
        except sqlite3.DatabaseError:
            self.rebuild_later(scope, store_id)  # fts_purge.purge marked it damaged
        except (StorageError, sqlite3.Error):
            pass

    def rebuild_later(self, scope: Scope, store_id: str) -> None:
        """Run :meth:`heal` in the background (one run per store at a time)."""
        self.later.run(
            ("store-search", scope, store_id),
            lambda: self.heal(scope, store_id),
            f"rebuilding the search index of memory store {store_id}",
        )

    def heal(self, scope: Scope, store_id: str, budget: SearchBudget | None = None) -> int | None:
        """Rebuild a store's search index from its records if it is marked damaged, does not
        open (or, with ``budget``, fails FTS5's integrity check within it: one that runs out
        raises SearchTimeout), or has a rebuild to finish: under the store's lock the index is
        dropped and started empty, then filled :data:`FILL_BATCH` memories per hold of the
        lock, each from its head version, while writes go on in between (each writes its own
        row); searches answer 503 until it is full. Return how many memories it filled, None
        when nothing was done."""
        files = self.files
        store_dir = files.store_dir(scope, store_id)
        key = Key(scope, store_id)
        index = files.index(store_dir)
        with self.txns.locked(key):
            if not files.tree.is_dir(store_dir):
                return None
            marks = index.search_upkeep()
            if not (marks.damaged or marks.backfill):
                why = index.search_opens() if budget is None else index.search_damage(budget)
                if why is None:
                    return None
                index.mark_search_damaged(sqlite3.DatabaseError(why))
            token = index.start_search_rebuild()
        if token is None:
            return None
        count, after = 0, ""
        while True:
            with self.txns.locked(key):
                if not files.tree.is_dir(store_dir):
                    return None  # deleted meanwhile
                with index.write(create=False) as writer:
                    rows = writer.memories_after(after, FILL_BATCH)
                    for row in rows:
                        writer.fill_search(row.id, row.path, files.head_content(store_dir, row))
                    if not rows:
                        writer.search_filled(token)
                        break
            count += len(rows)
            after = rows[-1].id
        # The dropped index's pages were zeroed; their old images leave the WAL.
        with contextlib.suppress(StorageError, sqlite3.Error):
            index.purge()
        return count
