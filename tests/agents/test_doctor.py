"""``project-memory agent doctor``: each way the agent path breaks is found, in one line, and
makes it exit 1; a working set-up exits 0. Idle and under CPU load.

The doctor runs as a user runs it, a process in the repository with the user's environment,
against a real server behind the switch (tests/agents/conftest.py).
"""

from __future__ import annotations

import json
import os
import subprocess
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from tests.agents.conftest import CLI, VENV_BIN, Memory, Work, cli
from tests.e2e.conftest import start_server

pytestmark = pytest.mark.e2e


def doctor(env: dict[str, str], repo: Path) -> tuple[int, list[str], dict[str, Any]]:
    """The doctor's exit status, its problem lines, and its --json data."""
    text = cli(env, "agent", "doctor", cwd=repo)
    lines = (text.stdout + text.stderr).splitlines()
    problems = [line for line in lines if line.startswith("problem ")]
    as_json = cli(env, "agent", "doctor", "--json", cwd=repo)
    assert as_json.returncode == text.returncode, as_json.stdout + as_json.stderr
    data = json.loads(as_json.stdout)["data"]
    assert len(data["problems"]) == len(problems), (data, lines)
    return text.returncode, problems, data


@pytest.fixture
def installed(work: Work) -> Work:
    for agent in ("claude-code", "cursor"):
        done = cli(work.env, "agent", "install", agent, cwd=work.repo)
        assert done.returncode == 0, done.stderr
    return work


def test_a_working_set_up_has_no_problem(installed: Work, load: str) -> None:
    code, problems, data = doctor(installed.env, installed.repo)
    assert (code, problems) == (0, []), data
    names = {c["name"] for c in data["checks"]}
    assert {"settings", "token", "claude-code hooks", "claude-code mcp", "cursor mcp"} <= names
    assert any("tools at" in c["detail"] for c in data["checks"] if c["name"] == "claude-code mcp")


def _one(problems: list[str], name: str, *words: str) -> None:
    mine = [p for p in problems if p.startswith(f"problem {name}:")]
    assert len(mine) == 1, problems
    for word in words:
        assert word in mine[0], (word, mine[0])


def test_a_hook_command_not_on_path(installed: Work, load: str) -> None:
    """An older install named the client bare; the agent's PATH has no venv."""
    settings = installed.repo / ".claude" / "settings.json"
    value = json.loads(settings.read_text())
    for groups in value["hooks"].values():
        for hook in groups[0]["hooks"]:
            hook["command"] = hook["command"].replace(CLI, "project-memory")
    settings.write_text(json.dumps(value))
    path = os.pathsep.join(
        p for p in installed.env["PATH"].split(os.pathsep) if Path(p) != VENV_BIN
    )
    code, problems, _ = doctor({**installed.env, "PATH": path}, installed.repo)
    assert code == 1
    _one(problems, "claude-code hooks", "project-memory agent hook", "not found")


def test_an_install_from_before_the_prompt_hook_is_named(installed: Work) -> None:
    settings = installed.repo / ".claude" / "settings.json"
    value = json.loads(settings.read_text())
    del value["hooks"]["UserPromptSubmit"]
    settings.write_text(json.dumps(value))
    code, problems, _ = doctor(installed.env, installed.repo)
    assert code == 1
    _one(problems, "claude-code hooks", "no hook for UserPromptSubmit", "agent install claude-code")
    assert cli(installed.env, "agent", "install", "claude-code", cwd=installed.repo).returncode == 0
    assert doctor(installed.env, installed.repo)[:2] == (0, [])


def test_a_wrong_url(installed: Work, memory_up: Memory, load: str) -> None:
    env = {**installed.env, "PROJECT_MEMORY_URL": memory_up.url + "/elsewhere"}
    code, problems, _ = doctor(env, installed.repo)
    assert code == 1
    _one(problems, "url", "answered 404", "not a Project Memory server")


def test_a_wrong_token(installed: Work, load: str) -> None:
    env = {**installed.env, "PROJECT_MEMORY_TOKEN": "pm_" + "w" * 40}
    code, problems, _ = doctor(env, installed.repo)
    assert code == 1
    _one(problems, "token", "refused the token", "401")
    _one(problems, "claude-code mcp", "refused the token")


def test_the_server_down(installed: Work, memory_up: Memory, load: str) -> None:
    memory_up.switch.set("down")
    code, problems, _ = doctor(installed.env, installed.repo)
    assert code == 1
    _one(problems, "server", "cannot reach", memory_up.url)


def test_a_token_the_agent_cannot_expand(installed: Work, load: str) -> None:
    """The token is in the config file, not the environment: the hooks have it, Claude
    Code's header expands to 'Bearer '."""
    config = Path(installed.env["XDG_CONFIG_HOME"]) / "project-memory" / "config.toml"
    config.parent.mkdir(parents=True)
    config.write_text(f'token = "{installed.env["PROJECT_MEMORY_TOKEN"]}"\n')
    config.chmod(0o600)
    env = {k: v for k, v in installed.env.items() if k != "PROJECT_MEMORY_TOKEN"}
    code, problems, _ = doctor(env, installed.repo)
    assert code == 1
    _one(problems, "claude-code mcp", "PROJECT_MEMORY_TOKEN is not set")


