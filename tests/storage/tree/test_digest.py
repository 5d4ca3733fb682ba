"""project.md on the tree: the base file a person reads, what changed spliced in on a read,
compaction and rebuilds (behaviour: tests/conformance/test_digest.py)."""

from __future__ import annotations

import contextlib
import io
import random
import shutil
import time
from pathlib import Path

import pytest

from app.storage.core.errors import NotFound
from app.storage.core.names import Scope
from app.storage.tree.fsck import fsck
from app.storage.tree.retention import sweep
from app.storage.tree.sqlite import digestdb
from app.storage.tree.tasks import TaskStore
from tests.conftest import FixedClock, nested_summary
from tests.storage._helpers import assert_consistent, expected_digest, read_digest, upkeep_done


def test_the_digest_file_is_what_is_served(
    store: TaskStore, scope: Scope, clock: FixedClock
) -> None:
    store.put_turn(scope, "alpha", 0, meta={}, summary_md="alpha zero")
    clock.advance(minutes=1)
    store.put_turn(scope, "beta", 0, meta={}, summary_md="beta zero\n\n- item\n")
    served = read_digest(store, scope)
    assert store.layout.digest(scope).read_text() == served  # the file a person reads
    assert expected_digest(store, scope) == served  # computed from the records alone
    assert_consistent(store, scope)


def test_digest_is_not_rewritten_by_a_turn_write(
    store: TaskStore, scope: Scope, clock: FixedClock
) -> None:
    # A turn write costs O(1) in the project size: it must not render the whole digest.
    store.put_turn(scope, "a", 0, meta={}, summary_md="a")
    read_digest(store, scope)
    path = store.layout.digest(scope)
    inode = path.stat().st_ino
    for i in range(5):
        clock.advance(seconds=1)
        store.put_turn(scope, f"t{i}", 0, meta={}, summary_md=str(i))
    assert path.stat().st_ino == inode
    assert "## t4" in read_digest(store, scope)
    assert path.stat().st_ino != inode


# -- the base and what changed since --------------------------------------------------------
@pytest.fixture
def spliced(monkeypatch: pytest.MonkeyPatch) -> None:
    """Serve every project as a big one: reads splice changes into the base, and a
    compaction runs only past a few changes (in the background)."""
    monkeypatch.setattr(digestdb, "INLINE_BYTES", 0)
    monkeypatch.setattr(digestdb, "COMPACT_AFTER", 4)


def _wait_compacted(store: TaskStore, scope: Scope) -> None:
    upkeep_done(store, timeout=10)


@pytest.mark.usefixtures("spliced")
@pytest.mark.parametrize("seed", range(6))
def test_interleaved_writes_and_reads_equal_a_full_render(
    store: TaskStore, scope: Scope, clock: FixedClock, seed: int
) -> None:
    rng = random.Random(seed)
    ids = [f"t{i}" for i in range(12)]
    summaries = ["plain", "# own title\n\ntext", "```\n## in code\n```\n", "", "ünïcode ✓\n"]
    for step in range(160):
        op = rng.random()
        task = rng.choice(ids)
        clock.advance(seconds=rng.choice([0, 0, 1, 60, 3600]))  # 0: ties, ordered by id
        if op < 0.5:
            store.put_turn(scope, task, rng.randrange(4), meta={}, summary_md=rng.choice(summaries))
        elif op < 0.6:
            with contextlib.suppress(NotFound):
                store.put_artifact(
                    scope, task, 0, "a.txt", io.BytesIO(b"x"), content_type="text/plain"
                )
        elif op < 0.68:
            with contextlib.suppress(NotFound):
                store.delete_task(scope, task)
        elif op < 0.72:
            clock.advance(days=rng.choice([10, 29]))  # turns expire, the sweeper not yet run
        elif op < 0.75:
            sweep(store, now=clock())
        elif op < 0.8:
            store.compact_digest(scope)
        if rng.random() < 0.5:
            assert read_digest(store, scope) == expected_digest(store, scope), step
            _wait_compacted(store, scope)
    assert read_digest(store, scope) == expected_digest(store, scope)
    assert fsck(store).clean


