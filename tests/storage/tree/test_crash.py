"""Fault injection SQLite-style: the Nth write/fsync/rename/mkdir fails with ENOSPC or EIO.

For every step N of a put_turn and a put_artifact, the operation fails there; afterwards the
previous state (or, past the commit point, the new one) is completely readable, no temp file
is left, and the next write or repair_task brings every derived file back in line with the
records. Both ways of making a write durable are checked: per-file fsync, and group commit
(app/storage/tree/fs/sync.py), where the fault may also hit the shared flush (``syncfs``).
"""

from __future__ import annotations

import errno
import hashlib
import io
import json
import os
import shutil
import stat
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from app.storage.core.errors import InsufficientStorage, NotFound, StorageError
from app.storage.core.models import ArtifactUpload
from app.storage.core.names import Scope
from app.storage.tree.fs import sync
from app.storage.tree.fs.txn import Journal, Key
from app.storage.tree.sqlite.listing import Listing
from app.storage.tree.tasks import TaskStore
from tests.conftest import FixedClock
from tests.storage._helpers import Fault, assert_consistent, records_of, temp_files, upkeep_done

SCOPE = Scope("acme", "web")
FAULTY = ("replace", "fsync", "write", "mkdir", "rename")
# Under group commit the durable writes skip their fsyncs; the shared flush can fail instead.
FAULTY_GROUPED = ("replace", "syncfs", "write", "mkdir", "rename")
MODES = {"fsync": False, "group": True}


def _grouped(root: Path) -> bool:
    """Whether group commit applies to ``root`` (its filesystem honours syncfs)."""
    return sync._flusher_for(root) is not None


def _fault(name: str, at: int, err: int, *, persistent: bool = False) -> Fault:
    # The operation's own steps: a delete's purge after the answer is upkeep that may fail
    # and is tried again (tests/robust/test_removed_text.py).
    if name == "syncfs":
        return Fault("_syncfs_error", at, err, persistent=persistent, target=sync, own_thread=True)
    return Fault(name, at, err, persistent=persistent, own_thread=True)


def _base(root: Path, clock: FixedClock, *, group: bool = False) -> TaskStore:
    store = TaskStore(root, clock=clock, lock_timeout=5.0, group_commit=group)
    store.put_turn(SCOPE, "t1", 0, meta={"v": "old"}, summary_md="old summary")
    store.put_artifact(SCOPE, "t1", 0, "a.bin", io.BytesIO(b"old bytes"), content_type="x/old")
    clock.advance(seconds=1)
    store.put_turn(SCOPE, "t2", 0, meta={}, summary_md="t2 summary")
    clock.advance(seconds=1)
    return store


def _copy_of_base(tmp_path: Path, root: Path, clock: FixedClock, *, group: bool) -> TaskStore:
    """A copy of one base tree per test: copying is much cheaper than writing it again."""
    template = tmp_path / "template"
    if not template.exists():
        store = _base(template, FixedClock())
        Listing.forget(store.layout.listing(SCOPE))  # checkpoint the WAL into the file
    shutil.copytree(template, root)
    clock.advance(seconds=2)  # where _base leaves its clock
    return TaskStore(root, clock=clock, lock_timeout=5.0, group_commit=group)


OPS: dict[str, Callable[[TaskStore], object]] = {
    "put_turn_update": lambda s: s.put_turn(SCOPE, "t1", 0, meta={"v": "new"}, summary_md="new"),
    "put_turn_new_turn": lambda s: s.put_turn(SCOPE, "t1", 1, meta={"v": 1}, summary_md="one"),
    "put_turn_new_task": lambda s: s.put_turn(SCOPE, "t3", 0, meta={}, summary_md="t3"),
    "put_artifact_new": lambda s: s.put_artifact(
        SCOPE, "t1", 0, "b.bin", io.BytesIO(b"b" * 3000), content_type="x/b"
    ),
    "put_artifact_replace": lambda s: s.put_artifact(
        SCOPE, "t1", 0, "a.bin", io.BytesIO(b"new bytes!"), content_type="x/new"
    ),
    "delete_task": lambda s: s.delete_task(SCOPE, "t2"),
    # A turn with its artifacts in one write (beyond the seed): one replaced, one new.
    "put_turn_with_artifacts": lambda s: s.put_turn(
        SCOPE, "t1", 0, meta={"v": "new"}, summary_md="new",
        artifacts=[
            ArtifactUpload("a.bin", "x/new", io.BytesIO(b"new bytes!")),
            ArtifactUpload("c.bin", "x/c", io.BytesIO(b"c" * 3000)),
        ],
    ),
    "put_turn_with_artifacts_new_task": lambda s: s.put_turn(
        SCOPE, "t3", 0, meta={}, summary_md="t3",
        artifacts=[ArtifactUpload("d.bin", "x/d", io.BytesIO(b"d" * 100))],
    ),
}  # fmt: skip


