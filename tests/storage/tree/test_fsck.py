"""fsck finds each planted fault; repair fixes each but the symlink, which it reports."""

from __future__ import annotations

import io
import json
import os
import time
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path

import pytest

from app.storage.core.digest import Section
from app.storage.core.errors import NotFound
from app.storage.core.names import TMP_PREFIX, Scope
from app.storage.tree.fs import walk as tree_mod
from app.storage.tree.fs.txn import Key
from app.storage.tree.fsck import LOST_FOUND, fsck
from app.storage.tree.sqlite.listing import Listing
from app.storage.tree.sqlite.listing_sql import TurnRow
from app.storage.tree.tasks import TaskStore
from tests.conftest import FixedClock
from tests.storage._helpers import snapshot


@pytest.fixture
def populated(store: TaskStore, clock: FixedClock, scope: Scope) -> TaskStore:
    """Three tasks, a few turns, one artifact, a rendered digest: a clean tree."""
    for i, task in enumerate(["alpha", "beta", "gamma"]):
        for turn in range(i + 1):
            store.put_turn(
                scope, task, turn, meta={"turn": turn}, summary_md=f"{task} turn {turn}\n"
            )
            clock.advance(seconds=1)
    store.put_artifact(
        scope, "beta", 1, "notes.txt", io.BytesIO(b"hello artifact"), content_type="text/plain"
    )
    fh, _ = store.open_digest(scope)
    fh.close()
    return store


def old(path: Path) -> None:
    stamp = time.time() - 3600
    os.utime(path, (stamp, stamp), follow_symlinks=False)


def test_a_tree_the_engine_wrote_is_clean(populated: TaskStore) -> None:
    report = fsck(populated)
    assert report.problems == [], report
    assert report.clean


def test_empty_or_new_root_is_clean(store: TaskStore) -> None:
    assert fsck(store).clean


def _torn_meta(store: TaskStore, scope: Scope) -> None:
    (store.layout.turn_dir(scope, "gamma", 1) / "meta.json").write_bytes(b'{"task_id": "gam')


def _torn_index(store: TaskStore, scope: Scope) -> None:
    (store.layout.task_index(scope, "beta")).write_bytes(b'{"version": 1, "tur')


def _stale_index(store: TaskStore, scope: Scope) -> None:
    path = store.layout.task_index(scope, "gamma")
    index = json.loads(path.read_text())
    index["turns"] = index["turns"][:1]
    path.write_text(json.dumps(index))


def _missing_digest_section(store: TaskStore, scope: Scope) -> None:
    path = store.layout.digest(scope)
    text = path.read_text()
    start = text.index("\n## beta")
    end = text.index("\n## ", start + 1)
    path.write_text(text[:start] + text[end:])


def _stray_temp(store: TaskStore, scope: Scope) -> None:
    stray = store.layout.task_dir(scope, "alpha") / f"{TMP_PREFIX}0123456789abcdef"
    stray.write_bytes(b"half a write")
    old(stray)


def _stale_listing_row(store: TaskStore, scope: Scope) -> None:
    listing = Listing(store.layout.listing(scope), timeout=1)
    bogus = Section(5, 2**60, b"\n## alpha\n\nLatest turn: 5\n\n")
    listing.put_turn("alpha", TurnRow(5, 1, 2**60), bogus)  # a turn that does not exist
    nobody = Section(0, 2**60, b"\n## nobody\n\nLatest turn: 0\n\n")
    listing.put_turn("nobody", TurnRow(0, 1, 2**60), nobody)  # a task that does not exist


def _missing_summary(store: TaskStore, scope: Scope) -> None:
    (store.layout.turn_dir(scope, "beta", 0) / "summary.md").unlink()


def _artifact_mismatch(store: TaskStore, scope: Scope) -> None:
    store.layout.artifact(scope, "beta", 1, "notes.txt").write_bytes(b"tampered")


def _orphan_artifact(store: TaskStore, scope: Scope) -> None:
    orphan = store.layout.artifact(scope, "alpha", 0, "orphan.bin")
    orphan.parent.mkdir(exist_ok=True)
    orphan.write_bytes(b"no entry")


