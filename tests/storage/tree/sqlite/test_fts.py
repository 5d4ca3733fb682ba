"""The search indexes' FTS5 tables over thousands of deletes (tree/sqlite/fts.py): the
structure stays bounded, every write goes through, and what was deleted is not found.

Driven below the engine (the listing and a store's index), on tmpfs where the machine has
one: these tests are about FTS5's structure record, not the disk, and ten thousand purges,
each with its checkpoints, would spend a minute in fsync on a disk.
"""

# ruff: noqa: S608 - table names are module constants; every value is bound.
from __future__ import annotations

import os
import sqlite3
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from ulid import ULID

from app.storage.core.clock import iso_us
from app.storage.core.names import Scope
from app.storage.core.recovery import Plan
from app.storage.core.store_records import VersionRecord
from app.storage.tree.backend import TreeStorage
from app.storage.tree.sqlite import fts, fts_purge, turn_search
from app.storage.tree.sqlite.listing import Listing
from app.storage.tree.sqlite.listing_sql import TurnRow
from app.storage.tree.sqlite.store_index import StoreIndex
from app.storage.tree.sqlite.turn_search import TurnText
from tests.conftest import FixedClock
from tests.storage._helpers import upkeep_done

CLEAN = Plan(clean=True, full=False)  # the start after a clean stop

DELETES = 5000
# Rows the index holds throughout: a merged segment larger than what one write adds, which
# is what makes each full merge move it up the levels.
KEPT = 300
# What fts.py promises between two purges.
BOUND = fts.LEVEL_BOUND + 2
FAR = 10**18


@pytest.fixture
def scratch(tmp_path: Path) -> Iterator[Path]:
    shm = Path("/dev/shm")
    if not (shm.is_dir() and os.access(shm, os.W_OK)):
        yield tmp_path
        return
    with tempfile.TemporaryDirectory(prefix="pm-fts-", dir=shm) as directory:
        yield Path(directory)


def _levels(path: Path) -> int:
    """The level count of the structure record, read here apart from fts.levels: its first
    varint after the 4-byte cookie (SQLite 3.40's format)."""
    conn = sqlite3.connect(path)
    try:
        (blob,) = conn.execute(f"SELECT block FROM {fts.TEXT}_data WHERE id = 10").fetchone()
    finally:
        conn.close()
    value = 0
    for byte in blob[4:13]:
        value = (value << 7) | (byte & 0x7F)
        if not byte & 0x80:
            break
    return value


def _turn(listing: Listing, task_id: str, n: int) -> None:
    listing.put_turn(task_id, TurnRow(0, n, FAR), None, _text(task_id, n))


def _matches(listing: Listing, word: str) -> list[int]:
    with listing.read() as conn:
        return [
            int(r[0])
            for r in conn.execute(
                f"SELECT rowid FROM {fts.TEXT} WHERE {fts.TEXT} MATCH ?", (f'"{word}"',)
            )
        ]


@pytest.mark.slow  # thousands of deletes
def test_a_project_takes_thousands_of_deletes_with_a_bounded_index(scratch: Path) -> None:
    listing = Listing(scratch / "_listing.sqlite3", timeout=5.0)
    for n in range(KEPT):
        _turn(listing, f"kept-{n}", n)
    most = 0
    for n in range(KEPT, KEPT + DELETES):
        # A write, then a delete of the write before it, then its purge.
        _turn(listing, f"t{n}", n)
        listing.set_task(f"t{n - 1}" if n > KEPT else "kept-0", [])
        assert listing.purge_search(), f"purge {n} could not truncate the WAL"
        most = max(most, _levels(listing.path))
        assert most <= BOUND, f"{most} levels after purge {n - KEPT}"
    assert not listing.purge_owed()
    # Every write is there and found; nothing deleted is.
    assert _matches(listing, f"Qqzxword{KEPT + DELETES - 1}")
    assert not _matches(listing, f"Qqzxword{KEPT + DELETES - 2}")
    assert not _matches(listing, "Qqzxword0")
    with listing.read() as conn:
        assert fts.orphans(conn) == 0
        (rows,) = conn.execute(f"SELECT count(*) FROM {fts.TEXT}").fetchone()
    assert rows == KEPT
    with listing.maintain() as conn:
        assert fts.damage(conn) is None


