"""OAuth 2.1 for /mcp through the app, on each backend: the metadata, the consent page, the
token endpoint, and every refusal the authorization spec asks for, each in its own test.
(tests/agents/test_oauth_sdk.py runs the official SDK's whole flow on a real gunicorn.)"""

from __future__ import annotations

import base64
import hashlib
import re
import secrets
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlencode, urlsplit

import pytest
from flask import Flask
from flask.testing import FlaskClient
from joserfc import jwt
from joserfc.jwk import OctKey

from app.services.oauth import GRANT_RECHECK_SECONDS
from app.storage.core.names import OAUTH_KEY, Scope
from tests.conftest import FixedClock, Tokens

RESOURCE = "http://localhost/mcp"
REDIRECT = "http://127.0.0.1:5555/cb"
MCP_HEADERS = {"Accept": "application/json, text/event-stream"}

pytestmark = pytest.mark.all_backends


def pkce() -> tuple[str, str]:
    verifier = secrets.token_urlsafe(48)
    digest = hashlib.sha256(verifier.encode()).digest()
    return verifier, base64.urlsafe_b64encode(digest).rstrip(b"=").decode()


def csrf_of(html: str) -> str:
    found = re.search(r'name="csrf" value="([^"]+)"', html)
    assert found, html[:500]
    return found.group(1)


@dataclass
class Flow:
    app: Flask
    tokens: Tokens
    client: FlaskClient
    client_id: str = ""

    def register(self, **extra: Any) -> dict[str, Any]:
        body = {
            "redirect_uris": [REDIRECT],
            "client_name": "Test client",
            "token_endpoint_auth_method": "none",
            "grant_types": ["authorization_code", "refresh_token"],
            **extra,
        }
        r = self.client.post("/oauth/register", json=body)
        assert r.status_code == 201, r.get_json()
        self.client_id = r.get_json()["client_id"]
        return dict(r.get_json())

    def sign_in(self, who: str) -> None:
        page = self.client.get("/console/signin")
        r = self.client.post(
            "/console/signin", data={"token": self.tokens.secrets[who], "csrf": csrf_of(page.text)}
        )
        assert r.status_code == 303

    def query(self, challenge: str, **changes: str) -> str:
        params = {
            "response_type": "code",
            "client_id": self.client_id,
            "redirect_uri": REDIRECT,
            "code_challenge": challenge,
            "code_challenge_method": "S256",
            "state": "st-1",
            "resource": RESOURCE,
            "scope": "memory",
            **changes,
        }
        return urlencode({k: v for k, v in params.items() if v != ""})

    def approve(self, query: str, role: str = "writer") -> dict[str, list[str]]:
        page = self.client.get(f"/console/oauth/authorize?{query}")
        assert page.status_code == 200, page.text[:500]
        r = self.client.post(
            f"/console/oauth/authorize?{query}",
            data={"csrf": csrf_of(page.text), "role": role, "decision": "approve"},
        )
        assert r.status_code == 302, r.text[:500]
        assert r.headers["Location"].startswith(REDIRECT + "?")
        return parse_qs(urlsplit(r.headers["Location"]).query)

    def exchange(self, code: str, verifier: str, **extra: str) -> Any:
        data = {
            "grant_type": "authorization_code",
            "code": code,
            "redirect_uri": REDIRECT,
            "client_id": self.client_id,
            "code_verifier": verifier,
            "resource": RESOURCE,
            **extra,
        }
        return self.client.post("/oauth/token", data=data)

    def tokens_for(self, who: str = "writer", role: str = "writer") -> dict[str, Any]:
        self.register()
        self.sign_in(who)
        verifier, challenge = pkce()
        answer = self.approve(self.query(challenge), role)
        r = self.exchange(answer["code"][0], verifier)
        assert r.status_code == 200, r.get_json()
        return dict(r.get_json())

    def refresh(self, refresh_token: str) -> Any:
        data = {
            "grant_type": "refresh_token",
            "refresh_token": refresh_token,
            "client_id": self.client_id,
        }
        return self.client.post("/oauth/token", data=data)

    def mcp(self, access_token: str, method: str = "tools/list", **params: Any) -> Any:
        headers = {"Authorization": f"Bearer {access_token}", **MCP_HEADERS}
        body = {"jsonrpc": "2.0", "id": 1, "method": method, "params": params}
        return self.client.post("/mcp", json=body, headers=headers)


@pytest.fixture
def flow(app: Flask, tokens: Tokens, client: FlaskClient) -> Flow:
    return Flow(app, tokens, client)


