"""The real Codex CLI (pinned: tests/agents/npm) in a repository set up by
``project-memory agent install codex``, against a stub of OpenAI's Responses API.

Codex reads a project's ``.codex/`` only in a trusted project (``codex exec --trust`` saves
that, as a person would once) and runs a new hook only once the person trusted it in the
TUI's ``/hooks``; this run stands in for that review with
``--dangerously-bypass-hook-trust``. The model provider is the stub, named in the
isolated CODEX_HOME's config.toml, with plugins and analytics off (else it calls home).
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest

from tests.agents.conftest import Memory, cli, git_repo
from tests.agents.harness import EgressProbe, ResponsesStub, pinned, stream_events

pytestmark = pytest.mark.e2e
VERSION = "0.171.0"


@pytest.fixture(scope="module")
def codex() -> Path:
    return pinned("codex", VERSION)


def test_a_codex_session_gets_context_searches_and_is_recorded(
    codex: Path, memory_up: Memory, agent_env: dict[str, str], tmp_path: Path, egress: EgressProbe
) -> None:
    repo = tmp_path / "repo"
    head = git_repo(repo, "codex-branch")
    assert cli(agent_env, "agent", "install", "codex", cwd=repo).returncode == 0
    earlier = {"summary_md": "Cached the parser output: CODEX_MARK_4410."}
    assert memory_up.api("PUT", "/tasks/codex-earlier/turns/0", json=earlier).status_code == 200
    stub = ResponsesStub(
        {
            "steps": [
                {
                    "tool": "search",
                    "namespace": "mcp__project_memory",
                    "input": {"query": "CODEX_MARK_4410"},
                }
            ],
            "final": "Codex found it.",
        }
    )
    codex_home = Path(agent_env["HOME"]) / ".codex"
    codex_home.mkdir(parents=True)
    (codex_home / "config.toml").write_text(
        'model = "gpt-stub"\nmodel_provider = "stub"\n\n[model_providers.stub]\nname = "stub"\n'
        f'base_url = "{stub.url}/v1"\nwire_api = "responses"\nenv_key = "STUB_API_KEY"\n'
        # Without these Codex reaches github.com (its curated plugins) and ab.chatgpt.com
        # (metrics) at every start.
        "\n[features]\nplugins = false\n\n[analytics]\nenabled = false\n"
    )
    env = {**agent_env, "CODEX_HOME": str(codex_home), "STUB_API_KEY": "stub", **egress.env()}
    try:
        done = subprocess.run(
            [
                str(codex),
                "exec",
                "--json",
                "--trust",
                "--dangerously-bypass-hook-trust",
                "What about the parser?",
            ],
            cwd=repo,
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
    finally:
        stub.close()
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    events = stream_events(done.stdout)
    thread = next(e["thread_id"] for e in events if e.get("type") == "thread.started")
    answer = [e["item"]["text"] for e in events if e.get("item", {}).get("type") == "agent_message"]
    assert answer and "turn 0 of task codex-earlier" in answer[-1]
    calls = [r["body"] for r in stub.requests if r["method"] == "POST"]
    first = json.dumps(calls[0]["input"])
    assert "# Project memory" in first and "CODEX_MARK_4410" in first  # SessionStart context
    tools = {t.get("name"): t for t in calls[0]["tools"]}
    listed = [t["name"] for t in tools["mcp__project_memory"]["tools"]]
    assert "search" in listed and "record_turn" in listed
    outputs: list[Any] = [
        i.get("output") for i in calls[-1]["input"] if i.get("type") == "function_call_output"
    ]
    assert any("turn 0 of task codex-earlier" in json.dumps(o) for o in outputs)
    [turn] = memory_up.turns("codex-branch")
    meta = turn["meta"]
    assert meta["agent_id"] == "codex" and meta["codex_session_id"] == thread
    assert (
        meta["model"] == "gpt-stub" and meta["commit"] == head and meta["branch"] == "codex-branch"
    )
    usage, n = ResponsesStub.USAGE, len(calls)
    cached = usage["input_tokens_details"]["cached_tokens"]
    assert meta["tokens"] == {
        "input": (usage["input_tokens"] - cached) * n,
        "output": usage["output_tokens"] * n,
        "cache_read": cached * n,
        "cache_creation": 0,
    }
    assert (
        "What about the parser?" in turn["summary_md"] and "Codex found it." in turn["summary_md"]
    )
    assert egress.attempts == []
