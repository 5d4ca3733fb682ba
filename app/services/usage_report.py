"""What ``GET /sandbox/memory/v1/usage``, ``flask --app wsgi usage`` and ``/metrics`` show:
usage, quotas and traffic, gathered from the storage backend (plain Python, no Flask)."""

from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from app.storage.core.limits import QuotaOverride, Quotas, format_bytes, human_bytes
from app.storage.core.models import TaskSummary
from app.storage.core.names import Scope
from app.storage.core.traffic import TrafficRow
from app.storage.core.usage import ZERO, Usage
from app.storage.interface import StorageBackend

HOUR = 3600


def hour_now() -> int:
    """The current hour, in hours since the epoch (UTC)."""
    return int(time.time() // HOUR)


def hour_iso(hour: int) -> str:
    return datetime.fromtimestamp(hour * HOUR, UTC).strftime("%Y-%m-%dT%H:00:00Z")


def quota_json(quota: QuotaOverride | None) -> dict[str, int | None]:
    return {
        "bytes": None if quota is None else quota.bytes,
        "tasks": None if quota is None else quota.tasks,
    }


def project_entry(scope: Scope, usage: Usage, quotas: Quotas) -> dict[str, Any]:
    return {
        "tenant": scope.tenant,
        "project": scope.project,
        "usage": usage.to_json(),
        "quota": quota_json(quotas.projects.get((scope.tenant, scope.project))),
    }


def tenant_entries(
    storage: StorageBackend, tenants: Iterable[str] | None, quotas: Quotas
) -> list[dict[str, Any]]:
    """Per tenant: its projects' usage and quotas, their sum and the tenant's quota."""
    by_tenant: dict[str, list[tuple[Scope, Usage]]] = {}
    private: dict[str, Usage] = {}
    for scope, usage in sorted(
        storage.usages(tenants).items(), key=lambda kv: (kv[0].tenant, kv[0].project)
    ):
        if scope.owner is not None:
            # A user's private space counts in its tenant's sum (the quota is the tenant's)
            # and is named to no one: not even its size per user leaves it.
            private[scope.tenant] = private.get(scope.tenant, ZERO) + usage
            continue
        by_tenant.setdefault(scope.tenant, []).append((scope, usage))
    for tenant in (*(tenants or ()), *private):
        by_tenant.setdefault(tenant, [])
    out = []
    for tenant, rows in sorted(by_tenant.items()):
        out.append(
            {
                "tenant": tenant,
                "usage": sum((u for _, u in rows), private.get(tenant, ZERO)).to_json(),
                "quota": quota_json(quotas.tenants.get(tenant)),
                "projects": [project_entry(s, u, quotas) for s, u in rows],
            }
        )
    return out


def traffic_json(
    storage: StorageBackend, tenant: str, project: str | None, hours: int
) -> list[dict[str, Any]]:
    since = hour_now() - hours + 1
    return [
        {
            "hour": hour_iso(r.hour),
            "project": r.project,
            "token_id": r.token_id,
            "requests": r.requests,
            "bytes_in": r.bytes_in,
            "bytes_out": r.bytes_out,
        }
        for r in storage.traffic(tenant, project, since_hour=since)
    ]


def report(
    storage: StorageBackend, scope: Scope, *, whole_tenant: bool, hours: int
) -> dict[str, Any]:
    """The usage report of a request in ``scope`` (``whole_tenant``: with every project of the
    tenant and its traffic, for tenant_admin and admin tokens)."""
    quotas = storage.limits().quotas()
    tenant = tenant_entries(storage, [scope.tenant], quotas)[0]
    usage = next(
        (p["usage"] for p in tenant["projects"] if p["project"] == scope.project),
        ZERO.to_json(),
    )
    if scope.owner is not None:  # a private space: its own counters, named by its project
        usage = storage.usage(scope).to_json()
    free = storage.free_space()
    return {
        "tenant": scope.tenant,
        "project": scope.team.project,
        "usage": usage,
        "quota": quota_json(quotas.projects.get((scope.tenant, scope.team.project))),
        "tenant_usage": tenant["usage"],
        "tenant_quota": tenant["quota"],
        "projects": tenant["projects"] if whole_tenant else [],
        "disk": None if free is None else {"free_bytes": free[0], "floor_bytes": free[1]},
        "traffic": traffic_json(
            storage, scope.tenant, None if whole_tenant else scope.project, hours
        ),
        "secrets": secrets_json(storage, scope, hours),
    }


# The most audit events a report reads to count the project's secrets: past them the counts
# are marked partial rather than the report made slow.
SECRET_EVENTS_READ = 2000


def secrets_json(storage: StorageBackend, scope: Scope, hours: int) -> dict[str, Any]:
    """What the project's writes of the last ``hours`` held in secrets (services/secrets.py),
    from its audit log: how many were masked, by kind, and how many writes were refused."""
    since_us = storage.audit_log.now_us() - hours * 3_600_000_000
    masked: dict[str, int] = {}
    refused = read = 0
    cursor: str | None = None
    partial = False
    while True:
        page = storage.audit_log.page(scope, kind="secrets", limit=500, cursor=cursor)
        for event in page.events:
            if event.at_us < since_us:
                return _secrets(masked, refused, partial=False)
            read += 1
            kinds = event.detail.get("kinds") if isinstance(event.detail, dict) else None
            if event.action == "masked" and isinstance(kinds, dict):
                for kind, n in kinds.items():
                    if isinstance(n, int):
                        masked[str(kind)] = masked.get(str(kind), 0) + n
            elif event.action == "refused":
                refused += 1
        cursor = page.next_cursor
        if cursor is None:
            break
        if read >= SECRET_EVENTS_READ:
            partial = True
            break
    return _secrets(masked, refused, partial=partial)


def _secrets(masked: dict[str, int], refused: int, *, partial: bool) -> dict[str, Any]:
    return {
        "masked": sum(masked.values()),
        "masked_by_kind": dict(sorted(masked.items())),
        "refused_writes": refused,
        "truncated": partial,
    }


def usage_line(usage: dict[str, int]) -> str:
    """One line a person reads: ``12 task(s), 40 turn(s), ...``."""
    return (
        f"{human_bytes(usage['bytes'])}: {usage['tasks']} task(s), {usage['turns']}"
        f" turn(s) ({human_bytes(usage['turn_bytes'])}), {usage['artifacts']} artifact(s)"
        f" ({human_bytes(usage['artifact_bytes'])}), {usage['stores']} store(s),"
        f" {usage['memories']} memor(ies), {usage['versions']} version(s)"
        f" ({human_bytes(usage['version_bytes'])})"
    )


def quota_text(quota: dict[str, int | None]) -> str:
    parts = []
    if quota["bytes"] is not None:
        parts.append(f"bytes={format_bytes(quota['bytes'])}")
    if quota["tasks"] is not None:
        parts.append(f"tasks={quota['tasks']}")
    return " ".join(parts) or "no quota"


# -- the console's usage pages ------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Slot:
    """Requests and bytes of one hour (or one day) of a project, every token summed."""

    start: int  # hours since the epoch
    label: str
    requests: int = 0
    bytes_in: int = 0
    bytes_out: int = 0


@dataclass(frozen=True, slots=True)
class ProjectUsage:
    scope: Scope
    usage: Usage
    quota: QuotaOverride | None
    tenant_usage: Usage
    tenant_quota: QuotaOverride | None
    hours: tuple[Slot, ...]
    top: tuple[TaskSummary, ...]

    @property
    def requests(self) -> int:
        return sum(h.requests for h in self.hours)


def _slots(rows: Iterable[TrafficRow], first: int, count: int, width: int) -> tuple[Slot, ...]:
    """``count`` slots of ``width`` hours from hour ``first``, the rows summed into them."""
    sums = [[0, 0, 0] for _ in range(count)]
    for row in rows:
        i = (row.hour - first) // width
        if 0 <= i < count:
            sums[i][0] += row.requests
            sums[i][1] += row.bytes_in
            sums[i][2] += row.bytes_out
    fmt = "%Y-%m-%d %H:00 UTC" if width == 1 else "%Y-%m-%d"
    return tuple(
        Slot(
            first + i * width,
            datetime.fromtimestamp((first + i * width) * HOUR, UTC).strftime(fmt),
            *sums[i],
        )
        for i in range(count)
    )


def project_usage(
    storage: StorageBackend, scope: Scope, *, hours: int, top: int = 10
) -> ProjectUsage:
    """A project's usage page: counters and quotas, its last ``hours`` of traffic hour by
    hour, and its ``top`` largest tasks."""
    quotas = storage.limits().quotas()
    # A private space answers to its project's quota (core/quota.py QuotaSource.of).
    project_quota, tenant_quota = quotas.of(scope.tenant, scope.team.project)
    tenant_usage = sum(storage.usages([scope.tenant]).values(), ZERO)
    first = hour_now() - hours + 1
    traffic = storage.traffic(scope.tenant, scope.project, since_hour=first)
    largest = storage.tasks.list_tasks(scope, limit=top, sort="size").tasks
    return ProjectUsage(
        scope,
        storage.usage(scope),
        project_quota,
        tenant_usage,
        tenant_quota,
        _slots(traffic, first, hours, 1),
        largest,
    )


@dataclass(frozen=True, slots=True)
class ProjectRow:
    scope: Scope
    usage: Usage
    last_activity: str | None
    days: tuple[Slot, ...]


def projects_overview(
    storage: StorageBackend, scopes: Iterable[Scope], *, days: int = 14
) -> list[ProjectRow]:
    """The projects page: per project its counters, its last write and ``days`` of traffic."""
    wanted = list(scopes)
    tenants = sorted({s.tenant for s in wanted})
    usages = storage.usages(tenants) if tenants else {}
    first = (hour_now() // 24 - days + 1) * 24
    by_project: dict[tuple[str, str], list[TrafficRow]] = {}
    for tenant in tenants:
        for row in storage.traffic(tenant, since_hour=first):
            by_project.setdefault((row.tenant, row.project), []).append(row)
    out = []
    for found in wanted:
        newest = storage.tasks.list_tasks(found, limit=1).tasks
        out.append(
            ProjectRow(
                found,
                usages.get(found, ZERO),
                newest[0].updated_at if newest else None,
                _slots(by_project.get((found.tenant, found.project), ()), first, days, 24),
            )
        )
    return out
