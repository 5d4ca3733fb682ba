"""Backups of PostgreSQL + S3 while the deployment serves (a real PostgreSQL and SeaweedFS):
an export taken while writers write, replace and delete reads every object its snapshots
name; an import's objects survive the orphan sweep however long it takes, and a refused or
killed import leaves nothing a row names."""

from __future__ import annotations

import io
import os
import threading
from collections.abc import Callable, Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from app.storage.backends import open_backend
from app.storage.core.archive import ArchiveError
from app.storage.core.errors import NotFound
from app.storage.core.names import Scope
from app.storage.pg import restore as pg_restore
from app.storage.pg.backend import PgStorage
from app.storage.pg.db import backup_lock
from tests.conftest import FixedClock, Services, selected_backends

pytestmark = pytest.mark.skipif(
    "pg" not in selected_backends(), reason="MEMORY_TEST_BACKENDS does not name pg"
)
SCOPE = Scope("acme", "web")
MiB = 1 << 20
EVERY_OBJECT = timedelta(seconds=-60)  # a grace that makes every object old enough to sweep


@pytest.fixture
def deploy(services: Services, tmp_path: Path, clock: FixedClock) -> Iterator[Callable[[], Any]]:
    """A new deployment (its own schema and key prefix) per call."""
    opened: list[PgStorage] = []

    def make() -> PgStorage:
        settings = {
            "STORAGE_ROOT": str(tmp_path / "unused"),
            "TOKENS_FILE": str(tmp_path / "tokens.json"),
            "RETENTION_DAYS": 30.0,
            "LOCK_TIMEOUT": 5.0,
            "MAX_ARTIFACT_BYTES": 50 * MiB,
            "CLOCK": clock,
            "THREADS": 8,
            **services.settings(),
        }
        found = open_backend(settings)
        assert isinstance(found, PgStorage)
        opened.append(found)
        return found

    yield make
    for found in opened:
        found.close()


def objects(storage: PgStorage) -> set[str]:
    return {key for key, _, _ in storage.blobs.listing()}


def named(storage: PgStorage) -> set[str]:
    with storage.db.snapshot("test") as conn:
        return {r[0] for r in conn.execute("SELECT blob FROM artifacts")}


def put(storage: PgStorage, task: str, turn: int = 0, data: bytes = b"x") -> None:
    storage.tasks.put_turn(SCOPE, task, turn, meta={}, summary_md=task)
    storage.tasks.put_artifact(SCOPE, task, turn, "a.bin", io.BytesIO(data), content_type="x/y")


def test_objects_that_lose_their_rows_stay_while_a_backup_runs(
    deploy: Callable[[], PgStorage], clock: FixedClock
) -> None:
    storage = deploy()
    for task in ("deleted", "replaced", "expiring"):
        put(storage, task)
    before = objects(storage)
    with storage.db.connect(autocommit=True) as held, backup_lock(held):
        storage.tasks.delete_task(SCOPE, "deleted")
        put(storage, "replaced", data=b"new")
        clock.advance(days=31)
        storage.tasks.put_turn(SCOPE, "fresh", 0, meta={}, summary_md="")
        swept = storage.sweep(now=clock(), grace=EVERY_OBJECT)
        assert swept.tasks.tasks == 2  # the rows of both expired tasks went
        assert before <= objects(storage)  # every object a snapshot may name is still there
    assert named(storage) == set()
    storage.sweep(now=clock(), grace=EVERY_OBJECT)
    assert objects(storage) == set()  # the orphan pass collects them once the backup ended


def test_a_task_deleted_after_its_snapshot_still_exports_whole(
    deploy: Callable[[], PgStorage], tmp_path: Path, clock: FixedClock
) -> None:
    storage = deploy()
    data = [os.urandom(1000), os.urandom(2000)]
    for turn in (0, 1):
        put(storage, "victim", turn=turn, data=data[turn])
    read = storage.blobs.open

    def delete_then_read(key: str, size: int) -> Any:
        # The export took the task's snapshot and is about to read its first object: a
        # writer deletes the task now (its objects would go right after the commit).
        if storage.tasks.list_tasks(SCOPE).total:
            storage.tasks.delete_task(SCOPE, "victim")
        return read(key, size)

    storage.blobs.open = delete_then_read  # type: ignore[method-assign]
    backup = tmp_path / "b.tar.gz"
    storage.export(backup)
    restored = deploy()
    with open(backup, "rb") as fh:
        restored.import_(fh)
    for turn in (0, 1):
        opened = restored.tasks.open_artifact(SCOPE, "victim", turn, "a.bin")
        with opened.file as fh:
            assert fh.read() == data[turn]
    storage.sweep(now=clock(), grace=EVERY_OBJECT)
    assert objects(storage) == set()  # collected once the export ended


