"""Real faults for the robustness tests, made the way a machine makes them.

- a file the service cannot open: owned by ``nobody``, mode 000, read by a process that
  runs as root without ``CAP_DAC_OVERRIDE`` (:data:`NO_DAC_OVERRIDE`, util-linux's setpriv);
- EIO: the FUSE simulator of the power-loss tests (tests/powerloss/simfs.py) fails an
  operation on command (:func:`eio_mount`);
- a full disk: a small ext4 image, loop-mounted (:func:`small_ext4`), filled to its last
  byte (:func:`fill_bytes`) or its last inode (:func:`fill_inodes`);
- a clock that steps: Debian's libfaketime, preloaded, reading its offset from a file the
  test rewrites while the process runs (:class:`SteppedClock`).

Root is needed for the mounts and for setpriv: CI runs as root (.ci/run). Elsewhere these
tests fail, unless ``MEMORY_ALLOW_NO_ROOT=1`` makes them skip (never set in CI).
"""

from __future__ import annotations

import contextlib
import errno
import gc
import json
import os
import pwd
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from email.utils import parsedate_to_datetime
from pathlib import Path
from typing import Any

import pytest
import requests

from tests.e2e.conftest import REPO, VENV_BIN
from tests.powerloss.mount import PowerLossMount, mounted

PM = "/sandbox/memory/v1"
MS = "/v1/memory_stores"

# Root, less the two capabilities that let it open any file: what a service user meets.
NO_DAC_OVERRIDE = [
    "setpriv",
    "--bounding-set=-dac_override,-dac_read_search",
    "--inh-caps=-dac_override,-dac_read_search",
    "--",
]
LIBFAKETIME = "/usr/lib/x86_64-linux-gnu/faketime/libfaketimeMT.so.1"


def need_root(what: str) -> None:
    """Fail (skip with ``MEMORY_ALLOW_NO_ROOT=1``) when not root: ``what`` needs it."""
    if os.geteuid() == 0:
        return
    message = f"{what} needs root (CI runs as root)"
    if os.environ.get("MEMORY_ALLOW_NO_ROOT") == "1":
        pytest.skip(message)
    pytest.fail(message)


# -- a file nobody but its owner may open -------------------------------------------------------
@contextlib.contextmanager
def unreadable(path: Path) -> Iterator[Path]:
    """``path`` owned by nobody with mode 000 (a process in :data:`NO_DAC_OVERRIDE` cannot
    open it); owner and mode given back afterwards."""
    need_root("a file only another user could open")
    st = os.lstat(path)
    nobody = pwd.getpwnam("nobody")
    os.chown(path, nobody.pw_uid, nobody.pw_gid, follow_symlinks=False)
    os.chmod(path, 0)
    try:
        yield path
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.chown(path, st.st_uid, st.st_gid, follow_symlinks=False)
            os.chmod(path, st.st_mode & 0o7777)


def no_dac(argv: list[str]) -> list[str]:
    """``argv`` run as root without CAP_DAC_OVERRIDE and CAP_DAC_READ_SEARCH."""
    need_root("setpriv")
    return [*NO_DAC_OVERRIDE, *argv]


# -- a root with something in it, and the CLI on it -----------------------------------------------
@dataclass
class Seeded:
    """A storage root written through the API (in process), and the paths of its records."""

    root: Path
    tokens_file: Path
    secret: str
    store_id: str = ""
    memory_id: str = ""
    versions: list[str] = field(default_factory=list)

    @property
    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.secret}"}

    def env(self, **extra: str) -> dict[str, str]:
        return {
            **os.environ,
            "MEMORY_STORAGE_ROOT": str(self.root),
            "MEMORY_TOKENS_FILE": str(self.tokens_file),
            "MEMORY_LOG_LEVEL": "WARNING",
            **extra,
        }

    def task(self, task_id: str) -> Path:
        return self.root / "acme" / "web" / task_id

    def turn(self, task_id: str, turn: int) -> Path:
        return self.task(task_id) / f"{turn:04d}-turn"

    def store(self) -> Path:
        return self.root / "acme" / "web" / "_stores" / self.store_id

    def version(self, index: int) -> Path:
        return self.store() / "versions" / f"{self.versions[index]}.json"

    @contextlib.contextmanager
    def client(self, **config: Any) -> Iterator[Any]:
        """The API in process on this root (a test client that reads every body)."""
        from app import create_app
        from tests.conftest import BufferedClient
        from tests.storage._helpers import upkeep_done

        app = create_app(
            {
                "TESTING": True,
                "STORAGE_ROOT": str(self.root),
                "TOKENS_FILE": str(self.tokens_file),
                "LOCK_TIMEOUT": 5.0,
                **config,
            }
        )
        app.test_client_class = BufferedClient
        try:
            yield app.test_client()
        finally:
            # The upkeep the requests started after their answers (a purge, a compaction)
            # runs in threads of this process: it ends before the client does, or it would
            # write into the root while a test fills its disk or runs fsck on it.
            upkeep_done(getattr(app.extensions["storage"], "tasks", None))
            app.extensions["traffic"].close()
            app.extensions["storage"].close()