def test_metadata_and_the_401_say_where_tokens_come_from(flow: Flow) -> None:
    prm = flow.client.get("/.well-known/oauth-protected-resource/mcp").get_json()
    assert prm["resource"] == RESOURCE
    assert prm["authorization_servers"] == ["http://localhost"]
    assert prm["bearer_methods_supported"] == ["header"] and prm["scopes_supported"]
    assert flow.client.get("/.well-known/oauth-protected-resource").get_json() == prm
    asm = flow.client.get("/.well-known/oauth-authorization-server").get_json()
    assert asm["issuer"] == "http://localhost"
    assert asm["code_challenge_methods_supported"] == ["S256"]
    assert asm["authorization_response_iss_parameter_supported"] is True
    assert asm["client_id_metadata_document_supported"] is True
    r = flow.client.post("/mcp", json={}, headers=MCP_HEADERS)
    assert r.status_code == 401
    assert r.headers["WWW-Authenticate"] == (
        'Bearer resource_metadata="http://localhost/.well-known/oauth-protected-resource/mcp",'
        ' scope="memory"'
    )


def test_a_consented_grant_acts_in_its_role_as_its_token(flow: Flow) -> None:
    issued = flow.tokens_for("writer", role="writer")
    assert issued["expires_in"] == 3600 and issued["refresh_token"].startswith("pmr_")
    r = flow.mcp(
        issued["access_token"],
        "tools/call",
        name="record_turn",
        arguments={"task_id": "t1", "summary_md": "via oauth"},
    )
    assert r.status_code == 200 and not r.get_json()["result"]["isError"], r.get_json()
    task = flow.app.extensions["storage"].tasks.get_task(Scope("acme", "web"), "t1")
    assert task.owner == flow.tokens.ids["writer"]  # owned as if recorded with the token
    # The REST API takes no OAuth token: its audience is /mcp.
    r = flow.client.get(
        "/sandbox/memory/v1/tasks", headers={"Authorization": f"Bearer {issued['access_token']}"}
    )
    assert r.status_code == 401


def test_the_iss_and_state_come_back_with_the_code(flow: Flow) -> None:
    flow.register()
    flow.sign_in("writer")
    _, challenge = pkce()
    answer = flow.approve(flow.query(challenge))
    assert answer["iss"] == ["http://localhost"] and answer["state"] == ["st-1"]


def test_a_token_for_another_audience_is_refused(flow: Flow) -> None:
    issued = flow.tokens_for()
    key = OctKey.import_key(flow.app.extensions["storage"].key(OAUTH_KEY))
    claims = jwt.decode(issued["access_token"], key).claims
    forged = jwt.encode(
        {"alg": "HS256", "typ": "at+jwt"}, {**claims, "aud": "https://elsewhere/mcp"}, key
    )
    r = flow.mcp(forged)
    assert r.status_code == 401 and "another resource" in r.get_json()["detail"]
    assert 'error="invalid_token"' in r.headers["WWW-Authenticate"]
    assert flow.mcp(issued["access_token"]).status_code == 200


def test_a_reused_code_is_refused_and_revokes_its_grant(flow: Flow) -> None:
    flow.register()
    flow.sign_in("writer")
    verifier, challenge = pkce()
    code = flow.approve(flow.query(challenge))["code"][0]
    first = flow.exchange(code, verifier)
    assert first.status_code == 200
    again = flow.exchange(code, verifier)
    assert again.status_code == 400 and again.get_json()["error"] == "invalid_grant"
    assert flow.mcp(first.get_json()["access_token"]).status_code == 401
    assert flow.refresh(first.get_json()["refresh_token"]).status_code == 400
    (grant,) = flow.app.extensions["storage"].oauth.grants()
    assert grant.revoked_reason == "authorization code used twice"


@pytest.mark.parametrize("method", ["", "plain"])
def test_a_missing_or_plain_pkce_challenge_is_refused(flow: Flow, method: str) -> None:
    flow.register()
    flow.sign_in("writer")
    verifier, challenge = pkce()
    query = flow.query(challenge, code_challenge_method=method)
    r = flow.client.get(f"/console/oauth/authorize?{query}")
    assert r.status_code == 302  # the redirect URI checked out: the error goes back to it
    answer = parse_qs(urlsplit(r.headers["Location"]).query)
    assert answer["error"] == ["invalid_request"] and answer["iss"] == ["http://localhost"]
    r = flow.client.get(f"/console/oauth/authorize?{flow.query('', code_challenge_method='')}")
    assert parse_qs(urlsplit(r.headers["Location"]).query)["error"] == ["invalid_request"]
    assert flow.app.extensions["storage"].oauth.grants() == []


