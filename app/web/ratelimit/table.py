"""The buckets: one fixed-size table of GCRA budgets in memory every gunicorn worker shares.

A budget of ``rate`` units per second and ``burst`` units at once is one number, its
theoretical arrival time ``tat`` (the "generic cell rate algorithm", a token bucket kept as
one number): it admits a charge of ``cost`` units at ``now`` when
``max(tat, now) + cost / rate - now <= burst / rate``, and then moves ``tat`` there. A
``tat`` in the past is a full bucket, so a budget needs memory only while it is in use.

The table is created by the gunicorn master before it forks the workers
(``share_across_workers``, called from ``gunicorn.conf.py``), so a client gets the same
budget whichever workers its connections reach. Without that hook (``flask run``, tests,
``gunicorn`` without ``-c gunicorn.conf.py``) each process makes its own table. Keys come
only from authenticated token ids and validated tenant/project names, and the table never
grows: see :class:`BucketTable`.
"""

from __future__ import annotations

import fcntl
import math
import mmap
import os
import tempfile
import threading
import weakref
from collections.abc import Iterator, Sequence
from contextlib import contextmanager

SLOTS = 1 << 14  # 24 bytes each: 384 KiB of shared memory
PROBES = 8  # slots looked at per key: a key lives in one of the PROBES slots after its hash
# Seconds of arrival time that rounding may add to a charge: ``now + 1000.0 - now`` is not
# 1000.0 for most values of the monotonic clock, and a charge landing exactly on its limit
# (the first request of a burst of 1) must be admitted whatever the clock reads.
SLACK = 1e-6


def _shared_fd(size: int) -> int:
    """A descriptor of ``size`` zeroed bytes of memory that survives fork, for mmap and locks."""
    try:
        fd = os.memfd_create("memory-ratelimit", os.MFD_CLOEXEC)
    except (AttributeError, OSError):  # not Linux: an unlinked temp file does the same job
        with tempfile.TemporaryFile() as fh:
            fd = os.dup(fh.fileno())
    os.ftruncate(fd, size)
    return fd


_tables: weakref.WeakSet[BucketTable] = weakref.WeakSet()


def _after_fork_in_child() -> None:
    for table in _tables:
        table._mutex = threading.Lock()


os.register_at_fork(after_in_child=_after_fork_in_child)


