"""Who may do what, beyond the role's read/write line: one module for the console and the APIs.

Roles rank reader < writer < project_admin < tenant_admin < admin (app/storage/tokens.py).
Reading needs any role in scope; every change needs writer. On top of that:

* a task is deleted by its owner (the token that created it) or a project_admin and above;
* a memory version is redacted by a project_admin and above only;
* a store is managed (updated, archived, deleted) by its creator or a project_admin and
  above; creating stores and writing memories needs writer.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .storage import Scope
from .storage.tokens import Token

if TYPE_CHECKING:
    from .auth import Principal


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


def may_delete_task(principal: Principal, owner: str | None) -> bool:
    """The task's owner (a writer at least) or a project_admin and above."""
    if principal.at_least("project_admin"):
        return True
    return may_write(principal) and owner is not None and owner == principal.token.id


def delete_only_owner(principal: Principal) -> str | None:
    """The ``only_owner`` to pass to TaskStore.delete_task: the storage checks the owner
    under the task lock, so a check made before the call cannot go stale."""
    return None if principal.at_least("project_admin") else principal.token.id


def may_redact_version(principal: Principal) -> bool:
    return principal.at_least("project_admin")


def may_manage_store(principal: Principal, store_creator: str | None) -> bool:
    """Update, archive or delete a store: its creator (a writer at least) or a project_admin
    and above. ``store_creator`` None (not recorded): project_admin and above only."""
    if principal.at_least("project_admin"):
        return True
    return (
        may_write(principal) and store_creator is not None and store_creator == principal.token.id
    )
