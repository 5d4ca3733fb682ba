"""Who may do what, beyond the role's read/write line: one module for the console and the APIs.

Roles rank reader < writer < project_admin < tenant_admin < admin (app/storage/core/tokens.py).
Reading needs any role in scope; every change needs writer. On top of that:

* a task is deleted by its owner (the token that created it) or a project_admin and above;
* a memory version is redacted by a project_admin and above only;
* a store is managed (updated, archived, deleted) by its creator or a project_admin and
  above; creating stores and writing memories needs writer.

The storage calls take ``only_owner`` / ``only_creator``: None lets anyone through, a token
id limits the change to what that token created (NotOwner, a 403, otherwise). The storage
checks it under the lock, so a check made before the call cannot go stale.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from app.storage import Scope
from app.storage.core.tokens import Token
from app.web.errors import ApiError

if TYPE_CHECKING:
    from app.web.auth import Principal

ADMIN_ROLE = "project_admin"


def covers(token: Token, scope: Scope) -> bool:
    """Whether ``token`` may act in ``scope`` (the rule auth.resolve_scope applies to headers).

    An admin acts anywhere; any other token only in its tenant, and in its project when it
    names one.
    """
    if token.role == "admin":
        return True
    if token.tenant != scope.tenant:
        return False
    return token.project is None or token.project == scope.project


def may_write(principal: Principal) -> bool:
    return principal.at_least("writer")


def only_owner(principal: Principal) -> str | None:
    """The token a task or store change is limited to (None: this principal may change any)."""
    return None if principal.at_least(ADMIN_ROLE) else principal.token.id


def may_delete_task(principal: Principal, owner: str | None) -> bool:
    """The task's owner (a writer at least) or a project_admin and above."""
    if principal.at_least(ADMIN_ROLE):
        return True
    return may_write(principal) and owner is not None and owner == principal.token.id


def may_redact_version(principal: Principal) -> bool:
    return principal.at_least(ADMIN_ROLE)


def require_redact(principal: Principal) -> None:
    if not may_redact_version(principal):
        raise ApiError(403, f"redacting a memory version needs the {ADMIN_ROLE} role or above")