def test_an_export_under_writers_reads_every_object_its_snapshots_name(
    deploy: Callable[[], PgStorage], tmp_path: Path
) -> None:
    storage = deploy()
    for i in range(30):
        put(storage, f"t{i:02d}", data=os.urandom(64 << 10))
    stop = threading.Event()
    done: list[str] = []
    errors: list[BaseException] = []

    def write(k: int) -> None:
        n = 0
        try:
            while not stop.is_set():
                task = f"t{(k * 7 + n) % 30:02d}"
                try:
                    put(storage, task, turn=n % 3, data=os.urandom(8 << 10))  # a replacement
                    storage.tasks.delete_task(SCOPE, f"t{(k * 11 + n) % 30:02d}")
                except NotFound:
                    pass  # deleted by another writer in between
                done.append(task)
                n += 1
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    writers = [threading.Thread(target=write, args=(k,)) for k in range(3)]
    for w in writers:
        w.start()
    try:
        backups = []
        for i in range(2):
            backups.append(tmp_path / f"b{i}.tar.gz")
            storage.export(backups[-1], tenant="acme", project="web")
    finally:
        stop.set()
        for w in writers:
            w.join(timeout=60)
    assert not errors and len(done) > 10
    for backup in backups:
        restored = deploy()
        with open(backup, "rb") as fh:
            summary = restored.import_(fh)  # every artifact checked against its sha256
        assert summary.counts["artifacts"] > 0
        assert restored.fsck().clean


def test_export_refuses_an_artifact_whose_object_is_missing(
    deploy: Callable[[], PgStorage], tmp_path: Path
) -> None:
    storage = deploy()
    put(storage, "t")
    storage.blobs.delete(named(storage))
    backup = tmp_path / "b.tar.gz"
    with pytest.raises(ArchiveError, match="missing from the object store.*fsck"):
        storage.export(backup)
    assert not backup.exists() and not [p for p in tmp_path.iterdir() if p.name.startswith(".")]


class _Pipe(io.RawIOBase):
    """A backup arriving slowly: reads block until the test lets more through."""

    def __init__(self, data: bytes) -> None:
        self.data = data
        self.allowed = 0
        self.pos = 0
        self.more = threading.Condition()

    def readable(self) -> bool:
        return True

    def allow(self, upto: int) -> None:
        with self.more:
            self.allowed = upto
            self.more.notify_all()

    def readinto(self, buf: Any) -> int:
        with self.more:
            self.more.wait_for(lambda: self.allowed > self.pos or self.allowed < 0)
            end = len(self.data) if self.allowed < 0 else self.allowed
            chunk = self.data[self.pos : min(end, self.pos + len(buf))]
        buf[: len(chunk)] = chunk
        self.pos += len(chunk)
        return len(chunk)


def _slow_import(storage: PgStorage, data: bytes) -> tuple[_Pipe, threading.Thread, list[Any]]:
    pipe = _Pipe(data)
    outcome: list[Any] = []

    def run() -> None:
        try:
            outcome.append(storage.import_(io.BufferedReader(pipe)))  # type: ignore[arg-type]
        except BaseException as exc:  # noqa: BLE001 - the test looks at it
            outcome.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return pipe, thread, outcome


def _backup_of_big_artifacts(deploy: Callable[[], PgStorage], tmp_path: Path) -> bytes:
    source = deploy()
    for i, size in enumerate((MiB, MiB, MiB, 6 * MiB)):  # 6 MiB: a multipart upload
        put(source, f"t{i}", data=os.urandom(size))  # random: the backup stays this large
    backup = tmp_path / "b.tar.gz"
    source.export(backup)
    return backup.read_bytes()


def test_an_import_that_takes_long_keeps_its_objects_through_the_orphan_sweep(
    deploy: Callable[[], PgStorage], tmp_path: Path, clock: FixedClock
) -> None:
    data = _backup_of_big_artifacts(deploy, tmp_path)
    target = deploy()
    pipe, thread, outcome = _slow_import(target, data)
    try:
        pipe.allow(len(data) // 2)
        while not objects(target) and thread.is_alive():
            thread.join(0.05)
        uploaded = objects(target)
        assert uploaded and not named(target)  # uploaded, named by no committed row yet
        target.sweep(now=clock(), grace=EVERY_OBJECT)
        assert uploaded <= objects(target)
    finally:
        pipe.allow(-1)
        thread.join(60)
    assert not isinstance(outcome[0], BaseException), outcome
    assert named(target) == objects(target) and len(named(target)) == 4
    assert target.fsck().clean


def test_a_refused_import_deletes_its_objects_and_a_killed_one_leaves_orphans(
    deploy: Callable[[], PgStorage], tmp_path: Path, clock: FixedClock, monkeypatch: Any
) -> None:
    data = _backup_of_big_artifacts(deploy, tmp_path)
    target = deploy()
    with pytest.raises(ArchiveError, match="corrupt or truncated"):
        target.import_(io.BytesIO(data[: len(data) * 3 // 4]))
    assert objects(target) == set()
    # A process killed mid-import deletes nothing: what it uploaded no row names.
    monkeypatch.setattr(pg_restore, "_clean_up", lambda storage, importer: None)
    with pytest.raises(ArchiveError):
        target.import_(io.BytesIO(data[: len(data) * 3 // 4]))
    assert objects(target) and not named(target)
    target.sweep(now=clock(), grace=EVERY_OBJECT)
    assert objects(target) == set()
