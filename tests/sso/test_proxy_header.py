"""The trusted proxy's header (oauth2-proxy, Cloudflare Access, Tailscale serve), on each
backend: believed from an address MEMORY_TRUSTED_PROXIES lists, ignored from any other; and
the token sign-in narrowed to admins, or turned off."""

from __future__ import annotations

import json
from typing import Any

import pytest
from flask import Flask

from app.config import ConfigError
from app.console.people import PROXY_ISSUER
from app.storage.core.users import user_id
from tests.conftest import BufferedClient, Tokens
from tests.console.conftest import SAME_SITE, csrf_of

pytestmark = pytest.mark.all_backends

RULES = [{"claim": "groups", "equals": "eng", "role": "writer", "tenant": "acme", "project": "*"}]
HEADERS = {"X-Forwarded-Email": "ana@example.com", "X-Forwarded-Groups": "eng,ops"}


@pytest.fixture
def app_overrides() -> dict[str, Any]:
    return {
        "PROXY_USER_HEADER": "X-Forwarded-Email",
        "PROXY_GROUPS_HEADER": "X-Forwarded-Groups",
        "TRUSTED_PROXIES": "10.0.0.0/8",
        "ROLE_RULES": json.dumps(RULES),
        "CONSOLE_TOKEN_SIGNIN": "admins",
    }


def test_the_header_from_a_trusted_proxy_signs_the_person_in(app: Flask) -> None:
    app.test_client_class = BufferedClient
    client = app.test_client()
    r = client.get(
        "/console/p/acme/web/tasks", headers=HEADERS, environ_base={"REMOTE_ADDR": "10.1.2.3"}
    )
    assert r.status_code == 200, r.text[:300]
    user = app.extensions["storage"].users.get(user_id(PROXY_ISSUER, "ana@example.com"))
    assert user is not None and user.role == "writer" and user.groups == ("eng", "ops")


def test_the_header_from_any_other_address_names_no_one(app: Flask) -> None:
    client = app.test_client()
    for peer in ("127.0.0.1", "192.168.1.10", "11.0.0.1"):
        r = client.get(
            "/console/p/acme/web/tasks", headers=HEADERS, environ_base={"REMOTE_ADDR": peer}
        )
        assert r.status_code == 303 and "/console/signin" in r.headers["Location"], peer
    assert app.extensions["storage"].users.get(user_id(PROXY_ISSUER, "ana@example.com")) is None


def test_token_sign_in_for_admins_only_refuses_a_writer(app: Flask, tokens: Tokens) -> None:
    client = app.test_client()
    form = client.get("/console/signin")
    r = client.post(
        "/console/signin",
        data={"token": tokens.secrets["writer"], "csrf": csrf_of(form)},
        headers=SAME_SITE,
    )
    assert r.status_code == 403
    form = client.get("/console/signin")
    r = client.post(
        "/console/signin",
        data={"token": tokens.secrets["tenant_admin"], "csrf": csrf_of(form)},
        headers=SAME_SITE,
    )
    assert r.status_code == 303


@pytest.mark.tree_only("checks settings: no storage")
def test_settings_that_would_trust_anyone_are_refused(app: Flask) -> None:
    from app import create_app

    base = {
        "STORAGE_ROOT": app.config["STORAGE_ROOT"],
        "TOKENS_FILE": app.config["TOKENS_FILE"],
    }
    refused: list[dict[str, Any]] = [
        {"PROXY_USER_HEADER": "X-Forwarded-Email", "TRUSTED_PROXIES": 1},
        {"OIDC_ALGORITHMS": "RS256,HS256"},
        {"OIDC_ALGORITHMS": "none"},
        {"OIDC_CLOCK_SKEW": 3600},
        {"CONSOLE_TOKEN_SIGNIN": "maybe"},
        {"ROLE_RULES": json.dumps([{"claim": "groups", "equals": "x", "role": "root"}])},
        {"OIDC_ISSUER": "http://idp.example.com", "OIDC_CLIENT_ID": "c"},
    ]
    for settings in refused:
        with pytest.raises(ConfigError):
            create_app({**base, **settings})


def test_token_sign_in_turned_off_is_refused(app: Flask, tokens: Tokens) -> None:
    client = app.test_client()
    form = client.get("/console/signin")  # its CSRF token, while the form is still offered
    app.config["CONSOLE_TOKEN_SIGNIN"] = "off"
    assert 'name="token"' not in client.get("/console/signin").text
    r = client.post(
        "/console/signin",
        data={"token": tokens.secrets["admin"], "csrf": csrf_of(form)},
        headers=SAME_SITE,
    )
    assert r.status_code == 403 and "turned off" in r.text
