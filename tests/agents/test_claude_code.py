"""The real Claude Code CLI (pinned: tests/agents/npm) in a repository set up only by
``project-memory agent install claude-code``, against a stub of the Messages API.

``claude -p`` gets no flag that names the server, the hooks or a permission: what it loads
is what install wrote. HOME is the test's own, non-essential traffic is off, and every
attempt to reach beyond 127.0.0.1 goes to a probe that refuses and records it.
"""

from __future__ import annotations

import json
import os
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from tests.agents.conftest import BUSY, LOADED, VENV_BIN, Memory, Work, cli, default_timeout
from tests.agents.harness import AnthropicStub, EgressProbe, pinned, stream_events

pytestmark = pytest.mark.e2e
VERSION = "2.1.332"


@pytest.fixture(scope="module")
def claude() -> Path:
    return pinned("claude", VERSION)


@pytest.fixture
def installed(work: Work) -> Work:
    done = cli(work.env, "agent", "install", "claude-code", cwd=work.repo)
    assert done.returncode == 0, done.stderr
    return work


class Session:
    """One ``claude -p`` run: its stream-json events, wall time and the stub's requests."""

    def __init__(
        self,
        claude: Path,
        work: Work,
        env: dict[str, str],
        egress: EgressProbe,
        script: dict[str, Any],
        prompt: str,
        *options: str,
    ) -> None:
        self.stub = AnthropicStub(script)
        run_env = {
            **env,
            "ANTHROPIC_BASE_URL": self.stub.url,
            "ANTHROPIC_API_KEY": "sk-ant-stub",
            "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
            "DISABLE_TELEMETRY": "1",
            "DISABLE_AUTOUPDATER": "1",
            "DISABLE_ERROR_REPORTING": "1",
            **egress.env(),
        }
        started = time.monotonic()
        # Each line of the stream as it comes, with the time it came: a hook's wall time in
        # the agent is the time between its hook_started and hook_response events.
        self.stamped: list[tuple[float, str]] = []
        errors: list[str] = []
        with subprocess.Popen(
            [str(claude), "-p", prompt, "--output-format", "stream-json", "--verbose", *options],
            cwd=work.repo,
            env=run_env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        ) as proc:
            assert proc.stdout is not None and proc.stderr is not None
            err = proc.stderr
            reader = threading.Thread(target=lambda: errors.append(err.read()), daemon=True)
            reader.start()
            killer = threading.Timer(120, proc.kill)
            killer.start()
            try:
                for line in proc.stdout:
                    self.stamped.append((time.monotonic(), line))
                proc.wait()
                reader.join(10)
            finally:
                killer.cancel()
                self.stub.close()
        self.took = time.monotonic() - started
        stdout = "".join(line for _, line in self.stamped)
        assert proc.returncode == 0, stdout[-2000:] + "".join(errors)[-2000:]
        self.events = stream_events(stdout)

    def hook_seconds(self, event: str) -> float:
        """How long the agent waited for its ``event`` hook (--include-hook-events)."""
        times: dict[str, float] = {}
        for at, line in self.stamped:
            for found in stream_events(line):
                if found.get("hook_event") == event and found.get("subtype") in (
                    "hook_started",
                    "hook_response",
                ):
                    times[found["subtype"]] = at
        return times["hook_response"] - times["hook_started"]

    def event(self, kind: str, subtype: str | None = None) -> dict[str, Any]:
        return next(
            e for e in self.events if e.get("type") == kind and subtype in (None, e.get("subtype"))
        )

    def servers(self) -> list[dict[str, Any]]:
        return list(self.event("system", "init")["mcp_servers"])

    def model_calls(self) -> list[dict[str, Any]]:
        """The requests of the session's own loop (side calls offer no tools)."""
        return [r["body"] for r in self.stub.requests if r["body"] and r["body"].get("tools")]


