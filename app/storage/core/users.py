"""People: a user is an identity provider's subject, with the role its claims map to.

A user is named by its issuer and subject (OpenID Connect's stable pair; an email can change
hands) and keeps a name and an email for people to read. Its role is never set by hand: the
rules (:class:`Rule`) map the claims of each sign-in to one role in one tenant, or one project
of it, so a changed group takes effect at the next sign-in. A record holds no secret; the
tree keeps one readable JSON file per user (tree/users.py), PostgreSQL a row (pg/users.py).

A user acts through tokens of the registry that name it (``Token.user``): one the console
signs in with, which no one knows the secret of, and the ones it mints for its agents.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, replace
from typing import Any, Protocol

from app.storage.core.errors import Corrupt
from app.storage.core.names import is_reserved_project, validate_id
from app.storage.core.tokens import ROLES

USER_ID_PREFIX = "usr_"
_USER_ID = re.compile(r"usr_[0-9a-f]{32}")
MAX_TEXT = 320  # an email address is at most 254 characters; a name gets the same room
MAX_RULES = 200


def user_id(issuer: str, subject: str) -> str:
    """The id of the user ``subject`` of ``issuer``: the same pair always gives the same id,
    so two first sign-ins at once make one user, and a record is found without a scan."""
    digest = hashlib.sha256(f"{issuer}\n{subject}".encode()).hexdigest()
    return USER_ID_PREFIX + digest[:32]


def is_user_id(value: str) -> bool:
    return bool(_USER_ID.fullmatch(value))


@dataclass(frozen=True, slots=True)
class Binding:
    """Where a user acts and as what: ``project`` None is every project of the tenant,
    ``tenant`` None (an admin) every tenant."""

    role: str
    tenant: str | None
    project: str | None

    def label(self) -> str:
        if self.tenant is None:
            return f"{self.role} everywhere"
        return f"{self.role} in {self.tenant}/{self.project or '*'}"


@dataclass(frozen=True, slots=True)
class User:
    id: str
    issuer: str
    subject: str
    email: str
    name: str
    created_at: str
    last_sign_in_at: str | None = None
    # The role the rules gave at the last sign-in (None: no rule matched, no access).
    role: str | None = None
    tenant: str | None = None
    project: str | None = None
    groups: tuple[str, ...] = ()
    disabled_at: str | None = None

    @property
    def binding(self) -> Binding | None:
        return None if self.role is None else Binding(self.role, self.tenant, self.project)

    @property
    def display(self) -> str:
        """How pages and events name this user: the name, else the email, else the subject."""
        return self.name or self.email or self.subject

    def to_json(self) -> dict[str, Any]:
        out = asdict(self)
        out["groups"] = list(self.groups)
        return out

    @classmethod
    def from_json(cls, data: Any, where: str) -> User:
        try:
            if not isinstance(data, dict):
                raise TypeError
            fields = dict(data)
            fields["groups"] = tuple(str(g) for g in fields.get("groups", ()))
            user = cls(**fields)
            if not is_user_id(user.id) or user.id != user_id(user.issuer, user.subject):
                raise ValueError
            if user.role is not None and user.role not in ROLES:
                raise ValueError
        except (TypeError, ValueError):
            raise Corrupt(f"{where} is not a user record") from None
        return user


class UserStore(Protocol):
    """Where users are kept: read by id, changed one at a time under the store's lock."""

    def get(self, user_id: str) -> User | None: ...

    def change(self, user_id: str, change: Callable[[User | None], User]) -> User:
        """Write ``change(found)`` (``found`` None for a new user) as one atomic step."""
        ...

    def all(self) -> list[User]: ...