class BucketTable:
    """GCRA budgets of up to ``slots`` keys, in memory shared with forked children.

    A slot holds a key, its bucket's arrival time and the seconds one unit cost at its last
    charge. A charge at another price (the limits changed, or a token acts in a project with
    other limits) first converts what the bucket owes into units at the new price, so a
    bucket keeps how full it is, not how long it is busy, when its rate changes.

    Open addressing: a key (a non-zero 64-bit hash) lives in one of the PROBES slots from
    ``hash % slots``, and each slot stores its key, so two keys that land on the same slot
    each keep their own budget. A slot whose time has passed holds a full bucket, which is
    the same as no entry: it is reused for the next new key. When every slot a new key may
    use is still in use, the one nearest to full is taken over (its key starts again from a
    full bucket); that needs more budgets in use at once than the table has slots, which
    bounds its memory whatever the requests.

    One lock guards the table: a ``threading.Lock`` for the threads of a process, then an
    fcntl lock on the shared descriptor for the processes, which the kernel releases if
    its holder dies (a semaphore held by a killed worker would stop every other one).
    """

    def __init__(self, slots: int = SLOTS) -> None:
        if slots < PROBES or slots & (slots - 1):
            raise ValueError("slots must be a power of two >= PROBES")
        self.slots = slots
        self._mask = slots - 1
        self._fd = _shared_fd(24 * slots)
        weakref.finalize(self, os.close, self._fd)
        self._map = mmap.mmap(self._fd, 24 * slots)  # MAP_SHARED: children see every write
        view = memoryview(self._map)
        self._keys = view[: 8 * slots].cast("q")
        self._tats = view[8 * slots : 16 * slots].cast("d")
        self._steps = view[16 * slots :].cast("d")
        self._mutex = threading.Lock()
        _tables.add(self)

    def _acquire(self) -> None:
        self._mutex.acquire()
        try:
            fcntl.lockf(self._fd, fcntl.LOCK_EX)
        except BaseException:
            self._mutex.release()
            raise

    def _release(self) -> None:
        try:
            fcntl.lockf(self._fd, fcntl.LOCK_UN)
        finally:
            self._mutex.release()

    @contextmanager
    def locked(self) -> Iterator[None]:
        """Hold the table's lock (tests use it to hold the lock from another process)."""
        self._acquire()
        try:
            yield
        finally:
            self._release()

    def _slot(self, key: int, step: float, now: float, taken: Sequence[int]) -> tuple[int, float]:
        """The slot of ``key`` and its bucket's time at ``step`` seconds per unit (``now``:
        full). ``taken``: slots this same call chose for other keys; they are not looked at
        (one of them may hold this key's expired entry, given up for a new key)."""
        keys, tats, mask = self._keys, self._tats, self._mask
        j = key & mask
        free = -1
        nearest, nearest_tat = -1, math.inf
        for _ in range(PROBES):
            if j not in taken:
                k = keys[j]
                if k == key:
                    return j, self._owed(j, step, now)
                if k == 0:
                    # Slots are never emptied, so a key is never stored past an empty slot.
                    return (free if free >= 0 else j), now
                tat = tats[j]
                if tat < now:
                    if free < 0:
                        free = j
                elif tat < nearest_tat:
                    nearest, nearest_tat = j, tat
            j = (j + 1) & mask
        return (free if free >= 0 else nearest), now

    def _owed(self, j: int, step: float, now: float) -> float:
        """Slot ``j``'s arrival time at ``step`` seconds per unit (``now`` when full)."""
        tat = self._tats[j]
        if tat <= now:
            return now
        was = self._steps[j]
        if was != step:
            tat = now + (tat - now) / was * step  # what it owes, at today's price
        return tat

    def take(
        self,
        charges: Sequence[tuple[int, float, float, float]],
        now: float,
        keep: Sequence[bool] | None = None,
    ) -> list[float]:
        """Charge every ``(key, step, units, limit)`` or none; return each bucket's new time.

        ``step`` is the seconds one unit costs (one over the rate). A charge is admitted when
        the bucket's new time is at most ``limit`` seconds ahead of ``now``. Nothing is stored
        unless all are admitted; the caller compares the times with its limits to see which
        refused. ``keep``: which of the charges are stored when all are admitted (the others
        are only checked: bytes announced, charged once they arrive).
        """
        keys, mask = self._keys, self._mask
        taken: list[int] = []
        times: list[float] = []
        admitted = True
        self._acquire()
        try:
            for key, step, units, limit in charges:
                j = key & mask
                if keys[j] == key and j not in taken:  # where a key usually is
                    tat = self._owed(j, step, now)
                else:
                    j, tat = self._slot(key, step, now, taken)
                tat += units * step
                if tat - now > limit + SLACK:
                    admitted = False
                taken.append(j)
                times.append(tat)
            if admitted:
                tats, steps = self._tats, self._steps
                for i, (key, step, _, _) in enumerate(charges):
                    if keep is not None and not keep[i]:
                        continue
                    j = taken[i]
                    keys[j] = key
                    tats[j] = times[i]
                    steps[j] = step
        finally:
            self._release()
        return times

    def charge(self, charges: Sequence[tuple[int, float, float]], now: float) -> list[float]:
        """Charge every ``(key, step, units)`` unconditionally (bytes already received);
        return each bucket's new time."""
        taken: list[int] = []
        times: list[float] = []
        self._acquire()
        try:
            for key, step, units in charges:
                j, tat = self._slot(key, step, now, taken)
                taken.append(j)
                self._keys[j] = key
                self._tats[j] = tat + units * step
                self._steps[j] = step
                times.append(tat + units * step)
        finally:
            self._release()
        return times


_shared: BucketTable | None = None


def share_across_workers() -> None:
    """Create the table every process forked from here will use (gunicorn's ``on_starting``)."""
    global _shared
    if _shared is None:
        _shared = BucketTable()


def shared_table() -> BucketTable | None:
    """The table ``share_across_workers`` made in this process or its parent, if any."""
    return _shared
