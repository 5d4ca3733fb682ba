"""The project's secrets page: the policy in force (set here by a project_admin), and what is
already stored, found and purged (services/secret_sweep.py) within a bounded time; a project
larger than that is walked by `flask --app wsgi secrets scan|purge` on the server."""

from __future__ import annotations

import time

from flask import render_template
from flask.typing import ResponseReturnValue

from app.console.admin import _require_manager
from app.console.base import bp, field, purl, scope, see_other, signed_in, storage
from app.services import secrets as secrets_service
from app.services.secret_sweep import Found, Sweep, Tally
from app.storage.core.limits import InvalidLimit
from app.storage.core.secret_policy import POLICIES, SecretsOverride

# A page answers within seconds: a walk that takes longer stops and says so.
SCAN_SECONDS = 10.0
PURGE_SECONDS = 20.0
MOST_SHOWN = 500


def _page(
    *,
    found: list[Found] | None = None,
    tally: Tally | None = None,
    purged: bool = False,
    error: str = "",
) -> str:
    where = scope()
    return render_template(
        "console/secrets.html",
        policy=secrets_service.policy_of(storage(), where.tenant, where.project),
        policies=POLICIES,
        found=found,
        tally=tally,
        purged=purged,
        most_shown=MOST_SHOWN,
        error=error,
    )


@bp.get("/p/<tenant>/<project>/secrets")
def secrets_page(tenant: str, project: str) -> ResponseReturnValue:
    """The project's secret policy, and a scan and purge of what is stored (project_admin)."""
    _require_manager()
    return _page()


@bp.post("/p/<tenant>/<project>/secrets/policy")
def set_secret_policy(tenant: str, project: str) -> ResponseReturnValue:
    """Set the project's policy: mask, reject or allow (audited)."""
    _require_manager()
    chosen = field("policy", 16)
    if chosen not in POLICIES:
        return _page(error=f"policy: one of {', '.join(POLICIES)}"), 422
    where = scope()
    try:
        secrets_service.set_policy(
            storage(), signed_in(), where.tenant, where.project, SecretsOverride(policy=chosen)
        )
    except InvalidLimit as exc:
        return _page(error=str(exc)), 422
    return see_other(purl("secrets_page"))


def _sweep(*, purge: bool, seconds: float) -> tuple[list[Found], Tally]:
    found: list[Found] = []
    sweep = Sweep(
        storage(),
        purge=purge,
        report=found.append,
        deadline=time.monotonic() + seconds,
        most_found=None if purge else MOST_SHOWN,
    )
    return found, sweep.run([scope()])


@bp.post("/p/<tenant>/<project>/secrets/scan")
def scan_secrets(tenant: str, project: str) -> ResponseReturnValue:
    """Find the secrets stored in this project: where and what kind, never the value."""
    _require_manager()
    found, tally = _sweep(purge=False, seconds=SCAN_SECONDS)
    return _page(found=found, tally=tally)


@bp.post("/p/<tenant>/<project>/secrets/purge")
def purge_secrets(tenant: str, project: str) -> ResponseReturnValue:
    """Mask the secrets stored in this project, in place (secrets purge, bounded in time)."""
    _require_manager()
    found, tally = _sweep(purge=True, seconds=PURGE_SECONDS)
    return _page(found=found, tally=tally, purged=True)