def seed(root: Path, tokens_file: Path, *, memories: bool = True) -> Seeded:
    """Tasks t (turns 0 and 1, an artifact a.bin on turn 0) and u (turns 0 and 1), and a
    memory store with one memory updated once (two versions)."""
    from app import create_app

    app = create_app({"TESTING": True, "STORAGE_ROOT": str(root), "TOKENS_FILE": str(tokens_file)})
    _, secret = app.extensions["token_registry"].create(
        role="project_admin", tenant="acme", project="web"
    )
    app.extensions["traffic"].close()
    app.extensions["storage"].close()
    seeded = Seeded(root, tokens_file, secret)
    h = seeded.headers
    with seeded.client() as c:
        for task in ("t", "u"):
            for turn in (0, 1):
                body = {"meta": {"n": turn}, "summary_md": f"{task} turn {turn}"}
                r = c.put(f"{PM}/tasks/{task}/turns/{turn}", headers=h, json=body)
                assert r.status_code == 200, r.data
        r = c.put(f"{PM}/tasks/t/turns/0/artifacts/a.bin", headers=h, data=ARTIFACT)
        assert r.status_code == 200, r.data
        if memories:
            r = c.post(MS, headers=h, json={"name": "notes"})
            assert r.status_code == 200, r.data
            seeded.store_id = r.json["id"]
            r = c.post(
                f"{MS}/{seeded.store_id}/memories",
                headers=h,
                json={"path": "/a.md", "content": "first"},
            )
            assert r.status_code == 200, r.data
            seeded.memory_id = r.json["id"]
            r = c.post(
                f"{MS}/{seeded.store_id}/memories/{seeded.memory_id}",
                headers=h,
                json={"content": "second"},
            )
            assert r.status_code == 200, r.data
            r = c.get(
                f"{MS}/{seeded.store_id}/memory_versions",
                headers=h,
                query_string={"memory_id": seeded.memory_id},
            )
            seeded.versions = [v["id"] for v in reversed(r.json["data"])]
            assert len(seeded.versions) == 2
    return seeded


ARTIFACT = bytes(range(256)) * 40


