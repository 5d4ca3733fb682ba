"""The search indexes' health over a whole root, at start-up (tree/sqlite/fts.py).

Every start checks each index cheaply (it opens and its structure reads: one row of each)
and rebuilds from the records one that is damaged, does not open, or has a rebuild to
finish, and compacts one whose structure has grown past its bound: a root that an older
version left past FTS5's limit, or close to it, heals by itself. After an unclean stop each
index also gets FTS5's integrity check, within a time budget per index and for the whole
pass; what it has no time for, fsck checks, and a write or a search that meets damage has
it rebuilt.
"""

from __future__ import annotations

import logging
import sqlite3
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path

from app.storage.core.errors import SearchTimeout, StorageError
from app.storage.core.names import STORE_ID_RE, Scope
from app.storage.core.query import SearchBudget
from app.storage.tree.sqlite import fts
from app.storage.tree.stores.engine import MemoryStoreEngine
from app.storage.tree.tasks import TaskStore

log = logging.getLogger("app.storage.search")

# After an unclean stop: FTS5's integrity check, at most this long per index and in all.
CHECK_EACH = 2.0
CHECK_TOTAL = 30.0


def heal_search_indexes(
    tasks: TaskStore, stores: MemoryStoreEngine, *, thorough: bool = False
) -> list[str]:
    """Heal every search index of the root (see the module); what was done, one line each.
    ``thorough``: with FTS5's integrity check (after an unclean stop)."""
    layout = tasks.layout
    deadline = time.monotonic() + CHECK_TOTAL
    done: list[str] = []
    unchecked = 0

    def heal(where: Path, rows: str, rebuild: Callable[[SearchBudget | None], int | None]) -> None:
        nonlocal unchecked
        budget = None
        if thorough:
            left = deadline - time.monotonic()
            if left <= 0:
                unchecked += 1
                return
            budget = SearchBudget(min(CHECK_EACH, left))
        rel = stores.rel(where)
        try:
            count = rebuild(budget)
        except SearchTimeout:
            unchecked += 1
            return
        except (StorageError, sqlite3.Error) as exc:
            done.append(f"{rel}: search index not checked ({exc})")
            return
        if count is not None:
            done.append(f"{rel}: search index rebuilt from the records ({count} {rows})")

    for scope in layout.projects([]):
        listing = layout.listing(scope)
        if layout.tree.lstat(listing) is not None:
            heal(listing, "task(s)", partial(tasks.heal_search, scope))
            project = tasks.listing(scope)
            _bound(done, stores.rel(listing), project.search_levels, project.purge_search)
        for store_id in _store_ids(stores, scope):
            store_dir = stores.layout.store_dir(scope, store_id)
            index = stores.layout.store_index(store_dir)
            if layout.tree.lstat(index) is None:
                continue
            heal(index, "memories", partial(stores.heal_search, scope, store_id))
            store = stores.index(store_dir)
            _bound(done, stores.rel(index), store.search_levels, store.purge)
    if unchecked:
        done.append(
            f"{unchecked} search index(es) not integrity-checked within {CHECK_TOTAL:g} s"
            " (fsck checks them)"
        )
    return done


def _store_ids(stores: MemoryStoreEngine, scope: Scope) -> list[str]:
    entries = stores.tree.entries(stores.layout.stores_dir(scope))
    return sorted(e.name for e in entries if e.is_dir and STORE_ID_RE.fullmatch(e.name))


def _bound(
    done: list[str], where: str, levels: Callable[[], int], purge: Callable[[], bool]
) -> None:
    """Compact an index whose structure has more levels than a purge leaves (fts_purge.purge)."""
    try:
        count = levels()
        if count <= fts.LEVEL_BOUND:
            return
        purge()
    except (StorageError, sqlite3.Error) as exc:
        log.warning("%s: search index not compacted (%s)", where, exc)
        return
    done.append(f"{where}: search index compacted ({count} levels)")
