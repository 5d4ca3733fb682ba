"""Single sign-on through the app, on each backend, against a real OpenID Connect provider
(node's oidc-provider, one per module): the sign-in and the role its rules give, a changed
group at the next sign-in, a person's own tokens, a disabled user, and each refusal: a wrong
state or nonce, a token of another issuer, an expired one, ``alg: none`` and HS256 keyed
with the client secret, and the proxy's header from an address it is not believed from."""

from __future__ import annotations

import json
import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlencode, urlsplit, urlunsplit

import pytest
import requests
from authlib.integrations.requests_client import OAuth2Session
from flask import Flask
from flask.testing import FlaskClient
from joserfc import jws, jwt
from joserfc.jwk import OctKey

from app.services.oidc import Provider, Settings, SignInRefused
from app.storage.core.users import user_id
from tests.api.test_oauth import MCP_HEADERS, REDIRECT, RESOURCE, pkce
from tests.conftest import BufferedClient
from tests.sso.provider import CLIENT_ID, CLIENT_SECRET, OidcProvider, provider_login, query_of

pytestmark = pytest.mark.all_backends

CALLBACK = "http://localhost/console/oidc/callback"
OTHER_CALLBACK = "http://127.0.0.1:9/cb"
RULES = [
    {"claim": "groups", "equals": "eng", "role": "writer", "tenant": "acme", "project": "*"},
    {"email_domain": "example.com", "role": "reader", "tenant": "acme", "project": "*"},
    {"claim": "groups", "equals": "leads", "role": "tenant_admin", "tenant": "acme"},
    {"claim": "groups", "equals": "web-team", "role": "writer", "tenant": "acme", "project": "web"},
]
_CSRF = re.compile(r'name="csrf" value="([^"]+)"')


@pytest.fixture(scope="module")
def idp(tmp_path_factory: pytest.TempPathFactory) -> Iterator[OidcProvider]:
    found = OidcProvider(tmp_path_factory.mktemp("idp"), [CALLBACK, OTHER_CALLBACK])
    yield found
    found.stop()


@pytest.fixture
def idp_accounts(idp: OidcProvider) -> Iterator[OidcProvider]:
    """The provider with its accounts as each test starts them."""
    idp.accounts.clear()
    idp.set_account("ana", email="ana@example.com", name="Ana", groups=["eng"])
    idp.set_account("lee", email="lee@example.com", name="Lee", groups=["leads"])
    yield idp


@pytest.fixture
def app_overrides(idp: OidcProvider) -> dict[str, Any]:
    return idp.settings(ROLE_RULES=json.dumps(RULES))


def csrf(page: str) -> str:
    found = _CSRF.search(page)
    assert found, "no CSRF field"
    return found.group(1)


def start(client: FlaskClient) -> str:
    r = client.get("/console/oidc/start")
    assert r.status_code == 303, r.text[:500]
    return str(r.headers["Location"])


def callback(client: FlaskClient, back: str) -> Any:
    parts = urlsplit(back)
    assert f"{parts.scheme}://{parts.netloc}{parts.path}" == CALLBACK, back
    return client.get(f"{parts.path}?{parts.query}")


def sign_in(app: Flask, idp: OidcProvider, login: str = "ana") -> FlaskClient:
    app.test_client_class = BufferedClient
    client = app.test_client()
    with requests.Session() as browser:
        back = provider_login(browser, start(client), login)
    r = callback(client, back)
    assert r.status_code == 200, r.text[:800]
    assert 'http-equiv="refresh"' in r.text
    return client


def session_token(app: Flask, login: str, idp: OidcProvider) -> Any:
    registry = app.extensions["token_registry"]
    uid = user_id(idp.issuer, login)
    (live,) = [
        t
        for t in registry.all()
        if t.user == uid and t.name == "console" and t.usable(registry.clock())
    ]
    return live


def test_a_sign_in_gives_the_role_the_rules_map_the_groups_to(
    app: Flask, idp_accounts: OidcProvider
) -> None:
    client = sign_in(app, idp_accounts)
    page = client.get("/console/p/acme/web/tasks")
    assert page.status_code == 200
    assert "Ana via console" in page.text and "writer" in page.text
    user = app.extensions["storage"].users.get(user_id(idp_accounts.issuer, "ana"))
    assert (user.email, user.name, user.role, user.tenant, user.project) == (
        "ana@example.com",
        "Ana",
        "writer",
        "acme",
        None,
    )
    assert user.groups == ("eng",)
    assert client.get("/console/p/globex/web/tasks").status_code == 403
    # The user's file holds no secret: nothing of the client's, no token's.
    if app.config["DATABASE_URL"] == "":
        record = (Path(app.config["STORAGE_ROOT"]) / ".users" / f"{user.id}.json").read_text()
        assert CLIENT_SECRET not in record and "pm_" not in record and "sha256" not in record


