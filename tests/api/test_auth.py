"""Every route needs a credential; scope and roles hold on every route."""

from __future__ import annotations

import re
from urllib.parse import urlsplit

import pytest
from flask import Flask
from flask.testing import FlaskClient

from app.api.public import PUBLIC_ENDPOINTS
from app.console import PUBLIC_ENDPOINTS as CONSOLE_PUBLIC_ENDPOINTS
from tests.conftest import FixedClock, Tokens

BASE = "/sandbox/memory/v1"
_SAMPLE = {
    "task_id": "t",
    "turn": "0",
    "name": "a.txt",
    "memory_store_id": "memstore_x",
    "memory_id": "mem_x",
    "memory_version_id": "memver_x",
}


def protected_routes(app: Flask) -> list[tuple[str, str, str]]:
    routes = []
    for rule in app.url_map.iter_rules():
        if rule.endpoint in PUBLIC_ENDPOINTS | CONSOLE_PUBLIC_ENDPOINTS:
            continue
        url = re.sub(r"<(?:[a-z]+:)?([a-z_]+)>", lambda m: _SAMPLE.get(m.group(1), "x"), rule.rule)
        for method in sorted((rule.methods or set()) - {"HEAD", "OPTIONS"}):
            routes.append((method, url, rule.endpoint))
    return routes


def test_every_non_public_route_requires_a_credential(app: Flask, client: FlaskClient) -> None:
    routes = protected_routes(app)
    assert len(routes) >= 8
    assert any(endpoint.startswith("console.") for _, _, endpoint in routes)
    for method, url, endpoint in routes:
        for headers in (
            {},
            {"Authorization": "Bearer pm_wrong"},
            {"x-api-key": "nope"},
            {"Authorization": "Basic dXNlcjpwYXNz"},
            {"Authorization": "Bearer"},
        ):
            resp = client.open(
                url, method=method, headers=headers, data=b"{}", content_type="application/json"
            )
            assert b"summary" not in resp.data
            if endpoint.startswith("console."):
                # A browser without a console session is sent to the sign-in page; the
                # console never reads API credentials.
                assert resp.status_code == 303, (method, url, headers, resp.status_code)
                assert urlsplit(resp.headers["Location"]).path == "/console/signin"
                continue
            assert resp.status_code == 401, (method, url, headers, resp.status_code)
            assert resp.headers["WWW-Authenticate"].startswith("Bearer")


def test_public_routes_need_no_credential(client: FlaskClient) -> None:
    assert client.get("/healthz").status_code == 200
    assert client.get("/readyz").status_code == 200
    assert client.get(f"{BASE}/openapi.yaml").status_code == 200


def test_x_api_key_is_accepted(client: FlaskClient, tokens: Tokens) -> None:
    resp = client.get(f"{BASE}/tasks", headers={"x-api-key": tokens.secrets["reader"]})
    assert resp.status_code == 200


def test_expired_and_revoked_tokens_are_refused(
    client: FlaskClient, tokens: Tokens, clock: FixedClock
) -> None:
    from datetime import timedelta

    token, secret = tokens.registry.create(
        role="reader", tenant="acme", project="web", expires_in=timedelta(days=1)
    )
    headers = {"Authorization": f"Bearer {secret}"}
    assert client.get(f"{BASE}/tasks", headers=headers).status_code == 200
    clock.advance(days=1)
    assert client.get(f"{BASE}/tasks", headers=headers).status_code == 401
    assert client.get(f"{BASE}/tasks", headers=tokens.headers("writer")).status_code == 200
    tokens.registry.revoke(tokens.ids["writer"])
    assert client.get(f"{BASE}/tasks", headers=tokens.headers("writer")).status_code == 401


def test_registry_stores_only_hashes_with_mode_0600(app: Flask, tokens: Tokens) -> None:
    import os
    import stat
    from pathlib import Path

    path = app.config["TOKENS_FILE"]
    text = Path(path).read_text()
    for secret in tokens.secrets.values():
        assert secret not in text
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600


def _seed(client: FlaskClient, tokens: Tokens) -> None:
    """acme/web has task "t" (turn 0 with artifact a.txt) written by "writer"."""
    client.put(
        f"{BASE}/tasks/t/turns/0",
        json={"summary_md": "SECRET-SUMMARY"},
        headers=tokens.headers("writer"),
    )
    client.put(
        f"{BASE}/tasks/t/turns/0/artifacts/a.txt",
        data=b"SECRET-BYTES",
        headers=tokens.headers("writer"),
    )


ALL_ROUTES = [
    ("GET", f"{BASE}/project.md"),
    ("GET", f"{BASE}/tasks"),
    ("GET", f"{BASE}/tasks/t"),
    ("DELETE", f"{BASE}/tasks/t"),
    ("GET", f"{BASE}/tasks/t/turns/0"),
    ("PUT", f"{BASE}/tasks/t/turns/0"),
    ("GET", f"{BASE}/tasks/t/turns/0/artifacts/a.txt"),
    ("PUT", f"{BASE}/tasks/t/turns/0/artifacts/a.txt"),
]


def _call(client: FlaskClient, method: str, url: str, headers: dict[str, str]):
    if method == "PUT" and "/artifacts/" in url:
        return client.put(url, data=b"OTHER", headers=headers)
    if method == "PUT":
        return client.put(url, json={"summary_md": "OTHER"}, headers=headers)
    return client.open(url, method=method, headers=headers)


