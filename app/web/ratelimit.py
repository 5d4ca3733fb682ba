"""Rate limits per token and per project, one budget for the whole server.

Every budget is a GCRA bucket (the "generic cell rate algorithm", a token bucket kept as one
number): its theoretical arrival time ``tat``. A budget of ``rate`` units per second and
``burst`` units at once admits a charge of ``cost`` units at ``now`` when
``max(tat, now) + cost / rate - now <= burst / rate``, and then moves ``tat`` there. A
``tat`` in the past is a full bucket, so a budget needs memory only while it is in use.

Each request charges one unit to the request budget of its token and of its project; a
write (any method but GET, HEAD, OPTIONS) also charges its body bytes to their upload
budgets as they are read (:class:`UploadMeter`), never as announced: a ``Content-Length``
claimed and never sent costs nothing. Before the body is read, the upload budgets must
admit its ``Content-Length`` (a body without one: they must not be overdrawn); a length
larger than the burst is admitted only by a full bucket, which that one request may then
overdraw by its own bytes: the time it borrowed is repaid before the budget admits anything
else. A read that leaves a budget overdrawn beyond that (concurrent uploads, each admitted
while the budget was not yet spent) refuses the rest of the body with 429, so together they
never take more than the burst. A request is admitted only if every budget it charges
admits it; otherwise none is charged.

The buckets of every gunicorn worker live in one fixed-size table in shared memory, created
by the gunicorn master before it forks the workers (``share_across_workers``, called from
``gunicorn.conf.py``), so a client gets the same budget whichever workers its connections
reach. Without that hook (``flask run``, tests, ``gunicorn`` without ``-c gunicorn.conf.py``)
each process makes its own table. Keys come only from authenticated token ids and validated
tenant/project names, and the table never grows: see :class:`BucketTable`.

Limits come from the MEMORY_RATE_LIMIT_* settings, overridden per tenant and per project
by ``<root>/.limits.json`` (app/storage/core/limits.py, ``flask --app wsgi ratelimit``); a
request in a project is held to that project's limits, per project and per token. Each
worker looks at the file's stat at most once a second and re-reads it when it changed.
"""

from __future__ import annotations

import fcntl
import logging
import math
import mmap
import os
import tempfile
import threading
import time
import weakref
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from flask import Blueprint, Flask, current_app, g, request
from werkzeug.wrappers import Response

from app.storage.core.errors import StorageError
from app.storage.core.limits import NO_OVERRIDES, RateOverride, RateOverrides
from app.storage.core.task_rules import max_form_bytes
from app.storage.interface import LimitsStore
from app.web.body import COUNTED_INPUT, CountingInput
from app.web.errors import ApiError

log = logging.getLogger("app.ratelimit")

READ_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
SLOTS = 1 << 14  # 24 bytes each: 384 KiB of shared memory
PROBES = 8  # slots looked at per key: a key lives in one of the PROBES slots after its hash
CHECK_EVERY = 1.0  # seconds between two looks at the overrides file's stat, per worker
# Seconds of arrival time that rounding may add to a charge: ``now + 1000.0 - now`` is not
# 1000.0 for most values of the monotonic clock, and a charge landing exactly on its limit
# (the first request of a burst of 1) must be admitted whatever the clock reads.
SLACK = 1e-6


# -- the shared table --------------------------------------------------------------------------
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


# -- limits ------------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Rate:
    """``per_second`` units per second, ``burst`` at once."""

    per_second: float
    burst: int
    unit: str  # the draft's quota unit: "requests" or "content-bytes"
    interval: float  # seconds per unit
    window: float  # seconds an empty bucket takes to refill

    def describe(self) -> str:
        if self.unit == "requests":
            return f"{self.per_second:g} requests/s, burst {self.burst}"
        return f"{_size(self.per_second)}/s of request bodies, burst {_size(self.burst)}"


