"""A full disk keeps reads up and writes honest (docs/guarantees.md, "Faults").

Real disks: small ext4 images, loop-mounted, with no blocks reserved for root, filled to
their last byte or inode by a filler beside the storage root. What must hold:

- reads answer at 0 bytes and at 0 inodes: ``project.md`` (which compacts when it can, and
  must serve the base plus the changes when it cannot), ``/usage``;
- the free-space floor counts inodes too: writes stop with 507 while inodes are left;
- a refused write did nothing: no task directory without a turn, fsck clean;
- a memory write that meets a full disk is a 507, never a 500;
- a server SIGKILLed on a full disk comes back up, serving reads, refusing writes with 507
  and saying why on /readyz, and finishes its recovery once space returns;
- on a 1 KiB-block ext4 (mke2fs's default below 512 MiB) at 0 bytes free, no worker dies
  of SIGBUS in SQLite's shared-memory file, and neither does fsck.
"""

from __future__ import annotations

import logging
import os
import random
import sqlite3
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests

from tests.e2e.conftest import REPO
from tests.robust.faultkit import (
    MS,
    PM,
    Seeded,
    fill_bytes,
    fill_inodes,
    flask,
    free_bytes,
    free_inodes,
    seed,
    small_ext4,
    unfill,
)
from tests.robust.helpers import Live

pytestmark = pytest.mark.e2e
MiB = 1 << 20
NO_FLOOR = {"MIN_FREE_BYTES": 0, "MIN_FREE_INODES": 0}


@pytest.fixture
def disk(tmp_path: Path) -> Iterator[Path]:
    with small_ext4(tmp_path, size=24 * MiB, inodes=1024) as mount:
        yield mount


@pytest.fixture
def seeded(disk: Path, tmp_path: Path) -> Seeded:
    return seed(disk / "root", tmp_path / "tokens.json")


def _changed_digest(seeded: Seeded) -> None:
    """A new turn: the next read of project.md splices it in, and compacts if it can."""
    with seeded.client(**NO_FLOOR) as c:
        body = {"summary_md": "written just before the disk filled"}
        assert c.put(f"{PM}/tasks/v/turns/0", headers=seeded.headers, json=body).status_code == 200


@pytest.mark.parametrize("fill", [fill_inodes, fill_bytes], ids=["0 inodes", "0 bytes"])
def test_reads_go_on_at_a_full_disk(seeded: Seeded, disk: Path, fill: object) -> None:
    _changed_digest(seeded)
    filler = fill(disk)  # type: ignore[operator]
    assert free_inodes(disk) == 0 or free_bytes(disk) == 0
    with seeded.client(**NO_FLOOR) as c:
        h = seeded.headers
        for _ in range(3):
            got = c.get(f"{PM}/project.md", headers=h)
            assert got.status_code == 200, got.data
            assert b"written just before the disk filled" in got.data
            assert b"t turn 1" in got.data
        got = c.get(f"{PM}/usage", headers=h)
        assert got.status_code == 200, got.data
        assert got.json["usage"]["tasks"] == 3
        assert c.get(f"{PM}/tasks", headers=h).json["total"] == 3
        assert c.get(f"{PM}/tasks/t/turns/0/artifacts/a.bin", headers=h).status_code == 200
        assert (
            c.get(f"{MS}/{seeded.store_id}/memories/{seeded.memory_id}", headers=h).status_code
            == 200
        )
        r = c.put(f"{PM}/tasks/w/turns/0", headers=h, json={"summary_md": "no room"})
        assert r.status_code == 507, r.data
    unfill(filler)
    done = flask(seeded.env(), "fsck")
    assert done.returncode == 0, done.stdout + done.stderr


def test_traffic_of_a_fresh_process_is_read_at_0_bytes(seeded: Seeded, disk: Path) -> None:
    """The traffic database without its -wal and -shm (its last connection closed) is read
    without creating anything."""
    for suffix in ("-wal", "-shm"):
        (seeded.root / f".traffic.sqlite3{suffix}").unlink(missing_ok=True)
    filler = fill_bytes(disk)
    with seeded.client(**NO_FLOOR) as c:
        got = c.get(f"{PM}/usage", headers=seeded.headers)
        assert got.status_code == 200, got.data
    unfill(filler)


