"""The official MCP Python SDK's OAuth client (``OAuthClientProvider``) against /mcp on a real
gunicorn, on each backend: discovery from the 401, a Client ID Metadata Document served by
the test over https on 127.0.0.1 (the server told to trust the test's CA and private
addresses), the consent page approved in Chromium, a search through ``tools/call``, a refresh
once the (shortened) access token has expired, and the same again with dynamic registration.
"""

from __future__ import annotations

import http.server
import json
import ssl
import threading
import time
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import anyio
import pytest

from app.storage.tree.tokens import TokenRegistry
from tests.agents.harness import self_signed
from tests.conftest import selected_backends
from tests.e2e.conftest import Server, free_port, start_server
from tests.e2e.test_console_browser import CHROMIUM, CHROMIUM_ARGS, _browser_or_fail

pytestmark = pytest.mark.e2e

with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    import httpx2
    from mcp import Client
    from mcp.client.auth import OAuthClientProvider
    from mcp.client.streamable_http import streamable_http_client
    from mcp.shared.auth import (
        AuthorizationCodeResult,
        OAuthClientInformationFull,
        OAuthClientMetadata,
        OAuthToken,
    )

ACCESS_SECONDS = 3


class DocumentSite:
    """An https server on 127.0.0.1 that serves one client metadata document."""

    def __init__(self, directory: Path, callback: str) -> None:
        self.cert, key = self_signed(directory)
        self.callback = callback
        self.port = free_port()
        self.url = f"https://localhost:{self.port}/oauth/client.json"
        self.fetches = 0
        document = json.dumps(
            {
                "client_id": self.url,
                "client_name": "SDK test client",
                "redirect_uris": [callback],
                "grant_types": ["authorization_code", "refresh_token"],
                "response_types": ["code"],
                "token_endpoint_auth_method": "none",
            }
        ).encode()
        site = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 - the stdlib's name
                site.fetches += 1
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Cache-Control", "max-age=60")
                self.send_header("Content-Length", str(len(document)))
                self.end_headers()
                self.wfile.write(document)

            def log_message(self, *args: Any) -> None:
                pass

        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(self.cert, key)
        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        self.httpd.socket = context.wrap_socket(self.httpd.socket, server_side=True)
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


class Memory:
    """Token storage for the SDK, remembering every token it was handed."""

    def __init__(self) -> None:
        self.tokens: list[OAuthToken] = []
        self.client: OAuthClientInformationFull | None = None

    async def get_tokens(self) -> OAuthToken | None:
        return self.tokens[-1] if self.tokens else None

    async def set_tokens(self, tokens: OAuthToken) -> None:
        self.tokens.append(tokens)

    async def get_client_info(self) -> OAuthClientInformationFull | None:
        return self.client

    async def set_client_info(self, client_info: OAuthClientInformationFull) -> None:
        self.client = client_info


class Browser:
    """Chromium (Playwright's async API), signing in and approving the consent page."""

    def __init__(self, secret: str, callback: str, profile: Path) -> None:
        self.secret, self.callback, self.profile = secret, callback, profile
        self.answer: dict[str, list[str]] = {}
        self.consent_text = ""

    async def approve(self, authorize_url: str) -> None:
        from playwright.async_api import async_playwright

        async with async_playwright() as playwright:
            context = await playwright.chromium.launch_persistent_context(
                str(self.profile), executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS
            )
            context.set_default_timeout(20_000)
            try:
                page = await context.new_page()

                async def caught(route: Any) -> None:
                    self.answer = parse_qs(urlsplit(route.request.url).query)
                    await route.fulfill(status=200, body="done", content_type="text/plain")

                await page.route(f"{self.callback}**", caught)
                await page.goto(authorize_url)
                await page.fill("#token", self.secret)
                await page.click("button[type=submit]")
                await page.wait_for_selector("section.consent")
                self.consent_text = await page.inner_text("section.consent")
                await page.select_option("#role", "writer")
                await page.click("button[value=approve]")
                deadline = time.monotonic() + 20
                while not self.answer and time.monotonic() < deadline:
                    await anyio.sleep(0.05)
            finally:
                await context.close()

    async def redirect(self, url: str) -> None:
        await self.approve(url)

    async def callback_result(self) -> AuthorizationCodeResult:
        assert "code" in self.answer, self.answer
        return AuthorizationCodeResult(
            code=self.answer["code"][0],
            state=self.answer.get("state", [None])[0],
            iss=self.answer.get("iss", [None])[0],
        )


