"""Reads of the storage engine leave access times alone (no journaled inode write per read)."""

from __future__ import annotations

import io
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from app.storage.core.names import Scope
from app.storage.tree.fs.beneath import Beneath
from app.storage.tree.fs.noatime import O_NOATIME, open_noatime, read_all
from app.storage.tree.tasks import TaskStore

SCOPE = Scope("acme", "web")
OLD = 1_000_000_000  # 2001: relatime updates an access time older than the modification time


def _age_atimes(root: Path) -> dict[Path, int]:
    """Set every file's access time to OLD; return their inode numbers."""
    files = {}
    for path in root.rglob("*"):
        if path.is_file() and not path.is_symlink():
            st = path.stat()
            os.utime(path, ns=(OLD * 10**9, st.st_mtime_ns))
            files[path] = st.st_ino
    return files


def _plain_read_updates_atime(path: Path) -> bool:
    os.utime(path, ns=(OLD * 10**9, path.stat().st_mtime_ns))
    path.read_bytes()
    changed = path.stat().st_atime_ns != OLD * 10**9
    os.utime(path, ns=(OLD * 10**9, path.stat().st_mtime_ns))
    return changed


@pytest.fixture
def store(tmp_path: Path) -> TaskStore:
    store = TaskStore(tmp_path / "root")
    store.put_turn(SCOPE, "t1", 0, meta={"a": 1}, summary_md="# zero\n")
    store.put_artifact(SCOPE, "t1", 0, "out.bin", io.BytesIO(b"x" * 4096), content_type="a/b")
    store.put_turn(SCOPE, "t1", 1, meta={"a": 2}, summary_md="# one\n")
    return store


@pytest.mark.skipif(not O_NOATIME, reason="no O_NOATIME on this platform")
def test_reads_and_writes_do_not_update_access_times(store: TaskStore) -> None:
    root = store.layout.root
    meta0 = store.layout.task_dir(SCOPE, "t1") / "0000-turn" / "meta.json"
    if not _plain_read_updates_atime(meta0):
        pytest.skip("this filesystem never updates access times (noatime): nothing to see")
    aged = _age_atimes(root)

    # Reads: the turn (openat2 or the walk), the task index, an artifact, the listing.
    assert store.get_turn(SCOPE, "t1", 0).meta == {"a": 1}
    assert [t.turn for t in store.get_task(SCOPE, "t1").turns] == [0, 1]
    with store.open_artifact(SCOPE, "t1", 0, "out.bin").file as fh:
        assert fh.read() == b"x" * 4096
    # A write reads the dirty flag, task.json, the turn's meta.json and index.json.
    store.put_turn(SCOPE, "t1", 1, meta={"a": 3}, summary_md="# one again\n")

    # Files the write replaced are new inodes; every file still there kept its access time.
    kept = [p for p, ino in aged.items() if p.exists() and p.stat().st_ino == ino]
    touched = [p.relative_to(root) for p in kept if p.stat().st_atime_ns != OLD * 10**9]
    assert kept, "the test must look at some files"
    assert meta0 in kept and store.layout.task_dir(SCOPE, "t1") / "task.json" in kept
    # SQLite reads its own files with plain read(): the listing is not ours to open.
    assert [p for p in touched if ".sqlite" not in p.name and ".db" not in p.name] == []


@pytest.fixture
def shared_dir() -> Iterator[Path]:
    """A directory another user can traverse (tmp_path's parents are private to us)."""
    path = Path(tempfile.mkdtemp(prefix="pm-noatime-"))
    path.chmod(0o755)
    yield path
    shutil.rmtree(path)


@pytest.mark.skipif(not hasattr(os, "geteuid") or os.geteuid() != 0, reason="needs root")
def test_a_file_someone_else_owns_is_still_read(shared_dir: Path) -> None:
    """O_NOATIME on another user's file is EPERM: the open falls back to a plain one."""
    (shared_dir / "sub").mkdir(mode=0o755)
    target = shared_dir / "sub" / "meta.json"
    target.write_bytes(b'{"k": 1}')
    target.chmod(0o644)  # owned by root, readable by everyone
    pid = os.fork()
    if pid == 0:  # the child reads as nobody, which does not own the file
        code = 1
        try:
            os.setgid(65534)
            os.setuid(65534)
            ok = read_all(open_noatime(target)) == b'{"k": 1}'
            fd = Beneath(str(shared_dir)).open_read("sub/meta.json")
            ok = ok and fd is not None and read_all(fd) == b'{"k": 1}'
            code = 0 if ok else 2
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