@pytest.mark.parametrize("fill", [fill_inodes, fill_bytes], ids=["0 inodes", "0 bytes"])
def test_traffic_not_written_at_a_full_disk_is_one_line(
    seeded: Seeded, disk: Path, fill: object, caplog: pytest.LogCaptureFixture
) -> None:
    """Counts the disk has no room for are kept for the next flush, and say so in one line
    (every flush of every worker meets the same full disk: no traceback each time)."""
    with seeded.client(**NO_FLOOR) as c:
        for _ in range(3):
            assert c.get(f"{PM}/tasks", headers=seeded.headers).status_code == 200
        recorder = c.application.extensions["traffic"]
        filler = fill(disk)  # type: ignore[operator]
        with caplog.at_level(logging.WARNING, logger="app.traffic"):
            assert recorder.flush() == 0
        [line] = [r for r in caplog.records if r.name == "app.traffic"]
        assert line.levelno == logging.WARNING and line.exc_info is None, line
        assert "no space left" in line.getMessage() and "\n" not in line.getMessage()
        unfill(filler)
        assert recorder.flush() == 1  # the same hour, project and token: one row


def test_the_floor_counts_inodes(tmp_path: Path) -> None:
    with small_ext4(tmp_path, size=64 * MiB, inodes=512) as disk:
        seeded = seed(disk / "root", tmp_path / "tokens.json", memories=False)
        refused = None
        with seeded.client(MIN_FREE_BYTES=0) as c:
            for n in range(1000):
                r = c.put(
                    f"{PM}/tasks/n{n}/turns/0", headers=seeded.headers, json={"summary_md": "x"}
                )
                if r.status_code != 200:
                    refused = r
                    break
            assert refused is not None and refused.status_code == 507, refused and refused.data
            detail = refused.json["detail"]
            assert detail.startswith(
                "insufficient storage: the server's disk is at its free-space floor"
            )
            assert "inode" in detail, detail
            assert free_inodes(disk) > 0
            assert c.get(f"{PM}/project.md", headers=seeded.headers).status_code == 200
        done = flask(seeded.env(), "fsck")
        assert done.returncode == 0, done.stdout + done.stderr


@pytest.mark.faults
def test_a_turn_refused_at_the_last_inodes_leaves_no_task_behind(
    seeded: Seeded, disk: Path
) -> None:
    """A new task needs a handful of inodes: with fewer left, each one a write may take
    first, the write is refused and takes none of them."""
    for left in range(1, 8):
        filler = fill_inodes(disk)
        for path in sorted(filler.iterdir())[:left]:
            path.unlink()
        with seeded.client(**NO_FLOOR) as c:
            body = {"summary_md": "x"}
            r = c.put(f"{PM}/tasks/new{left}/turns/0", headers=seeded.headers, json=body)
        assert r.status_code in (200, 507), r.data
        if r.status_code == 507:
            assert not seeded.task(f"new{left}").exists(), f"a 507 left new{left} behind"
        done = flask(seeded.env(), "fsck", "--grace-minutes", "0")
        assert done.returncode == 0, (left, done.stdout + done.stderr)
        unfill(filler)


@pytest.mark.faults
def test_a_memory_write_on_a_full_disk_is_507_never_500(seeded: Seeded, disk: Path) -> None:
    """Another program fills the disk right after the floor last looked at it (it trusts
    statvfs for a second): writes admitted then meet the full disk half-way."""
    rng = random.Random(7)
    statuses: dict[int, int] = {}
    memories: list[str] = []
    with seeded.client(MIN_FREE_BYTES=0) as c:
        h = seeded.headers
        for round_ in range(8):
            filler = fill_bytes(disk)
            largest = max(filler.iterdir(), key=lambda p: p.stat().st_size)
            os.truncate(largest, max(0, largest.stat().st_size - 2 * MiB))
            os.sync()
            time.sleep(1.05)  # the floor looks again at the next write: 2 MiB free
            body = {"path": f"/r{round_}.md", "content": "r"}
            assert (
                c.post(f"{MS}/{seeded.store_id}/memories", headers=h, json=body).status_code == 200
            )
            fill_bytes(disk)
            for step in range(8):
                content = "c" * rng.randrange(10, 20_000)
                if memories and rng.random() < 0.5:
                    url = f"{MS}/{seeded.store_id}/memories/{rng.choice(memories)}"
                    r = c.post(url, headers=h, json={"content": content})
                else:
                    body = {"path": f"/m{round_}-{step}.md", "content": content}
                    r = c.post(f"{MS}/{seeded.store_id}/memories", headers=h, json=body)
                    if r.status_code == 200:
                        memories.append(r.json["id"])
                statuses[r.status_code] = statuses.get(r.status_code, 0) + 1
                assert r.status_code in (200, 507), (statuses, r.json)
                if r.status_code == 507:
                    assert r.json["error"]["type"] == "insufficient_storage_error"
                    assert r.headers["x-should-retry"] == "false"
            unfill(filler)
    assert statuses.get(507), statuses
    done = flask(seeded.env(), "fsck")
    assert done.returncode == 0, (statuses, done.stdout + done.stderr)


