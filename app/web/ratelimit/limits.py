"""The limits each project is held to: the settings, overridden per tenant and per project.

Limits come from the MEMORY_RATE_LIMIT_* settings, overridden per tenant and per project
by ``<root>/.limits.json`` (app/storage/core/limits.py, ``flask --app wsgi ratelimit``); a
request in a project is held to that project's limits, per project and per token. Each
worker looks at the file's stat at most once a second and re-reads it when it changed.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from app.storage.core.errors import StorageError
from app.storage.core.limits import NO_OVERRIDES, RateOverride, RateOverrides
from app.storage.interface import LimitsStore

# The name operators filter on, the same whichever module of the package logs.
log = logging.getLogger("app.ratelimit")

CHECK_EVERY = 1.0  # seconds between two looks at the overrides file's stat, per worker


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


class ProjectLimits:
    """The limits of every tenant and project: the settings (``defaults``) with the
    overrides of ``limits_file``, which is looked at every ``check_every`` seconds of
    ``clock`` and re-read when it changed."""

    def __init__(
        self,
        defaults: RateOverride,
        limits_file: LimitsStore,
        *,
        clock: Callable[[], float] = time.monotonic,
        check_every: float = CHECK_EVERY,
    ) -> None:
        self.defaults = defaults
        self.file = limits_file
        self.clock = clock
        self.check_every = check_every
        self._refresh_mutex = threading.Lock()
        self._next_check = -math.inf
        self._stamp: tuple[int, int, int] | None = None
        self._install(NO_OVERRIDES)

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
        """The limits a request in ``tenant``/``project`` is held to."""
        now = self.clock()
        if now >= self._next_check:
            self._refresh(now)
        _, default, by_tenant, by_project = self._state
        return by_project.get((tenant, project)) or by_tenant.get(tenant) or default