def _size(count: float) -> str:
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if count >= size:
            return f"{count / size:.3g} {unit}"
    return f"{count:.0f} bytes"


@dataclass(frozen=True, slots=True)
class Limits:
    """The budgets of one project (each held per project and per token)."""

    requests: Rate | None
    upload: Rate | None
    policy: str  # the RateLimit-Policy field value

    @property
    def off(self) -> bool:
        return self.requests is None and self.upload is None

    def describe(self) -> str:
        parts = [rate.describe() for rate in (self.requests, self.upload) if rate is not None]
        return "; ".join(parts) or "no limit"


def _rate(per_second: float, burst: int, unit: str) -> Rate | None:
    if per_second <= 0:
        return None
    if burst <= 0:  # one second's worth
        burst = max(1, math.ceil(per_second))
    return Rate(float(per_second), int(burst), unit, 1.0 / per_second, burst / per_second)


def resolve(
    defaults: RateOverride, overrides: RateOverrides, tenant: str, project: str
) -> RateOverride:
    """The limits of a project: each pair (a rate and its burst) comes whole from the most
    specific place that sets the rate: the project's entry, the tenant's, the settings."""
    levels = [
        overrides.projects.get((tenant, project)),
        overrides.tenants.get(tenant),
        defaults,
    ]
    found: dict[str, Any] = {}
    for rate, burst in (("rps", "burst"), ("upload_bps", "upload_burst")):
        for level in levels:
            if level is not None and getattr(level, rate) is not None:
                found[rate] = getattr(level, rate)
                found[burst] = getattr(level, burst) or 0
                break
    return RateOverride(**found)


def limits_of(resolved: RateOverride) -> Limits:
    requests = _rate(resolved.rps or 0, resolved.burst or 0, "requests")
    upload = _rate(resolved.upload_bps or 0, resolved.upload_burst or 0, "content-bytes")
    items = []
    for name, rate in (("", requests), ("-upload", upload)):
        if rate is None:
            continue
        window = max(1, round(rate.window))
        unit = ';qu="content-bytes"' if rate.unit == "content-bytes" else ""
        for who in ("project", "token"):
            items.append(f'"{who}{name}";q={rate.burst};w={window}{unit}')
    return Limits(requests, upload, ", ".join(items))


def _remaining(rate: Rate, ahead: float) -> int:
    """Units a bucket whose arrival time is ``ahead`` seconds away still admits."""
    # The epsilon: 0.8 / 0.2 is 3.9999999999999996 in floating point.
    return max(0, int((rate.window - ahead) / rate.interval + 1e-9))


REQUEST_BUDGETS = ("project", "token")
ALL_BUDGETS = ("project", "token", "project-upload", "token-upload")


class Outcome:
    """What a check decided: admitted, with the new arrival times of the budgets ``names``
    at ``now`` (``low`` once one of them is at least half spent); or refused
    (``retry_after`` > 0), with the budgets that refused in ``refused`` as (name, seconds to
    wait, rate).

    A plain class: one is made per request, and a frozen dataclass is slower to build.
    """

    __slots__ = (
        "limits",
        "low",
        "message",
        "names",
        "now",
        "rates",
        "refused",
        "retry_after",
        "times",
    )

    def __init__(
        self,
        limits: Limits,
        names: tuple[str, ...],
        rates: tuple[Rate, ...],
        times: Sequence[float],
        now: float,
        refused: Sequence[tuple[str, float, Rate]] = (),
        retry_after: int = 0,
        message: str = "",
    ) -> None:
        self.limits = limits
        self.names = names
        self.rates = rates
        self.times = times
        self.now = now
        self.refused = refused
        self.retry_after = retry_after
        self.message = message
        self.low = False  # admitted, with a budget at least half spent

    @property
    def items(self) -> tuple[tuple[str, int, int], ...]:
        """(budget, remaining, seconds until full) when admitted; (budget, 0, seconds to
        wait) for each budget that refused."""
        if self.retry_after:
            return tuple((name, 0, max(1, math.ceil(wait))) for name, wait, _ in self.refused)
        now = self.now
        return tuple(
            (name, _remaining(rate, tat - now), math.ceil(tat - now))
            for name, rate, tat in zip(self.names, self.rates, self.times, strict=True)
        )

    def rate_limit_field(self) -> str:
        if self.retry_after:
            return ", ".join([f'"{name}";r={r};t={t}' for name, r, t in self.items])
        # Built in one pass, without the tuples of ``items``: this runs on every response.
        now, parts = self.now, []
        for name, rate, tat in zip(self.names, self.rates, self.times, strict=True):
            ahead = tat - now
            parts.append(f'"{name}";r={_remaining(rate, ahead)};t={math.ceil(ahead)}')
        return ", ".join(parts)

    def headers(self) -> dict[str, str]:
        headers = {"RateLimit": self.rate_limit_field(), "RateLimit-Policy": self.limits.policy}
        if self.retry_after:
            headers["Retry-After"] = str(self.retry_after)
        return headers


