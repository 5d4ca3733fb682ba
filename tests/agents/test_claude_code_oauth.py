"""The real Claude Code CLI (pinned) connects to /mcp by OAuth and calls a tool.

``claude mcp add --transport http`` with no header, then ``claude mcp login``: Claude Code
opens its browser (``BROWSER``, here a script that hands the URL to the test), the test's
Chromium signs in to the console and approves the consent page, the redirect reaches Claude
Code's own callback listener, and it exchanges the code. Then ``claude -p`` (its model a
stub) calls ``search`` with the token it got.

Claude Code names itself by a client metadata document on claude.ai, which this offline
machine cannot fetch; the test gives it a client registered here instead (``--client-id``,
``--callback-port``): the same code, PKCE and token exchange, without the fetch.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
import requests

from tests.agents.conftest import Memory, Work
from tests.agents.harness import EgressProbe, free_port, pinned
from tests.agents.oauth_consent import approve
from tests.agents.test_claude_code import VERSION, Session
from tests.e2e.conftest import flask_cli

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def claude() -> Path:
    return pinned("claude", VERSION)


def test_claude_code_signs_in_by_oauth_and_calls_a_tool(
    claude: Path, memory_up: Memory, work: Work, egress: EgressProbe, tmp_path: Path
) -> None:
    mark = f"OAUTH_MARK_{os.getpid()}"
    assert memory_up.api("PUT", "/tasks/cc-oauth/turns/0", json={"summary_md": mark}).ok
    callback_port = free_port()
    registered = requests.post(
        f"{memory_up.url}/oauth/register",
        json={
            "client_name": "Claude Code",
            "redirect_uris": [f"http://localhost:{callback_port}/callback"],
            "token_endpoint_auth_method": "none",
            "grant_types": ["authorization_code", "refresh_token"],
        },
        timeout=10,
    )
    assert registered.status_code == 201, registered.text
    client_id = registered.json()["client_id"]
    # No token anywhere in what Claude Code is given: the server entry is the URL alone.
    env = {k: v for k, v in work.env.items() if k != "PROJECT_MEMORY_TOKEN"}
    env.update(
        {
            "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
            "DISABLE_AUTOUPDATER": "1",
            "DISABLE_TELEMETRY": "1",
            **egress.env(),
        }
    )
    added = subprocess.run(
        [str(claude), "mcp", "add", "--transport", "http", "--scope", "local",
         "--client-id", client_id, "--callback-port", str(callback_port),
         "memory", f"{memory_up.url}/mcp"],
        cwd=work.repo, env=env, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert added.returncode == 0, added.stdout + added.stderr
    config = (Path(env["HOME"]) / ".claude.json").read_text()
    assert memory_up.writer not in config and "Authorization" not in config

    urls = tmp_path / "browser-urls"
    browser = tmp_path / "browser.sh"
    browser.write_text(f'#!/bin/sh\nprintf "%s\\n" "$1" >> {urls}\n')
    browser.chmod(0o755)
    # `claude mcp login` wants a terminal; script(1) gives it one.
    login = subprocess.Popen(
        ["script", "-qfec", f"{claude} mcp login memory", "/dev/null"],
        cwd=work.repo,
        env={**env, "BROWSER": str(browser)},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        stdin=subprocess.PIPE,
    )
    try:
        deadline = time.monotonic() + 60
        while not (urls.exists() and urls.read_text().strip()) and time.monotonic() < deadline:
            assert login.poll() is None, login.stdout.read() if login.stdout else b""
            time.sleep(0.1)
        authorize = urls.read_text().split()[0]
        assert urlsplit(authorize).path == "/console/oauth/authorize"
        landed = approve(
            authorize,
            memory_up.writer,
            tmp_path / "chromium",
            callback=f"http://localhost:{callback_port}/callback",
            role="reader",
        )
        assert "code=pmc_" in landed
        out, _ = login.communicate(timeout=60)
    finally:
        if login.poll() is None:
            login.kill()
    text = out.decode(errors="replace")
    assert login.returncode == 0, text[-2000:]

    grants = flask_cli(memory_up.server.env, "oauth", "grants")
    assert f"client_id={client_id}" in grants and "\treader\t" in grants

    # The tools are the person's to allow, as agent install allows them.
    settings = work.repo / ".claude" / "settings.local.json"
    settings.parent.mkdir(exist_ok=True)
    settings.write_text(json.dumps({"permissions": {"allow": ["mcp__memory"]}}))
    script: dict[str, Any] = {
        "steps": [{"tool": "mcp__memory__search", "input": {"query": mark}}],
        "final": "Found.",
    }
    run = Session(claude, work, env, egress, script, "Search the project memory for it.")
    assert any(s.get("name") == "memory" and s["status"] == "connected" for s in run.servers())
    assert "cc-oauth" in run.event("result")["result"]
    assert egress.attempts == []