def _visible_state(store: TaskStore) -> dict[str, Any]:
    """Everything a client can read, with artifact bytes checked against their records."""
    state: dict[str, Any] = {"turns": {}, "artifacts": {}}
    for task_id in ("t1", "t2", "t3"):
        try:
            index = store.get_task(SCOPE, task_id)
        except NotFound:
            continue
        for entry in index.turns:
            rec = store.get_turn(SCOPE, task_id, entry.turn)
            state["turns"][(task_id, entry.turn)] = (rec.meta, rec.summary_md)
            for info in rec.artifacts:
                art = store.open_artifact(SCOPE, task_id, entry.turn, info.name)
                with art.file:
                    data = art.file.read()
                # The bytes served must be the bytes the record describes.
                assert len(data) == info.size == art.size, (task_id, info.name)
                assert hashlib.sha256(data).hexdigest() == info.sha256, (task_id, info.name)
                state["artifacts"][(task_id, entry.turn, info.name)] = (data, info.content_type)
    return state


def _run_case(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    op_name: str,
    fault_name: str,
    n: int,
    *,
    err: int,
    persistent: bool,
    finish: str,
    group: bool = False,
) -> bool:
    """Run one case; return False once N is past the operation's last call (no fault fired)."""
    clock = FixedClock()
    root = tmp_path / f"{op_name}-{fault_name}-{n}-{persistent}-{finish}"
    store = _copy_of_base(tmp_path, root, clock, group=group)
    before = _visible_state(store)
    after_ok = _expected_after(tmp_path / f"ref-{op_name}-{n}-{fault_name}-{finish}", op_name)
    fault = _fault(fault_name, n, err, persistent=persistent)
    fault.install(monkeypatch)
    try:
        OPS[op_name](store)
        failed: BaseException | None = None
    except (OSError, StorageError) as exc:
        failed = exc
    finally:
        monkeypatch.setattr(fault.target, fault.name, fault.real)
    upkeep_done(store)  # the upkeep after a delete's answer (its purge)
    if not fault.fired:
        assert failed is None
        return False
    if failed is None:
        # Only a fault the engine may rightly absorb (mkdir of a directory that exists):
        # then the operation really happened, completely.
        assert fault_name == "mkdir", "an injected failure was swallowed and reported as success"
        assert _visible_state(store) == after_ok
        assert_consistent(store, SCOPE)
        return True
    if err == errno.ENOSPC and not isinstance(failed, InsufficientStorage):
        # The lock tree's own mkdir is the one place a raw OSError may surface.
        assert isinstance(failed, OSError), failed
    left = temp_files(root)
    if persistent:
        # While the disk still refuses renames, the kept copy of a replaced artifact cannot be
        # put back yet; it must be the only thing left, and the next write restores it.
        left = [p for p in left if not p.name.startswith(".~tmp-prev-")]
    else:
        now = _visible_state(store)
        assert now in (before, after_ok), f"neither the old nor the new state:\n{now}"
    assert left == [], f"temp files left: {left}"
    if finish == "next_write":
        # The next writer of the task sees the write in flight (if any) and repairs first.
        clock.advance(seconds=1)
        store.put_turn(SCOPE, "t1", 7, meta={}, summary_md="later")
        store.put_turn(SCOPE, "t2", 7, meta={}, summary_md="later")
        store.put_turn(SCOPE, "t3", 7, meta={}, summary_md="later")
    else:
        for task_id in ("t1", "t2", "t3"):
            with store.txns.locked(Key(SCOPE, task_id), repair=False):
                store.repair_task(SCOPE, task_id)
                store.txns.settle(Key(SCOPE, task_id))
    assert_consistent(store, SCOPE)
    assert _unnamed_files(store) == []
    assert store.txns.journal.pending() == []
    later = _visible_state(store)
    for key in ("turns", "artifacts"):
        settled = {k: v for k, v in later[key].items() if k[1] != 7}
        assert settled in (before[key], after_ok[key]), f"{key} neither old nor new: {settled}"
    return True


