"""The MCP TypeScript SDK's OAuth flow (``@modelcontextprotocol/sdk``, pinned in
tests/agents/npm) against /mcp on a real gunicorn, on each backend, as the Python SDK's is
run in test_oauth_sdk.py: discovery from the 401, a client metadata document or dynamic
registration, the consent approved in Chromium, tools called, and a refresh once the
(shortened) access token has expired. The flow itself is tests/agents/ts/oauth_client.mjs."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from tests.agents.harness import missing, npm_installed
from tests.agents.oauth_consent import approve
from tests.agents.test_oauth_sdk import ACCESS_SECONDS, DocumentSite, served  # noqa: F401
from tests.e2e.conftest import Server

# In `make slow`: the Python SDK's flow (test_oauth_sdk.py) keeps the same path in `make test`.
pytestmark = [pytest.mark.e2e, pytest.mark.slow]
SCRIPT = Path(__file__).resolve().parent / "ts" / "oauth_client.mjs"


def _run(server: Server, secret: str, site: DocumentSite, tmp: Path, *, cimd: bool) -> Any:
    node = shutil.which("node")
    if node is None:
        missing("node is needed for the TypeScript SDK")
    root = npm_installed()
    # Beside node_modules, where its imports resolve; a name of its own per test (xdist).
    script = root / f"oauth_client-{os.getpid()}-{tmp.name}.mjs"
    shutil.copyfile(SCRIPT, script)
    args = [node, str(script), f"{server.url}/mcp", site.callback, site.url if cimd else "-"]
    proc = subprocess.Popen(
        [*args, str(ACCESS_SECONDS + 1)],
        cwd=root,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None and proc.stdin is not None
        first = json.loads(proc.stdout.readline() or "{}")
        assert "authorize" in first, proc.stderr.read() if proc.stderr else ""
        landed = approve(
            first["authorize"], secret, tmp / "chromium", callback=site.callback, answer=True
        )
        proc.stdin.write(landed + "\n")
        proc.stdin.flush()
        out, err = proc.communicate(timeout=90)
    finally:
        if proc.poll() is None:
            proc.kill()
        script.unlink(missing_ok=True)
    assert proc.returncode == 0, err[-3000:]
    steps = [json.loads(line) for line in out.splitlines() if line.strip()]
    assert steps[0] == {"iss": server.url}
    return steps[-1]


def test_the_ts_sdk_connects_with_a_client_id_metadata_document(
    served: tuple[Server, str, DocumentSite],  # noqa: F811
    tmp_path: Path,
) -> None:
    server, secret, site = served
    result = _run(server, secret, site, tmp_path, cimd=True)
    assert result["client_id"] == site.url and site.fetches >= 1
    assert not result["recorded_error"]
    assert "ts-oauth-task" in result["first"] and "ts-oauth-task" in result["second"]
    tokens = result["refresh_tokens"]
    assert len(tokens) >= 2 and len(set(tokens)) == len(tokens)  # rotated at the refresh


def test_the_ts_sdk_connects_with_dynamic_registration(
    served: tuple[Server, str, DocumentSite],  # noqa: F811
    tmp_path: Path,
) -> None:
    server, secret, site = served
    result = _run(server, secret, site, tmp_path, cimd=False)
    assert result["client_id"].startswith("dcr_") and site.fetches == 0
    assert "ts-oauth-task" in result["second"]
    assert len(result["refresh_tokens"]) >= 2
