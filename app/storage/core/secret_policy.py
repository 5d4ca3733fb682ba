"""What a project does with the secrets found in what it is sent: its policy and allowlist.

A project's entry in the limits document (core/limits.py) may hold a ``"secrets"`` section,
and so may its tenant's entry, which every project of the tenant inherits::

    "projects": {"acme/web": {"secrets": {
        "policy": "reject",
        "allow_patterns": ["AKIAIOSFODNN7EXAMPLE"],
        "allow_fingerprints": ["9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08"]
    }}}

``policy`` is one of :data:`POLICIES`:

* ``mask`` (the default): each secret is replaced by ``[secret:<kind>]`` before it is stored,
  and the answer says how many of each kind were masked;
* ``reject``: the write is refused with a 422 that names each secret's kind and where it is,
  and nothing is stored;
* ``allow``: what is written is stored as given (a project meant to hold credentials).

``allow_patterns`` are regular expressions searched in each found value (one that matches
lets it through); ``allow_fingerprints`` the SHA-256 (hex) of exact values that are not
secrets. A project's policy wins over its tenant's; the two allowlists add up.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field

POLICIES = ("mask", "reject", "allow")
DEFAULT_POLICY = "mask"
MAX_PATTERNS = 64
MAX_PATTERN_CHARS = 256
MAX_FINGERPRINTS = 1024
_FINGERPRINT = re.compile(r"[0-9a-f]{64}")
FIELDS = ("policy", "allow_patterns", "allow_fingerprints")


class SecretsSectionError(ValueError):
    """A ``"secrets"`` section breaks the rules above (the message says which)."""


@dataclass(frozen=True, slots=True)
class SecretsOverride:
    """The ``"secrets"`` section of one entry; None: not set here."""

    policy: str | None = None
    allow_patterns: tuple[str, ...] | None = None
    allow_fingerprints: tuple[str, ...] | None = None

    def to_json(self) -> dict[str, object]:
        out: dict[str, object] = {}
        if self.policy is not None:
            out["policy"] = self.policy
        if self.allow_patterns is not None:
            out["allow_patterns"] = list(self.allow_patterns)
        if self.allow_fingerprints is not None:
            out["allow_fingerprints"] = list(self.allow_fingerprints)
        return out

    def merged(self, change: SecretsOverride) -> SecretsOverride:
        """This section with every field ``change`` sets replaced."""
        return SecretsOverride(
            change.policy if change.policy is not None else self.policy,
            change.allow_patterns if change.allow_patterns is not None else self.allow_patterns,
            change.allow_fingerprints
            if change.allow_fingerprints is not None
            else self.allow_fingerprints,
        )

    @property
    def empty(self) -> bool:
        return not self.to_json()


def from_json(obj: object, where: str) -> SecretsOverride:
    """Check a ``"secrets"`` section; SecretsSectionError naming ``where`` when it is wrong."""
    if not isinstance(obj, dict):
        raise SecretsSectionError(f"{where}: the secrets section must be an object")
    unknown = sorted(set(obj) - set(FIELDS))
    if unknown:
        raise SecretsSectionError(f"{where}: unknown secrets field(s) {', '.join(unknown)}")
    policy = obj.get("policy")
    if policy is not None and policy not in POLICIES:
        raise SecretsSectionError(f"{where}: policy must be one of {', '.join(POLICIES)}")
    patterns = obj.get("allow_patterns")
    if patterns is not None:
        patterns = tuple(_patterns(patterns, where))
    fingerprints = obj.get("allow_fingerprints")
    if fingerprints is not None:
        fingerprints = tuple(_fingerprints(fingerprints, where))
    return SecretsOverride(policy, patterns, fingerprints)


def _strings(value: object, where: str, name: str, most: int) -> list[str]:
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise SecretsSectionError(f"{where}: {name} must be a list of strings")
    if len(value) > most:
        raise SecretsSectionError(f"{where}: {name} holds at most {most} entries")
    return list(dict.fromkeys(value))  # in order, once each


def _patterns(value: object, where: str) -> list[str]:
    found = _strings(value, where, "allow_patterns", MAX_PATTERNS)
    for pattern in found:
        if not pattern or len(pattern) > MAX_PATTERN_CHARS:
            raise SecretsSectionError(
                f"{where}: an allow pattern has 1 to {MAX_PATTERN_CHARS} characters"
            )
        try:
            re.compile(pattern)
        except re.error as exc:
            raise SecretsSectionError(f"{where}: allow pattern {pattern!r}: {exc}") from None
    return found


def _fingerprints(value: object, where: str) -> list[str]:
    found = _strings(value, where, "allow_fingerprints", MAX_FINGERPRINTS)
    for item in found:
        if _FINGERPRINT.fullmatch(item) is None:
            raise SecretsSectionError(
                f"{where}: an allow fingerprint is the SHA-256 of the value, 64 lowercase hex"
                " digits"
            )
    return found


@dataclass(frozen=True, slots=True)
class SecretPolicy:
    """What one project does with a secret: the policy in force and both allowlists."""

    policy: str = DEFAULT_POLICY
    allow_patterns: tuple[str, ...] = ()
    allow_fingerprints: tuple[str, ...] = ()

    def to_json(self) -> dict[str, object]:
        return {
            "policy": self.policy,
            "allow_patterns": list(self.allow_patterns),
            "allow_fingerprints": list(self.allow_fingerprints),
        }


DEFAULT = SecretPolicy()


@dataclass(frozen=True, slots=True)
class SecretSettings:
    """Every ``"secrets"`` section of the document, by tenant and by (tenant, project);
    ``skipped``: why each entry that breaks the rules was left out."""

    tenants: Mapping[str, SecretsOverride] = field(default_factory=dict)
    projects: Mapping[tuple[str, str], SecretsOverride] = field(default_factory=dict)
    skipped: tuple[str, ...] = ()

    def of(self, tenant: str, project: str, default: str = DEFAULT_POLICY) -> SecretPolicy:
        """The policy ``tenant/project`` works under: the project's policy, else the tenant's,
        else ``default`` (the deployment's, MEMORY_SECRETS_POLICY); both allowlists
        together."""
        own = self.projects.get((tenant, project)) or SecretsOverride()
        inherited = self.tenants.get(tenant) or SecretsOverride()
        policy = own.policy or inherited.policy or default
        patterns = (inherited.allow_patterns or ()) + (own.allow_patterns or ())
        prints = (inherited.allow_fingerprints or ()) + (own.allow_fingerprints or ())
        return SecretPolicy(policy, tuple(dict.fromkeys(patterns)), tuple(dict.fromkeys(prints)))


NO_SETTINGS = SecretSettings()