@pytest.mark.usefixtures("spliced")
def test_a_read_splices_the_changes_into_the_base_without_rewriting_it(
    store: TaskStore, scope: Scope, clock: FixedClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Two changes in 20 tasks are one in SPREAD of them: the read would queue a compaction.
    monkeypatch.setattr(digestdb, "SPREAD", 1)
    for i in range(20):
        clock.advance(seconds=1)
        store.put_turn(scope, f"t{i:02d}", 0, meta={}, summary_md=f"first {i}")
    store.compact_digest(scope)
    path = store.layout.digest(scope)
    base = path.read_bytes()
    clock.advance(seconds=1)
    store.put_turn(scope, "t05", 1, meta={}, summary_md="moved to the top")
    store.put_turn(scope, "t10", 1, meta={}, summary_md="rewritten")
    served = read_digest(store, scope)
    assert served == expected_digest(store, scope)
    assert served.index("## t10") < served.index("## t05") < served.index("## t19")
    assert path.read_bytes() == base  # two changes: no compaction, the base untouched
    store.compact_digest(scope)
    assert path.read_text() == served  # the file a person reads catches up
    # A delete is more than a change: its purge rewrites a base that holds the removed
    # text, right after the delete's answer.
    store.delete_task(scope, "t10")
    while store.later.busy():
        time.sleep(0.01)
    assert "## t10" not in path.read_text() and "rewritten" not in path.read_text()


@pytest.mark.usefixtures("spliced")
def test_a_reader_keeps_its_version_while_the_base_is_rewritten(
    store: TaskStore, scope: Scope, clock: FixedClock
) -> None:
    for i in range(10):
        clock.advance(seconds=1)
        store.put_turn(scope, f"t{i}", 0, meta={}, summary_md=f"text {i}")
    store.compact_digest(scope)
    clock.advance(seconds=1)
    store.put_turn(scope, "t3", 0, meta={}, summary_md="changed")
    before = expected_digest(store, scope)
    fh, size = store.open_digest(scope)
    with fh:
        first = fh.read(10)
        for i in range(10, 20):
            clock.advance(seconds=1)
            store.put_turn(scope, f"t{i}", 0, meta={}, summary_md=f"text {i}")
        store.compact_digest(scope)  # renames a new base over the one this reader streams
        rest = fh.read()
    assert (first + rest).decode() == before
    assert len(first + rest) == size
    assert read_digest(store, scope) == expected_digest(store, scope)


@pytest.mark.parametrize("damage", ["edited", "truncated", "removed", "emptied"])
def test_a_damaged_base_is_rebuilt_from_the_records(
    store: TaskStore, scope: Scope, clock: FixedClock, damage: str
) -> None:
    for i in range(6):
        clock.advance(seconds=1)
        store.put_turn(scope, f"t{i}", 0, meta={}, summary_md=f"text {i}\n")
    read_digest(store, scope)
    path = store.layout.digest(scope)
    if damage == "edited":
        path.write_text(path.read_text().replace("text 3", "TEXT three, by hand"))
    elif damage == "truncated":
        path.write_bytes(path.read_bytes()[:-20])
    elif damage == "removed":
        path.unlink()
    else:
        path.write_bytes(b"")
    report = fsck(store)
    assert any("_project.md" in p for p in report.problems), report.problems
    assert read_digest(store, scope) == expected_digest(store, scope)  # rebuilt on the read
    assert path.read_text() == expected_digest(store, scope)
    assert fsck(store).clean


def test_the_base_survives_a_copy_of_the_root(
    store: TaskStore, scope: Scope, clock: FixedClock, tmp_path: Path
) -> None:
    for i in range(5):
        clock.advance(seconds=1)
        store.put_turn(scope, f"t{i}", 0, meta={}, summary_md=f"text {i}")
    served = read_digest(store, scope)
    copy = tmp_path / "copy"
    shutil.copytree(store.layout.root, copy)  # new inodes, new times
    other = TaskStore(copy, clock=clock)
    assert fsck(other).clean
    path = other.layout.digest(scope)
    mtime = path.stat().st_mtime_ns
    assert read_digest(other, scope) == served
    assert path.stat().st_mtime_ns == mtime  # served as it is, not rebuilt


def test_a_summarys_own_headings_sit_below_its_section(store: TaskStore, scope: Scope) -> None:
    summary = (
        "# Title\n## Sub\n###### deepest\n#no-space is text\n    # indented code\n"
        "```md\n# in a fence\n```\n~~~~\n## tilde fence\n~~~~\n#\n"
    )
    store.put_turn(scope, "a", 0, meta={}, summary_md=summary)
    body = read_digest(store, scope).split("\n\n", 3)[3]
    assert body == (
        "### Title\n#### Sub\n###### deepest\n#no-space is text\n    # indented code\n"
        "```md\n# in a fence\n```\n~~~~\n## tilde fence\n~~~~\n###\n"
    )
    assert nested_summary(summary) == body  # the tests' own reading of the rule agrees


@pytest.mark.usefixtures("spliced")
def test_reads_that_keep_copying_the_same_changes_compact_the_base(
    store: TaskStore, scope: Scope, clock: FixedClock
) -> None:
    for i in range(digestdb.SPREAD * 2):
        clock.advance(seconds=1)
        store.put_turn(scope, f"t{i:03d}", 0, meta={}, summary_md=f"text {i}")
    store.compact_digest(scope)
    path = store.layout.digest(scope)
    clock.advance(seconds=1)
    store.put_turn(scope, "t007", 1, meta={}, summary_md="one change")  # too few to compact
    reads = 0
    while "one change" not in path.read_text():
        assert reads < digestdb.COPIES + 2, "spliced reads never asked for a compaction"
        assert read_digest(store, scope) == expected_digest(store, scope)
        reads += 1
        _wait_compacted(store, scope)
    assert reads >= digestdb.COPIES  # not before the copies cost a compaction
    fh, _ = store.open_digest(scope)
    with fh:
        assert fh.fileno() >= 0  # the base itself again: served by sendfile