class Limiter:
    """Checks requests against their budgets in a :class:`BucketTable`."""

    def __init__(
        self,
        defaults: RateOverride,
        limits_file: LimitsStore,
        *,
        exempt_admin: bool = True,
        table: BucketTable | None = None,
        clock: Callable[[], float] = time.monotonic,
        check_every: float = CHECK_EVERY,
    ) -> None:
        self.defaults = defaults
        self.file = limits_file
        self.exempt_admin = exempt_admin
        self.clock = clock
        self.check_every = check_every
        self._table = table
        self._table_mutex = threading.Lock()
        self._refresh_mutex = threading.Lock()
        self._next_check = -math.inf
        self._stamp: tuple[int, int, int] | None = None
        self._install(NO_OVERRIDES)

    @classmethod
    def from_config(cls, config: Mapping[str, Any], limits: LimitsStore) -> Limiter:
        defaults = RateOverride(
            rps=config["RATE_LIMIT_RPS"],
            burst=config["RATE_LIMIT_BURST"],
            upload_bps=config["RATE_LIMIT_UPLOAD_BPS"],
            upload_burst=config["RATE_LIMIT_UPLOAD_BURST"],
        )
        return cls(
            defaults,
            limits,
            exempt_admin=config["RATE_LIMIT_EXEMPT_ADMIN"],
            table=_shared,
        )

    # -- limits and their overrides -------------------------------------------------------
    def _install(self, overrides: RateOverrides) -> None:
        default = limits_of(resolve(self.defaults, NO_OVERRIDES, "", ""))
        by_tenant: dict[str, Limits] = {}
        by_project: dict[tuple[str, str], Limits] = {}
        for tenant in overrides.tenants:
            found = self._entry_limits(overrides, tenant, "")
            if found is not None:
                by_tenant[tenant] = found
        for key in overrides.projects:
            found = self._entry_limits(overrides, *key)
            if found is not None:
                by_project[key] = found
        everything_off = default.off and all(
            limits.off for limits in (*by_tenant.values(), *by_project.values())
        )
        # One attribute, replaced whole: threads reading it never see half an update.
        self._state = (everything_off, default, by_tenant, by_project)

    def _entry_limits(self, overrides: RateOverrides, tenant: str, project: str) -> Limits | None:
        """The limits of one entry; None, logged, when they cannot be computed. The document
        checks every entry (app/storage/core/limits.py): this is the last line, so that an
        entry no check foresaw fails its own project, falling back to the next level, and
        never the worker's requests of every other project."""
        try:
            return limits_of(resolve(self.defaults, overrides, tenant, project))
        except (ArithmeticError, ValueError) as exc:
            where = f"project {tenant}/{project}" if project else f"tenant {tenant}"
            log.error("rate limits of %s not applied (%r): the next level's apply", where, exc)
            return None

    def _refresh(self, now: float) -> None:
        if not self._refresh_mutex.acquire(blocking=False):
            return  # another thread of this worker is looking
        try:
            self._next_check = now + self.check_every
            stamp = self.file.stamp()
            if stamp == self._stamp:
                return
            self._stamp = stamp
            try:
                overrides = self.file.rates()
            except (StorageError, OSError) as exc:
                log.error("rate limit overrides not applied, keeping the previous ones: %s", exc)
                return
            for fault in overrides.skipped:
                log.error("rate limit override skipped, it limits nothing: %s", fault)
            self._install(overrides)
        finally:
            self._refresh_mutex.release()

    def limits(self, tenant: str, project: str) -> Limits:
        now = self.clock()
        if now >= self._next_check:
            self._refresh(now)
        _, default, by_tenant, by_project = self._state
        return by_project.get((tenant, project)) or by_tenant.get(tenant) or default

    def table(self) -> BucketTable:
        if self._table is None:
            with self._table_mutex:
                if self._table is None:
                    self._table = BucketTable()
        return self._table

    # -- the check ------------------------------------------------------------------------
    def check(
        self, token_id: str, role: str, tenant: str, project: str, upload: int | None
    ) -> Outcome | None:
        """Charge one request to the token's and the project's budgets, and check that the
        upload budgets admit ``upload`` body bytes (None: no body; 0: a length not known
        yet), charged by charge_received as they arrive. None when no limit applies; else
        the outcome, refused when ``retry_after`` is set."""
        now = self.clock()
        if now >= self._next_check:
            self._refresh(now)
        everything_off, default, by_tenant, by_project = self._state
        if everything_off or (role == "admin" and self.exempt_admin):
            return None
        limits = by_project.get((tenant, project)) or by_tenant.get(tenant) or default
        requests, uploads = limits.requests, limits.upload
        charges: list[tuple[int, float, float, float]] = []
        if requests is not None:
            step, window = requests.interval, requests.window
            charges.append((hash(("project", tenant, project)) or 1, step, 1, window))
            charges.append((hash(("token", token_id)) or 1, step, 1, window))
        if upload is not None and uploads is not None:
            step = uploads.interval
            limit = max(uploads.window, upload * step)  # over the burst: needs a full bucket
            charges.append((hash(("project-upload", tenant, project)) or 1, step, upload, limit))
            charges.append((hash(("token-upload", token_id)) or 1, step, upload, limit))
        if not charges:
            return None
        names: tuple[str, ...]
        rates: tuple[Rate, ...]
        if len(charges) == 4:
            assert requests is not None and uploads is not None
            names, rates = ALL_BUDGETS, (requests, requests, uploads, uploads)
        else:
            rate = requests or uploads
            assert rate is not None
            names = REQUEST_BUDGETS if requests else ALL_BUDGETS[2:]
            rates = (rate, rate)
        # Body bytes are charged as they arrive (charge_received), never as announced: a
        # length claimed and never sent costs nothing. Here they are only checked.
        keep = [i < 2 and requests is not None for i in range(len(charges))]
        times = (self._table or self.table()).take(charges, now, keep)
        low = False
        for (_, _, _, limit), tat in zip(charges, times, strict=True):
            if tat - now > limit + SLACK:
                return self._refused(limits, names, rates, charges, times, now, tenant, project)
            if tat - now >= 0.5 * limit:
                low = True
        outcome = Outcome(limits, names, rates, times, now)
        outcome.low = low
        return outcome

    @staticmethod
    def _refused(
        limits: Limits,
        names: tuple[str, ...],
        rates: tuple[Rate, ...],
        charges: Sequence[tuple[int, float, float, float]],
        times: Sequence[float],
        now: float,
        tenant: str,
        project: str,
    ) -> Outcome:
        refused = [
            (name, tat - now - limit, rate)
            for name, rate, (*_, limit), tat in zip(names, rates, charges, times, strict=True)
            if tat - now > limit + SLACK
        ]
        wait = max(w for _, w, _ in refused)
        retry = max(1, math.ceil(wait))
        name, _, rate = next(r for r in refused if r[1] == wait)
        subject = f"project {tenant}/{project}" if name.startswith("project") else "this token"
        message = f"rate limit exceeded for {subject}: {rate.describe()}; retry in {retry} s"
        return Outcome(limits, names, rates, times, now, refused, retry, message)

    def check_token(self, token_id: str, role: str, tenant: str | None) -> Outcome | None:
        """Charge one request to the token's budget alone, at its tenant's limits: a request
        that acts in no project (a console page of a tenant, the project menu)."""
        now = self.clock()
        if now >= self._next_check:
            self._refresh(now)
        everything_off, default, by_tenant, _ = self._state
        if everything_off or (role == "admin" and self.exempt_admin):
            return None
        limits = (by_tenant.get(tenant) if tenant else None) or default
        requests = limits.requests
        if requests is None:
            return None
        charges = [(hash(("token", token_id)) or 1, requests.interval, 1.0, requests.window)]
        times = (self._table or self.table()).take(charges, now)
        if times[0] - now > requests.window + SLACK:
            return self._refused(
                limits, ("token",), (requests,), charges, times, now, tenant or "", ""
            )
        outcome = Outcome(limits, ("token",), (requests,), times, now)
        outcome.low = times[0] - now >= 0.5 * requests.window
        return outcome

    def charge_received(
        self, token_id: str, tenant: str, project: str, received: int, mine: int
    ) -> Outcome | None:
        """Charge ``received`` body bytes, just read, to the upload budgets; the refusal
        when they leave a budget overdrawn by more than its burst or than the ``mine``
        bytes this request has sent so far (one request may overdraw a full bucket by its
        own bytes, as one announced with a length may; concurrent ones never together)."""
        limits = self.limits(tenant, project)
        upload = limits.upload
        if upload is None or received <= 0:
            return None
        step = upload.interval
        keys = (("project-upload", tenant, project), ("token-upload", token_id))
        now = self.clock()
        times = self.table().charge([(hash(key) or 1, step, received) for key in keys], now)
        limit = max(upload.window, mine * step)
        if all(tat - now <= limit + SLACK for tat in times):
            return None
        charges = [(0, step, received, limit)] * 2
        return self._refused(
            limits, ALL_BUDGETS[2:], (upload, upload), charges, times, now, tenant, project
        )