def test_a_changed_group_changes_the_role_at_the_next_sign_in(
    app: Flask, idp_accounts: OidcProvider
) -> None:
    client = sign_in(app, idp_accounts)
    first = session_token(app, "ana", idp_accounts)
    assert first.role == "writer"
    idp_accounts.set_account("ana", email="ana@example.com", name="Ana", groups=["sales"])
    again = sign_in(app, idp_accounts)
    second = session_token(app, "ana", idp_accounts)
    assert second.role == "reader"  # only the email domain's rule is left
    assert second.id != first.id
    # The old session followed its token out; the new one may read, not write.
    assert client.get("/console/p/acme/web/tasks").status_code == 303
    page = again.get("/console/p/acme/web/tasks")
    assert page.status_code == 200 and "reader" in page.text


def test_someone_no_rule_matches_is_refused_but_recorded(
    app: Flask, idp_accounts: OidcProvider
) -> None:
    idp_accounts.set_account("eve", email="eve@elsewhere.org", name="Eve", groups=["x"])
    client = app.test_client()
    with requests.Session() as browser:
        back = provider_login(browser, start(client), "eve")
    r = callback(client, back)
    assert r.status_code == 403 and "no rule gives" in r.text
    assert app.extensions["storage"].users.get(user_id(idp_accounts.issuer, "eve")) is not None


def test_a_wrong_state_is_refused(app: Flask, idp_accounts: OidcProvider) -> None:
    client = app.test_client()
    with requests.Session() as browser:
        back = provider_login(browser, start(client), "ana")
    parts = urlsplit(back)
    query = {k: v[0] for k, v in parse_qs(parts.query).items()}
    query["state"] = "not-the-state"
    r = client.get(f"{parts.path}?{urlencode(query)}")
    assert r.status_code == 400 and "state does not match" in r.text
    assert app.extensions["storage"].users.get(user_id(idp_accounts.issuer, "ana")) is None


def test_a_wrong_nonce_is_refused(app: Flask, idp_accounts: OidcProvider) -> None:
    client = app.test_client()
    asked = urlsplit(start(client))
    query = {k: v[0] for k, v in parse_qs(asked.query).items()}
    query["nonce"] = "a-nonce-this-sign-in-never-sent"  # the provider puts it in the ID token
    with requests.Session() as browser:
        back = provider_login(browser, urlunsplit(asked._replace(query=urlencode(query))), "ana")
    r = callback(client, back)
    assert r.status_code == 400 and "nonce" in r.text
    assert app.extensions["storage"].users.get(user_id(idp_accounts.issuer, "ana")) is None


def test_a_callback_without_its_cookie_is_refused(app: Flask, idp_accounts: OidcProvider) -> None:
    client = app.test_client()
    with requests.Session() as browser:
        back = provider_login(browser, start(client), "ana")
    stranger = app.test_client()
    r = callback(stranger, back)
    assert r.status_code == 400 and "start again" in r.text


# -- the ID token's checks ---------------------------------------------------------------------
def raw_id_token(found: OidcProvider, login: str = "ana") -> str:
    """An ID token the provider issued, got as a client would (authlib, PKCE)."""
    metadata = requests.get(f"{found.issuer}/.well-known/openid-configuration", timeout=10).json()
    verifier, _ = pkce()
    with OAuth2Session(
        CLIENT_ID,
        CLIENT_SECRET,
        scope="openid email profile groups",
        redirect_uri=OTHER_CALLBACK,
        code_challenge_method="S256",
    ) as session:
        url, _ = session.create_authorization_url(
            metadata["authorization_endpoint"], nonce="n-1", code_verifier=verifier
        )
        with requests.Session() as browser:
            back = provider_login(browser, url, login)
        tokens = session.fetch_token(
            metadata["token_endpoint"], code=query_of(back)["code"], code_verifier=verifier
        )
    return str(tokens["id_token"])


