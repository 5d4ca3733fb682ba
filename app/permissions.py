"""Who may do what, beyond the role's read/write floor (auth.require_principal).

One place for the rules the APIs and the console share:

* a task: ``writer`` creates and writes; deleting it is its owner's (the token that created
  it) or a ``project_admin``'s and above;
* a memory store: ``writer`` creates stores and writes memories; updating, archiving or
  deleting a store is its creator's or a ``project_admin``'s and above;
* redacting a memory version is a ``project_admin``'s and above.

The storage calls take ``only_owner`` / ``only_creator``: None lets anyone through (an
admin), a token id limits the change to what that token created (NotOwner otherwise).
"""

from __future__ import annotations

from .auth import Principal
from .errors import ApiError

ADMIN_ROLE = "project_admin"


def only_owner(principal: Principal) -> str | None:
    """The token a task or store change is limited to (None: this principal may change any)."""
    return None if principal.at_least(ADMIN_ROLE) else principal.token.id


def may_redact_version(principal: Principal) -> bool:
    return principal.at_least(ADMIN_ROLE)


def require_redact(principal: Principal) -> None:
    if not may_redact_version(principal):
        raise ApiError(403, f"redacting a memory version needs the {ADMIN_ROLE} role or above")
