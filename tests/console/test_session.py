"""The console's session cookie and its CSRF defences."""

from __future__ import annotations

import base64
import json
import zlib
from collections.abc import Callable
from pathlib import Path

import pytest
from flask import Flask
from flask.testing import FlaskClient

from app import create_app
from app.storage.core.names import CONSOLE_KEY, Scope
from tests.conftest import FixedClock, Tokens

from .conftest import Browser, csrf_of, put_turn, sign_in


def _decode(body: str) -> dict[str, object]:
    """The JSON an itsdangerous payload holds (a leading "." marks it zlib-compressed)."""
    raw = base64.urlsafe_b64decode(body.lstrip(".") + "=" * (-len(body.lstrip(".")) % 4))
    data: dict[str, object] = json.loads(zlib.decompress(raw) if body.startswith(".") else raw)
    return data


def _encode(data: dict[str, object]) -> str:
    return base64.urlsafe_b64encode(json.dumps(data).encode()).decode().rstrip("=")


def _cookie_header(browser: Browser, token: str) -> str:
    page = browser.get("/console/signin")
    browser.csrf = csrf_of(page)
    done = browser.post("/console/signin", {"token": token})
    assert done.status_code == 303
    return done.headers["Set-Cookie"]


def test_the_cookie_is_httponly_strict_scoped_and_holds_no_secret(
    app: Flask, tokens: Tokens
) -> None:
    secret = tokens.secrets["writer"]
    header = _cookie_header(Browser(app.test_client()), secret)
    attributes = {part.strip().split("=")[0].lower() for part in header.split(";")}
    assert {"httponly", "path", "max-age"} <= attributes
    assert "SameSite=Strict" in header and "Path=/console" in header
    assert "secure" not in attributes  # plain HTTP here: a Secure cookie would never return
    value = header.split(";")[0].split("=", 1)[1]
    assert secret not in value and secret[3:20] not in value
    assert tokens.registry.get(tokens.ids["writer"]) is not None
    # It names the token by id (readable, signed: base64 of JSON, then a signature).
    body = value.rsplit(".", 1)[0]
    assert _decode(body)["t"] == tokens.ids["writer"]


def test_secure_over_tls_and_behind_a_trusted_proxy_only(tmp_path: Path, clock: FixedClock) -> None:
    def app_with(proxies: int) -> tuple[Flask, str]:
        application = create_app(
            {
                "TESTING": True,
                "STORAGE_ROOT": str(tmp_path / "root"),
                "TOKENS_FILE": str(tmp_path / "tokens.json"),
                "CLOCK": clock,
                "TRUSTED_PROXIES": proxies,
            }
        )
        _, secret = application.extensions["token_registry"].create(
            role="reader", tenant="acme", project="web"
        )
        return application, secret

    direct, secret = app_with(0)
    tls = Browser(direct.test_client())
    page = tls.client.get("/console/signin", base_url="https://localhost")
    assert "Secure" in page.headers["Set-Cookie"]
    forged = direct.test_client().get("/console/signin", headers={"X-Forwarded-Proto": "https"})
    assert "Secure" not in forged.headers["Set-Cookie"]  # nobody is trusted to say so

    proxied, secret = app_with(1)
    behind = proxied.test_client().get(
        "/console/signin", headers={"X-Forwarded-Proto": "http, https"}
    )
    assert "Secure" in behind.headers["Set-Cookie"]  # the value our own proxy appended


def test_a_tampered_or_foreign_cookie_is_no_session(app: Flask, tokens: Tokens) -> None:
    browser = sign_in(app, tokens.secrets["reader"])
    assert browser.get("/console/p/acme/web/tasks").status_code == 200
    cookie = browser.client.get_cookie("pm_console", path="/console")
    assert cookie is not None
    body, signature = cookie.value.rsplit(".", 1)
    # The body with another token's id, signed with the old signature.
    data = _decode(body)
    data["t"] = tokens.ids["admin"]
    forged = _encode(data)
    flipped = signature[:5] + ("B" if signature[5] == "A" else "A") + signature[6:]
    for value in (f"{body}.{flipped}", f"{forged}.{signature}", "garbage", ""):
        browser.client.set_cookie("pm_console", value, path="/console")
        assert browser.get("/console/p/acme/web/tasks").status_code == 303


def test_the_key_is_per_root_private_and_shared(app: Flask, tmp_path: Path) -> None:
    key = tmp_path / "root" / CONSOLE_KEY
    assert not key.exists()  # made by the first console request, not by building the app
    assert app.test_client().get("/console/signin").status_code == 200
    assert key.stat().st_mode & 0o777 == 0o600 and len(key.read_bytes()) == 32
    again = create_app({"STORAGE_ROOT": str(tmp_path / "root"), "TOKENS_FILE": str(tmp_path / "t")})
    with again.test_request_context("/console/signin"):
        from app.console.session import _serializer

        assert _serializer().secret_key == key.read_bytes()