def _text(task_id: str, n: int) -> TurnText:
    return TurnText(task_id, "model opus", f"summary {n} of {task_id} Qqzxword{n}")


def test_writes_during_a_compaction_reach_the_copy(
    scratch: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Rows written, rewritten and deleted while a compaction copies the index (in another
    thread, on a connection of its own) are in the table that takes its place as written.
    Compactions run one after another until enough writes met a copy past their row."""
    rows = 1000
    monkeypatch.setattr(fts_purge, "COPY_ROWS", 2)  # many short copy steps for writes to land in
    listing = Listing(scratch / "_listing.sqlite3", timeout=5.0)
    live: dict[str, int] = {}
    for n in range(rows):
        _turn(listing, f"k{n}", n)
        live[f"k{n}"] = n
    failed: list[BaseException] = []

    def compact() -> None:
        conn = listing.connect()
        try:
            fts_purge.compact(conn, "listing index", turn_search.TEXT_COLUMNS)
        except BaseException as exc:
            failed.append(exc)
        finally:
            conn.close()

    def copied() -> int:
        with listing.read() as conn:
            row = conn.execute(f"SELECT value FROM {fts.STATE} WHERE name = 'copied'")
            found = row.fetchone()
        return -1 if found is None else int(found[0])

    met, compactions, n = 0, 0, rows
    deadline = time.monotonic() + 120
    copier = threading.Thread(target=compact)
    while met < 40 and time.monotonic() < deadline:
        if not copier.is_alive():
            copier = threading.Thread(target=compact)
            copier.start()
            compactions += 1
        past = copied()
        _turn(listing, f"k{n}", n)  # a new row
        live[f"k{n}"] = n
        old = f"k{n - rows}"  # the oldest row: the first a copy takes
        listing.set_task(old, [])
        live.pop(old, None)
        rewritten = f"k{n - rows // 2}"
        if rewritten in live:
            _turn(listing, rewritten, n)  # its text replaced
            live[rewritten] = n
        met += past > 0
        n += 1
    copier.join()
    assert not failed, failed
    assert met >= 40, f"only {met} writes met a copy in {compactions} compactions"
    with listing.read() as conn:
        assert fts.levels(conn) <= BOUND
        assert fts.orphans(conn) == 0
        indexed = turn_search.digests(conn)
    assert copied() == -1
    assert indexed == {t: {0: _text(t, k).digest()} for t, k in live.items()}
    with listing.maintain() as conn:
        assert fts.damage(conn) is None
    assert not _matches(listing, "Qqzxword0")


def _version(store: str, memory: str, n: int, content: str | None) -> VersionRecord:
    at = iso_us(n)
    return VersionRecord.new(
        id=str(ULID()),
        store_id=store,
        memory_id=memory,
        operation="created" if content is not None else "deleted",
        path=f"/notes/{memory}.md",
        content=content,
        actor=None,
        created_us=n,
        created_at=at,
        memory_created_at=at,
        path_since=at,
        previous=None,
    )


@pytest.mark.slow  # thousands of deletes
def test_a_memory_store_takes_thousands_of_deletes_with_a_bounded_index(scratch: Path) -> None:
    index = StoreIndex(scratch / "index.sqlite3", timeout=5.0)
    store = "memstore_test"
    for n in range(KEPT):
        with index.write() as writer:
            writer.put_version(_version(store, f"kept{n}", n + 1, f"kept Qqzxword{n}"))
    most = 0
    for n in range(KEPT, KEPT + DELETES):
        with index.write() as writer:
            writer.put_version(_version(store, f"m{n}", n + 1, f"memory Qqzxword{n}"))
        with index.write() as writer:
            gone = f"m{n - 1}" if n > KEPT else "kept0"
            writer.put_version(_version(store, gone, n + 1, None))
        assert index.purge(), f"purge {n} could not truncate the WAL"
        most = max(most, _levels(index.path))
        assert most <= BOUND, f"{most} levels after purge {n - KEPT}"
    assert not index.purge_owed()
    with index.read() as reader:
        rows = reader.search_rows()
        assert reader.search_orphans() == 0
    assert len(rows) == KEPT
    assert rows[f"m{KEPT + DELETES - 1}"][1] == f"memory Qqzxword{KEPT + DELETES - 1}"
    assert index.search_damage() is None


def reproduce(path: Path, columns: tuple[str, ...], until: int | None = None) -> int:
    """The reproduction, in plain SQLite with none of our code: writes, a delete and a full
    merge with a negative page count, again and again, until FTS5 can no longer read the
    structure (every statement on the table then fails), or until the structure has
    ``until`` levels. Return how many rounds it took."""
    conn = sqlite3.connect(path, isolation_level=None)
    names, marks = ", ".join(columns), ", ".join("?" * len(columns))
    rounds = 0
    try:
        while until is None or _levels(path) < until:
            rounds += 1
            for k in range(3):
                conn.execute(
                    f"INSERT INTO {fts.TEXT} (rowid, {names}) VALUES (?, {marks})",
                    (10**9 + 3 * rounds + k, *[f"filler {rounds}"] * len(columns)),
                )
            conn.execute(f"DELETE FROM {fts.TEXT} WHERE rowid = ?", (10**9 + 3 * rounds,))
            while True:
                before = conn.total_changes
                conn.execute(f"INSERT INTO {fts.TEXT} ({fts.TEXT}, rank) VALUES ('merge', -256)")
                if conn.total_changes - before < 2:
                    break
    except sqlite3.DatabaseError as exc:
        assert "malformed" in str(exc), exc
    finally:
        conn.close()
    return rounds


def test_fsck_repairs_indexes_the_reproduction_broke(scratch: Path) -> None:
    storage = TreeStorage(scratch / "root", lock_timeout=5.0)
    scope = Scope("acme", "web")
    for n in range(20):
        summary = f"turn {n} Qqzxfsckword"
        storage.tasks.put_turn(scope, f"t{n}", 0, meta={}, summary_md=summary, actor="tok")
    store_id = storage.stores.create_store(scope, name="notes").id
    for n in range(10):
        storage.stores.create_memory(
            scope, store_id, path=f"/m{n}.md", content=f"memory {n} Qqzxfsckword", actor=None
        )
    upkeep_done(storage.tasks)
    listing = storage.layout.listing(scope)
    index = storage.layout.store_index(storage.layout.store_dir(scope, store_id))
    # Every connection of ours is closed, as on a stopped server.
    Listing.forget(listing)
    StoreIndex._pool.forget(lambda _key: True)
    assert reproduce(listing, ("task_id", "meta", "summary")) > 900
    assert reproduce(index, ("path", "content")) > 900
    for path in (listing, index):
        conn = sqlite3.connect(path)
        with pytest.raises(sqlite3.DatabaseError, match="vtable constructor failed"):
            conn.execute(f"SELECT count(*) FROM {fts.TEXT}").fetchone()
        conn.close()

    report = storage.fsck()
    assert any("_listing.sqlite3: search index damaged" in p for p in report.problems)
    assert any("index.sqlite3: search index" in p for p in report.problems), report.problems
    repaired = storage.fsck(repair=True)
    assert repaired.unrepairable == [], repaired.unrepairable
    assert storage.fsck().problems == []
    hits = storage.search(scope, "Qqzxfsckword", limit=50).hits
    assert sorted((h.kind, h.task_id or h.path) for h in hits) == sorted(
        [("turn", f"t{n}") for n in range(20)] + [("memory", f"/m{n}.md") for n in range(10)]
    )
    assert _levels(listing) <= BOUND and _levels(index) <= BOUND
    storage.close()


def _project(root: Path) -> tuple[TreeStorage, str]:
    """A project of 20 turns and a store of 10 memories, every one holding one word; the
    store's id. Its connections are closed, as on a stopped server."""
    storage = TreeStorage(root, lock_timeout=5.0)
    scope = Scope("acme", "web")
    for n in range(20):
        storage.tasks.put_turn(scope, f"t{n}", 0, meta={}, summary_md=f"{n} Qqzxheal", actor="t")
    store_id = storage.stores.create_store(scope, name="notes").id
    for n in range(10):
        storage.stores.create_memory(
            scope, store_id, path=f"/m{n}.md", content=f"{n} Qqzxheal", actor=None
        )
    upkeep_done(storage.tasks)
    Listing.forget(storage.layout.listing(scope))
    StoreIndex._pool.forget(lambda _key: True)
    return storage, store_id


def _paths(storage: TreeStorage, store_id: str) -> tuple[Path, Path]:
    scope = Scope("acme", "web")
    listing = storage.layout.listing(scope)
    return listing, storage.layout.store_index(storage.layout.store_dir(scope, store_id))


def _all_found(storage: TreeStorage) -> bool:
    hits = storage.search(Scope("acme", "web"), "Qqzxheal", limit=50).hits
    return sorted((h.kind, h.task_id or h.path) for h in hits) == sorted(
        [("turn", f"t{n}") for n in range(20)] + [("memory", f"/m{n}.md") for n in range(10)]
    )


def test_a_root_past_the_limit_heals_at_its_next_start(scratch: Path) -> None:
    storage, store_id = _project(scratch / "root")
    listing, index = _paths(storage, store_id)
    reproduce(listing, ("task_id", "meta", "summary"))
    reproduce(index, ("path", "content"))
    lines = storage.recover(CLEAN).search
    assert any("_listing.sqlite3: search index rebuilt" in line for line in lines), lines
    assert any("index.sqlite3: search index" in line for line in lines), lines
    assert _all_found(storage)
    assert storage.fsck().problems == []
    storage.close()


def test_a_root_close_to_the_limit_is_compacted_at_its_next_start(scratch: Path) -> None:
    storage, store_id = _project(scratch / "root")
    listing, index = _paths(storage, store_id)
    reproduce(listing, ("task_id", "meta", "summary"), until=1900)
    reproduce(index, ("path", "content"), until=1900)
    for path in (listing, index):  # the reproduction's own rows go (with no merge)
        conn = sqlite3.connect(path)
        with conn:
            conn.execute(f"DELETE FROM {fts.TEXT} WHERE rowid >= ?", (10**9,))
        conn.close()
    assert _levels(listing) >= 1900 and _levels(index) >= 1900
    lines = storage.recover(CLEAN).search
    assert sum("search index compacted" in line for line in lines) == 2, lines
    assert _levels(listing) <= BOUND and _levels(index) <= BOUND
    assert _all_found(storage)
    assert storage.fsck().problems == []
    storage.close()


def test_the_sweep_heals_a_broken_index(scratch: Path, clock: FixedClock) -> None:
    storage, store_id = _project(scratch / "root")
    listing, index = _paths(storage, store_id)
    reproduce(listing, ("task_id", "meta", "summary"))
    reproduce(index, ("path", "content"))
    storage.sweep(now=clock())
    assert _all_found(storage)
    assert storage.fsck().problems == []
    storage.close()


def test_the_start_after_a_crash_checks_each_index_with_fts5s_own_check(scratch: Path) -> None:
    """Damage the cheap check at every start cannot see (the table opens, its structure
    reads) is found by FTS5's integrity check after an unclean stop."""
    storage, store_id = _project(scratch / "root")
    for path in _paths(storage, store_id):
        conn = sqlite3.connect(path)
        with conn:
            conn.execute(f"DELETE FROM {fts.TEXT}_data WHERE id > 10")  # the segments
        conn.close()
    assert storage.recover(CLEAN).search == []  # every start: opens, reads its structure
    report = storage.recover(Plan(clean=False, full=False, reason="killed"))
    assert sum("search index rebuilt" in line for line in report.search) == 2, report.search
    assert any("search indexes:" in line for line in report.lines())
    assert _all_found(storage)
    assert storage.fsck().problems == []
    storage.close()