# -- Flask -------------------------------------------------------------------------------------
#: The one route whose body is not JSON: an artifact, up to MAX_ARTIFACT_BYTES.
ARTIFACT_ENDPOINT = "project_memory.put_artifact"
TURN_ENDPOINT = "project_memory.put_turn"


def body_limit(endpoint: str | None, content_type: str | None = None) -> int:
    """The largest request body the route accepts (a turn with its artifacts: the form of
    app/api/turn_form.py)."""
    config = current_app.config
    if endpoint == ARTIFACT_ENDPOINT:
        return int(config["MAX_ARTIFACT_BYTES"])
    if endpoint == TURN_ENDPOINT and (content_type or "").startswith("multipart/form-data"):
        return max_form_bytes(int(config["MAX_JSON_BYTES"]), int(config["MAX_ARTIFACT_BYTES"]))
    return int(config["MAX_JSON_BYTES"])


def check_request() -> None:
    """Refuse the request with 429 when one of its budgets is spent (a blueprint hook that
    runs after the blueprint's authentication, which leaves the principal on ``g``)."""
    # One lookup through each context proxy: this runs on every request of the APIs.
    ctx = g._get_current_object()
    req = request._get_current_object()  # type: ignore[attr-defined]
    limiter: Limiter = current_app.extensions["rate_limiter"]
    principal = ctx.principal
    token, scope = principal.token, principal.scope
    upload: int | None = None  # no body
    environ = req.environ
    if environ["REQUEST_METHOD"] not in READ_METHODS:
        upload = req.content_length
        if upload is None and "chunked" in environ.get("HTTP_TRANSFER_ENCODING", "").lower():
            upload = 0  # its size is known only once read: admitted unless overdrawn
    if upload and upload > body_limit(req.endpoint, environ.get("CONTENT_TYPE")):
        # The view refuses such a body unread (413), so it is charged as a request without
        # one: a claimed length of any size must not drain the upload budgets.
        upload = None
    outcome = limiter.check(token.id, token.role, scope.tenant, scope.project, upload)
    if outcome is None:
        return
    if outcome.retry_after:
        raise ApiError(429, outcome.message, headers=outcome.headers())
    if upload is not None and outcome.limits.upload is not None:
        counting: CountingInput | None = environ.get(COUNTED_INPUT)  # app/web/body.py
        if counting is not None:
            counting.meter = UploadMeter(limiter, token.id, scope.tenant, scope.project)
    # Admitted responses carry the RateLimit fields once a budget is half spent: a client
    # is told in time to slow down, and far from its limits no response pays for them.
    if outcome.low:
        ctx.rate_limit = outcome


