"""Symlinks planted inside the root are never followed, by reads or by writes.

An outside tree holds a complete, valid copy of the same project with content marked OUTSIDE;
each case replaces one entry of the real tree with a link into it (or to / or /etc/hosts).
Every operation must then fail with UnsafePath, Corrupt or NotFound, or succeed without
showing OUTSIDE content, and nothing outside the root may change.
"""

from __future__ import annotations

import contextlib
import io
import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from app.storage.core.errors import Corrupt, NotFound, UnsafePath
from app.storage.core.names import Scope
from app.storage.tree.fs.txn import Key
from app.storage.tree.sqlite.listing import Listing
from app.storage.tree.tasks import TaskStore
from tests.conftest import FixedClock
from tests.storage._helpers import snapshot

SCOPE = Scope("acme", "web")
ALLOWED = (UnsafePath, Corrupt, NotFound)


def _fill(store: TaskStore, word: str) -> None:
    for task_id in ("t1", "evil"):
        store.put_turn(SCOPE, task_id, 0, meta={"w": word}, summary_md=f"{word} {task_id}")
        store.put_artifact(
            SCOPE, task_id, 0, "a.bin", io.BytesIO(f"{word} bytes".encode()), content_type="x/y"
        )
    if word == "OUTSIDE":
        # Only the outside tree has this task: listing it would mean reading outside.
        store.put_turn(SCOPE, "OUTSIDE-only", 0, meta={}, summary_md="OUTSIDE only")
    fh, _ = store.open_digest(SCOPE)
    fh.close()


@pytest.fixture
def trees(tmp_path: Path) -> tuple[TaskStore, Path]:
    clock = FixedClock()
    outside = TaskStore(tmp_path / "outside", clock=clock, lock_timeout=5.0)
    _fill(outside, "OUTSIDE")
    Listing.forget(outside.layout.listing(SCOPE))  # quiesce its SQLite files
    store = TaskStore(tmp_path / "root", clock=clock, lock_timeout=2.0)
    _fill(store, "inside")
    return store, tmp_path / "outside"


def _swap(link: Path, target: Path | str) -> None:
    if link.is_dir() and not link.is_symlink():
        shutil.rmtree(link)
    elif link.exists() or link.is_symlink():
        link.unlink()
    os.symlink(target, link)


def _rel(store: TaskStore, outside: Path, *parts: str) -> tuple[Path, Path]:
    return store.layout.root.joinpath(*parts), outside.joinpath(*parts)


PLANTS: dict[str, tuple[str, ...]] = {
    "task_dir": ("acme", "web", "evil"),
    "turn_dir": ("acme", "web", "evil", "0000-turn"),
    "meta_json": ("acme", "web", "evil", "0000-turn", "meta.json"),
    "summary_md": ("acme", "web", "evil", "0000-turn", "summary.md"),
    "index_json": ("acme", "web", "evil", "index.json"),
    "task_json": ("acme", "web", "evil", "task.json"),
    "artifacts_dir": ("acme", "web", "evil", "0000-turn", "artifacts"),
    "artifact": ("acme", "web", "evil", "0000-turn", "artifacts", "a.bin"),
    "digest": ("acme", "web", "_project.md"),
    "project_dir": ("acme", "web"),
    "tenant_dir": ("acme",),
}


def _read_all(fh: Any) -> bytes:
    with fh:
        data: bytes = fh.read()
    return data


def _operations(store: TaskStore) -> list[tuple[str, Callable[[], Any]]]:
    def repair() -> None:
        with store.txns.locked(Key(SCOPE, "evil")):
            store.repair_task(SCOPE, "evil")

    return [
        ("get_turn", lambda: store.get_turn(SCOPE, "evil", 0)),
        ("get_task", lambda: store.get_task(SCOPE, "evil")),
        ("list_tasks", lambda: store.list_tasks(SCOPE)),
        ("open_digest", lambda: _read_all(store.open_digest(SCOPE)[0])),
        ("rebuild_digest", lambda: store.rebuild_digest(SCOPE)),
        ("open_digest_rendered", lambda: _read_all(store.open_digest(SCOPE)[0])),
        ("open_artifact", lambda: _read_all(store.open_artifact(SCOPE, "evil", 0, "a.bin").file)),
        ("owner_of", lambda: store.owner_of(SCOPE, "evil")),
        ("put_turn", lambda: store.put_turn(SCOPE, "evil", 0, meta={}, summary_md="new")),
        ("put_turn_1", lambda: store.put_turn(SCOPE, "evil", 1, meta={}, summary_md="new")),
        (
            "put_artifact",
            lambda: store.put_artifact(
                SCOPE, "evil", 0, "a.bin", io.BytesIO(b"new"), content_type="x"
            ),
        ),
        (
            "put_artifact_new",
            lambda: store.put_artifact(
                SCOPE, "evil", 0, "b.bin", io.BytesIO(b"new"), content_type="x"
            ),
        ),
        ("repair_task", repair),
        ("open_digest_again", lambda: _read_all(store.open_digest(SCOPE)[0])),
        ("delete_task", lambda: store.delete_task(SCOPE, "evil")),
        ("get_task_after", lambda: store.get_task(SCOPE, "evil")),
    ]