def test_a_session_gets_the_digest_searches_and_is_recorded(
    claude: Path, memory_up: Memory, installed: Work, egress: EgressProbe
) -> None:
    earlier = {
        "meta": {"agent_id": "claude-code"},
        "summary_md": "Raised the session TTL to 30 min: DIGEST_MARK_7781.",
    }
    assert memory_up.api("PUT", "/tasks/earlier-task/turns/0", json=earlier).status_code == 200
    secret = "sk-ant-api03-" + "s" * 40
    script = {
        "steps": [{"tool": "mcp__project-memory__search", "input": {"query": "DIGEST_MARK_7781"}}],
        "final": f"Found it; the key {secret} stays here.",
    }
    run = Session(
        claude, installed, installed.env, egress, script, "What did we do about the session TTL?"
    )
    assert {"name": "project-memory", "status": "connected", "source": "project"} in run.servers()
    result = run.event("result")
    assert result["subtype"] == "success" and not result["is_error"]
    # The digest's newest text was in the model's first request (the SessionStart context).
    first = json.dumps(run.model_calls()[0])
    assert "SessionStart hook additional context" in first and "DIGEST_MARK_7781" in first
    # The search ran on the server, and its hit went back to the model: as the structured
    # result, which Claude Code gives the model in place of the text when a result has one.
    hit = '"task_id":"earlier-task","turn":0'
    sent = [json.dumps(body.get("messages", [])) for body in run.model_calls()]
    assert any(json.dumps(hit)[1:-1] in m and "tool_result" in m for m in sent)
    assert hit in result["result"]
    # The session ended and its turn is on the server.
    [turn] = memory_up.turns("fix-login")
    meta = turn["meta"]
    calls = run.model_calls()
    assert meta["claude_session_id"] == result["session_id"] and meta["model"] == calls[-1]["model"]
    assert (
        meta["commit"] == installed.head
        and meta["branch"] == "fix-login"
        and meta["agent_id"] == "claude-code"
    )
    usage, n = AnthropicStub.USAGE, len(calls)
    assert meta["tokens"] == {
        "input": usage["input_tokens"] * n,
        "output": usage["output_tokens"] * n,
        "cache_read": usage["cache_read_input_tokens"] * n,
        "cache_creation": usage["cache_creation_input_tokens"] * n,
    }
    assert "What did we do about the session TTL?" in turn["summary_md"]
    assert "Found it; the key [secret:anthropic-key] stays here." in turn["summary_md"]
    assert secret not in json.dumps(turn) and installed.env[
        "PROJECT_MEMORY_TOKEN"
    ] not in json.dumps(turn)
    assert egress.attempts == []


def test_with_the_server_stopped_a_session_ends_and_its_turn_arrives_once(
    claude: Path, memory_up: Memory, installed: Work, egress: EgressProbe
) -> None:
    env = default_timeout(installed.task("offline-task"))
    memory_up.switch.set("down")
    offline = Session(
        claude,
        installed,
        env,
        egress,
        {"steps": [], "final": "Answer given while the server was down."},
        "Work offline, please.",
    )
    assert {"name": "project-memory", "status": "failed", "source": "project"} in offline.servers()
    assert offline.event("result")["subtype"] == "success"
    assert offline.took < 30, f"the session took {offline.took:.1f}s"
    assert memory_up.task("offline-task") is None and len(installed.spooled()) == 1
    # Back up: the next session's start sends the spooled turn, then records its own.
    memory_up.switch.set("up")
    online = Session(
        claude, installed, env, egress, {"steps": [], "final": "Second answer."}, "And now online."
    )
    turns = memory_up.turns("offline-task")
    sessions = [t["meta"]["claude_session_id"] for t in turns]
    assert sessions == [offline.event("result")["session_id"], online.event("result")["session_id"]]
    assert "Answer given while the server was down." in turns[0]["summary_md"]
    assert cli(env, "agent", "flush", "--json").returncode == 0
    assert len(memory_up.turns("offline-task")) == 2
    assert egress.attempts == []


# -- under load, as installed, with the URL as people give it ------------------------------
SESSIONS_UNDER_LOAD = 10


def _first_request_has(run: Session, mark: str) -> bool:
    first = json.dumps(run.model_calls()[0])
    return "SessionStart hook additional context" in first and mark in first


@pytest.mark.parametrize("load", ["idle", LOADED, BUSY], indirect=True)
def test_the_digest_reaches_the_first_request_in_every_session(
    claude: Path, memory_up: Memory, installed: Work, egress: EgressProbe, load: str
) -> None:
    """The hooks' own time limits (the defaults), a machine busy or not: in each of ten
    sessions the context, digest included, is in the model's first request."""
    env = default_timeout(installed.task(f"ten-{load}"))
    missed = []
    for n in range(SESSIONS_UNDER_LOAD):
        mark = f"DIGEST_{load.upper()}_{n}_{time.monotonic_ns()}"
        body = {"summary_md": f"Decided the cache key: {mark}."}
        assert memory_up.api("PUT", f"/tasks/other-{load}-{n}/turns/0", json=body).ok
        run = Session(claude, installed, env, egress, {"steps": [], "final": "ok"}, f"Session {n}.")
        if not _first_request_has(run, mark):
            missed.append(n)
    assert missed == [], f"no digest in the first request of sessions {missed} ({load})"
    assert len(memory_up.turns(f"ten-{load}")) == SESSIONS_UNDER_LOAD  # and each recorded
    assert egress.attempts == []


