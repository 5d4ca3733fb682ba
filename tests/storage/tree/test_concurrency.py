"""Several processes (spawned, each with its own TaskStore) write one task and many tasks at once.

At the end every acknowledged turn is there, and index.json, the listing rows and project.md
equal a rebuild from the records, with no temp file left. With the task lock disabled these
tests fail: acknowledged artifacts of the shared turn are lost (4-5 of 60 in our runs) and
threads lose index entries (30-36 of 40 kept).
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import queue
import threading
import time
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path

import pytest

from app.storage.core.errors import LockTimeout
from app.storage.core.names import Scope
from app.storage.tree.fs.txn import Key
from app.storage.tree.tasks import TaskStore
from tests.storage import _workers
from tests.storage._helpers import assert_consistent, records_of, run_released, temp_files

WORKERS = 4
ROUNDS = 15


def _run_workers(root: Path) -> list[tuple[str, int, str]]:
    payloads = run_released(_workers.write_turns, [(str(root), w, ROUNDS) for w in range(WORKERS)])
    return [ack for payload in payloads for ack in payload]


def test_processes_writing_one_task_and_many_tasks(tmp_path: Path) -> None:
    root = tmp_path / "root"
    scope = Scope("acme", "web")
    TaskStore(root).put_turn(
        scope, "shared", _workers.SHARED_ARTIFACT_TURN, meta={}, summary_md="artifacts"
    )
    acked = _run_workers(root)
    assert len(acked) == WORKERS * ROUNDS * 5

    store = TaskStore(root)
    expected: dict[tuple[str, int], str] = {}
    contended: set[str] = set()
    artifacts: dict[tuple[str, int], dict[str, str]] = defaultdict(dict)
    for task_id, turn, text in acked:
        if text.startswith("artifact:"):
            _, name, body = text.split(":", 2)
            artifacts[(task_id, turn)][name] = body
        elif (task_id, turn) == ("shared", 0):
            contended.add(text)
        else:
            expected[(task_id, turn)] = text
    for (task_id, turn), text in expected.items():
        assert store.get_turn(scope, task_id, turn).summary_md == text
    # The contended turn holds one of the acknowledged writes, the last one by updated_us.
    last = store.get_turn(scope, "shared", 0)
    assert last.summary_md in contended
    for (task_id, turn), names in artifacts.items():
        rec = store.get_turn(scope, task_id, turn)
        lost = set(names) - {a.name for a in rec.artifacts}
        assert not lost, f"{len(lost)} of {len(names)} acknowledged artifacts lost"
        assert len(rec.artifacts) == len(names)
        for name, body in names.items():
            art = store.open_artifact(scope, task_id, turn, name)
            with art.file:
                assert art.file.read() == body.encode()

    shared = store.get_task(scope, "shared")
    assert len(shared.turns) == 2 + WORKERS * ROUNDS
    # updated_us is strictly increasing per task: no two acknowledged writes share a version.
    versions = [r.updated_us for r in records_of(store, scope, "shared")]
    assert len(set(versions)) == len(versions)

    tasks = {t for t, _ in expected} | {"shared"}
    page = store.list_tasks(scope, limit=1000)
    assert page.total == len(tasks) == len(page.tasks)
    assert {t.task_id for t in page.tasks} == tasks
    assert_consistent(store, scope)
    assert temp_files(root) == []
    assert store.txns.journal.pending() == []


def test_threads_of_one_process_exclude_each_other(tmp_path: Path) -> None:
    """gthread workers: threads sharing one TaskStore must not lose index updates either."""
    store = TaskStore(tmp_path / "root", lock_timeout=30.0)
    scope = Scope("acme", "web")
    errors: queue.Queue[BaseException] = queue.Queue()

    def run(worker: int) -> None:
        try:
            for i in range(10):
                store.put_turn(scope, "t", worker * 100 + i, meta={}, summary_md=f"{worker}/{i}")
        except BaseException as exc:
            errors.put(exc)

    threads = [threading.Thread(target=run, args=(w,)) for w in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert errors.empty(), errors.get()
    assert len(store.get_task(scope, "t").turns) == 40
    assert_consistent(store, scope)


@contextlib.contextmanager
def held_elsewhere(path: Path) -> Iterator[None]:
    """Hold the flock on ``path`` in a spawned process for the block."""
    ctx = multiprocessing.get_context("spawn")
    ready, release = ctx.Event(), ctx.Event()
    holder = ctx.Process(target=_workers.hold_lock, args=(str(path), ready, release))
    holder.start()
    try:
        assert ready.wait(30), "the lock holder did not start"
        yield
    finally:
        release.set()
        holder.join(timeout=30)
        if holder.is_alive():
            holder.kill()
            holder.join()


def test_a_busy_task_lock_times_out_with_lock_timeout_and_writes_nothing(tmp_path: Path) -> None:
    store = TaskStore(tmp_path / "root", lock_timeout=0.3)
    scope = Scope("acme", "web")
    store.put_turn(scope, "t", 0, meta={}, summary_md="before")
    lock_path = store.txns.lock_path(Key(scope, "t"))
    with held_elsewhere(lock_path):
        with pytest.raises(LockTimeout):
            store.put_turn(scope, "t", 0, meta={}, summary_md="after")
        with pytest.raises(LockTimeout):
            store.delete_task(scope, "t")
        # Readers take no lock: they are not blocked by a writer.
        assert store.get_turn(scope, "t", 0).summary_md == "before"
        assert store.list_tasks(scope).total == 1
    assert lock_path.exists(), "lock files are never deleted"
    store.put_turn(scope, "t", 0, meta={}, summary_md="after")
    assert store.get_turn(scope, "t", 0).summary_md == "after"
    assert_consistent(store, scope)


def test_threads_of_one_process_queue_on_the_lock_and_time_out(tmp_path: Path) -> None:
    """Threads wait on a per-path gate in front of the flock: one holder at a time, a waiter
    past its timeout gets LockTimeout, and no gate outlives its users."""
    from app.storage.tree.fs import locks

    path = tmp_path / "locks" / "x.lock"
    inside, held = [], threading.Event()
    release = threading.Event()

    def holder() -> None:
        with locks.locked(path, 5.0):
            held.set()
            release.wait(10)

    t = threading.Thread(target=holder)
    t.start()
    assert held.wait(10)
    with pytest.raises(LockTimeout), locks.locked(path, 0.2):
        pass
    release.set()
    t.join(10)

    overlaps: list[list[int]] = []

    def worker(i: int) -> None:
        for _ in range(20):
            with locks.locked(path, 10.0):
                inside.append(i)
                if len(inside) != 1:
                    overlaps.append(list(inside))
                time.sleep(0.0005)
                inside.remove(i)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(6)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(60)
    assert overlaps == [] and inside == [] and locks._gates == {}


def test_reused_lock_objects_still_exclude_other_processes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """locked() reuses one FileLock per path: after a timeout and after being evicted from
    the bounded cache, the path still excludes another process and can be taken again."""
    from app.storage.tree.fs import locks

    monkeypatch.setattr(locks, "_FILE_LOCKS_LIMIT", 3)
    path = tmp_path / "locks" / "x.lock"
    with locks.locked(path, 5.0):
        pass
    with held_elsewhere(path):
        for _ in range(2):  # the cached object, twice: a timeout leaves it usable
            with pytest.raises(LockTimeout), locks.locked(path, 0.2):
                pass
        for i in range(5):  # evicts x.lock from the cache of 3
            with locks.locked(tmp_path / "locks" / f"other-{i}.lock", 5.0):
                pass
        assert len(locks._file_locks) == 3 and str(path) not in locks._file_locks
        with pytest.raises(LockTimeout), locks.locked(path, 0.2):
            pass
    with locks.locked(path, 5.0):
        assert str(path) in locks._file_locks


def test_a_process_waiting_for_a_busy_lock_gets_it_before_the_holder_takes_it_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A thread of another process that finds the lock taken says so; the holder's process
    lets it go first on its next take, instead of taking the lock again at once."""
    from app.storage.tree.fs import locks

    monkeypatch.setattr(locks, "_DEFER_SECONDS", 30.0)  # the order is all this test checks
    path = tmp_path / "locks" / "busy.lock"
    log = tmp_path / "order"
    ctx = multiprocessing.get_context("spawn")
    with locks.locked(path, 5.0):
        waiter = ctx.Process(target=_workers.take_lock_and_log, args=(str(path), str(log), "P"))
        waiter.start()
        slot = locks._Waiting(path)
        deadline = time.monotonic() + 30
        while slot.get() != waiter.pid:  # the other process found it taken and waits
            assert time.monotonic() < deadline and waiter.is_alive()
            time.sleep(0.01)
    with locks.locked(path, 30.0), open(log, "a") as fh:
        fh.write("T")
    waiter.join(30)
    assert waiter.exitcode == 0
    assert log.read_text() == "PT"
    assert slot.get() == 0