# -- a server killed on a full disk ------------------------------------------------------------
def _server(seeded: Seeded, tmp_path: Path, **env: str) -> Live:
    return Live(
        tmp_path=tmp_path,
        root=seeded.root,
        workers=2,
        env_extra={
            "MEMORY_TOKENS_FILE": str(seeded.tokens_file),
            "MEMORY_MIN_FREE_BYTES": "0",
            **env,
        },
    )


@pytest.mark.faults
@pytest.mark.parametrize("fill", [fill_bytes, fill_inodes], ids=["0 bytes", "0 inodes"])
def test_a_server_killed_on_a_full_disk_comes_back_read_only(
    seeded: Seeded, disk: Path, tmp_path: Path, fill: object
) -> None:
    server = _server(seeded, tmp_path).start()
    h = seeded.headers
    try:
        assert (
            requests.put(
                f"{server.url}{PM}/tasks/k/turns/0", headers=h, json={"summary_md": "k"}, timeout=30
            ).status_code
            == 200
        )
        filler = fill(disk)  # type: ignore[operator]
        server.kill_all()
        server.start()  # must come up: the start-up recovery cannot write
        got = requests.get(f"{server.url}{PM}/tasks/k/turns/0", headers=h, timeout=30)
        assert got.status_code == 200 and got.json()["summary_md"] == "k"
        got = requests.put(
            f"{server.url}{PM}/tasks/k/turns/1", headers=h, json={"summary_md": "no"}, timeout=30
        )
        assert got.status_code == 507, got.text
        ready = requests.get(f"{server.url}/readyz", timeout=30)
        assert ready.status_code == 503
        assert "read-only" in ready.json()["detail"] and "space" in ready.json()["detail"], (
            ready.text
        )
        unfill(filler)
        deadline = time.monotonic() + 60
        while requests.get(f"{server.url}/readyz", timeout=30).status_code != 200:
            assert time.monotonic() < deadline, requests.get(
                f"{server.url}/readyz", timeout=30
            ).text
            time.sleep(0.5)
        got = requests.put(
            f"{server.url}{PM}/tasks/k/turns/1", headers=h, json={"summary_md": "yes"}, timeout=30
        )
        assert got.status_code == 200, got.text
    finally:
        server.stop()
    done = flask(seeded.env(), "fsck")
    assert done.returncode == 0, done.stdout + done.stderr


_OPEN_READ_WRITE = """
import os, sys
from app.storage.core.errors import InsufficientStorage
from app.storage.tree.sqlite.db import open_index, write_txn

def write(conn):
    with write_txn(conn, "test") as txn:
        txn.execute("INSERT INTO t (v) VALUES (randomblob(3000))")

try:
    conn = open_index(sys.argv[1], timeout=5)
    print("read", conn.execute("SELECT count(*) FROM t").fetchone()[0])
    write(conn)
    print("wrote")
    # The connection stays open while the disk fills to its last block: each write now is
    # a 507 (never a signal), whatever the WAL and its index meet.
    os.unlink(sys.argv[2])
    with open(sys.argv[3], "wb", buffering=0) as fh:
        try:
            while True:
                fh.write(b"f" * 1024)
        except OSError:
            pass
    for _ in range(20):
        try:
            write(conn)
        except InsufficientStorage:
            pass
    print("read", conn.execute("SELECT count(*) FROM t").fetchone()[0] > 0)
except InsufficientStorage as exc:
    print("507", exc)
"""