def _unnamed_files(store: TaskStore) -> list[Path]:
    """Files under a turn directory that no committed record names: a turn directory without
    its meta.json, or an artifact its record does not list (a write that never committed)."""
    left = []
    for task_id in ("t1", "t2", "t3"):
        task_dir = store.layout.task_dir(SCOPE, task_id)
        for turn_dir in sorted(task_dir.glob("*-turn")):
            meta = turn_dir / "meta.json"
            named = (
                {a["name"] for a in json.loads(meta.read_bytes())["artifacts"]}
                if meta.exists()
                else None
            )
            for path in sorted(turn_dir.rglob("*")):
                if path.is_file() and (
                    named is None or (path.parent.name == "artifacts" and path.name not in named)
                ):
                    left.append(path)
    return left


_EXPECTED: dict[str, dict[str, Any]] = {}


def _expected_after(root: Path, op_name: str) -> dict[str, Any]:
    if op_name not in _EXPECTED:
        store = _base(root, FixedClock())
        OPS[op_name](store)
        _EXPECTED[op_name] = _visible_state(store)
    return _EXPECTED[op_name]


def _mode_faults(faults: tuple[str, ...], grouped: tuple[str, ...]) -> list[Any]:
    return [pytest.param("fsync", f, id=f"fsync-{f}") for f in faults] + [
        pytest.param("group", f, id=f"group-{f}") for f in grouped
    ]


@pytest.mark.parametrize("op_name", sorted(OPS))
@pytest.mark.parametrize(("mode", "fault_name"), _mode_faults(FAULTY, FAULTY_GROUPED))
def test_single_fault_at_every_step(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, op_name: str, mode: str, fault_name: str
) -> None:
    group = MODES[mode]
    if group and not _grouped(tmp_path):
        pytest.skip("the test's filesystem has no group commit")
    fired = 0
    for n in range(1, 40):
        err = errno.ENOSPC if n % 2 else errno.EIO
        finish = "next_write" if n % 2 else "repair"
        if not _run_case(
            tmp_path,
            monkeypatch,
            op_name,
            fault_name,
            n,
            err=err,
            persistent=False,
            finish=finish,
            group=group,
        ):
            break
        fired += 1
    else:
        pytest.fail("the operation made more calls than the test expects")
    if fault_name in ("replace", "fsync", "mkdir", "syncfs") and op_name != "delete_task":
        assert fired > 0, f"{op_name} never called {fault_name}"


@pytest.mark.parametrize("op_name", ["put_turn_update", "put_artifact_replace", "delete_task"])
@pytest.mark.parametrize(
    ("mode", "fault_name"),
    _mode_faults(("replace", "fsync", "write"), ("replace", "syncfs", "write")),
)
def test_persistent_fault_then_recovery(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, op_name: str, mode: str, fault_name: str
) -> None:
    group = MODES[mode]
    if group and not _grouped(tmp_path):
        pytest.skip("the test's filesystem has no group commit")
    for n in range(1, 40):
        if not _run_case(
            tmp_path,
            monkeypatch,
            op_name,
            fault_name,
            n,
            err=errno.EIO,
            persistent=True,
            finish="next_write",
            group=group,
        ):
            break


def _is_file_fd(args: tuple[Any, ...]) -> bool:
    return not stat.S_ISDIR(os.fstat(args[0]).st_mode)


