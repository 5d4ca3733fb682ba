"""Proxy headers are believed only from the proxies MEMORY_TRUSTED_PROXIES says are in front
(real gunicorn), and the console's origin check takes MEMORY_PUBLIC_URL when it is set."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import requests
from flask import Flask

from app import create_app
from tests.conftest import BufferedClient
from tests.console.conftest import csrf_of
from tests.e2e.conftest import Server, start_server

pytestmark = pytest.mark.e2e
SPOOFED = {"X-Forwarded-Proto": "https", "X-Forwarded-Ssl": "on", "X-Forwarded-Protocol": "ssl"}


@pytest.fixture(scope="module", params=[0, 1])
def server(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Server]:
    srv = start_server(
        tmp_path_factory.mktemp(f"proxies-{request.param}"),
        env_extra={"MEMORY_TRUSTED_PROXIES": str(request.param), "MEMORY_SWEEP_INTERVAL": "0"},
    )
    try:
        yield srv
    finally:
        srv.stop()


def test_the_scheme_comes_from_a_proxy_only_when_one_is_trusted(server: Server) -> None:
    trusted = server.env["MEMORY_TRUSTED_PROXIES"] == "1"
    plain = requests.get(f"{server.url}/console/signin", timeout=10)
    assert "Secure" not in plain.headers["Set-Cookie"]
    # From 127.0.0.1, as a proxy on the same machine would send it.
    for name, value in SPOOFED.items():
        r = requests.get(f"{server.url}/console/signin", headers={name: value}, timeout=10)
        believed = "Secure" in r.headers["Set-Cookie"]
        assert believed == (trusted and name == "X-Forwarded-Proto"), (name, r.headers)


def console_app(tmp_path: Path, **config: object) -> Flask:
    app = create_app(
        {
            "TESTING": True,
            "STORAGE_ROOT": str(tmp_path / "root"),
            "TOKENS_FILE": str(tmp_path / "tokens.json"),
            **config,
        }
    )
    app.test_client_class = BufferedClient
    return app


def posted_from(app: Flask, origin: str, host: str = "localhost") -> str:
    """The refusal a sign-in form posted with ``Origin: origin`` gets (a wrong token)."""
    browser = app.test_client()
    form = browser.get("/console/signin", base_url=f"http://{host}")
    r = browser.post(
        "/console/signin",
        base_url=f"http://{host}",
        data={"csrf": csrf_of(form), "token": "wrong"},
        headers={"Origin": origin, "Sec-Fetch-Site": "same-origin"},
    )
    assert r.status_code == 403
    text = r.get_data(as_text=True)
    return "another site" if "posted from another site" in text else "checked"


def test_the_public_url_is_the_origin_forms_must_come_from(tmp_path: Path) -> None:
    app = console_app(tmp_path, PUBLIC_URL="https://memory.example.com")
    assert posted_from(app, "https://memory.example.com") == "checked"
    # The request's own Host (a client sets it) no longer vouches for a form.
    assert posted_from(app, "http://localhost") == "another site"
    assert posted_from(app, "https://evil.example", host="evil.example") == "another site"
    app.extensions["storage"].close()


def test_without_a_public_url_the_requests_own_origin_is_ours(tmp_path: Path) -> None:
    app = console_app(tmp_path / "own")
    assert posted_from(app, "http://localhost") == "checked"
    assert posted_from(app, "https://memory.example.com") == "another site"
    app.extensions["storage"].close()


@pytest.mark.parametrize(
    "value",
    ["memory.example.com", "ftp://memory.example.com", "https://", "https://x.example/path?q"],
)
def test_a_public_url_that_is_no_origin_stops_the_start(tmp_path: Path, value: str) -> None:
    from app.config import ConfigError

    with pytest.raises(ConfigError, match="MEMORY_PUBLIC_URL"):
        console_app(tmp_path, PUBLIC_URL=value)
