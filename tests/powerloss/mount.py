"""Mount a power-loss filesystem over a backing directory, and cut its power.

Two filesystems speak the same control protocol: LazyFS (``LAZYFS=/path/to/lazyfs``, built
by hand, never part of this repository) and the simulator in simfs.py, which CI installs
from the package registries (Debian's fuse3, PyPI's mfusepy). Both keep what was written but
not fsynced in their own memory and drop it on ``lazyfs::clear-cache``.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import os
import select
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
MOUNT_TIMEOUT = 60.0  # LazyFS allocates its whole cache before it mounts
LAZYFS_CACHE = "1gb"  # above the unsynced data of one cycle: a full LazyFS cache writes through

_libc = ctypes.CDLL(None, use_errno=True)


class MountError(RuntimeError):
    """The filesystem did not mount, or did not answer a command."""


def lazyfs_binary() -> Path | None:
    """The LazyFS named by ``$LAZYFS`` (None: use the simulator)."""
    value = os.environ.get("LAZYFS", "").strip()
    if not value:
        return None
    path = Path(value)
    if not (path.is_file() and os.access(path, os.X_OK)):
        raise MountError(f"LAZYFS={value} is not an executable file")
    return path


def is_mounted(path: Path) -> bool:
    target = str(path.resolve())
    with open("/proc/self/mountinfo", encoding="utf-8") as fh:
        return any(line.split()[4] == target for line in fh)


@dataclass
class PowerLossMount:
    """A mounted power-loss filesystem: ``mountpoint`` shows ``backing`` plus unsynced data."""

    kind: str  # "lazyfs" or "simulator"
    workdir: Path
    backing: Path
    mountpoint: Path
    proc: subprocess.Popen[bytes]
    fifo: Path
    done_fd: int
    log_path: Path
    cuts: int = 0

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")[-4000:]

    def cut_power(self, timeout: float = 60.0) -> None:
        """Lose every write nobody fsynced. Stop every writer first (SIGKILL), as on a real cut.

        syncfs first: pages a killed process dirtied through mmap (SQLite's -shm) are still
        in the kernel's page cache, and writeback would deliver them to the filesystem after
        the cut. Written now, they are unsynced data like any other and are dropped with it.
        """
        self._check_alive()
        fd = os.open(self.mountpoint, os.O_RDONLY | os.O_DIRECTORY)
        try:
            if _libc.syncfs(fd) != 0:
                err = ctypes.get_errno()
                raise OSError(err, f"syncfs {self.mountpoint}: {os.strerror(err)}")
        finally:
            os.close(fd)
        self._ask("lazyfs::clear-cache", "finished::clear-cache", timeout)
        self.cuts += 1

    def fail(self, op: str, path: Path | str, timeout: float = 30.0) -> None:
        """Make every ``op`` (open, read, write) at or under ``path`` (a path under the
        mountpoint) fail with EIO, until :meth:`heal` (the simulator only)."""
        if self.kind == "lazyfs":
            raise MountError("EIO on command is the simulator's (simfs.py), not LazyFS's")
        inside = Path(path).relative_to(self.mountpoint).as_posix()
        target = "/" if inside == "." else f"/{inside}"
        self._ask(f"simfs::fail {op} {target}", "finished::fail", timeout)

    def heal(self, timeout: float = 30.0) -> None:
        """No operation fails any more."""
        self._ask("simfs::fail clear", "finished::fail", timeout)

    def _ask(self, text: str, answer_text: str, timeout: float) -> None:
        """Send a command and wait for its answer on the completion fifo."""
        self._drain()
        deadline = time.monotonic() + timeout
        self.command(text, deadline)
        answer = b""
        while answer_text.encode() not in answer:
            left = deadline - time.monotonic()
            if left <= 0:
                raise MountError(
                    f"{self.kind}: no answer to {text!r} in {timeout:.0f}s\n{self.log()}"
                )
            ready, _, _ = select.select([self.done_fd], [], [], min(left, 1.0))
            if ready:
                answer += os.read(self.done_fd, 4096)
            self._check_alive()

    def command(self, text: str, deadline: float) -> None:
        """Send one command (one write: LazyFS takes each read as one command)."""
        while True:
            try:
                fd = os.open(self.fifo, os.O_WRONLY | os.O_NONBLOCK)
                break
            except OSError as exc:  # ENXIO: the daemon has not opened its end yet
                if exc.errno != errno.ENXIO or time.monotonic() > deadline:
                    raise MountError(f"{self.kind}: cannot send {text!r} ({exc})") from None
                self._check_alive()
                time.sleep(0.05)
        try:
            os.write(fd, f"{text}\n".encode())
        finally:
            os.close(fd)

    def _drain(self) -> None:
        while select.select([self.done_fd], [], [], 0)[0]:
            if not os.read(self.done_fd, 4096):
                break

    def _check_alive(self) -> None:
        if self.proc.poll() is not None:
            raise MountError(f"{self.kind} exited with {self.proc.returncode}:\n{self.log()}")

    def unmount(self) -> None:
        """Unmount (what is still unsynced is lost, as with LazyFS) and stop the daemon."""
        if is_mounted(self.mountpoint):
            done = subprocess.run(
                ["fusermount3", "-u", str(self.mountpoint)], capture_output=True, check=False
            )
            if done.returncode != 0:
                subprocess.run(["fusermount3", "-uz", str(self.mountpoint)], check=False)
        try:
            self.proc.wait(timeout=30)  # LazyFS always exits with SIGABRT here: not an error
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=30)
        with contextlib.suppress(OSError):
            os.close(self.done_fd)


def mount(workdir: Path, lazyfs: Path | None = None, *, ext4: bool = False) -> PowerLossMount:
    """Mount LazyFS (``lazyfs``: its binary) or the simulator over ``workdir/backing``
    (``ext4``: the simulator with ext4's ordering and a syncfs command, simfs.py)."""
    if ext4 and lazyfs is not None:
        raise MountError("--ext4 is the simulator's: LazyFS has no syncfs command")
    if shutil.which("fusermount3") is None:
        raise MountError("fusermount3 not found: install Debian's fuse3 (and libfuse3-3)")
    if not os.path.exists("/dev/fuse"):
        raise MountError("/dev/fuse is missing: this machine cannot mount FUSE filesystems")
    backing, mountpoint = workdir / "backing", workdir / "mnt"
    backing.mkdir(parents=True, exist_ok=True)
    mountpoint.mkdir(parents=True, exist_ok=True)
    fifo, done = workdir / "faults.fifo", workdir / "faults_done.fifo"
    for path in (fifo, done):
        if not path.exists():
            os.mkfifo(path)
    log_path = workdir / "fs.log"
    if lazyfs is not None:
        kind = "lazyfs"
        config = workdir / "lazyfs.toml"
        if "-o" in str(config).lower():
            # LazyFS takes a --config-path containing "-o" (any case) for a mount option
            # and silently falls back to config/default.toml.
            raise MountError(f"LazyFS cannot use a config path containing '-o': {config}")
        config.write_text(
            "[faults]\n"
            f'fifo_path="{fifo}"\n'
            f'fifo_path_completed="{done}"\n'
            "[cache]\n"
            "apply_eviction=false\n"
            "[cache.simple]\n"
            f'custom_size="{LAZYFS_CACHE}"\n'
            "blocks_per_page=1\n"
            "[filesystem]\n"
            "log_all_operations=false\n"
            f'logfile="{workdir / "lazyfs.log"}"\n'
        )
        # subdir is mandatory: without it LazyFS passes paths straight to /.
        args = [str(lazyfs), str(mountpoint), "--config-path", str(config)]
        args += ["-o", "modules=subdir", "-o", f"subdir={backing}", "-f"]
    else:
        kind = "simulator (ext4 order, group commit)" if ext4 else "simulator"
        args = [sys.executable, "-m", "tests.powerloss.simfs", str(backing), str(mountpoint)]
        args += ["--fifo", str(fifo), "--done-fifo", str(done)] + (["--ext4"] if ext4 else [])
    # LazyFS answers nothing until its completion fifo has a reader: open it first.
    done_fd = os.open(done, os.O_RDONLY | os.O_NONBLOCK)
    with open(log_path, "ab") as log:
        proc = subprocess.Popen(
            args, cwd=REPO, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
    mounted = PowerLossMount(kind, workdir, backing, mountpoint, proc, fifo, done_fd, log_path)
    deadline = time.monotonic() + MOUNT_TIMEOUT
    while not is_mounted(mountpoint):
        if proc.poll() is not None:
            os.close(done_fd)
            raise MountError(
                f"{kind} exited with {proc.returncode} before mounting:\n{mounted.log()}"
            )
        if time.monotonic() > deadline:
            mounted.unmount()
            raise MountError(f"{kind} did not mount in {MOUNT_TIMEOUT:.0f}s:\n{mounted.log()}")
        time.sleep(0.05)
    return mounted


@contextlib.contextmanager
def mounted(
    workdir: Path, lazyfs: Path | None = None, *, ext4: bool = False
) -> Iterator[PowerLossMount]:
    fs = mount(workdir, lazyfs, ext4=ext4)
    try:
        yield fs
    finally:
        fs.unmount()