def flask(
    env: dict[str, str], *args: str, prefix: Sequence[str] = (), timeout: float = 120
) -> subprocess.CompletedProcess[str]:
    """``flask --app wsgi ARGS`` (``prefix``: e.g. :func:`no_dac`'s), whatever its status."""
    return subprocess.run(
        [*prefix, str(VENV_BIN / "flask"), "--app", "wsgi", *args],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def lost_found(root: Path) -> list[str]:
    """What fsck moved to ``<root>/.lost+found`` (paths under it)."""
    base = root / ".lost+found"
    if not base.exists():
        return []
    return sorted(str(p.relative_to(base)) for p in base.rglob("*") if not p.is_dir())


def power_lost(root: Path) -> None:
    """Make the next start see what a power cut leaves: the running sentinel of a server
    on another boot (docs/guarantees.md, "Power loss"), so its full check runs."""
    sentinel = root / ".server-running"
    sentinel.write_text(json.dumps({"pid": 1, "boot_id": "another boot", "nonce": "0"}) + "\n")


def close_cached_connections(under: Path) -> None:
    """Close the idle SQLite connections to files under ``under``: the engine keeps them
    open between requests, and a mount with files open cannot be unmounted (a FUSE
    daemon then outlives a lazy unmount until the test process exits)."""
    from app.storage.tree.audit import TreeAudit
    from app.storage.tree.sqlite.listing import Listing
    from app.storage.tree.sqlite.store_index import StoreIndex

    prefix = str(under).rstrip("/") + "/"
    for pool in (Listing._pool, StoreIndex._pool, TreeAudit._pool):
        pool.forget(lambda p: p.startswith(prefix))
    # The lock module's _waiting hint files, kept open once per process and lock directory.
    from app.storage.tree.fs import locks

    waiting = getattr(locks, "_Waiting", None)
    fds: dict[str, int | None] = getattr(waiting, "_fds", {})
    for directory in [d for d in fds if (d + "/").startswith(prefix)]:
        fd = fds.pop(directory)
        if fd is not None:
            os.close(fd)


# -- EIO through the simulator -------------------------------------------------------------------
@contextlib.contextmanager
def eio_mount() -> Iterator[PowerLossMount]:
    """The FUSE simulator mounted over a directory of its own (``.mountpoint``); its
    ``fail(op, path)`` and ``heal()`` turn EIO on and off."""
    if not os.path.exists("/dev/fuse"):
        pytest.fail("/dev/fuse is missing: the EIO tests mount the FUSE simulator")
    # Not under pytest's tmp_path: its retention may delete a directory still mounted.
    with (
        tempfile.TemporaryDirectory(prefix="eio_") as tmp,
        mounted(Path(tmp)) as fs,
    ):
        try:
            yield fs
        finally:
            fs.heal()
            # Descriptors the test's apps left to finalizers are closed while still mounted.
            gc.collect()
            close_cached_connections(fs.mountpoint)
            # What is still open under the mount (the directory descriptors an engine keeps
            # for openat2 until it is collected) would keep the daemon alive after a lazy
            # unmount: nothing on it is needed any more, so it is stopped at once.
            subprocess.run(["fusermount3", "-uz", str(fs.mountpoint)], check=False)
            fs.proc.kill()


# -- a small disk ------------------------------------------------------------------------------
@contextlib.contextmanager
def small_ext4(
    workdir: Path, *, size: int, block_size: int = 4096, inodes: int | None = None
) -> Iterator[Path]:
    """A fresh ext4 of ``size`` bytes loop-mounted at ``workdir/disk``, with no blocks
    reserved for root (so "full" is full for the root-run tests too)."""
    need_root("a loop-mounted ext4")
    image, target = workdir / "disk.img", workdir / "disk"
    target.mkdir(parents=True, exist_ok=True)
    with image.open("wb") as fh:
        fh.truncate(size)
    args = ["mkfs.ext4", "-q", "-F", "-m", "0", "-b", str(block_size)]
    if inodes is not None:
        args += ["-N", str(inodes)]
    subprocess.run([*args, str(image)], check=True, capture_output=True)
    subprocess.run(["mount", "-o", "loop", str(image), str(target)], check=True)
    try:
        yield target
    finally:
        gc.collect()  # descriptors the test's apps left to finalizers
        close_cached_connections(target)
        if subprocess.run(["umount", str(target)], check=False).returncode != 0:
            subprocess.run(["umount", "-l", str(target)], check=False)
        with contextlib.suppress(OSError):
            image.unlink()


def free_bytes(path: Path) -> int:
    st = os.statvfs(path)
    return st.f_bavail * st.f_frsize


def free_inodes(path: Path) -> int:
    return os.statvfs(path).f_favail


def fill_bytes(mount: Path) -> Path:
    """Write a filler under ``mount`` until not one more byte fits; return its directory.

    Files of halving sizes, each synced (ext4 reserves delayed blocks at write time, and
    a sync turns its estimate into what is really used), until a 1-byte write fails."""
    filler = mount / "filler"
    filler.mkdir(exist_ok=True)
    size, count = 1 << 20, len(os.listdir(filler))
    while size >= 1:
        path = filler / f"f{count}"
        count += 1
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        except OSError as exc:
            if exc.errno != errno.ENOSPC:
                raise
            size //= 2
            continue
        try:
            while True:
                os.write(fd, b"\0" * size)
        except OSError as exc:
            if exc.errno != errno.ENOSPC:
                raise
        finally:
            with contextlib.suppress(OSError):
                os.fsync(fd)
            os.close(fd)
        os.sync()
        size //= 2
    return filler


def fill_inodes(mount: Path) -> Path:
    """Create empty files under ``mount`` until no inode is left; return their directory."""
    filler = mount / "inodes"
    filler.mkdir(exist_ok=True)
    count = len(os.listdir(filler))
    while True:
        try:
            os.close(os.open(filler / f"i{count}", os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
        except OSError as exc:
            if exc.errno != errno.ENOSPC:
                raise
            return filler
        count += 1


def unfill(filler: Path) -> None:
    shutil.rmtree(filler)
    os.sync()


# -- a clock that steps --------------------------------------------------------------------------
# libfaketime 0.9.10 with the monotonic clock left real turns the absolute monotonic sleep of
# Python >= 3.11's time.sleep into a negative one (EINVAL; wolfcw/libfaketime#426). Preloaded
# first, this passes monotonic sleeps straight to the kernel and every other one on.
_SLEEP_SHIM = r"""
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

int clock_nanosleep(clockid_t clock, int flags, const struct timespec *req, struct timespec *rem) {
    static int (*next)(clockid_t, int, const struct timespec *, struct timespec *);
    if (clock == CLOCK_MONOTONIC || clock == CLOCK_MONOTONIC_RAW || clock == CLOCK_BOOTTIME)
        return syscall(SYS_clock_nanosleep, clock, flags, req, rem) == 0 ? 0 : errno;
    if (!next)
        next = dlsym(RTLD_NEXT, "clock_nanosleep");
    return next(clock, flags, req, rem);
}
"""


def _sleep_shim(workdir: Path) -> Path:
    if shutil.which("gcc") is None:
        pytest.fail("gcc is missing: the clock-step tests build a 15-line shim for libfaketime")
    source, built = workdir / "sleepshim.c", workdir / "sleepshim.so"
    source.write_text(_SLEEP_SHIM)
    subprocess.run(
        ["gcc", "-shared", "-fPIC", "-O2", "-o", str(built), str(source), "-ldl"],
        check=True,
        capture_output=True,
    )
    return built


# How long a process under libfaketime keeps the offset it read from its file: a step is seen
# by a process at its first reading of the clock after that long (SteppedClock.served waits
# for a server's workers to show it).
FAKETIME_CACHE_SECONDS = 1


class SteppedClock:
    """libfaketime for a child process, its offset read from a file the test rewrites
    (:meth:`step`: the process sees it within a second).

    The monotonic clock is left alone (a real step of the wall clock does not move it),
    and so are file times (the kernel writes the real ones)."""

    def __init__(self, workdir: Path) -> None:
        if not os.path.exists(LIBFAKETIME):
            pytest.fail(f"{LIBFAKETIME} is missing: apt-get install faketime")
        self.shim = _sleep_shim(workdir)
        self.file = workdir / "faketime"
        self.step(0)

    def step(self, days: float) -> None:
        """From now on the process's wall clock is ``days`` away from the real one."""
        tmp = self.file.with_suffix(".tmp")
        tmp.write_text(f"{days:+.6f}d\n")
        os.replace(tmp, self.file)

    def served(self, url: str, days: float, *, timeout: float = 30) -> None:
        """Return once the server at ``url`` (any path: each answer's Date is the clock of the
        worker that gave it) tells the time ``days`` from the real one, on six answers in a
        row, which cover its workers. A worker sees a step at its first look at the clock
        after libfaketime's cache lapses, which a loaded machine can put seconds after it."""
        want = timedelta(days=days)
        deadline = time.monotonic() + timeout
        right = 0
        while right < 6:
            served = parsedate_to_datetime(requests.get(url, timeout=30).headers["Date"])
            off = abs(served - datetime.now(UTC) - want)
            right = right + 1 if off < timedelta(minutes=1) else 0
            if time.monotonic() > deadline:
                pytest.fail(f"{url}: the server's clock is {off} from {days} day(s) ahead")
            time.sleep(0.1)

    def env(self) -> dict[str, str]:
        return {
            "LD_PRELOAD": f"{self.shim} {LIBFAKETIME}",
            "FAKETIME_TIMESTAMP_FILE": str(self.file),
            "FAKETIME_CACHE_DURATION": str(FAKETIME_CACHE_SECONDS),
            "FAKETIME_DONT_FAKE_MONOTONIC": "1",
            "NO_FAKE_STAT": "1",
        }
