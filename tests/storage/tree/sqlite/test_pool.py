"""The SQLite connections a worker keeps open are bounded by the pool, not by its threads."""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from app.storage.tree.sqlite import listing as listing_module, store_index as index_module
from app.storage.tree.sqlite.listing import Listing
from app.storage.tree.sqlite.store_index import StoreIndex
from tests.storage._helpers import open_fds

THREADS = 16


@pytest.fixture(autouse=True)
def _empty_pools() -> None:
    Listing._pool.forget(lambda _key: True)
    StoreIndex._pool.forget(lambda _key: True)


def _connections(under: Path) -> int:
    """How many SQLite connections of this process are open to databases under ``under``:
    each in WAL mode holds a descriptor of its own to the -wal file."""
    return len(open_fds(under, ".sqlite3-wal"))


def _open_databases(under: Path) -> set[str]:
    return {target for _fd, target in open_fds(under, ".sqlite3")}


def _in_threads(work: list[list[Any]], run: Callable[[Any], object], under: Path) -> int:
    """Run ``work`` on a thread per list and count the connections open once all are done,
    the threads still alive (a thread's own cache would go with it)."""
    errors: list[BaseException] = []
    start, done = threading.Barrier(len(work)), threading.Barrier(len(work) + 1)
    leave = threading.Event()

    def body(items: list[Any]) -> None:
        try:
            start.wait()
            for item in items:
                run(item)
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)
        done.wait()
        leave.wait()

    threads = [threading.Thread(target=body, args=(items,)) for items in work]
    for t in threads:
        t.start()
    done.wait()
    try:
        return _connections(under)
    finally:
        leave.set()
        for t in threads:
            t.join()
        assert not errors, errors


def test_listings_many_threads_open_stay_within_the_pool(tmp_path: Path) -> None:
    paths = []
    for n in range(48):
        (tmp_path / f"p{n}").mkdir()
        paths.append(tmp_path / f"p{n}" / "_listing.sqlite3")
    # Every thread reads every listing, each thread in its own order.
    work = [paths[t:] + paths[:t] for t in range(THREADS)]
    opened = _in_threads(work, lambda p: Listing(p, timeout=10).counts(), tmp_path)
    assert opened <= listing_module.POOL_LIMIT
    assert Listing._pool.idle() == opened


def test_store_indexes_many_threads_open_stay_within_the_pool(tmp_path: Path) -> None:
    paths = []
    for n in range(80):
        (tmp_path / f"s{n}").mkdir()
        paths.append(tmp_path / f"s{n}" / "index.sqlite3")
    for p in paths:
        with StoreIndex(p, timeout=10).write() as w:
            w.count()
    work = [paths[t:] + paths[:t] for t in range(THREADS)]

    def read(p: Path) -> None:
        with StoreIndex(p, timeout=10).read() as r:
            r.count()

    opened = _in_threads(work, read, tmp_path)
    assert opened <= index_module.POOL_LIMIT
    assert StoreIndex._pool.idle() == opened


def test_threads_taking_turns_share_one_connection(tmp_path: Path) -> None:
    path = tmp_path / "_listing.sqlite3"
    Listing(path, timeout=10).counts()
    for _ in range(THREADS):
        t = threading.Thread(target=lambda: Listing(path, timeout=10).counts())
        t.start()
        t.join()
    assert _open_databases(tmp_path) == {str(path)}


def test_a_read_inside_a_write_of_the_same_thread_sees_the_write(tmp_path: Path) -> None:
    listing = Listing(tmp_path / "_listing.sqlite3", timeout=10)
    before = listing.generation()
    with listing.write():
        assert listing.generation() == before + 1  # the same connection, the same transaction
        assert _connections(tmp_path) == 1
    assert listing.generation() == before + 1


def test_a_connection_left_in_a_transaction_is_not_kept(tmp_path: Path) -> None:
    listing = Listing(tmp_path / "_listing.sqlite3", timeout=10)
    with listing._use() as conn:
        conn.execute("BEGIN")
    assert Listing._pool.idle() == 0
    assert listing.generation() == 0  # a fresh connection, not one stuck in a transaction


def test_a_store_index_replaced_on_disk_is_not_read_through_a_kept_connection(
    tmp_path: Path,
) -> None:
    path = tmp_path / "index.sqlite3"
    index = StoreIndex(path, timeout=10)
    with index.write() as w:
        w.count()
    assert StoreIndex._pool.idle() == 1
    for suffix in ("", "-wal", "-shm"):
        Path(f"{path}{suffix}").unlink(missing_ok=True)
    with index.write() as w:  # a new, empty file
        assert w.count() == 0
    assert _open_databases(tmp_path) == {str(path)}


def test_a_forked_child_starts_with_an_empty_pool(tmp_path: Path) -> None:
    path = tmp_path / "_listing.sqlite3"
    Listing(path, timeout=10).counts()
    assert Listing._pool.idle() == 1
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child reports through its exit status
        code = 1
        try:
            empty = Listing._pool.idle() == 0
            Listing(path, timeout=10).counts()
            code = 0 if empty and Listing._pool.idle() == 1 else 2
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert Listing._pool.idle() == 1
