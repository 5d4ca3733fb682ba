"""What ``GET /sandbox/memory/v1/usage``, ``flask --app wsgi usage`` and ``/metrics`` show:
usage, quotas and traffic, gathered from the storage backend (plain Python, no Flask)."""

from __future__ import annotations

import time
from collections.abc import Iterable
from datetime import UTC, datetime
from typing import Any

from app.storage.core.limits import QuotaOverride, Quotas, format_bytes, human_bytes
from app.storage.core.names import Scope
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
    for scope, usage in sorted(
        storage.usages(tenants).items(), key=lambda kv: (kv[0].tenant, kv[0].project)
    ):
        by_tenant.setdefault(scope.tenant, []).append((scope, usage))
    for tenant in tenants or ():
        by_tenant.setdefault(tenant, [])
    out = []
    for tenant, rows in sorted(by_tenant.items()):
        out.append(
            {
                "tenant": tenant,
                "usage": sum((u for _, u in rows), ZERO).to_json(),
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
    free = storage.free_space()
    return {
        "tenant": scope.tenant,
        "project": scope.project,
        "usage": usage,
        "quota": quota_json(quotas.projects.get((scope.tenant, scope.project))),
        "tenant_usage": tenant["usage"],
        "tenant_quota": tenant["quota"],
        "projects": tenant["projects"] if whole_tenant else [],
        "disk": None if free is None else {"free_bytes": free[0], "floor_bytes": free[1]},
        "traffic": traffic_json(
            storage, scope.tenant, None if whole_tenant else scope.project, hours
        ),
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