def test_sign_out_ends_the_session(app: Flask, tokens: Tokens) -> None:
    browser = sign_in(app, tokens.secrets["reader"])
    r = browser.post("/console/signout")
    assert r.status_code == 303 and r.headers["Location"] == "/console/signin?out=1"
    assert browser.get("/console/p/acme/web/tasks").status_code == 303


@pytest.mark.all_backends
def test_a_copy_of_the_cookie_ends_with_the_sign_out(
    app: Flask, tokens: Tokens, clock: FixedClock
) -> None:
    browser = sign_in(app, tokens.secrets["reader"])
    elsewhere = sign_in(app, tokens.secrets["reader"])  # another browser, the same token
    copied = app.test_client()
    for name in ("pm_console",):
        cookie = browser.client.get_cookie(name, path="/console")
        assert cookie is not None
        copied.set_cookie(name, cookie.value, path="/console")
    tasks = "/console/p/acme/web/tasks"
    assert copied.get(tasks).status_code == 200
    clock.advance(seconds=1)
    assert browser.post("/console/signout").status_code == 303
    for client in (copied, elsewhere.client):
        ended = client.get(tasks)
        assert ended.status_code == 303 and "/console/signin" in ended.headers["Location"]
    clock.advance(seconds=1)
    again = sign_in(app, tokens.secrets["reader"])
    assert again.get(tasks).status_code == 200


@pytest.fixture
def doomed(client: FlaskClient, tokens: Tokens) -> str:
    put_turn(client, tokens, "doomed", who="writer")
    return "/console/p/acme/web/tasks/doomed/delete"


@pytest.mark.parametrize(
    "data, headers",
    [
        ({"csrf": ""}, {}),  # no token
        ({"csrf": "x" * 32}, {}),  # a wrong one
        ({}, {"Origin": "https://evil.example", "Sec-Fetch-Site": "cross-site"}),
        ({}, {"Origin": "https://evil.example", "Sec-Fetch-Site": ""}),  # Origin only
        ({}, {"Origin": "null", "Sec-Fetch-Site": ""}),  # a sandboxed frame, an old browser
        ({}, {"Origin": "null", "Sec-Fetch-Site": "cross-site"}),  # a sandboxed frame
        ({}, {"Sec-Fetch-Site": "same-site"}),  # a sibling subdomain
        ({}, {"Origin": "http://localhost:8000"}),  # another port is another origin
    ],
)
def test_a_forged_form_changes_nothing(
    app: Flask,
    tokens: Tokens,
    console: Callable[[str], Browser],
    doomed: str,
    data: dict[str, str],
    headers: dict[str, str],
) -> None:
    browser = console("writer")
    form = {"csrf": browser.csrf, **data}
    sent = {"Origin": "http://localhost", "Sec-Fetch-Site": "same-origin", **headers}
    r = browser.client.post(doomed, data=form, headers={k: v for k, v in sent.items() if v})
    assert r.status_code == 403
    assert app.extensions["storage"].tasks.get_task(Scope("acme", "web"), "doomed")
    # The same browser, its own form: done (Origin: null is what a no-referrer page sends).
    assert browser.post(doomed, headers={"Origin": "null"}).status_code == 303


def test_a_forged_sign_in_is_refused(app: Flask, tokens: Tokens) -> None:
    """Login CSRF: another site must not sign a victim's browser into the attacker's token."""
    client = app.test_client()
    r = client.post("/console/signin", data={"token": tokens.secrets["reader"]})
    assert r.status_code == 403 and "Set-Cookie" not in r.headers
    page = client.get("/console/signin")
    r = client.post(
        "/console/signin",
        data={"token": tokens.secrets["reader"], "csrf": csrf_of(page)},
        headers={"Origin": "https://evil.example", "Sec-Fetch-Site": "cross-site"},
    )
    assert r.status_code == 403
    assert client.get("/console/p/acme/web/tasks").status_code == 303


def test_a_linked_key_file_is_replaced_never_read(tmp_path: Path) -> None:
    from app.storage.tree.control import root_key
    from app.storage.tree.fs.layout import Layout

    outside = tmp_path / "outside"
    outside.write_bytes(b"k" * 32)
    root = tmp_path / "root"
    root.mkdir()
    (root / CONSOLE_KEY).symlink_to(outside)
    first = root_key(Layout(root), CONSOLE_KEY)
    assert not (root / CONSOLE_KEY).is_symlink() and outside.read_bytes() == b"k" * 32
    assert root_key(Layout(root), CONSOLE_KEY) == first != b"k" * 32
    assert not [p for p in root.iterdir() if p.name.startswith(".~tmp-")]