def _sqlite_db(path: Path) -> None:
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("CREATE TABLE t (k INTEGER PRIMARY KEY, v BLOB)")
    conn.execute("INSERT INTO t (v) VALUES (zeroblob(100))")
    conn.close()


@pytest.mark.faults
@pytest.mark.parametrize("left_kib", [0, 4, 8, 20, 40, 300, 600])
def test_sqlite_on_1k_blocks_survives_any_room_left(tmp_path: Path, left_kib: int) -> None:
    """On 1 KiB blocks SQLite gives each 4 KiB page of a new -shm one block: a database opened
    with a few blocks left (8 or 20 KiB) met SIGBUS writing the rest of a page through the
    mapping. An index is not opened without room for a whole -shm (a 507 then); open, a disk
    filled after that refuses its writes with 507 and still answers its reads."""
    with small_ext4(tmp_path, size=16 * MiB, block_size=1024) as disk:
        db = disk / "index.sqlite3"
        _sqlite_db(db)
        reserve, spare = disk / "reserve", disk / "spare"
        reserve.write_bytes(b"r" * (left_kib << 10))
        spare.write_bytes(b"s" * (64 << 10))
        os.sync()
        filler = fill_bytes(disk)
        reserve.unlink()
        os.sync()
        done = subprocess.run(
            [sys.executable, "-c", _OPEN_READ_WRITE, str(db), str(spare), str(disk / "more")],
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=60,
        )
        out = done.stdout + done.stderr
        assert done.returncode == 0, f"at {left_kib} KiB left: {done.returncode} {out}"
        if left_kib < 256:
            assert out.startswith("507 no space left"), out
        else:
            assert "read 1" in out and "wrote" in out, out
            assert "read True" in out, out
        unfill(filler)


@pytest.mark.faults
def test_no_sigbus_on_a_full_1k_block_disk(tmp_path: Path) -> None:
    with small_ext4(tmp_path, size=24 * MiB, block_size=1024) as disk:
        seeded = seed(disk / "root", tmp_path / "tokens.json")
        server = _server(seeded, tmp_path, MEMORY_THREADS="4").start()
        try:
            h = seeded.headers
            # Grow the write-ahead logs and their shared-memory index while there is room.
            for n in range(60):
                requests.put(
                    f"{server.url}{PM}/tasks/g{n}/turns/0",
                    headers=h,
                    json={"summary_md": "g" * 500},
                    timeout=30,
                )
            workers = sorted(server.worker_pids())
            filler = fill_bytes(disk)
            assert free_bytes(disk) == 0
            statuses: dict[int, int] = {}
            urls = [
                f"{PM}/tasks",
                f"{PM}/project.md",
                f"{PM}/search?q=turn",
                f"{PM}/usage",
                f"{MS}/{seeded.store_id}/memories",
            ]
            for n in range(40):
                for url in urls:
                    r = requests.get(f"{server.url}{url}", headers=h, timeout=30)
                    statuses[r.status_code] = statuses.get(r.status_code, 0) + 1
                r = requests.put(
                    f"{server.url}{PM}/tasks/g{n}/turns/1",
                    headers=h,
                    json={"summary_md": "x"},
                    timeout=30,
                )
                statuses[r.status_code] = statuses.get(r.status_code, 0) + 1
            assert sorted(server.worker_pids()) == workers, server.log()[-3000:]
            assert "SIGBUS" not in server.log(), server.log()[-3000:]
            assert set(statuses) <= {200, 507}, statuses
            assert statuses.get(200, 0) >= 40 * len(urls), statuses
            done = flask(seeded.env(), "fsck")
            assert done.returncode in (0, 1), done  # ran to its end: no signal
            assert "fsck:" in done.stdout, done.stdout + done.stderr
            unfill(filler)
        finally:
            server.stop()


# What each delete removes, and where to see it afterwards.
_DELETES = {
    "task": f"{PM}/tasks/doomed",
    "turn": f"{PM}/tasks/doomed/turns/1",
    "artifact": f"{PM}/tasks/doomed/turns/0/artifacts/notes.txt",
    "store": f"{MS}/{{store}}",
}


