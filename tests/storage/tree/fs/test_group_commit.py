"""Group commit (app/storage/tree/fs/sync.py): one flush for many writers, and the rules it keeps.

The flusher is checked with a stand-in for ``syncfs`` that records when each round started and
ended; the engines on a real filesystem, with every rename, listing write, lock release and
flush logged in the order it happened:

* a writer returns only after a flush that *started* after its last write;
* an artifact's bytes (and their name) are flushed before the ``meta.json`` that names them;
* the task or store lock is released before the flush the writer waits for;
* a flush that fails fails every writer whose block began before the failure was seen,
  and no later one;
* no durable write fsyncs by itself inside a block, and outside one (or on a filesystem
  whose syncfs is not known to be a barrier) every one does.
"""

from __future__ import annotations

import contextlib
import errno
import io
import itertools
import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from app.storage.core.errors import NotFound, PreconditionFailed
from app.storage.core.names import Scope
from app.storage.tree.fs import sync, txn as txn_mod
from app.storage.tree.fs.walk import Tree
from app.storage.tree.sqlite.listing import Listing
from app.storage.tree.stores.engine import MemoryStoreEngine
from app.storage.tree.tasks import TaskStore
from tests.conftest import FixedClock
from tests.storage._helpers import assert_consistent

SCOPE = Scope("acme", "web")


def _grouped(root: Path) -> bool:
    root.mkdir(parents=True, exist_ok=True)
    return sync._flusher_for(root) is not None


@pytest.fixture
def root(tmp_path: Path) -> Path:
    path = tmp_path / "root"
    if not _grouped(path):
        pytest.skip("the test's filesystem has no group commit")
    return path


# -- the flusher ---------------------------------------------------------------------------
class Rounds:
    """A stand-in for ``syncfs`` that logs each round on a shared clock of events."""

    def __init__(self, seconds: float = 0.005) -> None:
        self.seconds = seconds
        self.tick = itertools.count()
        self.lock = threading.Lock()
        self.rounds: list[tuple[int, int]] = []
        self.fail_next = 0

    def now(self) -> int:
        with self.lock:
            return next(self.tick)

    def __call__(self, fd: int) -> OSError | None:
        start = self.now()
        time.sleep(self.seconds)
        failed = False
        with self.lock:
            if self.fail_next:
                self.fail_next -= 1
                failed = True
        end = self.now()
        self.rounds.append((start, end))
        return OSError(errno.EIO, "injected") if failed else None


@pytest.fixture
def rounds(monkeypatch: pytest.MonkeyPatch) -> Rounds:
    fake = Rounds()
    monkeypatch.setattr(sync, "_syncfs_error", fake)
    return fake


