"""What survives a power cut on the configured power-loss filesystem: one table, two filesystems.

Each row writes through the mount, cuts the power (``lazyfs::clear-cache``) and checks what
is left, through the mount and in the backing directory. The rows are the reference note's
table of LazyFS (shared/reference/power-loss-testing.md) plus a few the service relies on
(hard links, an fsync through another descriptor, truncation, mmap). Run against LazyFS
(``LAZYFS=/path/to/lazyfs``) and against the simulator, they say the simulator loses what
LazyFS loses and keeps what it keeps. Then: locks and SQLite in WAL mode work through it.
"""

from __future__ import annotations

import fcntl
import mmap
import os
import sqlite3
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.powerloss.mount import PowerLossMount

pytestmark = pytest.mark.powerloss

KIB8 = 8192
OLD, NEW = b"o" * KIB8, b"n" * KIB8


def put(path: Path, data: bytes, sync: str | None = "fsync", flags: int = 0) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | flags, 0o644)
    try:
        os.write(fd, data)
        if sync == "fsync":
            os.fsync(fd)
        elif sync == "fdatasync":
            os.fdatasync(fd)
    finally:
        os.close(fd)


def sync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)  # accepted by both filesystems, and a no-op in both
    finally:
        os.close(fd)


def write_fsync(d: Path) -> None:
    put(d / "f", NEW)


def write_fdatasync(d: Path) -> None:
    put(d / "f", NEW, sync="fdatasync")


def write_no_fsync(d: Path) -> None:
    put(d / "f", NEW, sync=None)


def append_unsynced(d: Path) -> None:
    put(d / "f", OLD)
    put(d / "f", NEW, sync=None, flags=os.O_APPEND)


def overwrite_unsynced(d: Path) -> None:
    put(d / "f", OLD)
    fd = os.open(d / "f", os.O_WRONLY)
    os.pwrite(fd, b"x" * 100, 1000)
    os.close(fd)