def test_failed_fsync_of_the_record_is_a_failed_write(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """fsync fails, and would succeed if retried: the call raises and nothing new is published."""
    clock = FixedClock()
    store = _base(tmp_path / "r", clock)
    turn_dir = store.layout.turn_dir(SCOPE, "t1", 0)
    meta_before = (turn_dir / "meta.json").read_bytes()
    fault = Fault("fsync", 1, errno.EIO, only=_is_file_fd)
    fault.install(monkeypatch)
    with pytest.raises(OSError):
        store.put_turn(SCOPE, "t1", 0, meta={"v": "new"}, summary_md="new")
    monkeypatch.undo()
    assert fault.fired == 1
    assert (turn_dir / "meta.json").read_bytes() == meta_before
    assert store.get_turn(SCOPE, "t1", 0).summary_md == "old summary"
    assert (turn_dir / "summary.md").read_text() == "old summary"
    assert temp_files(store.layout.root) == []
    assert_consistent(store, SCOPE)


def test_failed_fsync_of_an_artifact_publishes_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    clock = FixedClock()
    store = _base(tmp_path / "r", clock)
    path = store.layout.artifact(SCOPE, "t1", 0, "a.bin")
    fault = Fault("fsync", 1, errno.EIO, only=_is_file_fd)
    fault.install(monkeypatch)
    with pytest.raises(OSError):
        store.put_artifact(SCOPE, "t1", 0, "a.bin", io.BytesIO(b"new"), content_type="x/new")
    monkeypatch.undo()
    assert path.read_bytes() == b"old bytes"
    art = store.open_artifact(SCOPE, "t1", 0, "a.bin")
    with art.file:
        assert art.file.read() == b"old bytes"
    assert art.info.content_type == "x/old"
    assert temp_files(store.layout.root) == []


def test_a_full_disk_is_insufficient_storage(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = _base(tmp_path / "r", FixedClock())
    Fault("write", 1, errno.ENOSPC, persistent=True).install(monkeypatch)
    with pytest.raises(InsufficientStorage):
        store.put_turn(SCOPE, "t1", 0, meta={}, summary_md="x")
    with pytest.raises(InsufficientStorage):
        store.put_artifact(SCOPE, "t1", 0, "c", io.BytesIO(b"c"), content_type="x")
    monkeypatch.undo()
    assert temp_files(store.layout.root) == []
    assert store.get_turn(SCOPE, "t1", 0).summary_md == "old summary"


def test_a_writer_killed_after_its_commit_is_repaired_by_the_next_writer(
    tmp_path: Path, clock: FixedClock
) -> None:
    """The journal: records written, derived files not, the write left in flight."""
    store = _base(tmp_path / "r", clock)
    key = Key(SCOPE, "t1")
    # Simulate the dead writer: commit a new record by hand and leave the flag set.
    from app.storage.core.records import turn_to_json
    from app.storage.tree.records import read_turn, write_json

    turn_dir = store.layout.turn_dir(SCOPE, "t1", 0)
    rec = read_turn(turn_dir)
    assert rec is not None
    from dataclasses import replace

    committed = replace(rec, summary_md="committed but not derived", updated_us=rec.updated_us + 5)
    store.txns.mark(key)
    write_json(turn_dir / "meta.json", turn_to_json(committed))
    assert (turn_dir / "summary.md").read_text() == "old summary"
    clock.advance(seconds=1)
    store.put_turn(SCOPE, "t1", 3, meta={}, summary_md="next")
    assert not store.txns.is_pending(key)
    assert (turn_dir / "summary.md").read_text() == "committed but not derived"
    assert [r.turn for r in records_of(store, SCOPE, "t1")] == [0, 3]
    assert_consistent(store, SCOPE)


def test_a_new_tasks_first_write_killed_before_its_commit_leaves_no_task(
    tmp_path: Path, clock: FixedClock
) -> None:
    """Killed after task.json and its turn's directory, before meta.json: nothing of the
    task was acknowledged, so its repair (the next writer's, or the start's) takes the
    directory back, as a failed write does; fsck is clean (the whole-server kill test under
    group commit met it)."""
    from app.storage.tree.fsck import fsck
    from app.storage.tree.records import write_json

    store = _base(tmp_path / "r", clock)
    key = Key(SCOPE, "t3")
    task_dir = store.layout.task_dir(SCOPE, "t3")
    store.txns.mark(key)
    task_dir.mkdir()
    write_json(task_dir / "task.json", {"version": 1, "task_id": "t3", "owner": None})
    (task_dir / "0000-turn").mkdir()
    assert [str(k.id) for k in store.txns.recover()] == ["t3"]
    assert not task_dir.exists()
    assert fsck(store).clean
    with pytest.raises(NotFound):
        store.get_task(SCOPE, "t3")
    store.put_turn(SCOPE, "t3", 0, meta={}, summary_md="written again")
    assert store.get_turn(SCOPE, "t3", 0).summary_md == "written again"
    assert_consistent(store, SCOPE)


def _durability_log(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, str]]:
    """Record renames, directory fsyncs and listing writes in the order they happen."""
    log: list[tuple[str, str]] = []
    real_replace, real_fsync = os.replace, os.fsync

    def replace(src: Any, dst: Any, *args: Any, **kwargs: Any) -> None:
        real_replace(src, dst, *args, **kwargs)
        log.append(("rename", str(dst)))

    def fsync(fd: int) -> None:
        real_fsync(fd)
        if stat.S_ISDIR(os.fstat(fd).st_mode):
            log.append(("dir_fsync", os.readlink(f"/proc/self/fd/{fd}")))

    for method in ("put_turn", "set_task"):
        real = getattr(Listing, method)

        def logged(self: Listing, *args: Any, _real: Any = real, **kwargs: Any) -> Any:
            log.append(("listing", str(self.path)))
            return _real(self, *args, **kwargs)

        monkeypatch.setattr(Listing, method, logged)
    monkeypatch.setattr(os, "replace", replace)
    monkeypatch.setattr(os, "fsync", fsync)
    return log


def _assert_commit_durable_before_derived(log: list[tuple[str, str]], turn_dir: Path) -> None:
    meta = str(turn_dir / "meta.json")
    commit = log.index(("rename", meta))
    synced = log.index(("dir_fsync", str(turn_dir)), commit)
    derived = [
        i
        for i, (kind, path) in enumerate(log)
        if kind == "listing" or (kind == "rename" and path.endswith("/index.json"))
    ]
    assert derived, log
    # A power loss may keep any rename that was not fsynced and drop the others: the derived
    # files must never become durable ahead of the record they are derived from.
    assert synced < min(derived), f"derived files written before the commit was durable: {log}"


@pytest.mark.parametrize("case", ["new_task", "update", "artifact"])
def test_the_commit_is_durable_before_any_derived_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, case: str
) -> None:
    store = _base(tmp_path / "r", FixedClock())
    log = _durability_log(monkeypatch)
    if case == "new_task":
        store.put_turn(SCOPE, "t9", 0, meta={}, summary_md="x")
        turn_dir = store.layout.turn_dir(SCOPE, "t9", 0)
    elif case == "update":
        store.put_turn(SCOPE, "t1", 0, meta={}, summary_md="x")
        turn_dir = store.layout.turn_dir(SCOPE, "t1", 0)
    else:
        store.put_artifact(SCOPE, "t1", 0, "a.bin", io.BytesIO(b"new"), content_type="x")
        turn_dir = store.layout.turn_dir(SCOPE, "t1", 0)
        blob = log.index(("rename", str(turn_dir / "artifacts" / "a.bin")))
        blob_synced = log.index(("dir_fsync", str(turn_dir / "artifacts")), blob)
        # The record must not name bytes whose rename could still be lost.
        assert blob_synced < log.index(("rename", str(turn_dir / "meta.json"))), log
    monkeypatch.undo()
    _assert_commit_durable_before_derived(log, turn_dir)


