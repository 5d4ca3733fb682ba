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
  role; the whole tenant's usage is a tenant_admin's, every tenant's an admin's;
* a tenant as a whole (its tokens, its projects' limits) is managed by its tenant_admins
  (bound to no project) and the admins; a tenant's own limits by the admins alone;
* a user's private space in a project (core/names.py ``private_scope``) is theirs alone:
  only a token of that user covers it, whatever its role (a project_admin, a tenant_admin
  and an admin of the project included), and a request reaches it only by asking for its
  own (``private_space``). A tenant_admin may delete what one holds, for compliance
  (``compliance_space``), and read nothing of it.

The role rules read the token's role alone, so each takes a principal or a bare token (a
tenant's own pages act in no project, and have no principal).

The storage calls take ``only_owner`` / ``only_creator``: None lets anyone through, a token
id limits the change to what that token created (NotOwner otherwise). The storage checks it
under the lock, so a check made before the call cannot go stale.

The checks raise core errors (Forbidden, NotOwner); app/web/errors.py maps them to 403 and
the MCP tools say them as a tool's refusal.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from typing import Any

from app.storage.core.errors import Forbidden
from app.storage.core.names import Scope, private_scope
from app.storage.core.tokens import ROLES, Token, role_rank
from app.storage.core.users import Binding, Rule, UserStore

READER, WRITER, PROJECT_ADMIN, TENANT_ADMIN, ADMIN = ROLES
# Who manages a project: its tokens, its limits, its audit log, other tokens' tasks.
MANAGER = PROJECT_ADMIN
# The roles a token made by another token may have: bound to one project, up to its
# project_admin; for the whole tenant, up to tenant_admin (which is never bound to a project).
# Admin tokens are the operator's to make (flask tokens create).
PROJECT_ROLES = (READER, WRITER, PROJECT_ADMIN)
TENANT_ROLES = (*PROJECT_ROLES, TENANT_ADMIN)


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
    if scope.owner is not None:
        return token.user == scope.owner and covers(token, scope.team)
    if token.role == ADMIN:
        return True
    if token.tenant != scope.tenant:
        return False
    return token.project is None or token.project == scope.project


# Whom a role rule is asked about: a principal, or a token acting in no project.
Who = Principal | Token


def token_of(who: Who) -> Token:
    """The token a principal acts with (a token: itself)."""
    return who.token if isinstance(who, Principal) else who


def _at_least(who: Who, role: str) -> bool:
    return role_rank(token_of(who).role) >= role_rank(role)


def may_write(principal: Principal) -> bool:
    return _at_least(principal, WRITER)


def require_write(principal: Principal) -> None:
    if not may_write(principal):
        raise Forbidden(f"role {principal.token.role} may only read")


def may_manage(who: Who) -> bool:
    """A project_admin and above: tokens, limits, the audit log, anyone's tasks and stores."""
    return _at_least(who, MANAGER)


def require_manage(who: Who, what: str) -> None:
    if not may_manage(who):
        raise Forbidden(f"{what} needs the {MANAGER} role or above")


def sees_tenant(who: Who) -> bool:
    """Whether usage and reports may cover the principal's whole tenant (tenant_admin+)."""
    return _at_least(who, TENANT_ADMIN)


def sees_everything(who: Who) -> bool:
    """An admin: every tenant."""
    return _at_least(who, ADMIN)


def manages_tenant(who: Who, tenant: str) -> bool:
    """Whether ``who`` manages ``tenant`` as a whole (its tokens, its projects' limits): an
    admin, or a tenant_admin of that tenant bound to no project."""
    token = token_of(who)
    if sees_everything(token):
        return True
    return token.tenant == tenant and token.project is None and token.role == TENANT_ADMIN


def require_manage_tenant(who: Who, tenant: str) -> None:
    if not manages_tenant(who, tenant):
        raise Forbidden("only a tenant_admin of this tenant or an admin may do this")


def only_owner(principal: Principal) -> str | None:
    """The token a task or store change is limited to (None: this principal may change any).
    In their private space a user changes anything, whichever of their tokens made it."""
    if may_manage(principal) or owns_space(principal):
        return None
    return principal.token.id


def may_delete_task(principal: Principal, owner: str | None) -> bool:
    """The task's owner (a writer at least) or a project_admin and above: what a page shows
    before asking; the storage call re-checks it under the lock (``only_owner``)."""
    if may_manage(principal) or (owns_space(principal) and may_write(principal)):
        return True
    return may_write(principal) and owner is not None and owner == principal.token.id


def may_redact(principal: Principal) -> bool:
    return may_manage(principal)


def require_redact(principal: Principal) -> None:
    if not may_redact(principal):
        raise Forbidden(f"redacting a memory version needs the {MANAGER} role or above")


def may_set_secret_policy(who: Who, tenant: str, project: str | None) -> bool:
    """A project's secret policy and allowlist are set by its managers (a project_admin of
    it and above); a tenant's own, which its projects inherit, by the tenant's managers."""
    if project is None:
        return manages_tenant(who, tenant)
    token = token_of(who)
    if token.role == ADMIN:
        return True
    in_scope = token.tenant == tenant and token.project in (None, project)
    return in_scope and may_manage(who)


def require_set_secret_policy(who: Who, tenant: str, project: str | None) -> None:
    if not may_set_secret_policy(who, tenant, project):
        if project is None:
            raise Forbidden("only a tenant_admin of this tenant or an admin sets its secret policy")
        raise Forbidden(f"setting a project's secret policy needs the {MANAGER} role or above")


def may_grant(who: Who, role: str) -> bool:
    """Whether ``who`` may create (or revoke) a token of ``role``: a manager, up to its own
    role."""
    return may_manage(who) and role in ROLES and role_rank(role) <= role_rank(token_of(who).role)


def grantable_roles(who: Who, roles: tuple[str, ...] = ROLES) -> list[str]:
    """The roles of ``roles`` that ``who`` may grant, lowest first."""
    return [role for role in roles if may_grant(who, role)]


def require_grant(who: Who, role: str) -> None:
    if not may_grant(who, role):
        raise Forbidden(f"role {token_of(who).role} may not grant or revoke a {role} token")


def may_manage_tokens(who: Who, tenant: str | None, project: str | None) -> bool:
    """Whether ``who`` may create and revoke the tokens bound to ``tenant`` / ``project``
    (None: the whole tenant): the tenant's managers (manages_tenant), and for a project's
    tokens also the managers acting in it. Tokens of no tenant are an admin's."""
    if sees_everything(who):
        return True
    if tenant is None:
        return False
    if manages_tenant(who, tenant):
        return True
    return project is not None and may_manage(who) and covers(token_of(who), Scope(tenant, project))


def require_manage_tokens(who: Who, tenant: str | None, project: str | None) -> None:
    if not may_manage_tokens(who, tenant, project):
        where = tenant if project is None else f"{tenant}/{project}"
        raise Forbidden(f"this token may not manage the tokens of {where}")


def require_binding(role: str, project: str | None) -> None:
    """A token bound to a project is at most its project_admin; one for the whole tenant at
    most a tenant_admin (PROJECT_ROLES, TENANT_ROLES)."""
    allowed = TENANT_ROLES if project is None else PROJECT_ROLES
    if role not in allowed:
        where = "for a whole tenant" if project is None else "bound to a project"
        raise Forbidden(f"a token {where} is one of {', '.join(allowed)}, not {role}")


def may_set_limits(who: Who, tenant: str, project: str | None) -> bool:
    """A project's quota and rate limits are set by its tenant's managers (manages_tenant); a
    tenant's own (``project`` None), which bound what its tenant_admins may use, by an admin."""
    if project is None:
        return sees_everything(who)
    return manages_tenant(who, tenant)


def require_set_limits(who: Who, tenant: str, project: str | None) -> None:
    if not may_set_limits(who, tenant, project):
        if project is None:
            raise Forbidden("only an admin sets a tenant's own limits")
        raise Forbidden("only a tenant_admin of this tenant or an admin may do this")


# -- private spaces ---------------------------------------------------------------------------
PRIVATE = "private"
PROJECT = "project"
VISIBILITIES = (PROJECT, PRIVATE)


def private_space(principal: Principal) -> Principal:
    """The principal acting in its own user's private space of its project: a token that
    belongs to no user has none (Forbidden)."""
    user = principal.token.user
    if user is None:
        raise Forbidden(
            "only a token that belongs to a user (a person's sign-in, or a token they minted)"
            " has a private space"
        )
    return Principal(principal.token, private_scope(principal.scope, user))


def compliance_space(principal: Principal, user: str) -> Principal:
    """The principal acting in ``user``'s private space to delete what it holds: a
    tenant_admin of the tenant (bound to no project) or an admin. Every other change and
    every read stay the owner's (the doors allow this one for deletes alone)."""
    if not manages_tenant(principal, principal.scope.tenant):
        raise Forbidden(
            "only a tenant_admin of this tenant or an admin deletes from a private space"
        )
    return Principal(principal.token, private_scope(principal.scope, user))


def owns_space(principal: Principal) -> bool:
    """Whether ``principal`` acts in its own user's private space."""
    owner = principal.scope.owner
    return owner is not None and principal.token.user == owner


def is_compliance(principal: Principal) -> bool:
    """Whether ``principal`` acts in a private space not its own (a compliance delete)."""
    owner = principal.scope.owner
    return owner is not None and principal.token.user != owner


# -- OAuth consent ----------------------------------------------------------------------------
def consent_roles(who: Who) -> list[str]:
    """The roles a person signed in with ``who`` may give an OAuth client: any project role up
    to their own (a client acts in one project, so never above project_admin)."""
    rank = role_rank(token_of(who).role)
    return [role for role in PROJECT_ROLES if role_rank(role) <= rank]


def require_consent(token: Token, scope: Scope, role: str) -> None:
    """``token`` may let a client act in ``scope`` with ``role``: it covers the scope, and
    the role is at most its own."""
    if not covers(token, scope):
        raise Forbidden(f"this token may not act in {scope.tenant}/{scope.project}")
    if role not in consent_roles(token):
        raise Forbidden(f"role {token.role} may not give a client the role {role}")


def lower_role(a: str, b: str) -> str:
    """The lower of two roles (a grant acts in the lower of its own and its parent's)."""
    return min(a, b, key=role_rank)


def may_see_grant(who: Who, token_id: str, tenant: str, project: str) -> bool:
    """Whether ``who`` sees (and may revoke) a grant: the person whose token made it, or a
    manager of that project's tokens."""
    return token_of(who).id == token_id or may_manage_tokens(who, tenant, project)


# -- users -------------------------------------------------------------------------------------
def may_manage_user(who: Who, tenant: str | None) -> bool:
    """Whether ``who`` lists and disables the users whose role is in ``tenant``: its
    tenant_admins and the admins (a user of no tenant, an admin or one no rule matched, is
    the admins' alone)."""
    if sees_everything(who):
        return True
    return tenant is not None and manages_tenant(who, tenant)


def require_manage_user(who: Who, tenant: str | None) -> None:
    if not may_manage_user(who, tenant):
        raise Forbidden("only a tenant_admin of the user's tenant or an admin may do this")


def mintable_roles(token: Token) -> list[str]:
    """The roles a signed-in person may give a token of their own: up to the role their
    identity gives them, in the same tenant and project (an admin: admin tokens alone, as any
    other needs a tenant to be bound to)."""
    if token.user is None:
        return []
    if token.tenant is None:
        return [ADMIN] if token.role == ADMIN else []
    allowed = TENANT_ROLES if token.project is None else PROJECT_ROLES
    return [r for r in allowed if role_rank(r) <= role_rank(token.role)]


def require_mint(token: Token, role: str) -> None:
    if token.user is None:
        raise Forbidden("only a person signed in through the identity provider mints tokens here")
    if role not in mintable_roles(token):
        raise Forbidden(f"role {token.role} may not mint a {role} token")


def acting_token(token: Token, users: UserStore) -> Token | None:
    """``token`` as it may act now: a person's token acts at most in the role their identity
    gives them today (a demoted user's tokens, minted when the role was higher, are capped at
    each use, not only at mint), and not at all once the user is disabled, gone, given no
    role, or bound elsewhere. A token of no user is itself."""
    if token.user is None:
        return token
    user = users.get(token.user)
    binding = None if user is None or user.disabled_at is not None else user.binding
    if binding is None:
        return None
    if binding.tenant is not None and (
        token.tenant != binding.tenant
        or (binding.project is not None and token.project != binding.project)
    ):
        return None
    role = lower_role(token.role, binding.role)
    return token if role == token.role else replace(token, role=role)


def binding_of_claims(rules: Iterable[Rule], claims: Mapping[str, Any]) -> Binding | None:
    """The binding a sign-in's claims earn: the highest role of the rules that match (the
    first of equals), None when none matches. One binding per user keeps "what may Ana do"
    one line."""
    best: Binding | None = None
    for rule in rules:
        if rule.matches(claims) and (best is None or role_rank(rule.role) > role_rank(best.role)):
            best = rule.binding
    return best