# -- the rules ---------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Rule:
    """One line of the claim -> role table.

    ``claim`` names an ID token claim (``groups``, ``email``, ``hd``...). The rule matches
    when the claim (or one of its values, for a list) equals ``equals``, or, with
    ``email_domain``, when the ``email`` claim ends in ``@<domain>`` and the provider says it
    is verified. It then grants ``role`` in ``tenant`` and ``project`` (``*``: every project
    of the tenant; an ``admin`` rule names neither).
    """

    role: str
    tenant: str | None
    project: str | None
    claim: str = ""
    equals: str = ""
    email_domain: str = ""

    def matches(self, claims: Mapping[str, Any]) -> bool:
        if self.email_domain:
            email = claims.get("email")
            verified = claims.get("email_verified", True) is not False
            return (
                isinstance(email, str)
                and verified
                and email.lower().endswith("@" + self.email_domain.lower())
            )
        value = claims.get(self.claim)
        values = value if isinstance(value, list) else [value]
        return any(isinstance(v, str | int | bool) and str(v) == self.equals for v in values)

    @property
    def binding(self) -> Binding:
        return Binding(self.role, self.tenant, self.project)


def parse_rules(data: Any) -> tuple[Rule, ...]:
    """The rules of a JSON list, each checked (ValueError names the one refused)."""
    if not isinstance(data, list):
        raise ValueError("the role rules are a JSON list of objects")
    if len(data) > MAX_RULES:
        raise ValueError(f"at most {MAX_RULES} role rules")
    rules = []
    for i, item in enumerate(data):
        where = f"role rule {i + 1}"
        if not isinstance(item, dict):
            raise ValueError(f"{where}: an object")
        unknown = set(item) - {"claim", "equals", "email_domain", "role", "tenant", "project"}
        if unknown:
            raise ValueError(f"{where}: unknown field {sorted(unknown)[0]!r}")
        role = item.get("role")
        if role not in ROLES:
            raise ValueError(f"{where}: role must be one of {', '.join(ROLES)}")
        tenant, project = item.get("tenant"), item.get("project", "*")
        if role == "admin":
            if tenant is not None:
                raise ValueError(f"{where}: an admin rule names no tenant")
            project = None
        else:
            if not isinstance(tenant, str) or not isinstance(project, str):
                raise ValueError(f"{where}: tenant and project (or *) are needed")
            try:
                validate_id("tenant", tenant)
                if project != "*":
                    validate_id("project", project)
            except Exception as exc:  # noqa: BLE001 - InvalidName, said as the rule's fault
                raise ValueError(f"{where}: {exc}") from None
            project = None if project == "*" else project
            if project is not None and is_reserved_project(project):
                raise ValueError(f"{where}: a rule cannot name a private space")
            if project is not None and role == "tenant_admin":
                raise ValueError(f"{where}: a tenant_admin covers the whole tenant: project *")
        domain = item.get("email_domain", "")
        claim, equals = item.get("claim", ""), item.get("equals", "")
        if not isinstance(domain, str) or not isinstance(claim, str):
            raise ValueError(f"{where}: claim and email_domain are strings")
        if not isinstance(equals, str | int | bool):
            raise ValueError(f"{where}: equals is a string")
        if bool(domain) == bool(claim):
            raise ValueError(f"{where}: give either claim and equals, or email_domain")
        rules.append(
            Rule(
                role=role,
                tenant=tenant,
                project=project,
                claim=claim,
                equals=str(equals),
                email_domain=domain.lstrip("@"),
            )
        )
    return tuple(rules)


def signed_in(
    found: User | None,
    *,
    issuer: str,
    subject: str,
    email: str,
    name: str,
    groups: tuple[str, ...],
    binding: Binding | None,
    now: str,
) -> User:
    """The record of a user after a sign-in: created on the first one, its name, email,
    groups and role refreshed on every one."""
    base = found or User(
        id=user_id(issuer, subject),
        issuer=issuer,
        subject=subject,
        email="",
        name="",
        created_at=now,
    )
    return replace(
        base,
        email=email[:MAX_TEXT],
        name=name[:MAX_TEXT],
        groups=tuple(g[:MAX_TEXT] for g in groups[:100]),
        last_sign_in_at=now,
        role=binding.role if binding else None,
        tenant=binding.tenant if binding else None,
        project=binding.project if binding else None,
    )