def _write_in_flight(store: TaskStore, scope: Scope) -> None:
    # A writer died after its commit point: the record is new, the derived files are not.
    turn_dir = store.layout.turn_dir(scope, "alpha", 0)
    meta = json.loads((turn_dir / "meta.json").read_text())
    meta["summary_md"] = "rewritten by a writer that died\n"
    (turn_dir / "meta.json").write_text(json.dumps(meta))
    store.txns.mark(Key(scope, "alpha"))


def _unindexed_dir(store: TaskStore, scope: Scope) -> None:
    stray = store.layout.task_dir(scope, "beta") / "notes"
    stray.mkdir()
    (stray / "x").write_text("?")


def _wrong_counter(store: TaskStore, scope: Scope) -> None:
    import sqlite3

    with sqlite3.connect(store.layout.listing(scope)) as conn:
        conn.execute("UPDATE counters SET value = 7 WHERE name = 'tasks'")
    conn.close()


def _stale_turn_count(store: TaskStore, scope: Scope) -> None:
    import sqlite3

    with sqlite3.connect(store.layout.listing(scope)) as conn:
        conn.execute("UPDATE tasks SET turn_count = 9, latest_turn = 8 WHERE task_id = 'gamma'")
    conn.close()


FAULTS: dict[str, tuple[Callable[[TaskStore, Scope], None], str]] = {
    "torn meta.json": (_torn_meta, "gamma/0001-turn/meta.json: cannot be rebuilt"),
    "torn index.json": (_torn_index, "beta/index.json: torn"),
    "stale index.json": (_stale_index, "gamma/index.json: stale"),
    "missing project.md section": (_missing_digest_section, "_project.md: differs"),
    "stray temp file": (_stray_temp, "stale temp file"),
    "stale listing row": (_stale_listing_row, "rows of task alpha differ"),
    "listing row of no task": (_stale_listing_row, "rows of task nobody differ"),
    "missing summary.md": (_missing_summary, "beta/0000-turn/summary.md: differs"),
    "artifact bytes differ": (_artifact_mismatch, "notes.txt: size/sha256 differ"),
    "artifact without entry": (_orphan_artifact, "orphan.bin: unindexed"),
    "write in flight": (_write_in_flight, "alpha: write in flight"),
    "unindexed directory": (_unindexed_dir, "beta/notes: unindexed"),
    "wrong task counter": (_wrong_counter, "task counter is 7"),
    "stale turn count": (_stale_turn_count, "latest turn of task gamma differ"),
}