class UploadMeter:
    """Charges a request's body bytes to its upload budgets as they are read, and refuses
    the rest of the body (429) once they leave a budget overdrawn (Limiter.charge_received).
    What was read is charged whatever the request's outcome; what never came costs nothing."""

    __slots__ = ("limiter", "mine", "project", "tenant", "token_id")

    def __init__(self, limiter: Limiter, token_id: str, tenant: str, project: str) -> None:
        self.limiter = limiter
        self.token_id = token_id
        self.tenant = tenant
        self.project = project
        self.mine = 0

    def __call__(self, received: int) -> None:
        self.mine += received
        refused = self.limiter.charge_received(
            self.token_id, self.tenant, self.project, received, self.mine
        )
        if refused is not None:
            raise ApiError(429, refused.message, headers=refused.headers())


def check_token_request(token_id: str, role: str, tenant: str | None) -> None:
    """Refuse with 429 a request in no project whose token's budget is spent."""
    limiter: Limiter = current_app.extensions["rate_limiter"]
    outcome = limiter.check_token(token_id, role, tenant)
    if outcome is None:
        return
    if outcome.retry_after:
        raise ApiError(429, outcome.message, headers=outcome.headers())
    if outcome.low:
        g.rate_limit = outcome


def _after_request(response: Response) -> Response:
    # g.get, not getattr with a default: g's __getattr__ raises for a missing name, and
    # building that exception on every request costs more than the rest of this function.
    outcome: Outcome | None = g.get("rate_limit")
    if outcome is None:
        return response
    if outcome.low:
        headers = response.headers
        headers["RateLimit"] = outcome.rate_limit_field()
        headers["RateLimit-Policy"] = outcome.limits.policy
    return response


_limited: weakref.WeakSet[Blueprint] = weakref.WeakSet()


def limit_blueprints(*blueprints: Blueprint) -> None:
    """Check every request of these blueprints, after their own ``before_request`` hooks.

    A blueprint's hooks run in the order they were added, so the check, added after the
    authentication hook each API blueprint declares, sees the token and the scope. Call it
    before the blueprints are registered (Flask refuses new hooks afterwards); blueprints are
    module-level, so later apps find them limited already.
    """
    for bp in blueprints:
        if bp not in _limited:
            bp.before_request(check_request)
            _limited.add(bp)


def init_app(app: Flask) -> None:
    # The overrides live where the storage backend keeps what every node shares.
    app.extensions["rate_limiter"] = Limiter.from_config(
        app.config, app.extensions["storage"].limits()
    )


def init_after_request(app: Flask) -> None:
    """Charge what each limited request read once it is answered (an app that serves)."""
    app.after_request(_after_request)
