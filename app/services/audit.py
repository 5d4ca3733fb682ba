"""Recording what was done for the audit log (app/storage/core/audit.py): called by the use
cases (tasks.py, stores.py, admin.py) once a change has succeeded, with the principal that made
it; no door records an event of its own.

The change is what matters: an event that cannot be written (a full disk, a database gone)
is logged and the answer stays the change's, never a failure of something already done.
"""

from __future__ import annotations

import logging
from typing import Any

from app.services.access import Principal, is_compliance
from app.storage.core.errors import StorageError
from app.storage.interface import StorageBackend

log = logging.getLogger("app.audit")


def record(
    storage: StorageBackend,
    tenant: str | None,
    project: str | None,
    *,
    actor: str | None,
    kind: str,
    action: str,
    subject: str,
    store_id: str | None = None,
    detail: dict[str, Any] | None = None,
) -> None:
    """Add one event; a tenant of None (an admin token of no tenant) records nothing."""
    if tenant is None:
        return
    try:
        storage.audit_log.record(
            tenant,
            project,
            actor=actor,
            kind=kind,
            action=action,
            subject=subject,
            store_id=store_id,
            detail=detail,
        )
    except StorageError as exc:  # a refused event is a bug of its caller: say which
        log.error("audit event refused (%s): %s %s %s", exc, kind, action, subject)
    except Exception:  # noqa: BLE001 - the change happened; a log it cannot reach must not undo it
        log.exception("audit event not recorded: %s %s %s", kind, action, subject)


def event(
    storage: StorageBackend,
    principal: Principal,
    kind: str,
    action: str,
    subject: str,
    detail: dict[str, Any] | None = None,
    *,
    store_id: str | None = None,
    project: str | None = None,
) -> None:
    """Record that ``principal`` did ``action`` in its scope (``project``: another project
    of its tenant, which an admin change named).

    An owner's change in their private space goes to that space's log, which only they
    read; a tenant_admin's compliance delete there goes to the team project's log, naming
    whose space it was, so that the project's managers can see it was done."""
    if is_compliance(principal):
        owner = principal.scope.owner
        detail = {**(detail or {}), "private_to": owner, "compliance": True}
        project = project or principal.scope.team.project
    record(
        storage,
        principal.scope.tenant,
        project or principal.scope.project,
        actor=principal.actor,
        kind=kind,
        action=action,
        subject=subject,
        store_id=store_id,
        detail=detail,
    )