def checker(found: OidcProvider, **changes: Any) -> Provider:
    settings = {
        "issuer": found.issuer,
        "client_id": CLIENT_ID,
        "client_secret": CLIENT_SECRET,
        "scopes": "openid",
        "algorithms": ("RS256",),
        "clock_skew": 60,
        **changes,
    }
    return Provider(Settings(**settings))


@pytest.fixture(scope="module")
def other_idp(tmp_path_factory: pytest.TempPathFactory) -> Iterator[OidcProvider]:
    found = OidcProvider(tmp_path_factory.mktemp("other-idp"), [OTHER_CALLBACK])
    yield found
    found.stop()


@pytest.mark.tree_only("checks an ID token: no storage")
def test_the_id_token_of_the_provider_passes_the_checks(idp_accounts: OidcProvider) -> None:
    claims = checker(idp_accounts).check_id_token(raw_id_token(idp_accounts), nonce="n-1")
    assert claims["sub"] == "ana" and claims["groups"] == ["eng"]
    with pytest.raises(SignInRefused, match="nonce"):
        checker(idp_accounts).check_id_token(raw_id_token(idp_accounts), nonce="n-2")


@pytest.mark.tree_only("checks an ID token: no storage")
def test_a_token_from_another_issuer_is_refused(
    idp_accounts: OidcProvider, other_idp: OidcProvider
) -> None:
    foreign = raw_id_token(other_idp)
    with pytest.raises(SignInRefused):
        checker(idp_accounts).check_id_token(foreign, nonce="n-1")


@pytest.mark.tree_only("checks an ID token: no storage")
def test_an_expired_id_token_is_refused_past_the_clock_skew(idp_accounts: OidcProvider) -> None:
    raw = raw_id_token(idp_accounts)
    exp = jws.extract_compact(raw.encode()).payload
    expires = json.loads(exp)["exp"]
    check = checker(idp_accounts, clock_skew=30)
    check.check_id_token(raw, nonce="n-1", now=expires + 29)  # within the skew allowed
    with pytest.raises(SignInRefused, match="exp"):
        check.check_id_token(raw, nonce="n-1", now=expires + 31)


@pytest.mark.tree_only("checks an ID token: no storage")
def test_alg_none_and_hs256_with_the_client_secret_are_refused(
    idp_accounts: OidcProvider,
) -> None:
    raw = raw_id_token(idp_accounts)
    claims = json.loads(jws.extract_compact(raw.encode()).payload)
    check = checker(idp_accounts)
    check.check_id_token(raw, nonce="n-1")
    hs256 = jwt.encode({"alg": "HS256"}, claims, OctKey.import_key(CLIENT_SECRET))
    with pytest.raises(SignInRefused):
        check.check_id_token(hs256, nonce="n-1")
    unsigned = ".".join(
        [
            _b64({"alg": "none", "typ": "JWT"}),
            _b64(claims),
            "",
        ]
    )
    with pytest.raises(SignInRefused):
        check.check_id_token(unsigned, nonce="n-1")


def _b64(obj: dict[str, Any]) -> str:
    import base64

    return base64.urlsafe_b64encode(json.dumps(obj).encode()).rstrip(b"=").decode()


# -- a person's own tokens, and a disabled user ------------------------------------------------
def mint(client: FlaskClient, name: str, role: str, days: str = "30") -> tuple[int, str]:
    page = client.get("/console/me/tokens")
    assert page.status_code == 200
    r = client.post(
        "/console/me/tokens",
        data={"csrf": csrf(page.text), "name": name, "role": role, "expires_in_days": days},
        headers={"Origin": "http://localhost", "Sec-Fetch-Site": "same-origin"},
    )
    found = re.search(r'value="(pm_[^"]+)"', r.text)
    return r.status_code, found.group(1) if found else ""


API = "/sandbox/memory/v1"


def test_a_person_mints_a_token_at_most_their_role_named_with_them(
    app: Flask, idp_accounts: OidcProvider
) -> None:
    client = sign_in(app, idp_accounts)
    status, _ = mint(client, "ci", "project_admin")
    assert status == 403
    status, _ = mint(client, "ci", "writer", days="9999")
    assert status == 422
    status, secret = mint(client, "laptop", "writer")
    assert status == 200 and secret
    headers = {
        "Authorization": f"Bearer {secret}",
        "X-Sandbox-Project-Id": "web",
    }
    body = {"meta": {}, "summary_md": "done"}
    r = client.put(f"{API}/tasks/t1/turns/1", json=body, headers=headers)
    assert r.status_code in (200, 201), r.text
    tasks = client.get("/console/p/acme/web/tasks")
    assert "Ana via laptop" in tasks.text
    assert "laptop" in client.get("/console/me/tokens").text


