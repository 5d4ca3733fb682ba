"""Token misuse on every route of both APIs (walked from the url_map, so none is forgotten).

For each route, with real ids of data that tenant acme / project web owns (a task with a
turn and an artifact, a memory store with a memory and a version): another tenant's token,
another project's token, a reader writing, an expired token, a revoked token and malformed
``Authorization`` headers each get the documented refusal, no response carries the other
side's data, and no log line carries a raw token.
"""

from __future__ import annotations

import re
from datetime import timedelta

import pytest
from flask import Flask
from flask.testing import FlaskClient

from app.api.public import PUBLIC_ENDPOINTS
from tests.conftest import FixedClock, Tokens
from tests.robust.helpers import BASE

# Runs against every backend MEMORY_TEST_BACKENDS names (tests/conftest.py).
pytestmark = pytest.mark.all_backends

SECRET_TEXT = b"SECRET-OF-ACME-WEB"
WRITE = {"POST", "PUT", "PATCH", "DELETE"}


def _seed(client: FlaskClient, tokens: Tokens) -> dict[str, str]:
    h = tokens.headers("writer")
    ids = {"task_id": "t", "turn": "0", "name": "a.bin"}
    assert (
        client.put(
            f"{BASE}/tasks/t/turns/0", json={"summary_md": SECRET_TEXT.decode()}, headers=h
        ).status_code
        == 200
    )
    assert (
        client.put(
            f"{BASE}/tasks/t/turns/0/artifacts/a.bin", data=SECRET_TEXT, headers=h
        ).status_code
        == 200
    )
    store = client.post("/v1/memory_stores", json={"name": SECRET_TEXT.decode()}, headers=h)
    if store.status_code == 200:  # the memory-stores API is present
        sid = store.get_json()["id"]
        mem = client.post(
            f"/v1/memory_stores/{sid}/memories",
            json={"path": "/notes.md", "content": SECRET_TEXT.decode()},
            headers=h,
        ).get_json()
        versions = client.get(f"/v1/memory_stores/{sid}/memory_versions", headers=h).get_json()
        ids.update(
            memory_store_id=sid,
            memory_id=mem.get("id", "mem_x"),
            memory_version_id=(versions.get("data") or [{"id": "memver_x"}])[0]["id"],
        )
    return ids


def _routes(app: Flask, ids: dict[str, str]) -> list[tuple[str, str]]:
    routes = []
    for rule in app.url_map.iter_rules():
        if rule.endpoint in PUBLIC_ENDPOINTS or rule.endpoint == "static":
            continue
        if rule.endpoint.startswith("console"):
            # The web console takes no API credential (tests/console/test_access.py walks
            # its routes with sessions of every kind of token).
            continue
        url = re.sub(r"<(?:[a-z]+:)?([a-z_]+)>", lambda m: ids.get(m.group(1), "x"), rule.rule)
        for method in sorted((rule.methods or set()) - {"HEAD", "OPTIONS"}):
            routes.append((method, url))
    return routes


def _send(client: FlaskClient, method: str, url: str, headers: dict[str, str]):  # noqa: ANN202
    return client.open(
        url, method=method, headers=headers, data=b"{}", content_type="application/json"
    )


@pytest.fixture
def setup(app: Flask, client: FlaskClient, tokens: Tokens, clock: FixedClock):  # noqa: ANN201
    ids = _seed(client, tokens)
    tokens.add(
        "expired", role="writer", tenant="acme", project="web", expires_in=timedelta(hours=1)
    )
    tokens.add("revoked", role="writer", tenant="acme", project="web")
    tokens.registry.revoke(tokens.ids["revoked"])
    clock.advance(hours=2)
    return _routes(app, ids)


