"""One server per storage root, and a start-up recovery proportional to what was in flight.

**The root lock.** A server holds an exclusive ``flock`` on ``<root>/.locks/_server.lock``
for its lifetime (the gunicorn master takes it before anything else; its workers inherit
it). A second server on the same root cannot take it and stops with the holder's PID; it
never touches the running sentinel and never repairs anything. Commands that only read,
and ``fsck --repair`` (which takes the same per-task and per-store locks the server's
writers take), still work beside a running server.

**What an unclean stop leaves.** The running sentinel (``<root>/.server-running``) is
written, durably, when a server starts and removed when it stops cleanly (kept, marked as a
clean stop, where a sync makes nothing durable: :meth:`Recovery.stopped_cleanly`). Found at start,
it means the last server did not stop cleanly, and what it may have left depends on how:

* a killed process (SIGKILL, OOM, a crash): the kernel still holds every write in its page
  cache, so the only inconsistent data is what the writes in flight had half-done, and the
  journals of both engines (tree/fs/txn.py) name exactly those. Recovery repairs them
  before the server accepts a connection, in time proportional to the writes in flight;
* a lost page cache (power loss, a kernel crash): every acknowledged record is on disk (it
  was fsynced before the answer), but derived files and the journals themselves may have
  lost recent writes, so nothing short of a full check finds what is stale. That check
  (``fsck --repair``) runs in the background while the server serves; ``/readyz`` answers
  503 until it is done.

The two are told apart without trusting the derived data: the sentinel records the boot id
of the machine and a nonce that is also written, *without* fsync, to a canary file
(``.locks/_canary``) first. A different boot id, or a canary that no longer holds the
sentinel's nonce, means unsynced data may have been lost. The nonce is renewed every few
seconds (:meth:`Recovery.renew`), so a canary that reached the disk by ordinary writeback
long ago does not hide a later loss.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import secrets
import weakref
from dataclasses import dataclass
from pathlib import Path

from app.storage.core.errors import StorageError, UnsafePath
from app.storage.core.recovery import Plan, RootBusy
from app.storage.tree.fs.atomic import make_dirs, write_atomic
from app.storage.tree.fs.layout import Layout
from app.storage.tree.fs.sync import fsync_dir, sync_is_barrier

BOOT_ID = Path("/proc/sys/kernel/random/boot_id")
# How the recovery marker starts once the full check ran and failed (not "running").
FAILED = "failed: "


def boot_id() -> str:
    try:
        return BOOT_ID.read_text().strip()
    except OSError:
        return ""


@dataclass
class Unfinished:
    """A start-up recovery that could not write (a full disk): what it was to do, why it
    stopped, and the running sentinel as it found it (it changes once the recovery is done)."""

    plan: Plan
    why: str
    sentinel: bytes | None


# Filled in the gunicorn master when its start-up recovery cannot write, and inherited by
# the workers it forks (one entry per storage root): the server then serves reads and
# refuses writes until the housekeeper's leader finishes the recovery (TreeStorage).
_UNFINISHED: dict[str, Unfinished] = {}


class Recovery:
    """The sentinel, the canary and the root lock of one storage root."""

    def __init__(self, layout: Layout) -> None:
        self.layout = layout
        self.sentinel = layout.sentinel()
        self.canary = layout.canary()
        self.lock_path = layout.server_lock()
        self.recovering = layout.recovering_marker()
        self._lock_fd: int | None = None

    # -- the root lock -----------------------------------------------------------------
    def acquire(self) -> None:
        """Hold the root for this process (and the workers it forks); RootBusy if taken."""
        if self._lock_fd is not None:
            return
        try:
            locks = self.layout.check_inside(self.layout.locks_dir())
        except UnsafePath:
            # Nothing can be locked through a link, so nothing could be written safely.
            raise RootBusy(
                self.layout.root,
                None,
                f"{self.layout.locks_dir()} is a symlink; it holds only lock files: remove it and start again",
            ) from None
        make_dirs(locks, self.layout.root)
        path = self.layout.own_file(self.lock_path)
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _read_pid(fd)
            os.close(fd)
            raise RootBusy(self.layout.root, holder) from None
        pid = f"{os.getpid()}\n".encode()
        # Over the old PID, then cut to length: on a full disk the block it had is reused
        # (a truncate first would free it, and the write could then find none: no start).
        with contextlib.suppress(OSError):
            os.pwrite(fd, pid, 0)
            os.ftruncate(fd, len(pid))
        self._lock_fd = fd
        weakref.finalize(self, _close_quietly, fd)

    def held_elsewhere(self) -> int | None:
        """The PID of a server holding the root, if one does (for commands that repair)."""
        path = self.lock_path
        try:
            fd = os.open(self.layout.check_inside(path), os.O_RDONLY | os.O_NOFOLLOW)
        except FileNotFoundError:
            return None
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
            except BlockingIOError:
                return _read_pid(fd) or -1
            fcntl.flock(fd, fcntl.LOCK_UN)
            return None
        finally:
            os.close(fd)

    def server_pid(self) -> int | None:
        """The PID the root lock file names (the server that took the root)."""
        try:
            fd = os.open(self.layout.check_inside(self.lock_path), os.O_RDONLY | os.O_NOFOLLOW)
        except FileNotFoundError:
            return None
        try:
            return _read_pid(fd)
        finally:
            os.close(fd)

    def release(self) -> None:
        if self._lock_fd is not None:
            os.close(self._lock_fd)
            self._lock_fd = None

    # -- sentinel and canary -------------------------------------------------------------
    def plan(self) -> Plan:
        """Read what the last server left (the caller holds the root lock)."""
        try:
            data = self.layout.read_bytes(self.sentinel)
        except StorageError as exc:
            return Plan(False, True, f"the running sentinel is unreadable: {exc}")
        if data is None:
            return Plan(True, False)
        try:
            last = json.loads(data)
            booted, nonce = str(last["boot_id"]), str(last["nonce"])
        except (ValueError, KeyError, TypeError):
            # A sentinel of an older version (a bare PID): nothing says what survived.
            return Plan(False, True, "the running sentinel names no boot or canary")
        if booted != boot_id():
            return Plan(False, True, "the machine restarted since")
        try:
            canary = self.layout.read_bytes(self.canary)
        except StorageError:
            canary = None
        stopped = last.get("stopped") is True
        if canary != nonce.encode():
            if stopped:
                return Plan(False, True, "the last stop was clean, but a cut since lost writes")
            return Plan(False, True, "writes the kernel had not flushed were lost")
        if stopped:
            return Plan(True, False)  # a clean stop, and nothing unsynced was lost since
        return Plan(False, False, "the server was killed; the kernel kept its writes")

    def renew(self, *, stopped: bool = False) -> None:
        """Write a new nonce: to the canary without fsync, then to the sentinel durably
        (``stopped``: marked as the sentinel of a clean stop, :meth:`stopped_cleanly`)."""
        nonce = secrets.token_hex(16)
        canary = self.layout.own_file(self.canary)
        fd = os.open(canary, os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW, 0o600)
        try:
            os.pwrite(fd, nonce.encode(), 0)
            os.ftruncate(fd, len(nonce))
        finally:
            os.close(fd)
        body: dict[str, object] = {"pid": self.server_pid(), "boot_id": boot_id(), "nonce": nonce}
        if stopped:
            body["stopped"] = True
        write_atomic(self.layout.own_file(self.sentinel), json.dumps(body).encode() + b"\n")

    def running(self) -> bool:
        return self.layout.tree.lstat(self.sentinel) is not None

    def stopped_cleanly(self) -> None:
        """Remove the sentinel (the caller synced the derived files first).

        Where that sync makes nothing durable (:func:`sync_is_barrier`: FUSE), the derived
        files may still be in a cache a power cut empties. The sentinel then stays, marked
        stopped, with a new nonce in the canary: the next start repairs nothing while the
        canary holds it, and runs the full check if a cut took it (:meth:`plan`).
        """
        if not sync_is_barrier(self.layout.root):
            self.renew(stopped=True)
            return
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.layout.check_inside(self.sentinel))
            fsync_dir(self.layout.root)

    # -- a recovery a full disk stopped ---------------------------------------------------
    def stopped_by_full_disk(self, plan: Plan, why: str) -> None:
        """Serve read-only: the recovery of ``plan`` could not write (``why``)."""
        try:
            sentinel = self.layout.read_bytes(self.sentinel)
        except StorageError:
            sentinel = None
        _UNFINISHED[str(self.layout.root)] = Unfinished(plan, why, sentinel)

    def unfinished(self) -> Unfinished | None:
        """The recovery still to finish, if any: in a worker, until the sentinel shows the
        leader finished it. Looked at on every call (one small read, only while read-only):
        a write sent once /readyz answers 200 must not meet a worker still refusing it."""
        entry = _UNFINISHED.get(str(self.layout.root))
        if entry is None:
            return None
        try:
            current = self.layout.read_bytes(self.sentinel)
        except StorageError:
            current = entry.sentinel
        if current != entry.sentinel:
            self.finished()
            return None
        return entry

    def finished(self) -> None:
        _UNFINISHED.pop(str(self.layout.root), None)

    # -- the background full check -------------------------------------------------------
    def mark_recovering(self, reason: str) -> None:
        write_atomic(self.layout.own_file(self.recovering), f"{reason}\n".encode())

    def mark_failed(self, why: str) -> None:
        """The full check ran and did not end clean: it stays pending, as failed (/readyz
        says so, and what to do), until a clean ``fsck --repair`` (:meth:`recovered`)."""
        self.mark_recovering(f"{FAILED}{why}")

    def recovering_reason(self) -> str | None:
        """Why the full check has not finished yet; None when nothing is pending."""
        try:
            data = self.layout.read_bytes(self.recovering)
        except StorageError:
            return "the recovery marker is unreadable"
        return None if data is None else data.decode("utf-8", "replace").strip()

    def recovered(self) -> None:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.layout.check_inside(self.recovering))


def check_failed(reason: str | None) -> str | None:
    """What a failed full check left (the marker's text after FAILED), else None."""
    if reason is None or not reason.startswith(FAILED):
        return None
    return reason[len(FAILED) :]


def _read_pid(fd: int) -> int | None:
    try:
        return int(os.pread(fd, 32, 0).split()[0])
    except (ValueError, IndexError, OSError):
        return None


def _close_quietly(fd: int) -> None:
    with contextlib.suppress(OSError):
        os.close(fd)