def test_the_hooks_run_without_the_clients_venv_on_path(
    claude: Path, memory_up: Memory, installed: Work, egress: EgressProbe, load: str
) -> None:
    """Installed from a shell with the venv on PATH; the agent started without it."""
    env = default_timeout(installed.task(f"no-venv-{load}"))
    env["PATH"] = os.pathsep.join(p for p in env["PATH"].split(os.pathsep) if Path(p) != VENV_BIN)
    mark = f"NO_VENV_MARK_{load}"
    assert memory_up.api("PUT", f"/tasks/no-venv-{load}-earlier/turns/0",
                         json={"summary_md": mark}).ok  # fmt: skip
    run = Session(claude, installed, env, egress, {"steps": [], "final": "done"}, "Go.")
    assert _first_request_has(run, mark)
    [turn] = memory_up.turns(f"no-venv-{load}")
    assert turn["meta"]["claude_session_id"] == run.event("result")["session_id"]


def test_mcp_tools_work_with_the_url_given_with_the_api_path(
    claude: Path, memory_up: Memory, work: Work, egress: EgressProbe, load: str
) -> None:
    """PROJECT_MEMORY_URL with the API's path, as docs/client.md allows, at install and when
    the agent runs."""
    env = {**work.env, "PROJECT_MEMORY_URL": memory_up.url + "/sandbox/memory/v1/"}
    done = cli(env, "agent", "install", "claude-code", cwd=work.repo)
    assert done.returncode == 0, done.stderr
    mark = f"API_PATH_MARK_{load}"
    assert memory_up.api("PUT", f"/tasks/api-path-{load}/turns/0", json={"summary_md": mark}).ok
    script = {"steps": [{"tool": "mcp__project-memory__search", "input": {"query": mark}}],
              "final": "Found."}  # fmt: skip
    run = Session(claude, work, default_timeout(env), egress, script, "Search for it.")
    assert {"name": "project-memory", "status": "connected", "source": "project"} in run.servers()
    assert f'"task_id":"api-path-{load}","turn":0' in run.event("result")["result"]


# -- the prompt hook: the project's memory about each prompt ---------------------------------
PROMPT_CONTEXT = "UserPromptSubmit hook additional context"


def test_a_prompt_about_another_sessions_fact_brings_it_to_the_model(
    claude: Path, memory_up: Memory, installed: Work, egress: EgressProbe
) -> None:
    mark = f"zephyr{time.monotonic_ns()}"
    fact = f"The {mark} vault rotates its quokka key every Tuesday at 04:00 UTC."
    body = {"meta": {"agent_id": "codex"}, "summary_md": f"## Answer\n\n{fact}"}
    assert memory_up.api("PUT", f"/tasks/other-session-{mark}/turns/0", json=body).ok
    env = installed.task(f"prompt-{mark}")
    run = Session(claude, installed, env, egress, {"steps": [], "final": "ok"},
                  f"When does the {mark} quokka key rotate?")  # fmt: skip
    first = json.dumps(run.model_calls()[0])
    assert PROMPT_CONTEXT in first, first[-3000:]
    added = first.split(PROMPT_CONTEXT, 1)[1]
    assert fact in added and "Project memory on this prompt" in added
    # A prompt nothing in the project matches: no context at all, not even a header.
    # (Words of this run's own: the server is every test's, and records each prompt.)
    run = Session(claude, installed, env, egress, {"steps": [], "final": "ok"},
                  f"Frob{mark} the xylo{mark} fimble{mark}.")  # fmt: skip
    first = json.dumps(run.model_calls()[0])
    assert PROMPT_CONTEXT not in first and "Project memory on this prompt" not in first
    assert egress.attempts == []


@pytest.mark.parametrize("state", ["down", "slow"])
def test_with_the_server_down_or_hung_the_prompt_still_goes_at_once(
    claude: Path, memory_up: Memory, installed: Work, egress: EgressProbe, state: str
) -> None:
    """The prompt reaches the model as typed, and the agent waited less than a second for
    the prompt hook (the other hooks' time cut to 1 s, to keep the session short)."""
    env = installed.task(f"prompt-{state}", PROJECT_MEMORY_HOOK_TIMEOUT="1")
    prompt = f"When does the quokka key rotate ({state})?"
    memory_up.switch.set(state)
    try:
        run = Session(claude, installed, env, egress, {"steps": [], "final": "ok"}, prompt,
                      "--include-hook-events")  # fmt: skip
    finally:
        memory_up.switch.set("up")
    first = json.dumps(run.model_calls()[0])
    assert prompt in first and PROMPT_CONTEXT not in first
    assert run.event("result")["subtype"] == "success"
    waited = run.hook_seconds("UserPromptSubmit")
    assert waited < 1.0, f"the agent waited {waited:.2f}s for the prompt hook"
    assert egress.attempts == []