def _killed_mid_replacement(store: TaskStore) -> Path:
    """The state a put_artifact killed between publishing its bytes and its commit leaves."""
    art = store.layout.artifact(SCOPE, "t1", 0, "a.bin")
    os.link(art, art.parent / ".~tmp-prev-a.bin")
    tmp = art.parent / ".~tmp-0123456789abcdef"
    tmp.write_bytes(b"uncommitted bytes")
    os.replace(tmp, art)
    store.txns.mark(Key(SCOPE, "t1"))
    return art


def test_the_next_writer_restores_the_committed_artifact_after_a_kill(tmp_path: Path) -> None:
    store = _base(tmp_path / "r", FixedClock())
    _killed_mid_replacement(store)
    store.put_turn(SCOPE, "t1", 5, meta={}, summary_md="next writer")
    art = store.open_artifact(SCOPE, "t1", 0, "a.bin")
    with art.file:
        assert art.file.read() == b"old bytes"
    assert temp_files(store.layout.root) == []
    assert_consistent(store, SCOPE)


@pytest.mark.parametrize("collector", ["fsck", "sweep"])
def test_collecting_stale_temp_files_keeps_a_dirty_tasks_committed_artifact(
    tmp_path: Path, collector: str
) -> None:
    from datetime import timedelta

    from app.storage.tree.fsck import fsck
    from app.storage.tree.retention import sweep

    clock = FixedClock()
    store = _base(tmp_path / "r", clock)
    art = _killed_mid_replacement(store)
    hour_ago = art.stat().st_mtime - 7200
    for path in art.parent.iterdir():
        os.utime(path, (hour_ago, hour_ago))
    if collector == "fsck":
        fsck(store, repair=True, grace=timedelta(minutes=1))
    else:
        sweep(store, now=clock(), grace=timedelta(minutes=1))
    store.put_turn(SCOPE, "t1", 5, meta={}, summary_md="next writer")
    rec = store.get_turn(SCOPE, "t1", 0)
    assert [a.name for a in rec.artifacts] == ["a.bin"], "the acknowledged artifact was dropped"
    opened = store.open_artifact(SCOPE, "t1", 0, "a.bin")
    with opened.file:
        assert opened.file.read() == b"old bytes"