def test_other_tenant_and_other_project_never_see_acme_web(
    client: FlaskClient, tokens: Tokens, setup
) -> None:  # noqa: ANN001
    routes = setup
    assert len(routes) >= 8
    for who, extra in [
        ("other_tenant", {}),
        ("other_tenant", {"X-Sandbox-Tenant-Id": "acme"}),
        ("other_tenant", {"X-Sandbox-Tenant-Id": "acme", "X-Sandbox-Project-Id": "web"}),
        ("other_project", {}),
        ("other_project", {"X-Sandbox-Project-Id": "web"}),
    ]:
        for method, url in routes:
            resp = _send(client, method, url, tokens.headers(who, **extra))
            assert SECRET_TEXT not in resp.data, (who, extra, method, url)
            if extra:
                # Naming a scope the token does not cover is refused outright.
                assert resp.status_code in {400, 403, 422}, (
                    who,
                    extra,
                    method,
                    url,
                    resp.status_code,
                )
            elif method not in WRITE or "/tasks/" in url or "/memory_stores/" in url:
                # In its own scope the outsider finds nothing of acme/web's (a redaction is
                # refused by role before anything is looked up).
                allowed = {200, 400, 404, 405, 415, 422} | (
                    {403} if url.endswith("/redact") else set()
                )
                assert resp.status_code in allowed, (
                    who,
                    method,
                    url,
                    resp.status_code,
                )
                if (
                    resp.status_code == 200
                    and method == "GET"
                    and url.endswith(("/t", "/0", "a.bin"))
                ):
                    pytest.fail(f"{who} read {url}")


def test_reader_cannot_write_anywhere(
    app: Flask, client: FlaskClient, tokens: Tokens, setup
) -> None:  # noqa: ANN001
    # A view marked as reading (app/web/auth.py ``reads``: POST /recall, whose prompt goes in
    # a body rather than a URL) is a reader's too; every other POST, PUT, PATCH or DELETE
    # is refused to a reader.
    reading = {
        rule.rule
        for rule in app.url_map.iter_rules()
        if getattr(app.view_functions[rule.endpoint], "__reads__", False)
    }
    assert reading, "no view is marked as reading: the exemption below would be dead"
    for method, url in setup:
        # Every MCP call is a POST, readers' too: /mcp (and its alias under the API prefix)
        # refuses a reader's write tool in the tool's result, naming the role
        # (tests/api/test_mcp.py, tests/agents/test_mcp_sdk.py).
        if url in reading:
            resp = _send(client, method, url, tokens.headers("reader"))
            assert resp.status_code != 403, (method, url, resp.status_code)
        elif method in WRITE and not url.endswith("/mcp"):
            resp = _send(client, method, url, tokens.headers("reader"))
            assert resp.status_code == 403, (method, url, resp.status_code)


def test_expired_revoked_and_malformed_credentials(
    client: FlaskClient, tokens: Tokens, setup
) -> None:  # noqa: ANN001
    secret = tokens.secrets["writer"]
    bad = [
        tokens.headers("expired"),
        tokens.headers("revoked"),
        {"Authorization": f"Bearer {secret[:-1]}"},
        {"Authorization": f"Bearer {secret}x"},
        {"Authorization": f"bearer  {secret} extra"},
        {"Authorization": f"Basic {secret}"},
        {"Authorization": secret},
        {"Authorization": "Bearer "},
        {"Authorization": "Bearer \x7f"},
        {"x-api-key": ""},
    ]
    for method, url in setup:
        for headers in bad:
            resp = _send(client, method, url, headers)
            assert resp.status_code == 401, (method, url, headers, resp.status_code)
            assert "WWW-Authenticate" in resp.headers
            assert SECRET_TEXT not in resp.data


def test_no_raw_token_in_any_log_line(
    client: FlaskClient,
    tokens: Tokens,
    setup,
    capfd: pytest.CaptureFixture[str],
    caplog: pytest.LogCaptureFixture,
) -> None:  # noqa: ANN001
    for method, url in setup:
        for who in ("writer", "reader", "other_tenant", "expired", "revoked"):
            _send(client, method, url, tokens.headers(who))
        _send(client, method, url, {"Authorization": f"Bearer {tokens.secrets['writer']}x"})
    out, err = capfd.readouterr()
    text = out + err + caplog.text
    assert text.strip(), "no log lines were captured: the check would prove nothing"
    for secret in tokens.secrets.values():
        assert secret not in text and secret[3:20] not in text