def test_a_redirect_uri_that_does_not_match_is_refused_without_redirecting(flow: Flow) -> None:
    flow.register()
    flow.sign_in("writer")
    _, challenge = pkce()
    for uri in ("https://evil.example/cb", "http://127.0.0.1:5555/other", "http://evil/cb"):
        r = flow.client.get(f"/console/oauth/authorize?{flow.query(challenge, redirect_uri=uri)}")
        assert r.status_code == 400 and "Location" not in r.headers, uri
        assert "was not sent back anything" in r.text
    # A loopback redirect matches on any port (RFC 8252): a CLI's port is the system's pick.
    other_port = "http://127.0.0.1:6123/cb"
    r = flow.client.get(
        f"/console/oauth/authorize?{flow.query(challenge, redirect_uri=other_port)}"
    )
    assert r.status_code == 200


def test_a_document_on_a_private_address_is_not_fetched(flow: Flow) -> None:
    flow.sign_in("writer")
    _, challenge = pkce()
    for client_id in ("https://127.0.0.1:9/client.json", "https://localhost:9/client.json"):
        query = flow.query(challenge, client_id=client_id)
        r = flow.client.get(f"/console/oauth/authorize?{query}")
        assert r.status_code == 400 and "Location" not in r.headers, client_id
        assert "private, loopback or reserved" in r.text


def test_a_rotated_refresh_token_used_again_revokes_the_family(flow: Flow) -> None:
    issued = flow.tokens_for()
    second = flow.refresh(issued["refresh_token"])
    assert second.status_code == 200
    rotated = second.get_json()
    assert rotated["refresh_token"] != issued["refresh_token"]
    assert flow.mcp(rotated["access_token"]).status_code == 200
    replay = flow.refresh(issued["refresh_token"])
    assert replay.status_code == 400 and replay.get_json()["error"] == "invalid_grant"
    # The whole family is gone: the newest refresh and access tokens too.
    assert flow.refresh(rotated["refresh_token"]).status_code == 400
    assert flow.mcp(rotated["access_token"]).status_code == 401
    events = flow.app.extensions["storage"].audit_log.page(Scope("acme", "web"), kind="oauth")
    actions = [e.action for e in events.events]
    assert actions.count("reuse_detected") == 1
    assert {"consented", "refreshed"} <= set(actions)


def test_a_reader_grant_may_not_call_a_write_tool(flow: Flow) -> None:
    issued = flow.tokens_for("writer", role="reader")
    listed = flow.mcp(issued["access_token"]).get_json()["result"]["tools"]
    assert "record_turn" not in {t["name"] for t in listed}
    r = flow.mcp(
        issued["access_token"],
        "tools/call",
        name="record_turn",
        arguments={"task_id": "t1", "summary_md": "nope"},
    )
    result = r.get_json()
    assert "error" in result or result["result"]["isError"], result


def test_a_role_above_the_persons_own_is_refused_at_consent(flow: Flow) -> None:
    flow.register()
    flow.sign_in("reader")
    _, challenge = pkce()
    query = flow.query(challenge)
    page = flow.client.get(f"/console/oauth/authorize?{query}")
    assert '<option value="writer"' not in page.text
    r = flow.client.post(
        f"/console/oauth/authorize?{query}",
        data={"csrf": csrf_of(page.text), "role": "writer", "decision": "approve"},
    )
    assert r.status_code == 403 and "Location" not in r.headers
    assert flow.app.extensions["storage"].oauth.grants() == []


def test_a_revoked_grant_stops_at_the_next_request(flow: Flow) -> None:
    issued = flow.tokens_for()
    assert flow.mcp(issued["access_token"]).status_code == 200
    page = flow.client.get("/console/oauth/grants")
    (grant_id,) = re.findall(r'data-grant="(grt_[0-9A-Z]+)"', page.text)
    r = flow.client.post(
        f"/console/oauth/grants/{grant_id}/revoke", data={"csrf": csrf_of(page.text)}
    )
    assert r.status_code == 303
    assert flow.mcp(issued["access_token"]).status_code == 401
    assert flow.refresh(issued["refresh_token"]).get_json()["error"] == "invalid_grant"


def test_the_revocation_endpoint_ends_the_grant(flow: Flow) -> None:
    issued = flow.tokens_for()
    r = flow.client.post(
        "/oauth/revoke", data={"token": issued["refresh_token"], "client_id": flow.client_id}
    )
    assert r.status_code == 200
    assert flow.mcp(issued["access_token"]).status_code == 401