def _consent(client: FlaskClient, query: str) -> dict[str, list[str]]:
    page = client.get(f"/console/oauth/authorize?{query}")
    assert page.status_code == 200, page.text[:500]
    r = client.post(
        f"/console/oauth/authorize?{query}",
        data={"csrf": csrf(page.text), "role": "writer", "project": "web", "decision": "approve"},
        headers={"Origin": "http://localhost", "Sec-Fetch-Site": "same-origin"},
    )
    assert r.status_code == 302, r.text[:500]
    return parse_qs(urlsplit(r.headers["Location"]).query)


def oauth_grant(client: FlaskClient) -> str:
    """An OAuth access token for /mcp, consented to by the signed-in person."""
    reg = client.post(
        "/oauth/register",
        json={
            "redirect_uris": [REDIRECT],
            "client_name": "Test client",
            "token_endpoint_auth_method": "none",
            "grant_types": ["authorization_code", "refresh_token"],
        },
    )
    assert reg.status_code == 201
    client_id = reg.get_json()["client_id"]
    verifier, challenge = pkce()
    query = urlencode(
        {
            "response_type": "code",
            "client_id": client_id,
            "redirect_uri": REDIRECT,
            "code_challenge": challenge,
            "code_challenge_method": "S256",
            "state": "st",
            "resource": RESOURCE,
            "scope": "memory",
        }
    )
    answer = _consent(client, query)
    r = client.post(
        "/oauth/token",
        data={
            "grant_type": "authorization_code",
            "code": answer["code"][0],
            "redirect_uri": REDIRECT,
            "client_id": client_id,
            "code_verifier": verifier,
            "resource": RESOURCE,
        },
    )
    assert r.status_code == 200, r.get_json()
    return str(r.get_json()["access_token"])


def mcp_status(client: FlaskClient, access_token: str) -> int:
    body = {"jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": {}}
    headers = {"Authorization": f"Bearer {access_token}", **MCP_HEADERS}
    return int(client.post("/mcp", json=body, headers=headers).status_code)


def test_a_disabled_users_token_session_and_oauth_grant_all_stop(
    app: Flask, idp_accounts: OidcProvider
) -> None:
    # Bound to one project, so that the events of the disabling are that project's.
    idp_accounts.set_account("ana", email="ana@elsewhere.org", name="Ana", groups=["web-team"])
    ana = sign_in(app, idp_accounts, "ana")
    _, secret = mint(ana, "laptop", "writer")
    access = oauth_grant(ana)
    api = {"Authorization": f"Bearer {secret}", "X-Sandbox-Project-Id": "web"}
    assert ana.get(f"{API}/tasks", headers=api).status_code == 200
    r = ana.put(f"{API}/tasks/t1/turns/1", json={"meta": {}, "summary_md": "x"}, headers=api)
    assert r.status_code in (200, 201), r.text
    assert mcp_status(ana, access) == 200
    lee = sign_in(app, idp_accounts, "lee")  # tenant_admin of acme
    users = lee.get("/console/users")
    assert users.status_code == 200 and "Ana" in users.text and "laptop" in users.text
    uid = user_id(idp_accounts.issuer, "ana")
    r = lee.post(
        f"/console/users/{uid}/disable",
        data={"csrf": csrf(users.text)},
        headers={"Origin": "http://localhost", "Sec-Fetch-Site": "same-origin"},
    )
    assert r.status_code == 303
    assert ana.get("/console/p/acme/web/tasks").status_code == 303  # the session ended
    assert ana.get(f"{API}/tasks", headers=api).status_code == 401
    time.sleep(1.1)  # a revoked grant's access tokens stop within GRANT_RECHECK_SECONDS
    assert mcp_status(ana, access) == 401
    # ... and the next sign-in is refused.
    again = app.test_client()
    with requests.Session() as browser:
        back = provider_login(browser, start(again), "ana")
    assert callback(again, back).status_code == 403
    events = lee.get("/console/p/acme/web/audit").text
    for needed in ("disabled", "revoked", "ended", "Ana via laptop"):
        assert needed in events, needed


# -- the sign-in page's options, and the trusted proxy's header ----------------------------------
def test_a_reader_may_not_see_the_users_page(app: Flask, idp_accounts: OidcProvider) -> None:
    assert sign_in(app, idp_accounts).get("/console/users").status_code == 403