@pytest.mark.parametrize("batch", [None, 1], ids=["names in one pass", "a pass per name"])
@pytest.mark.parametrize("fault", list(FAULTS))
def test_each_planted_fault_is_found_and_repaired(
    populated: TaskStore,
    scope: Scope,
    fault: str,
    batch: int | None,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    if batch is not None:  # the project's task names walked in sorted batches of this size
        monkeypatch.setattr(tree_mod, "NAME_BATCH", batch)
    plant, expected = FAULTS[fault]
    plant(populated, scope)
    report = fsck(populated)
    assert not report.clean
    assert any(expected in p for p in report.problems), report.problems

    repaired = fsck(populated, repair=True)
    assert repaired.unrepairable == [], repaired
    assert any(expected in p for p in repaired.repaired)
    after = fsck(populated)
    assert after.problems == [], after


def test_torn_meta_is_quarantined_not_deleted(populated: TaskStore, scope: Scope) -> None:
    _torn_meta(populated, scope)
    fsck(populated, repair=True)
    lost = list((populated.layout.root / LOST_FOUND).rglob("0001-turn/meta.json"))
    assert [p.read_bytes() for p in lost] == [b'{"task_id": "gam']
    assert [t.turn for t in populated.get_task(scope, "gamma").turns] == [0, 2]
    fh, _ = populated.open_digest(scope)
    with fh:
        assert b"gamma turn 2" in fh.read()


def test_repaired_listing_and_digest_serve_the_records(populated: TaskStore, scope: Scope) -> None:
    _stale_listing_row(populated, scope)
    _missing_digest_section(populated, scope)
    fsck(populated, repair=True)
    page = populated.list_tasks(scope, limit=10)
    assert [t.task_id for t in page.tasks] == [
        "beta",
        "gamma",
        "alpha",
    ]  # beta got the artifact last
    assert page.total == 3
    fh, _ = populated.open_digest(scope)
    with fh:
        assert b"## beta" in fh.read()


def _remove_listing(store: TaskStore, scope: Scope) -> Path:
    listing = store.layout.listing(scope)
    for path in listing.parent.glob(listing.name + "*"):  # with its WAL and shared memory
        path.unlink()
    return listing


def test_a_listing_removed_by_hand_is_made_again_from_the_records(
    populated: TaskStore, scope: Scope
) -> None:
    # The store's pooled connections still hold the removed file: none of them may serve.
    assert populated.list_tasks(scope, limit=10).total == 3
    listing = _remove_listing(populated, scope)
    page = populated.list_tasks(scope, limit=10)
    assert sorted(t.task_id for t in page.tasks) == ["alpha", "beta", "gamma"]
    assert listing.exists()
    populated.put_turn(scope, "delta", 0, meta={}, summary_md="delta turn 0\n")
    again = TaskStore(populated.layout.root, clock=populated.clock, lock_timeout=5.0)
    assert again.list_tasks(scope, limit=10).total == 4
    assert fsck(again).problems == []


def test_a_listing_is_not_made_through_a_project_swapped_for_a_link(
    populated: TaskStore, scope: Scope, tmp_path: Path
) -> None:
    listing = populated.listing(scope)  # checked inside the root here, swapped below
    project = listing.path.parent
    _remove_listing(populated, scope)
    outside = tmp_path / "outside"
    project.rename(outside)
    project.symlink_to(outside, target_is_directory=True)
    assert not listing.exists()
    assert not (outside / listing.path.name).exists()


def test_fsck_repair_makes_a_removed_listing_again(populated: TaskStore, scope: Scope) -> None:
    listing = _remove_listing(populated, scope)
    fresh = TaskStore(populated.layout.root, clock=populated.clock, lock_timeout=5.0)
    report = fsck(fresh, repair=True)
    assert report.repaired == [f"{scope.tenant}/{scope.project}/_listing.sqlite3: missing"]
    assert listing.exists()
    assert fresh.list_tasks(scope, limit=10).total == 3
    assert fsck(fresh).problems == []


def test_repairing_a_write_in_flight_makes_the_record_visible(
    populated: TaskStore, scope: Scope
) -> None:
    _write_in_flight(populated, scope)
    fsck(populated, repair=True)
    assert not populated.txns.is_pending(Key(scope, "alpha"))
    summary = populated.layout.turn_dir(scope, "alpha", 0) / "summary.md"
    assert summary.read_text() == "rewritten by a writer that died\n"


def test_artifact_mismatch_drops_the_entry_and_keeps_the_bytes(
    populated: TaskStore, scope: Scope
) -> None:
    _artifact_mismatch(populated, scope)
    fsck(populated, repair=True)
    with pytest.raises(NotFound):
        populated.open_artifact(scope, "beta", 1, "notes.txt")
    assert populated.get_turn(scope, "beta", 1).artifacts == ()
    lost = list((populated.layout.root / LOST_FOUND).rglob("notes.txt"))
    assert [p.read_bytes() for p in lost] == [b"tampered"]


@pytest.mark.parametrize("file_left", [True, False])
def test_a_replacement_cut_before_its_commit_gets_the_acknowledged_bytes_back(
    populated: TaskStore, scope: Scope, file_left: bool
) -> None:
    """What a power cut leaves of put_artifact between publishing the new bytes and
    meta.json: the new bytes in place, the acknowledged ones kept beside them, and no journal
    slot saying a write was in flight (it is not fsynced)."""
    artifacts = populated.layout.turn_dir(scope, "beta", 1) / "artifacts"
    kept = artifacts / f"{TMP_PREFIX}prev-notes.txt"
    os.link(artifacts / "notes.txt", kept)
    (artifacts / "notes.txt").unlink()
    if file_left:
        (artifacts / "notes.txt").write_bytes(b"never acknowledged")
    report = fsck(populated)
    assert [p for p in report.problems if "acknowledged copy" in p], report
    fsck(populated, repair=True)
    stream = populated.open_artifact(scope, "beta", 1, "notes.txt")
    with stream.file:
        assert stream.file.read() == b"hello artifact"
    assert not kept.exists()
    assert fsck(populated).clean


def test_symlink_is_reported_never_followed_never_repaired(
    populated: TaskStore, scope: Scope, tmp_path: Path
) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret").write_text("do not touch")
    link = populated.layout.task_dir(scope, "alpha") / "escape"
    link.symlink_to(outside)
    dir_link = populated.layout.project_dir(scope) / "linked-task"
    dir_link.symlink_to(outside, target_is_directory=True)
    old(link)
    report = fsck(populated, repair=True)
    assert len([p for p in report.problems if "symlink" in p]) == 2
    assert len(report.unrepairable) == 2
    assert link.is_symlink() and dir_link.is_symlink()
    assert sorted(p.name for p in outside.iterdir()) == ["secret"]
    assert (outside / "secret").read_text() == "do not touch"
    assert not fsck(populated).clean


def test_a_project_swapped_for_a_link_between_two_walks_is_reported_and_left_alone(
    populated: TaskStore, scope: Scope, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """fsck walks a project's task names a batch at a time; someone swaps the project
    directory for a link while it checks the first task. The next walk refuses the link:
    reported, nothing outside the root touched, and the check goes on."""
    from app.storage.tree import fsck as fsck_mod

    monkeypatch.setattr(tree_mod, "NAME_BATCH", 1)
    project = populated.layout.project_dir(scope)
    outside = tmp_path / "outside"
    # Make the tree stale first, so that a repair would have something to write.
    populated.layout.task_index(scope, "gamma").write_text("{}")
    checked = fsck_mod._Fsck.task
    seen: list[str] = []
    swapped: list[object] = []

    def task_then_swap(self: object, scope_: Scope, task_id: str) -> object:
        found = checked(self, scope_, task_id)  # type: ignore[arg-type]
        if not seen:
            project.rename(outside)
            project.symlink_to(outside, target_is_directory=True)
            swapped.append(snapshot(outside))
        seen.append(task_id)
        return found

    monkeypatch.setattr(fsck_mod._Fsck, "task", task_then_swap)
    report = fsck(populated, repair=True)
    assert seen == ["alpha"]
    assert any("acme/web: symlink" in p for p in report.problems), report.problems
    assert project.is_symlink()
    assert snapshot(outside) == swapped[0]  # gamma's index.json still stale, out there
    assert (outside / "gamma" / "index.json").read_text() == "{}"


def test_young_temp_file_is_noted_not_flagged(populated: TaskStore, scope: Scope) -> None:
    young = populated.layout.task_dir(scope, "alpha") / f"{TMP_PREFIX}inflight"
    young.write_bytes(b"x")
    report = fsck(populated, repair=True, grace=timedelta(minutes=10))
    assert report.problems == []
    assert any("in flight" in n for n in report.notes)
    assert young.exists()


def test_unfinished_trash_is_emptied(populated: TaskStore, scope: Scope) -> None:
    trash = populated.layout.trash_dir()
    trash.mkdir(exist_ok=True)
    leftover = trash / "01ARZ3NDEKTSV4RRFFQ69G5FAV-alpha"  # a ULID from 2016
    (leftover / "0000-turn").mkdir(parents=True)
    report = fsck(populated, repair=True)
    assert any("unfinished deletion" in p for p in report.repaired)
    assert not leftover.exists()


def test_task_record_torn_is_rewritten_from_the_turns(populated: TaskStore, scope: Scope) -> None:
    populated.layout.task_record(scope, "beta").write_bytes(b"{")
    report = fsck(populated)
    assert any("beta/task.json: torn" in p for p in report.problems)
    fsck(populated, repair=True)
    assert fsck(populated).clean
    assert populated.get_task(scope, "beta").owner is None


def test_a_linked_lock_tree_is_reported_and_nothing_is_created_through_it(
    populated: TaskStore, scope: Scope, tmp_path: Path
) -> None:
    outside = tmp_path / "outside-locks"
    outside.mkdir()
    locks = populated.layout.locks_dir()
    locks.rename(tmp_path / "old-locks")
    locks.symlink_to(outside, target_is_directory=True)
    report = fsck(populated, repair=True)
    assert any(p.startswith(".locks: symlink") for p in report.unrepairable)
    assert any("not checked" in p for p in report.problems)
    assert list(outside.iterdir()) == []
    assert locks.is_symlink()