def _check_all(store: TaskStore, forbidden: list[str]) -> dict[str, str]:
    outcomes = {}
    for name, op in _operations(store):
        try:
            result = op()
        except ALLOWED as exc:
            outcomes[name] = type(exc).__name__
            continue
        text = repr(result)
        for word in forbidden:
            assert word not in text, f"{name} returned outside content: {text[:300]}"
        outcomes[name] = "ok"
    return outcomes


@pytest.mark.parametrize("plant", sorted(PLANTS))
def test_links_into_an_outside_tree_are_never_followed(
    trees: tuple[TaskStore, Path], plant: str
) -> None:
    store, outside = trees
    link, target = _rel(store, outside, *PLANTS[plant])
    _swap(link, target)
    before = snapshot(outside)
    outcomes = _check_all(store, ["OUTSIDE"])
    assert snapshot(outside) == before, f"something outside the root changed: {outcomes}"
    assert link.is_symlink() or not link.exists() or plant in ("summary_md", "digest")
    # The reads that address the planted entry itself never succeed through it.
    if plant in ("task_dir", "turn_dir", "meta_json", "project_dir", "tenant_dir"):
        assert outcomes["get_turn"] != "ok"
    if plant in ("artifact", "artifacts_dir"):
        assert outcomes["open_artifact"] != "ok"


@pytest.mark.parametrize(
    ("plant", "target"),
    [
        ("task_dir", "/"),
        ("meta_json", "/etc/hosts"),
        ("index_json", "/etc/hosts"),
        ("artifact", "/etc/hosts"),
        ("digest", "/etc/hosts"),
        ("project_dir", "/etc"),
    ],
)
def test_links_to_system_files_are_never_followed(
    trees: tuple[TaskStore, Path], plant: str, target: str
) -> None:
    store, _ = trees
    link = store.layout.root.joinpath(*PLANTS[plant])
    hosts = Path("/etc/hosts").read_bytes()
    _swap(link, target)
    words = [line for line in Path("/etc/hosts").read_text().split() if len(line) > 6][:3]
    outcomes = _check_all(store, words + ["localhost"])
    assert Path("/etc/hosts").read_bytes() == hosts
    assert outcomes["get_turn"] != "ok" or plant in ("index_json", "artifact", "digest")


