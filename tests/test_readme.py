"""The README documents every setting and the two set-up commands, and opens with a quick
start whose commands run; docs/api.md's examples run too."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest
from flask.testing import FlaskClient

from app.config import SETTINGS
from tests.conftest import Tokens
from tests.e2e.conftest import VENV_BIN, start_server

REPO = Path(__file__).resolve().parents[1]
README = (REPO / "README.md").read_text()
API = (REPO / "docs" / "api.md").read_text()


def _bash(
    script: str, cwd: Path, env: dict[str, str], *, timeout: float
) -> subprocess.CompletedProcess[str]:
    """Run a README block as a user pastes it, stopping at its first failing line."""
    return subprocess.run(
        ["bash", "-c", "set -eu\n" + script],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def test_every_setting_is_in_the_readme_table() -> None:
    for name, (default, _, _) in SETTINGS.items():
        assert f"| `MEMORY_{name}` | `{default}` |" in README, name


def test_readme_gives_the_two_commands() -> None:
    assert "make run" in README and "make test" in README


def _sh_block_after(heading: str, text: str = README) -> str:
    start = text.index("```sh\n", text.index(heading)) + len("```sh\n")
    return text[start : text.index("```", start)]


@pytest.mark.e2e
def test_the_api_examples_run_as_printed(tmp_path: Path) -> None:
    """Every command of docs/api.md's "Using the API", curl and the client's CLI, pasted with
    the first token and this server's URL."""
    srv = start_server(tmp_path, workers=1)
    try:
        secret = re.search(r"^\s+(pm_\S+)$", srv.log(), re.M)
        assert secret, srv.log()
        script = _sh_block_after("## Using the API", API)
        script = script.replace("pm_...", secret.group(1))
        script = script.replace("http://127.0.0.1:8000", srv.url)
        work = tmp_path / "work"
        work.mkdir()
        env = {k: v for k, v in os.environ.items() if not k.startswith("PROJECT_MEMORY_")}
        env["PATH"] = f"{VENV_BIN}{os.pathsep}{env.get('PATH', '')}"  # project-memory
        env["XDG_CONFIG_HOME"] = str(tmp_path / "config")
        run = _bash(script, work, env, timeout=60)
    finally:
        srv.stop()
    assert run.returncode == 0, run.stderr
    # The artifact went up with the example's bytes and came back down the same.
    downloaded = (work / "test.log").read_bytes()
    assert downloaded.startswith(b"collected ")
    assert f'"size":{len(downloaded)}' in run.stdout
    # The CLI's lines ran too: the next free turn after 0, and the delete before curl's 404.
    assert "stored turn 1 of task fix-login" in run.stdout
    assert re.search(r"^deleted task fix-login\n.*\n404$", run.stdout, re.M)


@pytest.mark.e2e
def test_the_quick_start_runs_as_printed(tmp_path: Path) -> None:
    """The README's first block, pasted into a shell after ``make run`` (a server here) with
    the first token: install in a repository, and the doctor finds nothing wrong."""
    block = _sh_block_after("## Claude Code in your repository")
    assert "make run" in block and "\nclaude\n" in block
    srv = start_server(tmp_path, workers=1)
    try:
        secret = re.search(r"^\s+(pm_\S+)$", srv.log(), re.M)
        assert secret, srv.log()
        repo = tmp_path / "my-repo"
        repo.mkdir()
        subprocess.run(["git", "init", "-q", "-b", "main"], cwd=repo, check=True)
        lines = [
            line
            for line in block.splitlines()
            if line.strip() not in ("make run", "claude")  # the server here; no agent
        ]
        script = "\n".join(lines).replace("pm_...", secret.group(1))
        script = script.replace("http://127.0.0.1:8000", srv.url)
        script = script.replace("$HOME/src/project-memory/.venv/bin", str(VENV_BIN))
        script = script.replace("~/src/my-repo", str(repo))
        env = {k: v for k, v in os.environ.items() if not k.startswith("PROJECT_MEMORY_")}
        env.update(
            HOME=str(tmp_path),
            XDG_CONFIG_HOME=str(tmp_path / "config"),
            PROJECT_MEMORY_STATE_DIR=str(tmp_path / "state"),
        )
        run = _bash(script, tmp_path, env, timeout=120)
    finally:
        srv.stop()
    assert run.returncode == 0, run.stdout + run.stderr
    assert "claude-code installed in" in run.stdout
    assert "everything the agents need works" in run.stdout


def test_the_memory_stores_section_says_content_is_null_unless_view_full(
    client: FlaskClient, tokens: Tokens
) -> None:
    section = API[API.index("### Memory stores API") :]
    assert '`"content": null`' in section and "`?view=full`" in section
    headers = tokens.headers("writer")
    store = client.post("/v1/memory_stores", json={"name": "doc"}, headers=headers).get_json()
    base = f"/v1/memory_stores/{store['id']}/memories"
    created = client.post(base, json={"path": "/a.md", "content": "x"}, headers=headers)
    assert created.get_json()["content"] is None
    full = client.post(f"{base}?view=full", json={"path": "/b.md", "content": "y"}, headers=headers)
    assert full.get_json()["content"] == "y"
    listed = client.get(base, headers=headers).get_json()["data"]
    assert {m["content"] for m in listed} == {None}
    assert {
        m["content"] for m in client.get(f"{base}?view=full", headers=headers).get_json()["data"]
    } == {"x", "y"}
    one = client.get(f"{base}/{created.get_json()['id']}", headers=headers).get_json()
    assert one["content"] == "x"