def _doomed(seeded: Seeded) -> str:
    """Task ``doomed``: two turns of words found nowhere else, an artifact on the first; and
    a memory store of its own. Returns the store's id."""
    h = seeded.headers
    with seeded.client(**NO_FLOOR) as c:
        for turn in (0, 1):
            body = {"summary_md": f"zanzibar{turn} axolotl{turn}"}
            r = c.put(f"{PM}/tasks/doomed/turns/{turn}", headers=h, json=body)
            assert r.status_code == 200, r.data
        r = c.put(f"{PM}/tasks/doomed/turns/0/artifacts/notes.txt", headers=h, data=b"n" * 3000)
        assert r.status_code == 200, r.data
        r = c.post(MS, headers=h, json={"name": "doomed"})
        assert r.status_code == 200, r.data
        return str(r.json["id"])


def _still_there(c: Any, h: dict[str, str], what: str, store: str) -> dict[str, bool]:
    """Where the thing ``what`` deletes can still be seen: its own URL and the derived views."""
    seen = {"itself": c.get(_DELETES[what].format(store=store), headers=h).status_code == 200}
    if what in ("task", "turn"):
        word = "zanzibar1"
        seen["project.md"] = word.encode() in c.get(f"{PM}/project.md", headers=h).data
        seen["search"] = bool(
            c.get(f"{PM}/search", query_string={"q": word}, headers=h).json["hits"]
        )
        listed = c.get(f"{PM}/tasks/doomed", headers=h)
        seen["index"] = listed.status_code == 200 and 1 in [t["turn"] for t in listed.json["turns"]]
    if what == "task":
        seen["list"] = "doomed" in [
            t["task_id"] for t in c.get(f"{PM}/tasks", headers=h).json["tasks"]
        ]
    if what == "artifact":
        turn = c.get(f"{PM}/tasks/doomed/turns/0", headers=h).json
        seen["turn"] = "notes.txt" in [a["name"] for a in turn["artifacts"]]
    if what == "store":
        stores = c.get(MS, headers=h, query_string={"limit": 100}).json["data"]
        seen["list"] = store in [s["id"] for s in stores]
    return seen


@pytest.mark.faults
@pytest.mark.parametrize("what", list(_DELETES))
@pytest.mark.parametrize("left_kib", [0, 100, 400])
def test_a_delete_on_1k_blocks_is_refused_whole_or_done_whole(
    tmp_path: Path, what: str, left_kib: int
) -> None:
    """On 1 KiB blocks an index is not written with less than 256 KiB free (SIGBUS, see
    test_sqlite_on_1k_blocks_survives_any_room_left): a delete that needs it then is refused
    before its commit point (the rename into the trash, an artifact's new meta.json), so
    its 507 changed nothing; with room, it is done everywhere."""
    with small_ext4(tmp_path, size=24 * MiB, block_size=1024) as disk:
        seeded = seed(disk / "root", tmp_path / "tokens.json")
        store = _doomed(seeded)
        h = seeded.headers
        reserve = disk / "reserve"
        reserve.write_bytes(b"r" * (left_kib << 10))
        os.sync()
        filler = fill_bytes(disk)
        reserve.unlink()
        os.sync()
        assert (free_bytes(disk) < 256 << 10) == (left_kib < 256), free_bytes(disk)
        with seeded.client(**NO_FLOOR) as c:
            before = _still_there(c, h, what, store)
            assert all(before.values()), before
            r = c.delete(_DELETES[what].format(store=store), headers=h)
            after = _still_there(c, h, what, store)
        if left_kib < 256:
            assert r.status_code == 507, r.data
            assert after == before, f"a refused delete of a {what} did {after}"
        else:
            assert r.status_code in (200, 204), r.data
            assert not any(after.values()), f"a delete of a {what} left {after}"
        unfill(filler)
        if left_kib >= 256:
            # The purge after the answer may have met the full disk: it is owed until the
            # next write, sweep or repair (docs/guarantees.md, "Isolation").
            flask(seeded.env(), "fsck", "--repair")
        done = flask(seeded.env(), "fsck")
        assert done.returncode == 0, done.stdout + done.stderr
