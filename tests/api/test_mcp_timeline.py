"""The MCP tool ``read_timeline``: the project's turns newest first, filtered, with the start of
each summary framed; offered to readers, read-only; a bad argument is an error result that
says what to change."""

from __future__ import annotations

from typing import Any

import pytest
from flask.testing import FlaskClient

from tests.api.test_mcp import Mcp, unframe
from tests.conftest import Tokens

pytestmark = pytest.mark.all_backends


@pytest.fixture
def mcp(client: FlaskClient, tokens: Tokens) -> Mcp:
    return Mcp(client, tokens)


def record(mcp: Mcp, task: str, turn: int, summary: str, **meta: Any) -> None:
    mcp.ok("record_turn", task_id=task, turn=turn, summary_md=summary, meta=meta)


def test_what_the_team_did_on_a_branch_in_one_call(mcp: Mcp) -> None:
    record(mcp, "login", 0, "## Reproduced\nThe TTL is read twice.", agent_id="codex",
           model="gpt-5", branch="fix/login", started_at="2025-12-31T09:30:00Z",
           tokens={"input": 1200, "output": 80}, exit_code=1, commit="a1b2c3d4e5f6a7b8")  # fmt: skip
    record(mcp, "login", 1, "Fixed: one read.", agent_id="claude-code", model="opus",
           branch="fix/login", started_at="2025-12-31T11:00:00Z", cost=0.5)  # fmt: skip
    record(mcp, "docs", 0, "Docs on main.", agent_id="codex", model="gpt-5", branch="main",
           started_at="2025-12-31T12:00:00Z")  # fmt: skip
    reader = mcp.as_("reader")
    text, found = reader.records("read_timeline", branch="fix/login", since="2025-12-31T09:00:00Z")
    assert [(t["task_id"], t["turn"]) for t in found["turns"]] == [("login", 1), ("login", 0)]
    assert found["next_cursor"] is None
    first, second = found["turns"]
    assert (first["agent"], first["cost_usd"], first["summary"]) == (
        "claude-code",
        0.5,
        "Fixed: one read.",
    )
    assert second["summary"] == "Reproduced The TTL is read twice."
    assert (second["exit_code"], second["commit"], second["input_tokens"]) == (
        1,
        "a1b2c3d4e5f6a7b8",
        1200,
    )
    assert "turn 1 of task login" in text and "exit 1" in text and "1,200 in" in text
    framed = text.split("\n  ", 1)[1].split("\n", 1)[0]
    assert unframe(framed.replace(">", ">\n", 1)) == "Fixed: one read."
    by_codex = reader.records("read_timeline", agent="codex", limit=1)[1]
    assert [t["task_id"] for t in by_codex["turns"]] == ["docs"]
    older = reader.records("read_timeline", agent="codex", limit=1, cursor=by_codex["next_cursor"])
    assert [(t["task_id"], t["turn"]) for t in older[1]["turns"]] == [("login", 0)]


def test_it_is_a_read_tool_offered_to_readers(mcp: Mcp) -> None:
    tools = mcp.as_("reader").modern("tools/list").json["result"]["tools"]
    tool = next(t for t in tools if t["name"] == "read_timeline")
    assert tool["annotations"]["readOnlyHint"] is True
    assert mcp.as_("reader").ok("read_timeline") == "No turn matches."


@pytest.mark.parametrize(
    ("arguments", "says"),
    [
        ({"since": "last week"}, "since"),
        ({"until": "tomorrow"}, "until"),
        ({"agent": "a\u0001"}, "agent"),
        ({"limit": 0}, "limit"),
        ({"limit": 51}, "limit"),
        ({"cursor": "x"}, "cursor"),
        ({"branch": 3}, "branch"),
    ],
)
def test_bad_arguments_are_error_results(mcp: Mcp, arguments: dict[str, Any], says: str) -> None:
    assert says in mcp.err("read_timeline", **arguments)
