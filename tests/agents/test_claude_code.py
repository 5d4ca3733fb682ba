"""The real Claude Code CLI (pinned: tests/agents/npm) in a repository set up only by
``project-memory agent install claude-code``, against a stub of the Messages API.

``claude -p`` gets no flag that names the server, the hooks or a permission: what it loads
is what install wrote. HOME is the test's own, non-essential traffic is off, and every
attempt to reach beyond 127.0.0.1 goes to a probe that refuses and records it.
"""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.agents.conftest import Memory, cli, git_repo
from tests.agents.harness import AnthropicStub, EgressProbe, agent_cli, stream_events

pytestmark = pytest.mark.e2e
VERSION = "2.1.332"


@pytest.fixture(scope="module")
def claude() -> Path:
    binary = agent_cli("claude")
    out = subprocess.run(
        [str(binary), "--version"], capture_output=True, text=True, timeout=60, check=False
    )
    assert out.stdout.startswith(VERSION), out.stdout + out.stderr
    return binary


@pytest.fixture
def egress() -> Iterator[EgressProbe]:
    probe = EgressProbe()
    yield probe
    probe.close()


def run_claude(
    claude: Path,
    repo: Path,
    env: dict[str, str],
    stub: AnthropicStub,
    egress: EgressProbe,
    prompt: str,
) -> tuple[list[dict[str, Any]], float]:
    run_env = {
        **env,
        "ANTHROPIC_BASE_URL": stub.url,
        "ANTHROPIC_API_KEY": "sk-ant-stub",
        "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
        "DISABLE_TELEMETRY": "1",
        "DISABLE_AUTOUPDATER": "1",
        "DISABLE_ERROR_REPORTING": "1",
        **egress.env(),
    }
    started = time.monotonic()
    done = subprocess.run(
        [str(claude), "-p", prompt, "--output-format", "stream-json", "--verbose"],
        cwd=repo,
        env=run_env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    took = time.monotonic() - started
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    return stream_events(done.stdout), took


def event(events: list[dict[str, Any]], kind: str, subtype: str | None = None) -> dict[str, Any]:
    return next(
        e
        for e in events
        if e.get("type") == kind and (subtype is None or e.get("subtype") == subtype)
    )


@pytest.fixture
def installed(tmp_path: Path, agent_env: dict[str, str]) -> tuple[Path, str]:
    repo = tmp_path / "repo"
    head = git_repo(repo, "fix-login")
    done = cli(agent_env, "agent", "install", "claude-code", cwd=repo)
    assert done.returncode == 0, done.stderr
    return repo, head


def test_a_session_gets_the_digest_searches_and_is_recorded(
    claude: Path,
    memory_up: Memory,
    agent_env: dict[str, str],
    installed: tuple[Path, str],
    egress: EgressProbe,
) -> None:
    repo, head = installed
    earlier = {
        "meta": {"agent_id": "claude-code"},
        "summary_md": "Raised the session TTL to 30 min: DIGEST_MARK_7781.",
    }
    assert memory_up.api("PUT", "/tasks/earlier-task/turns/0", json=earlier).status_code == 200
    secret = "sk-ant-api03-" + "s" * 40
    stub = AnthropicStub(
        {
            "steps": [
                {"tool": "mcp__project-memory__search", "input": {"query": "DIGEST_MARK_7781"}}
            ],
            "final": f"Found it; the key {secret} stays here.",
        }
    )
    try:
        events, _ = run_claude(
            claude, repo, agent_env, stub, egress, "What did we do about the session TTL?"
        )
    finally:
        stub.close()
    init = event(events, "system", "init")
    assert {"name": "project-memory", "status": "connected", "source": "project"} in init[
        "mcp_servers"
    ]
    result = event(events, "result")
    assert result["subtype"] == "success" and not result["is_error"]
    # The digest's newest text was in the model's first request (the SessionStart context).
    first = json.dumps(stub.first_request())
    assert "SessionStart hook additional context" in first and "DIGEST_MARK_7781" in first
    # The search ran on the server, and its hit went back to the model.
    later = [
        json.dumps(r["body"].get("messages", []))
        for r in stub.requests
        if r["body"] and r["body"].get("tools")
    ]
    assert any("turn 0 of task earlier-task" in m and "tool_result" in m for m in later)
    assert "turn 0 of task earlier-task" in result["result"]
    # The session ended and its turn is on the server.
    [turn] = memory_up.turns("fix-login")
    meta = turn["meta"]
    assert meta["claude_session_id"] == result["session_id"]
    model_calls = [r["body"] for r in stub.requests if r["body"] and r["body"].get("tools")]
    assert meta["model"] == model_calls[-1]["model"]
    assert (
        meta["commit"] == head
        and meta["branch"] == "fix-login"
        and meta["agent_id"] == "claude-code"
    )
    n = len(model_calls)
    usage = AnthropicStub.USAGE
    assert meta["tokens"] == {
        "input": usage["input_tokens"] * n,
        "output": usage["output_tokens"] * n,
        "cache_read": usage["cache_read_input_tokens"] * n,
        "cache_creation": usage["cache_creation_input_tokens"] * n,
    }
    assert "What did we do about the session TTL?" in turn["summary_md"]
    assert "Found it; the key [masked:anthropic-key] stays here." in turn["summary_md"]
    assert secret not in json.dumps(turn) and agent_env["PROJECT_MEMORY_TOKEN"] not in json.dumps(
        turn
    )
    assert egress.attempts == []


def test_with_the_server_stopped_a_session_ends_and_its_turn_arrives_once(
    claude: Path,
    memory_up: Memory,
    agent_env: dict[str, str],
    installed: tuple[Path, str],
    egress: EgressProbe,
) -> None:
    repo, _ = installed
    env = {**agent_env, "PROJECT_MEMORY_TASK": "offline-task"}
    memory_up.switch.set("down")
    stub = AnthropicStub({"steps": [], "final": "Answer given while the server was down."})
    try:
        events, took = run_claude(claude, repo, env, stub, egress, "Work offline, please.")
    finally:
        stub.close()
    init = event(events, "system", "init")
    assert {"name": "project-memory", "status": "failed", "source": "project"} in init[
        "mcp_servers"
    ]
    assert event(events, "result")["subtype"] == "success"
    assert took < 30, f"the session took {took:.1f}s"
    offline_session = event(events, "result")["session_id"]
    assert memory_up.task("offline-task") is None
    assert len(list((Path(env["PROJECT_MEMORY_STATE_DIR"]) / "spool").glob("*.json"))) == 1
    # Back up: the next session's start sends the spooled turn, then records its own.
    memory_up.switch.set("up")
    stub = AnthropicStub({"steps": [], "final": "Second answer."})
    try:
        events, _ = run_claude(claude, repo, env, stub, egress, "And now online.")
    finally:
        stub.close()
    online_session = event(events, "result")["session_id"]
    turns = memory_up.turns("offline-task")
    sessions = [t["meta"]["claude_session_id"] for t in turns]
    assert sessions == [offline_session, online_session]
    assert "Answer given while the server was down." in turns[0]["summary_md"]
    assert cli(env, "agent", "flush", "--json").returncode == 0
    assert len(memory_up.turns("offline-task")) == 2
    assert egress.attempts == []