def test_a_trash_dir_link_does_not_move_a_task_outside(
    trees: tuple[TaskStore, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    store, outside = trees
    elsewhere = outside.parent / "elsewhere"
    elsewhere.mkdir()
    _swap(store.layout.trash_dir(), elsewhere)
    # Keep whatever reaches the trash, so a move through the link shows.
    monkeypatch.setattr(shutil, "rmtree", lambda *a, **k: None)
    with contextlib.suppress(*ALLOWED):
        store.delete_task(SCOPE, "evil")
    assert list(elsewhere.iterdir()) == []


def test_a_locks_dir_link_is_not_written_through(trees: tuple[TaskStore, Path]) -> None:
    store, outside = trees
    elsewhere = outside.parent / "elsewhere-locks"
    elsewhere.mkdir()
    _swap(store.layout.locks_dir(), elsewhere)
    with contextlib.suppress(*ALLOWED):
        store.put_turn(SCOPE, "t1", 3, meta={}, summary_md="x")
    assert list(elsewhere.iterdir()) == []


def test_a_cursor_key_link_is_replaced_by_a_new_key_never_read_through(tmp_path: Path) -> None:
    root = tmp_path / "root"
    TaskStore(root)
    secret = tmp_path / "outside-secret"
    secret.write_bytes(b"OUTSIDE key material")
    _swap(root / ".cursor-key", secret)
    store = TaskStore(root)  # starts: the link was the service's file, not a person's data
    key = root / ".cursor-key"
    assert not key.is_symlink() and key.read_bytes() != secret.read_bytes()
    assert secret.read_bytes() == b"OUTSIDE key material"
    store.put_turn(SCOPE, "t", 0, meta={}, summary_md="x")
    assert store.list_tasks(SCOPE, limit=1).total == 1


@pytest.mark.parametrize("name", ["_canary", "_server.lock", "_tasks.inflight", "_stores.inflight"])
def test_a_link_at_a_lock_file_is_replaced_and_the_server_still_starts(
    tmp_path: Path, name: str
) -> None:
    from app import create_app
    from app.ops.sweeper import startup_recovery

    config = {"STORAGE_ROOT": str(tmp_path / "root"), "TOKENS_FILE": str(tmp_path / "t.json")}
    app = create_app(config)
    storage = app.extensions["storage"]
    storage.tasks.put_turn(SCOPE, "t", 0, meta={}, summary_md="x")
    outside = tmp_path / "outside-file"
    outside.write_bytes(b"OUTSIDE")
    link = tmp_path / "root" / ".locks" / name
    if link.exists():
        link.unlink()
    os.symlink(outside, link)
    (tmp_path / "root" / ".server-running").write_text("1\n")  # an unclean stop
    app = create_app(config)
    startup_recovery(app)
    report = app.extensions["storage"].full_check()
    assert outside.read_bytes() == b"OUTSIDE"
    app.extensions["storage"].tasks.put_turn(SCOPE, "t", 1, meta={}, summary_md="y")
    assert [t.turn for t in app.extensions["storage"].tasks.get_task(SCOPE, "t").turns] == [0, 1]
    assert report is None or isinstance(report.problems, list)


def test_a_lost_and_found_link_gets_nothing_moved_through_it(tmp_path: Path) -> None:
    from app.storage.tree.backend import TreeStorage

    storage = TreeStorage(tmp_path / "root", clock=FixedClock(), lock_timeout=2.0)
    tasks = storage.tasks
    tasks.put_turn(SCOPE, "t", 0, meta={}, summary_md="zero")
    tasks.put_turn(SCOPE, "t", 1, meta={}, summary_md="one")
    root = tmp_path / "root"
    turn = root / "acme" / "web" / "t"
    (turn / "0001-turn" / "meta.json").write_text("torn{")  # fsck --repair moves it aside
    outside = tmp_path / "outside"
    outside.mkdir()
    os.symlink(outside, root / ".lost+found")
    report = storage.fsck(repair=True)
    assert list(outside.iterdir()) == []
    assert any(".lost+found" in line for line in report.problems + report.unrepairable)
    assert (turn / "0001-turn" / "meta.json").read_text() == "torn{"  # left where it was


def _fifo(path: Path) -> None:
    if path.is_dir():
        shutil.rmtree(path)
    elif path.exists():
        path.unlink()
    os.mkfifo(path)


def _directory(path: Path) -> None:
    path.unlink()
    (path / "x").mkdir(parents=True)


@pytest.mark.parametrize("plant", ["meta_json", "index_json", "task_json", "artifact", "digest"])
@pytest.mark.parametrize("put", [_fifo, _directory], ids=["fifo", "directory"])
def test_a_fifo_or_directory_where_a_file_belongs_never_blocks_and_is_reported(
    trees: tuple[TaskStore, Path], plant: str, put: Callable[[Path], None]
) -> None:
    """Opening a FIFO to read waits for a writer, and a directory reads as EISDIR: neither
    may hang a request or the fsck that should report it."""
    from app.storage.tree.backend import TreeStorage

    store, outside = trees
    target, _ = _rel(store, outside, *PLANTS[plant])
    put(target)
    storage = TreeStorage(store.layout.root, clock=FixedClock(), lock_timeout=2.0)
    report = _within(60, storage.fsck)
    rel = str(target.relative_to(store.layout.root))
    assert any(rel in line for line in report.problems), report
    outcomes = _within(60, lambda: _check_all(store, ["OUTSIDE"]))
    assert set(outcomes.values()) <= {"ok", "Corrupt", "NotFound", "UnsafePath"}, outcomes


def _within(seconds: float, call: Callable[[], Any]) -> Any:
    """``call()``'s result, or a failure once it has run ``seconds`` (the blocked thread is
    left behind as a daemon: a hang fails this test instead of stopping the run)."""
    import threading

    result: list[Any] = []
    errors: list[BaseException] = []

    def run() -> None:
        try:
            result.append(call())
        except BaseException as exc:  # noqa: BLE001 - re-raised in the test's thread
            errors.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(seconds)
    assert not thread.is_alive(), f"still blocked after {seconds} s"
    if errors:
        raise errors[0]
    return result[0]


def test_links_at_the_listing_wal_and_shm_are_removed_never_written_through(
    trees: tuple[TaskStore, Path],
) -> None:
    store, outside = trees
    listing = store.layout.listing(SCOPE)
    Listing.forget(listing)  # SQLite opens its -wal and -shm again on the next connection
    target = outside.parent / "outside-file"
    target.write_bytes(b"OUTSIDE")
    for suffix in ("-wal", "-shm"):
        companion = Path(f"{listing}{suffix}")
        if companion.exists():
            companion.unlink()
        os.symlink(target, companion)
    store.put_turn(SCOPE, "t2", 0, meta={}, summary_md="after")
    assert "t2" in [t.task_id for t in store.list_tasks(SCOPE).tasks]
    assert target.read_bytes() == b"OUTSIDE"
    assert not Path(f"{listing}-wal").is_symlink()
