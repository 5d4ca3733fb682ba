"""The token, limit and session use cases (app/services/admin.py) hold their own rules,
whichever door calls them: a manager grants at most its own role and only where it manages;
a token bound to a project is at most its project_admin; a project's limits are its tenant's
managers', a tenant's own an admin's. A refused change changes nothing and records nothing.
"""

from __future__ import annotations

from typing import Any

import pytest
from flask import Flask

from app.services import admin
from app.storage.core.errors import Forbidden
from app.storage.core.limits import QuotaOverride, RateOverride
from app.storage.core.names import Scope
from app.storage.core.tokens import Token
from tests.conftest import Tokens


@pytest.fixture
def parts(app: Flask, tokens: Tokens) -> tuple[Any, Any, dict[str, Token]]:
    registry = app.extensions["token_registry"]
    return app.extensions["storage"], registry, {n: registry.get(i) for n, i in tokens.ids.items()}


def _events(storage: Any, project: str = "web") -> list[tuple[str, str]]:
    return [(e.kind, e.action) for e in storage.audit_log.page(Scope("acme", project)).events]


@pytest.mark.parametrize(
    ("by", "project", "role"),
    [
        ("project_admin", "web", "tenant_admin"),  # above its own role
        ("project_admin", "mobile", "reader"),  # a project it does not act in
        ("project_admin", None, "reader"),  # the whole tenant
        ("writer", "web", "reader"),  # no manager
        ("tenant_admin", "web", "tenant_admin"),  # a tenant_admin is never bound to a project
        ("admin", None, "admin"),  # admin tokens are the operator's
    ],
)
def test_a_token_is_made_only_where_and_as_high_as_the_rules_allow(
    parts: tuple[Any, Any, dict[str, Token]], by: str, project: str | None, role: str
) -> None:
    storage, registry, token = parts
    before = len(registry.all())
    with pytest.raises(Forbidden):
        admin.create_token(storage, registry, token[by], "acme", project, role=role)
    assert len(registry.all()) == before and _events(storage) == []


def test_a_token_made_and_revoked_is_recorded_in_its_project(
    parts: tuple[Any, Any, dict[str, Token]],
) -> None:
    storage, registry, token = parts
    made, secret = admin.create_token(
        storage, registry, token["project_admin"], "acme", "web", role="writer", name="ci"
    )
    assert registry.authenticate(secret) == made
    with pytest.raises(Forbidden):  # a writer revokes nothing, a project_admin no tenant_admin
        admin.revoke_token(storage, registry, token["writer"], made)
    with pytest.raises(Forbidden):
        admin.revoke_token(storage, registry, token["project_admin"], token["tenant_admin"])
    admin.revoke_token(storage, registry, token["project_admin"], made)
    assert registry.authenticate(secret) is None
    assert _events(storage) == [("token", "revoked"), ("token", "created")]


def test_limits_are_set_by_the_tenants_managers_and_its_own_by_an_admin(
    parts: tuple[Any, Any, dict[str, Token]],
) -> None:
    storage, _, token = parts
    quota, rate = QuotaOverride(tasks=5), RateOverride(rps=5.0)
    for by, project in (("project_admin", "web"), ("tenant_admin", None)):
        with pytest.raises(Forbidden):
            admin.set_quota(storage, token[by], "acme", project, quota)
        with pytest.raises(Forbidden):
            admin.clear_rate(storage, token[by], "acme", project)
    assert storage.limits().quotas().projects == {} and _events(storage) == []
    admin.set_quota(storage, token["tenant_admin"], "acme", "web", quota)
    admin.set_rate(storage, token["admin"], "acme", None, rate)
    assert storage.limits().quotas().projects[("acme", "web")].tasks == 5
    assert storage.limits().rates().tenants["acme"].rps == 5
    assert admin.clear_quota(storage, token["tenant_admin"], "acme", "web") is True
    assert _events(storage) == [("limits", "cleared"), ("limits", "set")]


def test_a_sign_in_names_a_usable_token_and_a_wrong_secret_no_one(
    parts: tuple[Any, Any, dict[str, Token]], tokens: Tokens
) -> None:
    storage, registry, token = parts
    assert admin.sign_in(storage, registry, "pm_nope") is None
    assert admin.sign_in(storage, registry, tokens.secrets["reader"]) == token["reader"]
    admin.sign_out(storage, registry, token["reader"])
    assert _events(storage) == [("session", "signed_out"), ("session", "signed_in")]