def test_each_waiter_is_covered_by_a_flush_that_started_after_its_writes(
    tmp_path: Path, rounds: Rounds
) -> None:
    flusher = sync._Flusher(os.open(tmp_path, os.O_RDONLY))
    waits: list[tuple[int, int]] = []

    def writer() -> None:
        for _ in range(20):
            ticket = flusher.ticket()
            wrote = rounds.now()  # the writer's last write
            flusher.wait(ticket)
            waits.append((wrote, rounds.now()))

    threads = [threading.Thread(target=writer) for _ in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(waits) == 320
    for wrote, returned in waits:
        assert any(wrote < start and end < returned for start, end in rounds.rounds), (
            wrote,
            returned,
        )
    # Writers shared flushes: far fewer rounds than waits.
    assert len(rounds.rounds) < len(waits) / 2, len(rounds.rounds)
    os.close(flusher.fd)


def test_a_failed_flush_fails_every_writer_that_began_before_it_and_no_later_one(
    tmp_path: Path, rounds: Rounds
) -> None:
    flusher = sync._Flusher(os.open(tmp_path, os.O_RDONLY))
    early = flusher.ticket()  # began before the failing round
    rounds.fail_next = 1
    with pytest.raises(OSError) as failed:
        flusher.wait(flusher.ticket())
    assert failed.value.errno == errno.EIO
    # The failure may have been this writer's pages, whoever's flush saw it.
    with pytest.raises(OSError):
        flusher.wait(early)
    flusher.wait(flusher.ticket())  # a writer that began after it is not failed
    os.close(flusher.fd)


def test_a_flush_that_raises_fails_its_waiters(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def broken(fd: int) -> OSError | None:
        raise OSError(errno.EBADF, "bad descriptor")

    monkeypatch.setattr(sync, "_syncfs_error", broken)
    flusher = sync._Flusher(os.open(tmp_path, os.O_RDONLY))
    with pytest.raises(OSError):
        flusher.wait(flusher.ticket())
    monkeypatch.undo()
    flusher.wait(flusher.ticket())
    os.close(flusher.fd)


def test_a_failed_syncfs_is_an_error_not_a_silent_sync(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    class Failing:
        def __call__(self, fd: int) -> int:
            return -1

    monkeypatch.setattr(sync, "_syncfs", Failing())
    monkeypatch.setattr(sync.ctypes, "get_errno", lambda: errno.EIO)
    with pytest.raises(OSError) as failed:
        sync.sync_filesystem(tmp_path)
    assert failed.value.errno == errno.EIO


# -- where group commit applies ------------------------------------------------------------
class Calls:
    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.fsyncs = 0
        self.flushes = 0
        real_fsync, real_flush = os.fsync, sync._syncfs_error

        def fsync(fd: int) -> None:
            self.fsyncs += 1
            real_fsync(fd)

        def flush(fd: int) -> OSError | None:
            self.flushes += 1
            return real_flush(fd)

        monkeypatch.setattr(os, "fsync", fsync)
        monkeypatch.setattr(sync, "_syncfs_error", flush)


def _record(root: Path, *, group: bool) -> TaskStore:
    store = TaskStore(root, clock=FixedClock(), lock_timeout=5.0, group_commit=group)
    store.put_turn(SCOPE, "t1", 0, meta={}, summary_md="warm")  # lock tree, listing, ...
    return store


def test_inside_a_group_no_write_fsyncs_for_itself(
    root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = _record(root, group=True)
    engine = MemoryStoreEngine(root, lock_timeout=5.0)
    memstore = engine.create_store(SCOPE, name="s")
    calls = Calls(monkeypatch)
    store.put_turn(SCOPE, "t2", 0, meta={}, summary_md="new task")
    store.put_turn(SCOPE, "t1", 0, meta={"v": 2}, summary_md="replaced")
    store.put_artifact(SCOPE, "t1", 0, "a.bin", io.BytesIO(b"bytes"), content_type="x/y")
    mem = engine.create_memory(SCOPE, memstore.id, path="/a.md", content="a", actor=None)
    engine.update_memory(SCOPE, memstore.id, mem.id, content="b", actor=None)
    assert calls.fsyncs == 0
    # put_turn x2, artifact x2 (its bytes before its record), create, update
    assert calls.flushes == 6
    assert_consistent(store, SCOPE)


def test_without_group_commit_every_record_is_fsynced(
    root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = _record(root, group=False)
    calls = Calls(monkeypatch)
    store.put_turn(SCOPE, "t1", 0, meta={"v": 2}, summary_md="replaced")
    store.put_artifact(SCOPE, "t1", 0, "a.bin", io.BytesIO(b"bytes"), content_type="x/y")
    assert calls.flushes == 0
    assert calls.fsyncs >= 4  # meta.json twice, the artifact, their directories


def test_a_filesystem_not_known_to_honour_syncfs_keeps_per_file_fsync(
    root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = _record(root, group=True)
    monkeypatch.setattr(sync, "_flushers", {})
    monkeypatch.setattr(sync, "_filesystem_type", lambda dev: "fuse.lazyfs")
    assert sync._flusher_for(root) is None
    calls = Calls(monkeypatch)
    store.put_turn(SCOPE, "t1", 0, meta={"v": 2}, summary_md="replaced")
    assert calls.flushes == 0 and calls.fsyncs >= 2


def test_a_transaction_that_writes_nothing_still_answers_after_a_flush(
    root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Its predecessor let go of the lock before its flush: a 412 or 404 decided by that write
    # must not be answered before the write is on disk.
    store = _record(root, group=True)
    calls = Calls(monkeypatch)
    with pytest.raises(PreconditionFailed):
        store.put_turn(SCOPE, "t1", 0, meta={}, summary_md="x", if_none_match=True)
    assert calls.flushes == 1
    with pytest.raises(NotFound):
        store.delete_task(SCOPE, "absent")
    assert calls.flushes == 2
    assert calls.fsyncs == 0


def test_ext4_without_ordered_replacement_keeps_per_file_fsync() -> None:
    line = "29 1 254:0 / / rw,relatime shared:1 - ext4 /dev/vda rw,{}\n"
    assert sync._mount_type([line.format("discard")], "254:0") == "ext4"
    for option in ("data=writeback", "noauto_da_alloc"):
        found = sync._mount_type([line.format(option)], "254:0")
        assert found == f"ext4 ({option})"
        assert found not in sync.GROUP_COMMIT_FILESYSTEMS
    # xfs and btrfs may put a rename on disk before the data it names.
    assert sync._mount_type([line.replace("ext4", "xfs")], "254:0") == "xfs"
    assert "xfs" not in sync.GROUP_COMMIT_FILESYSTEMS
    assert "btrfs" not in sync.GROUP_COMMIT_FILESYSTEMS
    assert sync._mount_type([line], "8:1") is None


def test_a_write_on_another_filesystem_inside_a_group_is_not_deferred(root: Path) -> None:
    with sync.group_commit(root):
        assert sync.grouped()
        own = os.stat(root).st_dev
        assert not sync._deferred_dev(own + 1)
        assert sync._deferred_dev(own)
    assert not sync.grouped()


# -- the order of events ---------------------------------------------------------------------
class Log:
    """Renames, links, listing and index writes, journal clears, lock releases and flushes,
    in the order they happened."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.events: list[tuple[str, str]] = []
        real_replace, real_link = os.replace, os.link
        real_flush = sync._syncfs_error
        real_locked = txn_mod.locked

        def replace(src: Any, dst: Any, *args: Any, **kwargs: Any) -> None:
            real_replace(src, dst, *args, **kwargs)
            self.events.append(("rename", str(dst)))

        def link(src: Any, dst: Any, *args: Any, **kwargs: Any) -> None:
            real_link(src, dst, *args, **kwargs)
            self.events.append(("link", str(dst)))

        def flush(fd: int) -> OSError | None:
            self.events.append(("flush start", ""))
            try:
                return real_flush(fd)
            finally:
                self.events.append(("flush end", ""))

        @contextlib.contextmanager
        def locked(path: Path, timeout: float) -> Iterator[None]:
            with real_locked(path, timeout):
                yield
            self.events.append(("unlock", str(path)))

        for method in ("put_turn", "set_task"):
            real = getattr(Listing, method)

            def logged(self_: Listing, *a: Any, _real: Any = real, **kw: Any) -> Any:
                result = _real(self_, *a, **kw)
                self.events.append(("listing", str(self_.path)))
                return result

            monkeypatch.setattr(Listing, method, logged)
        monkeypatch.setattr(os, "replace", replace)
        monkeypatch.setattr(os, "link", link)
        monkeypatch.setattr(sync, "_syncfs_error", flush)
        monkeypatch.setattr(txn_mod, "locked", locked)

    def index(self, kind: str, suffix: str = "", start: int = 0) -> int:
        for i in range(start, len(self.events)):
            if self.events[i][0] == kind and self.events[i][1].endswith(suffix):
                return i
        raise AssertionError(f"no {kind} {suffix} after {start}: {self.events}")

    def last(self, kind: str) -> int:
        return max(i for i, (k, _) in enumerate(self.events) if k == kind)


def test_a_turn_is_answered_after_a_flush_that_began_after_its_last_write(
    root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = _record(root, group=True)
    log = Log(monkeypatch)
    store.put_turn(SCOPE, "t1", 0, meta={"v": 2}, summary_md="replaced")
    events = log.events
    writes = [i for i, (k, _) in enumerate(events) if k in ("rename", "link", "listing")]
    unlock = log.last("unlock")
    start, end = log.last("flush start"), log.last("flush end")
    # Every write, then the lock let go, then one flush, then (the return) the answer.
    assert max(writes) < unlock < start < end == len(events) - 1, events
    assert [k for k, _ in events].count("flush start") == 1


def test_an_artifacts_bytes_are_flushed_before_the_record_that_names_them(
    root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = _record(root, group=True)
    log = Log(monkeypatch)
    store.put_artifact(SCOPE, "t1", 0, "a.bin", io.BytesIO(b"bytes"), content_type="x/y")
    published = log.index("rename", "/artifacts/a.bin")
    first_start = log.index("flush start", "", published)
    first_end = log.index("flush end", "", first_start)
    committed = log.index("rename", "/meta.json", published)
    assert published < first_start < first_end < committed, log.events
    # The record and its derived files: flushed after the lock is released, before the answer.
    unlock = log.last("unlock")
    assert committed < unlock < log.last("flush start") < log.last("flush end"), log.events


def test_a_memory_write_lets_go_of_the_store_lock_before_its_flush(
    root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    engine = MemoryStoreEngine(root, lock_timeout=5.0)
    memstore = engine.create_store(SCOPE, name="s")
    engine.create_memory(SCOPE, memstore.id, path="/warm.md", content="w", actor=None)
    log = Log(monkeypatch)
    engine.create_memory(SCOPE, memstore.id, path="/a.md", content="a", actor=None)
    version = log.index("link", ".json")
    unlock = log.last("unlock")
    assert version < unlock < log.last("flush start") < log.last("flush end"), log.events
    assert [k for k, _ in log.events].count("flush start") == 1


def test_a_failed_flush_fails_the_write_and_the_next_one_succeeds(
    root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The flush comes after the rename: the write stays visible (its outcome is unknown to
    the client, as for any error past the commit point), the tree stays consistent."""
    store = _record(root, group=True)
    real = sync._syncfs_error
    monkeypatch.setattr(sync, "_syncfs_error", lambda fd: OSError(errno.EIO, "injected"))
    with pytest.raises(OSError):
        store.put_turn(SCOPE, "t1", 0, meta={"v": 2}, summary_md="maybe")
    monkeypatch.setattr(sync, "_syncfs_error", real)
    assert store.get_turn(SCOPE, "t1", 0).summary_md == "maybe"
    assert not store.txns.journal.pending()
    assert_consistent(store, SCOPE)
    store.put_turn(SCOPE, "t1", 0, meta={"v": 3}, summary_md="later")
    assert store.get_turn(SCOPE, "t1", 0).summary_md == "later"


def test_concurrent_writers_share_flushes(root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    store = _record(root, group=True)
    engine = MemoryStoreEngine(root, lock_timeout=10.0)
    memstore = engine.create_store(SCOPE, name="s")
    real = sync._syncfs_error
    count = itertools.count()

    def slow(fd: int) -> OSError | None:
        next(count)
        time.sleep(0.01)  # a flush long enough for the other writers to queue behind it
        return real(fd)

    monkeypatch.setattr(sync, "_syncfs_error", slow)
    errors: list[BaseException] = []

    def writer(n: int) -> None:
        try:
            for i in range(10):
                store.put_turn(SCOPE, f"w{n}", i, meta={}, summary_md=f"{n}/{i}")
                engine.create_memory(
                    SCOPE, memstore.id, path=f"/w{n}/{i}.md", content="x", actor=None
                )
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=writer, args=(n,)) for n in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    flushes = next(count)
    assert flushes < 160 / 2, flushes  # 160 writes
    assert_consistent(store, SCOPE)
    for n in range(8):
        page = engine.list_memories(SCOPE, memstore.id, path_prefix=f"/w{n}/", limit=100)
        assert len(page.data) == 10


def test_sync_tree_fsyncs_each_file_and_directory_where_syncfs_is_no_barrier(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Where syncfs makes nothing durable (FUSE: tests/powerloss/test_import.py cuts the power
    after an import), sync_tree fsyncs every file and directory below, and never what a
    link names."""
    staged = tmp_path / "staged"
    (staged / "tasks" / "t1" / "0000-turn" / "artifacts").mkdir(parents=True)
    (staged / "tasks" / "t1" / "task.json").write_text("{}")
    (staged / "tasks" / "t1" / "0000-turn" / "meta.json").write_text("{}")
    (staged / "tasks" / "t1" / "0000-turn" / "artifacts" / "a.bin").write_bytes(b"a")
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret").write_text("never opened")
    (staged / "tasks" / "link").symlink_to(outside, target_is_directory=True)
    (staged / "tasks" / "file-link").symlink_to(outside / "secret")
    synced: list[str] = []
    real_fsync = os.fsync

    def fsync(fd: int) -> None:
        synced.append(os.readlink(f"/proc/self/fd/{fd}"))
        real_fsync(fd)

    monkeypatch.setattr(sync, "_filesystem_type", lambda dev: "fuse.sshfs")
    monkeypatch.setattr(sync, "_flushers", {})
    monkeypatch.setattr(sync.os, "fsync", fsync)
    sync.sync_tree(staged, Tree(tmp_path))
    every = {str(staged)} | {str(p) for p in staged.rglob("*") if not p.is_symlink()}
    assert sorted(synced) == sorted(every)
    assert not any(str(outside) in path for path in synced)