def test_a_grant_whose_parent_token_was_revoked_is_refused(flow: Flow) -> None:
    issued = flow.tokens_for("writer")
    flow.tokens.registry.revoke(flow.tokens.ids["writer"])
    assert flow.mcp(issued["access_token"]).status_code == 401
    assert flow.refresh(issued["refresh_token"]).status_code == 400


def test_a_grant_whose_parent_token_expired_is_refused(flow: Flow, clock: FixedClock) -> None:
    from datetime import timedelta

    flow.tokens.add(
        "short", role="writer", tenant="acme", project="web", expires_in=timedelta(minutes=30)
    )
    issued = flow.tokens_for("short")
    assert flow.mcp(issued["access_token"]).status_code == 200
    clock.advance(minutes=31)
    assert flow.mcp(issued["access_token"]).status_code == 401


def test_an_access_token_expires_after_its_stated_lifetime(flow: Flow, clock: FixedClock) -> None:
    issued = flow.tokens_for()
    clock.advance(seconds=3599)
    assert flow.mcp(issued["access_token"]).status_code == 200
    clock.advance(seconds=2)
    assert flow.mcp(issued["access_token"]).status_code == 401
    assert (
        flow.mcp(flow.refresh(issued["refresh_token"]).get_json()["access_token"]).status_code
        == 200
    )


def test_the_consent_form_is_held_to_the_console_post_guard(flow: Flow) -> None:
    flow.register()
    flow.sign_in("writer")
    _, challenge = pkce()
    query = flow.query(challenge)
    page = flow.client.get(f"/console/oauth/authorize?{query}")
    url = f"/console/oauth/authorize?{query}"
    approve = {"role": "writer", "decision": "approve"}
    cases = {
        "no csrf": (approve, {}),
        "wrong csrf": ({**approve, "csrf": "x" * 32}, {}),
        "cross-site": ({**approve, "csrf": csrf_of(page.text)}, {"Sec-Fetch-Site": "cross-site"}),
        "other origin": ({**approve, "csrf": csrf_of(page.text)}, {"Origin": "https://evil"}),
    }
    for case, (data, headers) in cases.items():
        r = flow.client.post(url, data=data, headers=headers)
        assert r.status_code == 403 and "Location" not in r.headers, case
    # Method confusion: a GET carrying the form's fields approves nothing.
    r = flow.client.get(f"{url}&{urlencode({**approve, 'csrf': csrf_of(page.text)})}")
    assert r.status_code == 200 and "Location" not in r.headers
    assert flow.app.extensions["storage"].oauth.grants() == []


def test_a_code_verifier_that_does_not_match_is_refused(flow: Flow) -> None:
    flow.register()
    flow.sign_in("writer")
    _, challenge = pkce()
    code = flow.approve(flow.query(challenge))["code"][0]
    wrong, _ = pkce()
    r = flow.exchange(code, wrong)
    assert r.status_code == 400 and r.get_json()["error"] == "invalid_grant"
    assert flow.exchange(code, "").status_code == 400


def test_the_state_comes_back_unchanged_for_the_client_to_check(flow: Flow) -> None:
    """The state is the client's CSRF check (the SDK refuses a mismatch): the server must
    hand back exactly what it was sent, and nothing when it was sent none."""
    flow.register()
    flow.sign_in("writer")
    _, challenge = pkce()
    odd = "a b/&=?" + secrets.token_urlsafe(8)
    assert flow.approve(flow.query(challenge, state=odd))["state"] == [odd]
    assert "state" not in flow.approve(flow.query(challenge, state=""))


def test_registration_is_rate_limited_per_address(app: Flask, flow: Flow) -> None:
    app.config["OAUTH_REGISTRATIONS_PER_HOUR"] = 2
    flow.register()
    flow.register()
    r = flow.client.post("/oauth/register", json={"redirect_uris": [REDIRECT]})
    assert r.status_code == 429 and r.headers["Retry-After"]
    bad = flow.client.post(
        "/oauth/register",
        json={"redirect_uris": ["http://evil.example/cb"]},
        environ_base={"REMOTE_ADDR": "10.0.0.9"},
    )
    assert bad.status_code == 400 and bad.get_json()["error"] == "invalid_client_metadata"


def test_a_confidential_client_authenticates_with_its_secret(flow: Flow) -> None:
    made = flow.register(token_endpoint_auth_method="client_secret_post")
    assert made["client_secret"]
    flow.sign_in("writer")
    verifier, challenge = pkce()
    code = flow.approve(flow.query(challenge))["code"][0]
    assert flow.exchange(code, verifier, client_secret="wrong").status_code == 401
    code = flow.approve(flow.query(challenge))["code"][0]
    r = flow.exchange(code, verifier, client_secret=made["client_secret"])
    assert r.status_code == 200, r.get_json()
    stored = flow.app.extensions["storage"].oauth.client(flow.client_id)
    assert made["client_secret"] not in str(stored)  # kept as a hash only