def _still_intact(client: FlaskClient, tokens: Tokens) -> None:
    h = tokens.headers("reader")
    assert (
        client.get(f"{BASE}/tasks/t/turns/0", headers=h).get_json()["summary_md"]
        == "SECRET-SUMMARY"
    )
    assert client.get(f"{BASE}/tasks/t/turns/0/artifacts/a.txt", headers=h).data == b"SECRET-BYTES"


@pytest.mark.parametrize(("method", "url"), ALL_ROUTES)
@pytest.mark.parametrize(
    ("who", "extra", "expected"),
    [
        ("other_tenant", {}, {200, 204, 404}),  # its own (empty) project: never acme's data
        ("other_tenant", {"X-Sandbox-Tenant-Id": "acme"}, {403}),
        ("other_project", {}, {200, 204, 404}),
        ("other_project", {"X-Sandbox-Project-Id": "web"}, {403}),
        ("writer", {"X-Sandbox-Project-Id": "mobile"}, {403}),
        ("writer", {"X-Sandbox-Tenant-Id": "globex"}, {403}),
        ("tenant_admin", {}, {422}),
        ("admin", {}, {422}),
    ],
)
def test_scoping_matrix(
    client: FlaskClient, tokens: Tokens, method: str, url: str, who: str, extra: dict, expected: set
) -> None:
    _seed(client, tokens)
    resp = _call(client, method, url, tokens.headers(who, **extra))
    assert resp.status_code in expected, (who, extra, resp.status_code, resp.data)
    assert b"SECRET" not in resp.data
    if who in ("other_tenant", "other_project") and not extra and method != "PUT":
        assert resp.status_code != 200 or b"## t" not in resp.data
    _still_intact(client, tokens)


@pytest.mark.parametrize(("method", "url"), [r for r in ALL_ROUTES if r[0] in ("PUT", "DELETE")])
def test_reader_cannot_write(client: FlaskClient, tokens: Tokens, method: str, url: str) -> None:
    _seed(client, tokens)
    resp = _call(client, method, url, tokens.headers("reader"))
    assert resp.status_code == 403
    assert resp.get_json() == {"detail": "role reader may only read"}
    _still_intact(client, tokens)


def test_other_projects_data_is_separate(client: FlaskClient, tokens: Tokens) -> None:
    _seed(client, tokens)
    h = tokens.headers("other_project")
    assert client.get(f"{BASE}/tasks", headers=h).get_json()["total"] == 0
    assert client.get(f"{BASE}/tasks/t", headers=h).status_code == 404
    assert b"SECRET" not in client.get(f"{BASE}/project.md", headers=h).data


def test_tenant_admin_reaches_any_project_of_its_tenant(
    client: FlaskClient, tokens: Tokens
) -> None:
    _seed(client, tokens)
    h = tokens.headers("tenant_admin", **{"X-Sandbox-Project-Id": "web"})
    assert (
        client.get(f"{BASE}/tasks/t/turns/0", headers=h).get_json()["summary_md"]
        == "SECRET-SUMMARY"
    )
    other = tokens.headers(
        "tenant_admin", **{"X-Sandbox-Tenant-Id": "globex", "X-Sandbox-Project-Id": "web"}
    )
    assert client.get(f"{BASE}/tasks", headers=other).status_code == 403


def test_admin_names_tenant_and_project(client: FlaskClient, tokens: Tokens) -> None:
    _seed(client, tokens)
    h = tokens.headers("admin", **{"X-Sandbox-Tenant-Id": "acme", "X-Sandbox-Project-Id": "web"})
    assert client.get(f"{BASE}/tasks/t", headers=h).status_code == 200
    only_tenant = tokens.headers("admin", **{"X-Sandbox-Tenant-Id": "acme"})
    assert client.get(f"{BASE}/tasks", headers=only_tenant).status_code == 422


def test_admin_with_default_scope_needs_no_headers(client: FlaskClient, tokens: Tokens) -> None:
    tokens.add("first", role="admin", tenant="acme", project="web")
    _seed(client, tokens)
    assert client.get(f"{BASE}/tasks/t", headers=tokens.headers("first")).status_code == 200
    elsewhere = tokens.headers(
        "first", **{"X-Sandbox-Tenant-Id": "globex", "X-Sandbox-Project-Id": "p"}
    )
    assert client.get(f"{BASE}/tasks", headers=elsewhere).get_json()["total"] == 0


def test_duplicate_scope_headers_are_refused(client: FlaskClient, tokens: Tokens) -> None:
    headers = [
        ("Authorization", f"Bearer {tokens.secrets['tenant_admin']}"),
        ("X-Sandbox-Project-Id", "web"),
        ("X-Sandbox-Project-Id", "mobile"),
    ]
    resp = client.get(f"{BASE}/tasks", headers=headers)
    assert resp.status_code == 422
    assert resp.get_json()["detail"][0]["loc"] == ["header", "X-Sandbox-Project-Id"]


def test_log_lines_never_contain_the_secret(
    client: FlaskClient, tokens: Tokens, capfd: pytest.CaptureFixture[str]
) -> None:
    _seed(client, tokens)
    client.get(f"{BASE}/tasks", headers=tokens.headers("reader"))
    client.get(f"{BASE}/tasks", headers={"Authorization": "Bearer pm_not_a_real_token_value"})
    err = capfd.readouterr().err
    assert tokens.ids["reader"] in err
    for secret in [*tokens.secrets.values(), "pm_not_a_real_token_value"]:
        assert secret not in err