def append_records(d: Path) -> None:
    fd = os.open(d / "f", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    for i in range(5):
        os.write(fd, f"record {i}\n".encode())
        if i == 2:
            os.fsync(fd)
    os.close(fd)


def rename_synced_tmp(d: Path) -> None:
    put(d / "tmp", NEW)
    os.rename(d / "tmp", d / "f")


def rename_synced_tmp_dir_fsync(d: Path) -> None:
    rename_synced_tmp(d)
    sync_dir(d)


def rename_unsynced_tmp(d: Path) -> None:
    put(d / "tmp", NEW, sync=None)
    os.rename(d / "tmp", d / "f")
    sync_dir(d)


def replace_durable_unsynced(d: Path) -> None:
    put(d / "f", OLD)
    sync_dir(d)
    put(d / "tmp", NEW, sync=None)
    os.replace(d / "tmp", d / "f")


def mkdir_synced_file(d: Path) -> None:
    os.mkdir(d / "sub")
    put(d / "sub" / "f", NEW)


def unlink_no_dir_fsync(d: Path) -> None:
    put(d / "f", OLD)
    sync_dir(d)
    os.unlink(d / "f")


def fsync_through_hard_link(d: Path) -> None:
    put(d / "f", NEW, sync=None)
    os.link(d / "f", d / "g")
    fd = os.open(d / "g", os.O_RDONLY)
    os.fsync(fd)
    os.close(fd)


def fsync_other_descriptor(d: Path) -> None:
    put(d / "f", NEW, sync=None)
    fd = os.open(d / "f", os.O_RDONLY)  # a reader's descriptor: fsync covers the whole file
    os.fsync(fd)
    os.close(fd)


def truncate_unsynced(d: Path) -> None:
    put(d / "f", OLD)
    os.truncate(d / "f", 100)


def truncate_synced(d: Path) -> None:
    put(d / "f", OLD)
    fd = os.open(d / "f", os.O_WRONLY)
    os.ftruncate(fd, 100)
    os.fsync(fd)
    os.close(fd)


def open_trunc_unsynced(d: Path) -> None:
    put(d / "f", OLD)
    put(d / "f", NEW[:10], sync=None, flags=os.O_TRUNC)


def mmap_msync(d: Path) -> None:
    put(d / "f", OLD)
    with open(d / "f", "r+b") as fh, mmap.mmap(fh.fileno(), KIB8) as mm:
        mm[:] = NEW
        mm.flush()  # msync(MS_SYNC): an fsync of the range


def mmap_no_msync(d: Path) -> None:
    put(d / "f", OLD)
    with open(d / "f", "r+b") as fh, mmap.mmap(fh.fileno(), KIB8) as mm:
        mm[:] = NEW


@dataclass(frozen=True)
class Row:
    name: str
    act: Callable[[Path], None]
    expect: dict[str, bytes | None]  # path under the row's directory -> contents (None: absent)


ROWS = [
    Row("write+fsync: intact", write_fsync, {"f": NEW}),
    Row("write+fdatasync: intact", write_fdatasync, {"f": NEW}),
    Row("write, no fsync: exists, size 0", write_no_fsync, {"f": b""}),
    Row("8 KiB synced + 8 KiB appended unsynced: the synced 8 KiB", append_unsynced, {"f": OLD}),
    Row("unsynced overwrite in place: old contents", overwrite_unsynced, {"f": OLD}),
    Row(
        "O_APPEND, 3 records synced + 2 not: 3 records",
        append_records,
        {"f": b"record 0\nrecord 1\nrecord 2\n"},
    ),
    Row("tmp+fsync+rename, no dir fsync: survives", rename_synced_tmp, {"f": NEW, "tmp": None}),
    Row("tmp+fsync+rename+dir fsync: survives", rename_synced_tmp_dir_fsync, {"f": NEW}),
    Row("tmp without fsync, rename, dir fsync: size 0", rename_unsynced_tmp, {"f": b""}),
    Row(
        "replace a durable file via an unsynced tmp+rename: size 0",
        replace_durable_unsynced,
        {"f": b"", "tmp": None},
    ),
    Row("mkdir + synced file, no dir fsync: survives", mkdir_synced_file, {"sub/f": NEW}),
    Row("unlink, no dir fsync: stays deleted", unlink_no_dir_fsync, {"f": None}),
    Row(
        "fsync through a hard link: both names intact",
        fsync_through_hard_link,
        {"f": NEW, "g": NEW},
    ),
    Row("fsync through another descriptor: intact", fsync_other_descriptor, {"f": NEW}),
    Row("unsynced truncate: old contents", truncate_unsynced, {"f": OLD}),
    Row("truncate+fsync: truncated", truncate_synced, {"f": OLD[:100]}),
    Row("O_TRUNC and a rewrite, no fsync: old contents", open_trunc_unsynced, {"f": OLD}),
    Row("mmap write + msync: intact", mmap_msync, {"f": NEW}),
    Row("mmap write, no msync: old contents", mmap_no_msync, {"f": OLD}),
]


def contents(path: Path) -> bytes | None:
    try:
        return path.read_bytes()
    except FileNotFoundError:
        return None


def show(data: bytes | None) -> str:
    if data is None:
        return "absent"
    return f"{len(data)} bytes {data[:12]!r}{'...' if len(data) > 12 else ''}"


@pytest.mark.parametrize("row", ROWS, ids=[r.name for r in ROWS])
def test_what_survives_a_power_cut(plfs: PowerLossMount, area: Path, row: Row) -> None:
    row.act(area)
    plfs.cut_power()
    backing = plfs.backing / area.relative_to(plfs.mountpoint)
    wrong = []
    for rel, want in row.expect.items():
        for where, base in (("mount", area), ("backing", backing)):
            got = contents(base / rel)
            if got != want:
                wrong.append(f"{rel} ({where}): {show(got)}, expected {show(want)}")
    assert wrong == [], f"{plfs.kind}: {row.name}: {wrong}"


# -- what the service needs besides durability --------------------------------------------------
def test_directories_list_their_entries(area: Path) -> None:
    """By path and by descriptor (the tree walk opens directories and scans the descriptor),
    with the type of each entry."""
    (area / "sub").mkdir()
    put(area / "file", b"x", sync=None)
    os.symlink("file", area / "link")
    want = {"file": "file", "link": "link", "sub": "dir"}

    def kinds(entries: os.ScandirIterator[str] | os.ScandirIterator[bytes]) -> dict[str, str]:
        with entries as it:
            return {
                str(e.name): "link" if e.is_symlink() else "dir" if e.is_dir() else "file"
                for e in it
            }

    assert kinds(os.scandir(area)) == want
    fd = os.open(area, os.O_RDONLY | os.O_DIRECTORY)
    try:
        assert kinds(os.scandir(fd)) == want
        assert sorted(os.listdir(fd)) == sorted(want)
    finally:
        os.close(fd)


_TRY_LOCK = """
import fcntl, sys
kind, path = sys.argv[1], sys.argv[2]
with open(path, "a") as fh:
    try:
        if kind == "flock":
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        else:
            fcntl.lockf(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        print("busy")
    else:
        print("taken")
"""


def try_lock(kind: str, path: Path) -> str:
    out = subprocess.run(
        [sys.executable, "-c", _TRY_LOCK, kind, str(path)],
        capture_output=True,
        text=True,
        check=True,
        timeout=30,
    )
    return out.stdout.strip()


@pytest.mark.parametrize("kind", ["flock", "fcntl"])
def test_locks_exclude_another_process(area: Path, kind: str) -> None:
    path = area / "lock"
    with open(path, "a") as fh:
        if kind == "flock":
            fcntl.flock(fh, fcntl.LOCK_EX)
        else:
            fcntl.lockf(fh, fcntl.LOCK_EX)
        assert try_lock(kind, path) == "busy"
    assert try_lock(kind, path) == "taken"


_SQLITE_WRITER = """
import sqlite3, sys
db, who, synchronous = sys.argv[1], int(sys.argv[2]), sys.argv[3]
conn = sqlite3.connect(db, timeout=30, isolation_level=None)
conn.execute("PRAGMA journal_mode=WAL")
conn.execute(f"PRAGMA synchronous={synchronous}")
for i in range(150):
    conn.execute("BEGIN IMMEDIATE")
    conn.execute("INSERT INTO t VALUES (?, ?)", (who, i))
    conn.execute("COMMIT")
"""


_SQLITE_HOLDER = """
import sqlite3, sys, time
conn = sqlite3.connect(sys.argv[1])
conn.execute("SELECT 1 FROM t LIMIT 1").fetchall()
print("open", flush=True)
time.sleep(600)
"""


def sqlite_count(db: Path) -> tuple[int, str]:
    conn = sqlite3.connect(db)
    try:
        return conn.execute("SELECT count(*) FROM t").fetchone()[0], conn.execute(
            "PRAGMA integrity_check"
        ).fetchone()[0]
    finally:
        conn.close()


@pytest.mark.parametrize("synchronous", ["FULL", "NORMAL"])
def test_sqlite_wal_across_processes_and_a_cut(
    plfs: PowerLossMount, area: Path, synchronous: str
) -> None:
    """Two processes share one WAL database (its -shm is mmapped by both) while a third holds it
    open, as the workers share a listing; after a cut it opens intact. FULL keeps every
    commit; NORMAL keeps what the last checkpoint wrote."""
    db = area / "t.sqlite3"
    keeper = sqlite3.connect(db, isolation_level=None)
    keeper.execute("PRAGMA journal_mode=WAL")
    keeper.execute(f"PRAGMA synchronous={synchronous}")
    keeper.execute("CREATE TABLE t (who INTEGER, i INTEGER)")
    writers = [
        subprocess.Popen([sys.executable, "-c", _SQLITE_WRITER, str(db), str(w), synchronous])
        for w in range(2)
    ]
    assert [w.wait(timeout=120) for w in writers] == [0, 0]
    keeper.execute("PRAGMA wal_checkpoint(FULL)")
    checkpointed = keeper.execute("SELECT count(*) FROM t").fetchone()[0]
    assert checkpointed == 300
    for i in range(50):
        keeper.execute("INSERT INTO t VALUES (9, ?)", (i,))
    # The last connection to close would checkpoint (and sync) the WAL: it is killed instead.
    holder = subprocess.Popen(
        [sys.executable, "-c", _SQLITE_HOLDER, str(db)], stdout=subprocess.PIPE
    )
    assert holder.stdout is not None and holder.stdout.readline().strip() == b"open"
    keeper.close()
    holder.kill()
    holder.wait(timeout=30)
    holder.stdout.close()
    plfs.cut_power()
    count, integrity = sqlite_count(db)
    assert integrity == "ok"
    if synchronous == "FULL":
        assert count == 350
    else:
        assert checkpointed <= count <= 350