# The flows on the tree run in `make test`; on PostgreSQL, in `make slow` (the same code
# above the storage call; tests/api/test_oauth.py runs every refusal on both).
@pytest.fixture(
    params=[
        b if b == "tree" else pytest.param(b, marks=pytest.mark.slow) for b in selected_backends()
    ]
)
def served(
    request: pytest.FixtureRequest, tmp_path: Path
) -> Iterator[tuple[Server, str, DocumentSite]]:
    _browser_or_fail()
    callback = f"http://127.0.0.1:{free_port()}/callback"
    site = DocumentSite(tmp_path, callback)
    env = {
        "MEMORY_OAUTH_ACCESS_SECONDS": str(ACCESS_SECONDS),
        "MEMORY_OAUTH_CIMD_PRIVATE": "true",
        "MEMORY_OAUTH_CIMD_CA_FILE": str(site.cert),
    }
    if request.param != "tree":
        services = request.getfixturevalue("services")
        env.update({f"MEMORY_{k}": v for k, v in services.settings().items()})
    server = start_server(tmp_path, workers=2, threads=4, env_extra=env)
    try:
        if request.param == "tree":
            secret = TokenRegistry(tmp_path / "tokens.json").create(
                role="writer", tenant="acme", project="web", name="alice"
            )[1]
        else:
            secret = server.token("writer")
        yield server, secret, site
    finally:
        server.stop()
        site.close()


def _flow(server: Server, secret: str, site: DocumentSite, tmp: Path, *, cimd: bool) -> Memory:
    memory = Memory()
    cb = site.callback
    browser = Browser(secret, cb, tmp / ("profile-cimd" if cimd else "profile-dcr"))
    provider = OAuthClientProvider(
        server_url=f"{server.url}/mcp",
        client_metadata=OAuthClientMetadata(
            client_name="SDK test client",
            redirect_uris=[cb],
            grant_types=["authorization_code", "refresh_token"],
            response_types=["code"],
            token_endpoint_auth_method="none",
        ),
        storage=memory,
        redirect_handler=browser.redirect,
        callback_handler=browser.callback_result,
        client_metadata_url=site.url if cimd else None,
    )

    async def main() -> tuple[str, str]:
        async with httpx2.AsyncClient(auth=provider, timeout=30) as http:
            transport = streamable_http_client(f"{server.url}/mcp", http_client=http)
            async with Client(transport, mode="legacy") as client:
                recorded = await client.call_tool(
                    "record_turn", {"task_id": "oauth-task", "summary_md": "session TTL fix"}
                )
                assert not recorded.is_error, recorded
                first = await client.call_tool("search", {"query": "session"})
                await anyio.sleep(ACCESS_SECONDS + 1)  # the access token expires
                second = await client.call_tool("search", {"query": "session"})
                return str(first.content[0].text), str(second.content[0].text)

    first, second = anyio.run(main)
    assert "oauth-task" in first and "oauth-task" in second
    assert "Client id" in browser.consent_text and "127.0.0.1" in browser.consent_text
    assert browser.answer["iss"] == [server.url]
    return memory


def test_the_sdk_connects_with_a_client_id_metadata_document(
    served: tuple[Server, str, DocumentSite], tmp_path: Path
) -> None:
    server, secret, site = served
    memory = _flow(server, secret, site, tmp_path, cimd=True)
    assert memory.client is not None and memory.client.client_id == site.url
    assert site.fetches >= 1
    # One token from the code, one from the refresh: rotated, not reused.
    assert len(memory.tokens) >= 2
    assert memory.tokens[0].refresh_token != memory.tokens[-1].refresh_token


@pytest.mark.slow  # registration's refusals and rate limit run in make test (tests/api)
def test_the_sdk_connects_with_dynamic_registration(
    served: tuple[Server, str, DocumentSite], tmp_path: Path
) -> None:
    server, secret, site = served
    memory = _flow(server, secret, site, tmp_path, cimd=False)
    assert memory.client is not None and memory.client.client_id.startswith("dcr_")
    assert site.fetches == 0
    assert len(memory.tokens) >= 2
