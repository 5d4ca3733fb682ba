"""What the service creates under the root is not for other local users: files at most 0640,
directories at most 0750, whatever the process umask lets through (a CLI run under umask 022
included), and a root made setgid for a team's group hands that group read access."""

from __future__ import annotations

import io
import os
import stat
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import pytest

from app.storage.backends import open_backend
from app.storage.core.limits import QuotaOverride
from app.storage.core.names import Scope
from app.storage.core.traffic import TrafficRow
from app.storage.tree.backend import TreeStorage
from tests.conftest import FixedClock

SCOPE = Scope("acme", "web")


@pytest.fixture
def loose_umask() -> Iterator[None]:
    before = os.umask(0o022)
    try:
        yield
    finally:
        os.umask(before)


def _open(root: Path, tmp_path: Path, clock: FixedClock) -> TreeStorage:
    storage = open_backend(
        {
            "STORAGE_ROOT": str(root),
            "TOKENS_FILE": str(tmp_path / f"{root.name}-tokens.json"),
            "RETENTION_DAYS": 30.0,
            "LOCK_TIMEOUT": 5.0,
            "MAX_ARTIFACT_BYTES": 1 << 20,
            "CLOCK": clock,
            "THREADS": 2,
        }
    )
    assert isinstance(storage, TreeStorage)
    return storage


def _use_everything(storage: TreeStorage, clock: FixedClock, backup: Path) -> None:
    tasks = storage.tasks
    # A tenant quota: each write takes the tenant's quota lock and reserves in the listing.
    storage.limits().set_quota("acme", None, QuotaOverride(bytes=1 << 30))
    for i in range(3):
        tasks.put_turn(SCOPE, f"t{i}", 0, meta={"i": i}, summary_md=f"turn {i} words")
    tasks.put_artifact(SCOPE, "t0", 0, "a.bin", io.BytesIO(b"x" * 5000), content_type="x/y")
    tasks.put_artifact(SCOPE, "t0", 0, "a.bin", io.BytesIO(b"y" * 5000), content_type="x/y")
    fh, _ = tasks.open_digest(SCOPE)
    fh.close()
    tasks.compact_digest(SCOPE)
    storage.search(SCOPE, "words")
    tasks.list_tasks(SCOPE)
    tasks.delete_task(SCOPE, "t2")
    stores = storage.stores
    store = stores.create_store(SCOPE, name="Prefs", creator=None)
    mem = stores.create_memory(SCOPE, store.id, path="/a/b.md", content="one", actor=None)
    stores.update_memory(SCOPE, store.id, mem.id, content="two", actor=None)
    clock.advance(days=40)
    storage.sweep(now=clock())
    storage.fsck(repair=True, grace=timedelta(0))
    storage.export(backup)
    storage.record_traffic([TrafficRow(0, "acme", "web", "tok", 1, 10, 20)])


def _too_open(root: Path) -> list[str]:
    found = []
    for directory, dirs, files in os.walk(root):
        for name in dirs + files:
            path = Path(directory) / name
            st = path.lstat()
            limit = 0o750 if stat.S_ISDIR(st.st_mode) else 0o640
            if stat.S_IMODE(st.st_mode) & ~limit & 0o777:
                found.append(f"{path.relative_to(root)} {oct(stat.S_IMODE(st.st_mode))}")
    return found


@pytest.mark.usefixtures("loose_umask")
def test_nothing_the_service_creates_is_readable_by_other_users(
    tmp_path: Path, clock: FixedClock
) -> None:
    source = _open(tmp_path / "root", tmp_path, clock)
    backup = tmp_path / "all.tar.gz"
    _use_everything(source, clock, backup)
    restored = _open(tmp_path / "restored", tmp_path, clock)
    with open(backup, "rb") as fh:
        restored.import_(fh)
    restored.tasks.list_tasks(SCOPE)
    for root in (source.layout.root, restored.layout.root):
        assert sorted(p.name for p in root.iterdir())  # something was written
        assert _too_open(root) == []


@pytest.mark.usefixtures("loose_umask")
def test_a_setgid_root_gives_its_group_every_new_directory(tmp_path: Path, clock: FixedClock):
    root = tmp_path / "root"
    root.mkdir()
    root.chmod(0o2750)  # what docs/operations.md tells a team to do, after a chgrp
    storage = _open(root, tmp_path, clock)
    _use_everything(storage, clock, tmp_path / "all.tar.gz")
    group = root.stat().st_gid
    for directory, dirs, files in os.walk(root):
        for name in dirs + files:
            st = (Path(directory) / name).lstat()
            assert st.st_gid == group
            if stat.S_ISDIR(st.st_mode):
                assert st.st_mode & stat.S_ISGID, Path(directory) / name
