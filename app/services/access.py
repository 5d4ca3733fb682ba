"""Who may do what: the principal a change is made by, and every rule of the roles.

Roles rank reader < writer < project_admin < tenant_admin < admin (app/storage/core/tokens.py
defines them); this is the one module that compares them. Reading needs any role in scope;
every change needs writer. On top of that:

* a task (its turns, its artifacts) is deleted by its owner (the token that created it) or a
  project_admin and above;
* a memory version is redacted by a project_admin and above only;
* a store is managed (updated, archived, deleted) by its creator or a project_admin and
  above; creating stores and writing memories needs writer;
* tokens and limits are managed by a project_admin and above, who grants at most its own
  role; the whole tenant's usage is a tenant_admin's, every tenant's an admin's.

The storage calls take ``only_owner`` / ``only_creator``: None lets anyone through, a token
id limits the change to what that token created (NotOwner otherwise). The storage checks it
under the lock, so a check made before the call cannot go stale.

The checks raise core errors (Forbidden, NotOwner); app/web/errors.py maps them to 403 and
the MCP tools say them as a tool's refusal.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from app.storage.core.errors import Forbidden
from app.storage.core.names import Scope
from app.storage.core.tokens import ROLES, Token, role_rank

READER, WRITER, PROJECT_ADMIN, TENANT_ADMIN, ADMIN = ROLES
# Who manages a project: its tokens, its limits, its audit log, other tokens' tasks.
MANAGER = PROJECT_ADMIN


@dataclass(frozen=True, slots=True)
class Principal:
    """A token acting in one tenant/project (the scope its request resolved to)."""

    token: Token
    scope: Scope

    @property
    def actor(self) -> str:
        """The id the records and the audit log name this principal by."""
        return self.token.id

    @property
    def store_actor(self) -> dict[str, Any]:
        """The actor a memory version records (the reference API's ``api_actor``)."""
        return {"type": "api_actor", "api_key_id": self.token.id}


def covers(token: Token, scope: Scope) -> bool:
    """Whether ``token`` may act in ``scope`` (the rule a request's headers are held to).

    An admin acts anywhere; any other token only in its tenant, and in its project when it
    names one.
    """
    if token.role == ADMIN:
        return True
    if token.tenant != scope.tenant:
        return False
    return token.project is None or token.project == scope.project


def _at_least(principal: Principal, role: str) -> bool:
    return role_rank(principal.token.role) >= role_rank(role)


def may_write(principal: Principal) -> bool:
    return _at_least(principal, WRITER)


def require_write(principal: Principal) -> None:
    if not may_write(principal):
        raise Forbidden(f"role {principal.token.role} may only read")


def may_manage(principal: Principal) -> bool:
    """A project_admin and above: tokens, limits, the audit log, anyone's tasks and stores."""
    return _at_least(principal, MANAGER)


def require_manage(principal: Principal, what: str) -> None:
    if not may_manage(principal):
        raise Forbidden(f"{what} needs the {MANAGER} role or above")


def sees_tenant(principal: Principal) -> bool:
    """Whether usage and reports may cover the principal's whole tenant (tenant_admin+)."""
    return _at_least(principal, TENANT_ADMIN)


def sees_everything(principal: Principal) -> bool:
    """An admin: every tenant."""
    return _at_least(principal, ADMIN)


def only_owner(principal: Principal) -> str | None:
    """The token a task or store change is limited to (None: this principal may change any)."""
    return None if may_manage(principal) else principal.token.id


def may_delete_task(principal: Principal, owner: str | None) -> bool:
    """The task's owner (a writer at least) or a project_admin and above: what a page shows
    before asking; the storage call re-checks it under the lock (``only_owner``)."""
    if may_manage(principal):
        return True
    return may_write(principal) and owner is not None and owner == principal.token.id


def may_redact(principal: Principal) -> bool:
    return may_manage(principal)


def require_redact(principal: Principal) -> None:
    if not may_redact(principal):
        raise Forbidden(f"redacting a memory version needs the {MANAGER} role or above")


def may_grant(principal: Principal, role: str) -> bool:
    """Whether ``principal`` may create (or revoke) a token of ``role``: a manager, up to
    its own role."""
    return (
        may_manage(principal)
        and role in ROLES
        and role_rank(role) <= role_rank(principal.token.role)
    )


def grantable_roles(principal: Principal, roles: tuple[str, ...] = ROLES) -> list[str]:
    """The roles of ``roles`` that ``principal`` may grant, lowest first."""
    return [role for role in roles if may_grant(principal, role)]


def require_grant(principal: Principal, role: str) -> None:
    if not may_grant(principal, role):
        raise Forbidden(f"role {principal.token.role} may not grant or revoke a {role} token")
