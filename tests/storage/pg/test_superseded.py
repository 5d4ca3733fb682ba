"""On PostgreSQL a replaced artifact's object stays for the downloads reading it, and a delete
of the artifact, its turn or its task removes it with the current one: no byte an artifact
ever held outlives its delete waiting for the sweeper. (The tree unlinks a replaced file at
once: tests/robust/test_removed_text.py.)"""

from __future__ import annotations

import io
import threading
from typing import Any

import pytest

from app.storage.core.names import Scope
from tests.conftest import FixedClock

pytestmark = pytest.mark.all_backends
WEB = Scope("acme", "web")


def objects(pg: Any, task_id: str) -> dict[str, bytes]:
    """Every object of ``task_id``'s artifacts in the bucket, with its bytes."""
    prefix = f"acme/web/{task_id}/"
    client = pg.blobs.client()
    return {
        key: client.get_object(Bucket=pg.blobs.bucket, Key=key)["Body"].read()
        for key, _, _ in pg.blobs.listing(prefix)
    }


def put(pg: Any, task_id: str, turn: int, name: str, data: bytes) -> None:
    pg.tasks.put_artifact(WEB, task_id, turn, name, io.BytesIO(data), content_type="text/plain")


def test_a_deleted_artifact_takes_the_bytes_it_replaced(pg_storage: Any) -> None:
    pg_storage.tasks.put_turn(WEB, "leak", 0, meta={}, summary_md="x")
    put(pg_storage, "leak", 0, "env.txt", b"TOKEN=first-secret")
    put(pg_storage, "leak", 0, "env.txt", b"TOKEN=second-secret")
    put(pg_storage, "leak", 0, "kept.txt", b"kept")
    # Both uploads are in the bucket: the first for a download that may be reading it.
    assert sorted(objects(pg_storage, "leak").values()) == [
        b"TOKEN=first-secret",
        b"TOKEN=second-secret",
        b"kept",
    ]
    pg_storage.tasks.delete_artifact(WEB, "leak", 0, "env.txt")
    assert list(objects(pg_storage, "leak").values()) == [b"kept"]


def test_a_deleted_turn_or_task_takes_the_bytes_its_artifacts_replaced(
    pg_storage: Any,
) -> None:
    for turn in (0, 1):
        pg_storage.tasks.put_turn(WEB, "leak", turn, meta={}, summary_md="x")
        for version in (1, 2, 3):
            put(pg_storage, "leak", turn, "log.txt", f"turn {turn} v{version}".encode())
    assert len(objects(pg_storage, "leak")) == 6
    pg_storage.tasks.delete_turn(WEB, "leak", 0)
    assert sorted(objects(pg_storage, "leak").values()) == [
        b"turn 1 v1",
        b"turn 1 v2",
        b"turn 1 v3",
    ]
    pg_storage.tasks.delete_turn(WEB, "leak", 1)  # the last turn: the task goes with it
    assert objects(pg_storage, "leak") == {}
    pg_storage.tasks.put_turn(WEB, "other", 0, meta={}, summary_md="x")
    put(pg_storage, "other", 0, "a.txt", b"old")
    put(pg_storage, "other", 0, "a.txt", b"new")
    pg_storage.tasks.delete_task(WEB, "other")
    assert objects(pg_storage, "other") == {}


def test_a_delete_takes_what_racing_uploads_replaced(pg_storage: Any) -> None:
    """Eight writers replace one artifact at once, then it is deleted: none of their bytes
    stay, whichever order their commits took."""
    pg_storage.tasks.put_turn(WEB, "race", 0, meta={}, summary_md="x")
    put(pg_storage, "race", 0, "env.txt", b"TOKEN=the-secret")
    start = threading.Barrier(8)
    failed: list[BaseException] = []

    def writer(i: int) -> None:
        try:
            start.wait()
            put(pg_storage, "race", 0, "env.txt", f"writer {i}".encode())
        except BaseException as exc:  # noqa: BLE001 - reported below
            failed.append(exc)

    threads = [threading.Thread(target=writer, args=(i,)) for i in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert failed == []
    assert len(objects(pg_storage, "race")) == 9
    pg_storage.tasks.delete_artifact(WEB, "race", 0, "env.txt")
    assert objects(pg_storage, "race") == {}


def test_a_download_begun_before_a_replacement_reads_the_old_bytes_whole(
    pg_storage: Any,
) -> None:
    old = b"old bytes " * 100_000  # a megabyte, read in parts
    pg_storage.tasks.put_turn(WEB, "dl", 0, meta={}, summary_md="x")
    put(pg_storage, "dl", 0, "big.bin", old)
    opened = pg_storage.tasks.open_artifact(WEB, "dl", 0, "big.bin")
    try:
        first = opened.file.read(1000)
        put(pg_storage, "dl", 0, "big.bin", b"new")
        assert first + opened.file.read() == old
    finally:
        opened.file.close()
    pg_storage.tasks.delete_artifact(WEB, "dl", 0, "big.bin")
    assert objects(pg_storage, "dl") == {}


def test_the_list_of_superseded_objects_keeps_a_day(pg_storage: Any, clock: FixedClock) -> None:
    """An artifact replaced again and again lists the objects of the last day only: the
    sweeper has removed the older ones by then."""
    pg_storage.tasks.put_turn(WEB, "often", 0, meta={}, summary_md="x")
    put(pg_storage, "often", 0, "a.txt", b"v1")
    put(pg_storage, "often", 0, "a.txt", b"v2")  # lists v1's object
    clock.advance(hours=25)
    put(pg_storage, "often", 0, "a.txt", b"v3")  # lists v2's, drops v1's

    def listed() -> list[bytes]:
        with pg_storage.db.snapshot("test") as conn:
            keys = [r[0] for r in conn.execute("SELECT blob FROM superseded_blobs")]
        client = pg_storage.blobs.client()
        return [
            client.get_object(Bucket=pg_storage.blobs.bucket, Key=k)["Body"].read() for k in keys
        ]

    assert listed() == [b"v2"]
