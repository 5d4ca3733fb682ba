"""The check: what each request is charged, whether its budgets admit it, and the answer's
RateLimit fields.

Each request charges one unit to the request budget of its token and of its project; a
write (any method but GET, HEAD, OPTIONS) also charges its body bytes to their upload
budgets as they are read (app/web/ratelimit/hooks.py's ``UploadMeter``), never as
announced: a ``Content-Length`` claimed and never sent costs nothing. Before the body is
read, the upload budgets must admit its ``Content-Length`` (a body without one: they must
not be overdrawn); a length larger than the burst is admitted only by a full bucket, which
that one request may then overdraw by its own bytes: the time it borrowed is repaid before
the budget admits anything else. A read that leaves a budget overdrawn beyond that
(concurrent uploads, each admitted while the budget was not yet spent) refuses the rest of
the body with 429, so together they never take more than the burst. A request is admitted
only if every budget it charges admits it; otherwise none is charged.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from app.storage.core.limits import RateOverride
from app.storage.interface import LimitsStore
from app.web.ratelimit.limits import CHECK_EVERY, Limits, ProjectLimits, Rate
from app.web.ratelimit.table import SLACK, BucketTable, shared_table


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


class Limiter(ProjectLimits):
    """Checks requests against their budgets in a :class:`BucketTable`, at the limits of
    their project (:class:`ProjectLimits`)."""

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
        super().__init__(defaults, limits_file, clock=clock, check_every=check_every)
        self.exempt_admin = exempt_admin
        self._table = table
        self._table_mutex = threading.Lock()

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
            table=shared_table(),
        )

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
