"""The real Claude Code (pinned: tests/agents/npm) writing and reading its auto-memory, shared
by ``agent install claude-code --share-memory`` between two machines (two HOMEs, two state
directories, two clones), against a stub of the Messages API that scripts the model's tool
calls. The sync's rules, conflicts and hostile folders: tests/agents/test_shared_memory.py.
"""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import Any

import pytest

from tests.agents.conftest import Memory, Work, default_timeout
from tests.agents.harness import EgressProbe, pinned
from tests.agents.test_claude_code import VERSION, Session
from tests.agents.test_shared_memory import Machine, Store

pytestmark = pytest.mark.e2e
MARK = "CLAUDE_MEMORY_MARK_42"


@pytest.fixture(scope="module")
def claude() -> Path:
    return pinned("claude", VERSION)


@pytest.fixture
def pair(tmp_path: Path, agent_env: dict[str, str], memory_up: Memory) -> Pair:
    """Two machines sharing one new store; the store's id."""
    name = f"claude memory {uuid.uuid4().hex[:8]}"
    a, b = Machine(tmp_path, "a", agent_env), Machine(tmp_path, "b", agent_env)
    a.install(name)
    b.install(name)
    return a, b, Store(memory_up).named(name)["id"]


Pair = tuple[Machine, Machine, str]


def run(
    claude: Path,
    machine: Machine,
    egress: EgressProbe,
    script: dict[str, Any],
    env: dict[str, str] | None = None,
) -> Session:
    work = Work(machine.repo, "", machine.env, machine.repo.parent)
    return Session(claude, work, env or machine.env, egress, script, "Remember how we deploy.")


def memory_prompt(session: Session) -> str:
    """The system prompt's own memory section of the session's first model request."""
    system = json.dumps(session.model_calls()[0].get("system"))
    return system[system.index("# Memory") :][:400]


def test_a_memory_claude_writes_on_one_machine_is_in_the_next_session_on_the_other(
    claude: Path, memory_up: Memory, pair: Pair, egress: EgressProbe
) -> None:
    a, b, store_id = pair
    topic = (
        "---\nname: deploy\ndescription: how we deploy\nmetadata:\n  type: project\n---\n\n"
        f"Deploy with make ship: {MARK}.\n"
    )
    index = f"- [Deploy](deploy.md) — make ship: {MARK}\n"
    script = {
        "steps": [
            {
                "tool": "Write",
                "input": {"file_path": str(a.folder / "deploy.md"), "content": topic},
            },
            {
                "tool": "Write",
                "input": {"file_path": str(a.folder / "MEMORY.md"), "content": index},
            },
        ],
        "final": "Saved.",
    }
    session_a = run(claude, a, egress, script)
    # Claude Code took the setting: its memory is the shared folder, and it wrote there.
    assert f"persistent file-based memory at `{a.folder}/`" in memory_prompt(session_a)
    assert session_a.event("result")["subtype"] == "success"
    assert MARK in a.read("deploy.md") and a.read("MEMORY.md") == index
    # A's stop hook sent both to the store.
    shared = Store(memory_up).tree(store_id)
    assert shared["/MEMORY.md"] == index and MARK in shared["/deploy.md"]
    # B's session: the folder holds both before the model's first request (a Read of the
    # topic file is the first thing it does), and the index is in that request.
    script_b = {"steps": [{"tool": "Read", "input": {"file_path": str(b.folder / "deploy.md")}}],
                "final": "Read."}  # fmt: skip
    session_b = run(claude, b, egress, script_b)
    first_b = json.dumps(session_b.model_calls()[0])
    assert MARK in first_b and "MEMORY.md now reads" in first_b
    second_b = json.dumps(session_b.model_calls()[1].get("messages"))
    assert MARK in second_b and "tool_result" in second_b
    assert b.read("MEMORY.md") == index and b.read("deploy.md") == a.read("deploy.md")
    # The next session on B: Claude Code loads the index itself, as its own memory.
    again = run(claude, b, egress, {"steps": [], "final": "ok"})
    first = json.dumps(again.model_calls()[0])
    assert f"Contents of {b.folder}/MEMORY.md" in first and MARK in first
    assert "MEMORY.md now reads" not in first
    assert egress.attempts == []


def test_with_the_server_down_the_session_runs_and_its_memory_goes_up_later(
    claude: Path, memory_up: Memory, pair: Pair, egress: EgressProbe
) -> None:
    a, _, store_id = pair
    env = default_timeout(a.env)
    memory_up.switch.set("down")
    note = "---\nname: offline\n---\n\nWritten while the server was down.\n"
    script = {"steps": [{"tool": "Write", "input": {"file_path": str(a.folder / "offline.md"),
                                                    "content": note}}], "final": "ok"}  # fmt: skip
    offline = run(claude, a, egress, script, env)
    assert offline.event("result")["subtype"] == "success" and offline.took < 30
    assert "Written while the server was down." in a.read("offline.md")
    memory_up.switch.set("up")
    run(claude, a, egress, {"steps": [], "final": "ok"}, env)
    shared = Store(memory_up).tree(store_id)
    assert "Written while the server was down." in shared["/offline.md"]
    assert egress.attempts == []