@pytest.mark.tree_only("plants links and damage in the tree's grant files")
@pytest.mark.parametrize("damage", ["link", "garbage", "directory-link"])
def test_a_grant_file_replaced_by_hand_is_never_followed_nor_a_500(
    flow: Flow, tmp_path: Any, damage: str
) -> None:
    issued = flow.tokens_for()
    (grant,) = flow.app.extensions["storage"].oauth.grants()
    root = Path(flow.app.config["STORAGE_ROOT"])
    path = root / ".oauth" / "grants" / f"{grant.id}.json"
    outside = tmp_path / "outside"
    outside.mkdir()
    original = path.read_bytes()
    (outside / path.name).write_bytes(original)
    if damage == "link":
        path.unlink()
        path.symlink_to(outside / path.name)
    elif damage == "garbage":
        path.write_bytes(b"{not json")
    else:
        grants_dir = path.parent
        for child in grants_dir.iterdir():
            child.unlink()
        grants_dir.rmdir()
        grants_dir.symlink_to(outside)
    time.sleep(GRANT_RECHECK_SECONDS + 0.1)  # past the worker's recheck of the grant
    r = flow.mcp(issued["access_token"])
    assert r.status_code in (401, 503), (r.status_code, r.get_data(as_text=True)[:300])
    refreshed = flow.refresh(issued["refresh_token"])
    assert refreshed.status_code in (400, 503), refreshed.get_data(as_text=True)[:300]
    page = flow.client.get("/console/oauth/grants")
    assert page.status_code < 500
    # Nothing was written through the link: the refresh would have rotated a grant it read.
    assert (outside / path.name).read_bytes() == original


REGISTRATIONS = [
    "1",
    "[]",
    '{"redirect_uris": "x"}',
    '{"redirect_uris": [1]}',
    '{"redirect_uris": ["https://a/b"], "scope": 5}',
    '{"redirect_uris": ["https://a/b"], "client_name": {"a": 1}}',
    '{"redirect_uris": ["javascript:alert(1)"]}',
    '{"redirect_uris": ["https://a/b"], "token_endpoint_auth_method": "private_key_jwt"}',
    '{"redirect_uris": ["https://a/b"], "grant_types": ["password"]}',
]
AUTHORIZE_QUERIES = [
    "",
    "response_type=code&client_id=https://exa%00mple.com/x",
    "response_type=code&client_id=https://%C3%A9xample.invalid/c.json",
    "response_type=code&client_id=https://h:99999/x",
    "response_type=code&client_id=https://[::1/x",
    "response_type=code&client_id=https://256.1.1.1/x",
    "response_type=token&client_id=dcr_x",
    "response_type=code&response_type=code&client_id=dcr_x",
]
TOKEN_FORMS: list[dict[str, str]] = [
    {},
    {"grant_type": "password", "username": "a"},
    {"grant_type": "authorization_code", "code": "pmc_x.y", "client_id": "dcr_x"},
    {"grant_type": "refresh_token", "refresh_token": "pmr_" + "x" * 300, "client_id": "dcr_x"},
    {"grant_type": "authorization_code", "code": "c", "client_id": "https://h:99999/x"},
]


def test_bad_input_at_every_oauth_endpoint_is_a_clear_error_never_a_500(flow: Flow) -> None:
    flow.sign_in("writer")
    for body in REGISTRATIONS:
        r = flow.client.post("/oauth/register", data=body, content_type="application/json")
        assert r.status_code == 400, (body, r.status_code)
        assert r.get_json()["error"] == "invalid_client_metadata", body
    for query in AUTHORIZE_QUERIES:
        r = flow.client.get(f"/console/oauth/authorize?{query}")
        assert r.status_code == 400 and "Location" not in r.headers, (query, r.status_code)
    for form in TOKEN_FORMS:
        r = flow.client.post("/oauth/token", data=form)
        assert r.status_code in (400, 401), (form, r.status_code)
        assert r.get_json()["error"], form
    for form in ({}, {"token": "eyJ.a.b"}, {"token": "x", "token_type_hint": "weird"}):
        r = flow.client.post("/oauth/revoke", data=form)
        assert r.status_code in (200, 400, 401), (form, r.status_code)
    assert flow.app.extensions["storage"].oauth.grants() == []