def test_journal_slot_states(tmp_path: Path) -> None:
    journal = Journal(tmp_path / "tasks.inflight")
    assert journal.pending() == [] and not journal.path.exists()
    key = Key(SCOPE, "t" * 128)
    journal.set(key.stripe, key)
    assert journal.get(key.stripe) == key and journal.pending() == [(key.stripe, key)]
    journal.clear(key.stripe)
    assert journal.get(key.stripe) is None and journal.pending() == []
    # A torn or foreign slot names nothing a writer could have written: it is ignored.
    os.pwrite(os.open(journal.path, os.O_WRONLY), b"acme\tweb\t../x\n", 0)
    assert journal.get(0) is None


@pytest.mark.parametrize("case", ["update", "artifact", "delete"])
def test_the_dirty_flag_is_set_before_the_first_record_write(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, case: str
) -> None:
    """A writer killed after any change must leave its write in flight, so the next repairs.

    The journal is not fsynced: a killed process leaves its writes in the page cache, and
    after a power loss the startup recovery checks the whole tree (tests/ops/test_cli_ops.py).
    """
    store = _base(tmp_path / "r", FixedClock())
    log = _durability_log(monkeypatch)
    real_set = Journal.set

    def set_logged(journal: Journal, stripe: int, key: Key) -> None:
        real_set(journal, stripe, key)
        log.append(("flag", key.id))

    monkeypatch.setattr(Journal, "set", set_logged)
    if case == "update":
        store.put_turn(SCOPE, "t1", 0, meta={}, summary_md="x")
    elif case == "artifact":
        store.put_artifact(SCOPE, "t1", 0, "a.bin", io.BytesIO(b"new"), content_type="x")
    else:
        real_rename = os.rename

        def rename(src: Any, dst: Any, *args: Any, **kwargs: Any) -> None:
            real_rename(src, dst, *args, **kwargs)
            log.append(("rename", str(dst)))

        monkeypatch.setattr(os, "rename", rename)
        store.delete_task(SCOPE, "t1")
    monkeypatch.undo()
    first_change = min(i for i, (kind, _) in enumerate(log) if kind in ("rename", "listing"))
    assert ("flag", "t1") in log[:first_change], log
    assert not store.txns.is_pending(Key(SCOPE, "t1"))  # cleared once the derived files are


@pytest.mark.parametrize("torn", ["meta.json", "task.json"])
def test_a_record_a_power_cut_left_empty_does_not_stop_the_recovery(
    tmp_path: Path, clock: FixedClock, torn: str
) -> None:
    """Under group commit a new record renamed into a free name and never flushed can come
    back empty after a power cut (ext4's delayed allocation): a write that never got its
    answer. Recovering the journal builds the task from its other records and clears the
    slot; fsck --repair then moves the empty record to lost+found."""
    from datetime import timedelta

    from app.storage.tree.fsck import fsck

    store = _base(tmp_path / "r", clock)
    key = Key(SCOPE, "t1")
    task_dir = store.layout.task_dir(SCOPE, "t1")
    if torn == "meta.json":
        turn_dir = task_dir / "0001-turn"
        turn_dir.mkdir()
        (turn_dir / "meta.json").write_bytes(b"")
    else:
        (task_dir / "task.json").write_bytes(b"")
    store.txns.mark(key)

    assert store.txns.recover() == [key]
    assert not store.txns.is_pending(key)
    assert [t.turn for t in store.get_task(SCOPE, "t1").turns] == [0]
    assert store.get_turn(SCOPE, "t1", 0).summary_md == "old summary"

    report = fsck(store, repair=True, grace=timedelta(minutes=1))
    assert report.unrepairable == []
    assert any(torn in line for line in report.repaired), report.repaired
    assert fsck(store, repair=False, grace=timedelta(minutes=1)).problems == []
    assert_consistent(store, SCOPE)
