"""storage_root.example/: a valid tree the engine reads back in full and fsck finds clean."""

from __future__ import annotations

import importlib.util
import io
import os
import shutil
from pathlib import Path
from types import ModuleType

import pytest

from app.storage.core.names import Scope
from app.storage.tree.sqlite.ledger import Ledger
from app.storage.tree.sqlite.listing import Listing
from app.storage.tree.tasks import TaskStore
from tests.storage._helpers import assert_consistent, expected_digest, read_digest, snapshot

REPO = Path(__file__).resolve().parents[3]
EXAMPLE = REPO / "storage_root.example"
SCOPE = Scope("acme", "webshop")


def _generator() -> ModuleType:
    spec = importlib.util.spec_from_file_location(
        "make_example_tree", REPO / "tools" / "make_example_tree.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _clone(dest: Path) -> Path:
    """Copy the example as a git checkout has it: git keeps no empty directories."""
    shutil.copytree(EXAMPLE, dest, symlinks=True)
    for dirpath, _, _ in sorted(os.walk(dest), key=lambda w: -len(w[0])):
        if not os.listdir(dirpath) and dirpath != str(dest):
            os.rmdir(dirpath)
    return dest


@pytest.fixture
def example(tmp_path: Path) -> TaskStore:
    # The real clock: the example is dated 2099 so that nothing in it has expired.
    return TaskStore(_clone(tmp_path / "root"), lock_timeout=5.0)


def test_the_example_reads_back_in_full(example: TaskStore) -> None:
    page = example.list_tasks(SCOPE)
    assert [t.task_id for t in page.tasks] == ["add-dark-mode", "upgrade-deps", "fix-login-bug"]
    assert page.total == 3 and page.next_cursor is None
    turns = 0
    for summary in page.tasks:
        index = example.get_task(SCOPE, summary.task_id)
        assert index.owner and index.created_at.startswith("2099-")
        assert [t.turn for t in index.turns] == list(range(summary.turn_count))
        for entry in index.turns:
            rec = example.get_turn(SCOPE, summary.task_id, entry.turn)
            turn_dir = example.layout.turn_dir(SCOPE, summary.task_id, entry.turn)
            assert (turn_dir / "summary.md").read_text() == rec.summary_md
            assert rec.meta == entry.meta
            turns += 1
    assert turns == 5
    art = example.open_artifact(SCOPE, "fix-login-bug", 1, "test-output.txt")
    with art.file:
        assert art.file.read() == b"214 passed in 3.02s\n"
    assert art.info.content_type == "text/plain; charset=utf-8"
    committed = (EXAMPLE / "acme" / "webshop" / "_project.md").read_text()
    assert read_digest(example, SCOPE) == committed == expected_digest(example, SCOPE)
    assert_consistent(example, SCOPE)


def test_the_example_is_clean_for_fsck(example: TaskStore) -> None:
    fsck_mod = pytest.importorskip("app.storage.tree.fsck")
    report = fsck_mod.fsck(example)
    assert report.clean, report.problems


def test_the_example_accepts_new_writes(example: TaskStore) -> None:
    example.put_turn(SCOPE, "upgrade-deps", 1, meta={}, summary_md="Pinned filelock>=3.29.5.")
    # A turn restored from git has no (empty) artifacts/ directory; uploads still work.
    example.put_artifact(
        SCOPE, "upgrade-deps", 0, "lock.txt", io.BytesIO(b"filelock==4.3.1\n"), content_type="t/p"
    )
    listed = {t.task_id: t for t in example.list_tasks(SCOPE).tasks}
    assert listed["upgrade-deps"].turn_count == 2
    assert example.get_task(SCOPE, "upgrade-deps").turns[0].artifacts == ("lock.txt",)
    assert "Pinned filelock" in read_digest(example, SCOPE)
    assert_consistent(example, SCOPE)


def test_the_example_is_what_the_generator_writes_today(tmp_path: Path) -> None:
    """If the engine's format changes, run tools/make_example_tree.py and commit the result."""
    fresh = tmp_path / "fresh"
    _generator().build(fresh)
    # Files only: a checkout has no empty directories, and the engine does not need them.
    ours, theirs = (
        {k: v for k, v in snapshot(tree).items() if v is not None} for tree in (EXAMPLE, fresh)
    )
    listing = "acme/webshop/_listing.sqlite3"
    ledger = "acme/webshop/_ledger.sqlite3"
    for tree in (ours, theirs):
        tree.pop(listing)  # compared by content below, not byte for byte
        tree.pop(ledger)
    assert ours == theirs
    # Opened from a copy: opening a listing may write to it, and the example stays as committed.
    copy = _clone(tmp_path / "copy")
    a = Listing(copy / listing, timeout=5.0)
    b = Listing(fresh / listing, timeout=5.0)
    c = Ledger(copy / ledger, timeout=5.0)
    d = Ledger(fresh / ledger, timeout=5.0)
    try:
        assert a.all_tasks() == b.all_tasks()
        assert [c.task_entries(t) for t in c.task_ids()] == [
            d.task_entries(t) for t in d.task_ids()
        ]
    finally:
        Listing.forget(a.path)
        Listing.forget(b.path)
        Ledger.forget(c.path)
        Ledger.forget(d.path)
    # Nothing engine-private or per-root made it into the committed example.
    assert not any(name in ours for name in (".locks", ".trash", ".cursor-key"))
    assert not [k for k in ours if os.path.basename(k).startswith(".~tmp-")]
