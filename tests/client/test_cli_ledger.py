"""``project-memory ledger`` and ``project-memory timeline``: the ``--json`` envelopes against
tests/client/golden/cli-ledger-json.json (values that change from run to run masked, as
test_cli.py masks them), and the tables a person reads. After a deliberate change, rewrite the
file with PROJECT_MEMORY_UPDATE_GOLDEN=1 and review the diff."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest

from tests.client.conftest import Cli, cli_env
from tests.client.test_cli import normalise
from tests.e2e.conftest import Server

pytestmark = pytest.mark.e2e

GOLDEN = Path(__file__).parent / "golden" / "cli-ledger-json.json"


@pytest.fixture
def ledger_cli(pm_server: Server, tmp_path: Path) -> Cli:
    """The CLI with a token of a project of its own (acme/ledger-golden), holding turns of
    June 2025 (their started_at) and one written now."""
    token = pm_server.token("writer", project="ledger-golden")
    work = tmp_path / "work"
    work.mkdir()
    cli = Cli(cli_env(pm_server.url, token, tmp_path / "config"), work)
    turns = [
        ("fix-login", "0", "claude-code", "opus", "fix/login", "s1", "2025-06-01T09:00:00Z",
         '{"input": 1200, "output": 300, "cache_read": 5000, "cache_creation": 40}', "0"),
        ("fix-login", "1", "claude-code", "opus", "fix/login", "s1", "2025-06-01T10:00:00Z",
         '{"input": 800, "output": 200}', "1"),
        ("ci", "0", "codex", "gpt-5", "main", "s2", "2025-06-02T23:30:00Z",
         '{"input": 5000, "output": 1000, "cache_read": 2000}', "0"),
    ]  # fmt: skip
    for task, turn, agent, model, branch, session, started, tokens, code in turns:
        ran = cli(
            "turn", "put", task, turn, "--summary", f"{task} {turn}",
            "--meta", f"agent_id={agent}", "--meta", f"model={model}",
            "--meta", f"branch={branch}", "--meta", f"claude_session_id={session}",
            "--meta", f"started_at={started}", "--meta", f"tokens:={tokens}",
            "--meta", f"exit_code:={code}",
        )  # fmt: skip
        assert ran.code == 0, ran.stderr
    cost = ["--meta", "cost:=0.125", "--meta", "model=opus", "--meta", "agent_id=claude-code"]
    assert cli("turn", "put", "today", "0", "--summary", "now", *cost).code == 0
    return cli


def test_json_envelopes(ledger_cli: Cli, pm_server: Server, tmp_path: Path) -> None:
    cli = ledger_cli
    june = ["--since", "2025-06-01", "--until", "2025-07-01"]
    cases: dict[str, tuple[list[str], int]] = {
        "ledger --by day,model": (["ledger", "--by", "day,model", *june], 0),
        "ledger totals": (["ledger", "--by", "", *june], 0),
        "ledger --by task --limit 1": (["ledger", "--by", "task,session", "--limit", "1", *june], 0),
        "ledger --agent codex": (["ledger", "--by", "branch", "--agent", "codex"], 0),
        "timeline --branch": (["timeline", "--branch", "fix/login", "--since", "2025-06-01T09:30:00Z"], 0),
        "timeline --since yesterday": (["timeline", "--since", "yesterday"], 0),
        "error: bad usage": (["ledger", "--by", "week"], 2),
        "error: the API refused": (["ledger", "--since", "last tuesday"], 1),
    }  # fmt: skip
    replace = {pm_server.url: "<url>", str(tmp_path): "<tmp>"}
    got = {}
    for name, (args, code) in cases.items():
        ran = cli(*args, "--json")
        assert ran.code == code, (name, ran.stdout, ran.stderr)
        envelope = ran.json()
        assert envelope["ok"] is (code == 0), name
        data = envelope.get("data") or {}
        if data.get("next_cursor"):  # signed with the server's own key: differs every run
            data["next_cursor"] = "<cursor>"
        got[name] = normalise(envelope, replace)
    if os.environ.get("PROJECT_MEMORY_UPDATE_GOLDEN"):
        GOLDEN.write_text(json.dumps(got, indent=2, ensure_ascii=False) + "\n")
    assert got == json.loads(GOLDEN.read_text())


def test_tables(ledger_cli: Cli) -> None:
    shown = ledger_cli(
        "ledger", "--by", "day,model", "--since", "2025-06-01", "--until", "2025-07-01"
    )
    assert shown.code == 0, shown.stderr
    lines = shown.stdout.splitlines()
    assert re.match(r"DAY\s+MODEL\s+TURNS\s+SESSIONS\s+IN\s+OUT\s+CACHE READ", lines[0])
    assert re.match(r"2025-06-02\s+gpt-5\s+1\s+1\s+5000\s+1000\s+2000", lines[1])
    assert re.match(r"2025-06-01\s+opus\s+2\s+1\s+2000\s+500\s+5000", lines[2])
    assert re.match(r"total\s+3\s+2\s+7000\s+1500", lines[3])
    assert "days 2025-06-01 to 2025-06-30" in shown.stdout
    assert "3 turn(s) with no cost of their own" in shown.stdout
    timeline = ledger_cli("timeline", "--agent", "claude-code", "--limit", "2")
    assert timeline.code == 0, timeline.stderr
    rows = timeline.stdout.splitlines()
    assert re.match(
        r"AT\s+TURN\s+AGENT\s+MODEL\s+BRANCH\s+IN/OUT\s+COST USD\s+WALL\s+EXIT", rows[0]
    )
    assert re.search(r"today #0\s+claude-code\s+opus\s+-\s+0/0\s+0\.1250", rows[1])
    assert re.search(
        r"fix-login #1\s+claude-code\s+opus\s+fix/login\s+800/200\s+-\s+0m00s\s+1", rows[2]
    )
    assert "2 turn(s), newest first; older: --cursor " in timeline.stdout