def test_a_waiting_hint_left_by_a_dead_process_delays_a_lock_only_briefly(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from app.storage.tree.fs import locks

    monkeypatch.setattr(locks, "_DEFER_SECONDS", 0.2)
    path = tmp_path / "locks" / "busy.lock"
    with locks.locked(path, 5.0):
        pass
    slot = locks._Waiting(path)
    slot.put(2**31 + 7)  # no such process
    started = time.monotonic()
    with locks.locked(path, 5.0):
        waited = time.monotonic() - started
    assert 0.2 <= waited < 2.0
    assert slot.get() == 0  # cleared: the next taker does not wait
    started = time.monotonic()
    with locks.locked(path, 5.0):
        assert time.monotonic() - started < 0.15


@pytest.mark.parametrize("planted", ["symlink", "fifo", "directory"])
def test_a_waiting_file_replaced_by_hand_is_never_followed(
    tmp_path: Path, planted: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Whatever stands at <lock dir>/_waiting, a lock is still taken (with no hint), and
    nothing outside the lock tree is written."""
    from app.storage.tree.fs import locks

    monkeypatch.setattr(locks._Waiting, "_fds", {})
    outside = tmp_path / "outside"
    outside.write_bytes(b"keep")
    path = tmp_path / "locks" / "x.lock"
    path.parent.mkdir()
    waiting = path.parent / "_waiting"
    if planted == "symlink":
        waiting.symlink_to(outside)
    elif planted == "fifo":
        os.mkfifo(waiting)
    else:
        waiting.mkdir()
    with locks.locked(path, 5.0):
        slot = locks._Waiting(path)
        slot.announce()
        assert slot.get() == 0
    with held_elsewhere(path), pytest.raises(LockTimeout), locks.locked(path, 0.2):
        pass
    assert outside.read_bytes() == b"keep"