def test_a_spool_backlog(installed: Work, memory_up: Memory, load: str) -> None:
    spool = Path(installed.env["PROJECT_MEMORY_STATE_DIR"]) / "spool"
    spool.mkdir(parents=True, mode=0o700)
    entry = spool / ("b" * 32 + ".json")
    entry.write_text(
        json.dumps(
            {
                "record_id": "b" * 32,
                "agent": "claude-code",
                "url": memory_up.url,
                "tenant": None,
                "project": None,
                "task_id": "t",
                "meta": {},
                "summary_md": "waiting",
            }
        )  # fmt: skip
    )
    hour_ago = time.time() - 3600
    os.utime(entry, (hour_ago, hour_ago))
    code, problems, data = doctor(installed.env, installed.repo)
    assert code == 1
    _one(problems, "spool", "1 turn(s)", "60 min", "agent flush")
    status = json.loads(cli(installed.env, "agent", "status", "--json", cwd=installed.repo).stdout)
    assert status["data"]["spool"]["queued"] == 1
    assert status["data"]["spool"]["oldest_seconds"] >= 3600
    assert status["data"]["spool"]["bytes"] == entry.stat().st_size
    assert cli(installed.env, "agent", "flush").returncode == 0
    assert doctor(installed.env, installed.repo)[0] == 0


def test_nothing_installed(work: Work) -> None:
    code, problems, _ = doctor(work.env, work.repo)
    assert code == 1
    _one(problems, "install", "no agent is installed")


def test_the_last_hook_error_is_shown(installed: Work, memory_up: Memory) -> None:
    memory_up.switch.set("down")
    subprocess.run(
        [CLI, "agent", "hook", "session-start"],
        input="{}",
        env=installed.env,
        cwd=installed.repo,
        capture_output=True,
        text=True,
        check=True,
    )
    memory_up.switch.set("up")
    code, _, data = doctor(installed.env, installed.repo)
    last = [c for c in data["checks"] if c["name"] == "last hook error"]
    assert code == 0 and last and "Connection refused" in last[0]["detail"], data


# -- --auth oauth: the entry holds no credential -----------------------------------------------
def _mcp_checks(data: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {c["name"]: c for c in data["checks"] if c["name"].endswith(" mcp")}


def test_an_oauth_entry_is_followed_to_the_servers_metadata(work: Work) -> None:
    """The agents find how to sign in from the 401's resource metadata and the authorization
    server's; the doctor follows the same path, and says who signs in."""
    for agent in ("claude-code", "codex", "cursor"):
        done = cli(work.env, "agent", "install", agent, "--auth", "oauth", cwd=work.repo)
        assert done.returncode == 0, done.stderr
    code, problems, data = doctor(work.env, work.repo)
    # Codex trusts nothing of a new project until the person says so (test_codex.py).
    assert [p for p in problems if not p.startswith("problem codex")] == [], problems
    for agent, login in (
        ("claude-code", "claude mcp login project-memory"),
        ("codex", "codex mcp login project-memory"),
        ("cursor", "Cursor's MCP settings"),
    ):
        check = _mcp_checks(data)[f"{agent} mcp"]
        assert check["ok"], check
        assert "offers OAuth" in check["detail"] and login in check["detail"], check


def test_an_oauth_entry_at_another_url_than_the_servers_public_one(
    work: Work, tmp_path: Path
) -> None:
    """Installed with the internal URL while the server calls itself by MEMORY_PUBLIC_URL:
    the tokens it issues are for the public /mcp, which an agent will not send elsewhere."""
    public = "https://memory.example.com"
    (tmp_path / "public").mkdir()
    srv = start_server(tmp_path / "public", workers=1, env_extra={"MEMORY_PUBLIC_URL": public})
    try:
        install = ("agent", "install", "cursor", "--auth", "oauth", "--url", srv.url)
        done = cli(work.env, *install, cwd=work.repo)
        assert done.returncode == 0, done.stderr
        code, problems, _ = doctor(work.env, work.repo)
    finally:
        srv.stop()
    assert code == 1
    _one(problems, "cursor mcp", f"{public}/mcp", srv.url, "MEMORY_PUBLIC_URL")


class _BeforeOAuth(BaseHTTPRequestHandler):
    """A server older than OAuth, as /mcp answered then: 401 with a bare Bearer challenge,
    and no metadata anywhere."""

    def log_message(self, *args: Any) -> None:
        pass

    def _answer(self, status: int, headers: dict[str, str]) -> None:
        self.send_response(status)
        for name, value in {**headers, "Content-Length": "0"}.items():
            self.send_header(name, value)
        self.end_headers()

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        self._answer(401, {"WWW-Authenticate": "Bearer"})

    def do_GET(self) -> None:
        self._answer(404, {})


@pytest.fixture
def before_oauth() -> Iterator[str]:
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), _BeforeOAuth)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}"
    finally:
        httpd.shutdown()
        httpd.server_close()


def test_an_oauth_entry_for_a_server_without_oauth(work: Work, before_oauth: str) -> None:
    install = ("agent", "install", "cursor", "--auth", "oauth", "--url", before_oauth)
    done = cli(work.env, *install, cwd=work.repo)
    assert done.returncode == 0, done.stderr
    code, problems, _ = doctor(work.env, work.repo)
    assert code == 1
    _one(problems, "cursor mcp", "offers no OAuth", "--auth token")
