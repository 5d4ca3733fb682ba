"""The hooks as the agents run them (a process each, JSON on stdin) against a real server.

Claude Code's transcripts here are written line by line in its format (see
shared/reference/claude-code-harness/samples); tests/agents/test_claude_code.py has the
real CLI write them.
"""

from __future__ import annotations

import json
import stat
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from tests.agents.conftest import Memory, Transcript, cli, git_repo, run_hook

pytestmark = pytest.mark.e2e


@pytest.fixture
def repo(tmp_path: Path) -> tuple[Path, str]:
    path = tmp_path / "repo"
    return path, git_repo(path, "feature/login+fix")


def spooled(env: dict[str, str]) -> list[Path]:
    spool = Path(env["PROJECT_MEMORY_STATE_DIR"]) / "spool"
    return sorted(spool.glob("*.json")) if spool.is_dir() else []


def test_stop_records_the_turn(
    memory_up: Memory, agent_env: dict[str, str], repo: tuple[Path, str], tmp_path: Path
) -> None:
    path, head = repo
    t = Transcript(tmp_path / "t.jsonl", "sess-1", path)
    token = agent_env["PROJECT_MEMORY_TOKEN"]
    t.turn(
        f"Fix the login; the key is sk-ant-api03-{'x' * 30} and my token {token}",
        "Done: the TTL was 0.",
    )
    done, _ = run_hook(agent_env, "stop", t.stop("Done: the TTL was 0."))
    assert done.returncode == 0 and done.stdout == "", done.stderr
    [turn] = memory_up.turns("feature-login-fix")  # the branch made into a task id
    meta = turn["meta"]
    assert meta["agent_id"] == "claude-code" and meta["model"] == "claude-test-1"
    assert meta["claude_session_id"] == "sess-1" and meta["commit"] == head
    assert meta["branch"] == "feature/login+fix" and meta["cwd"] == str(path)
    assert meta["started_at"] == "2026-12-01T10:00:01.000Z" and meta["ended_at"].endswith("Z")
    # Two API messages: the tool-call message's two lines count once.
    assert meta["tokens"] == {"input": 200, "output": 30, "cache_read": 2000, "cache_creation": 10}
    assert len(meta["record_id"]) == 32
    summary = turn["summary_md"]
    assert (
        "## Prompt\n\nFix the login" in summary and "## Answer\n\nDone: the TTL was 0." in summary
    )
    assert "[masked:anthropic-key]" in summary and "sk-ant-api03" not in summary
    assert token not in json.dumps(turn)
    assert spooled(agent_env) == []


def test_each_turn_once_and_the_next_turn_apart(
    memory_up: Memory, agent_env: dict[str, str], tmp_path: Path
) -> None:
    path = tmp_path / "repo"
    git_repo(path)
    env = {**agent_env, "PROJECT_MEMORY_TASK": "once-task"}
    t = Transcript(tmp_path / "t.jsonl", "sess-2", path)
    t.turn("first prompt", "first answer")
    assert run_hook(env, "stop", t.stop())[0].returncode == 0
    assert run_hook(env, "stop", t.stop())[0].returncode == 0  # nothing new since
    t.turn("second prompt", "second answer")
    assert (
        run_hook(env, "pre-compact", {**t.stop(), "hook_event_name": "PreCompact"})[0].returncode
        == 0
    )
    turns = memory_up.turns("once-task")
    assert [t_["turn"] for t_ in turns] == [0, 1]
    assert "first prompt" in turns[0]["summary_md"] and "first" not in turns[1]["summary_md"]
    assert turns[1]["meta"]["hook_event"] == "pre-compact"
    # The session's state lost: the same turn again has the same record id, found on the
    # server, and is not written twice.
    for state in (Path(env["PROJECT_MEMORY_STATE_DIR"]) / "sessions").iterdir():
        state.unlink()
    assert run_hook(env, "stop", t.stop())[0].returncode == 0
    assert len(memory_up.turns("once-task")) == 2


def test_server_down_the_turn_waits_in_the_spool_and_arrives_once(
    memory_up: Memory, agent_env: dict[str, str], tmp_path: Path
) -> None:
    path = tmp_path / "repo"
    git_repo(path)
    env = {**agent_env, "PROJECT_MEMORY_TASK": "down-task"}
    t = Transcript(tmp_path / "t.jsonl", "sess-3", path)
    t.turn("while the server is down", "answer kept")
    memory_up.switch.set("down")
    done, took = run_hook(env, "stop", t.stop())
    assert done.returncode == 0 and done.stdout == "" and took < 2.0, (took, done.stderr)
    [entry] = spooled(env)
    assert stat.S_IMODE(entry.stat().st_mode) == 0o600
    assert stat.S_IMODE(entry.parent.stat().st_mode) == 0o700
    assert env["PROJECT_MEMORY_TOKEN"] not in entry.read_text()
    start, took = run_hook(
        env, "session-start", {"session_id": "sess-3", "cwd": str(path), "source": "startup"}
    )
    assert start.returncode == 0 and start.stdout == "" and took < 2.0
    assert memory_up.task("down-task") is None
    memory_up.switch.set("up")
    flushed = cli(env, "agent", "flush", "--json")
    assert flushed.returncode == 0, flushed.stdout + flushed.stderr
    assert json.loads(flushed.stdout)["data"]["sent"] == 1
    again = json.loads(cli(env, "agent", "flush", "--json").stdout)["data"]
    assert again["sent"] == 0 and spooled(env) == []
    [turn] = memory_up.turns("down-task")
    assert "while the server is down" in turn["summary_md"]


def test_a_hung_server_is_given_up_on_within_2_seconds(
    memory_up: Memory, agent_env: dict[str, str], tmp_path: Path
) -> None:
    path = tmp_path / "repo"
    git_repo(path)
    env = {**agent_env, "PROJECT_MEMORY_TASK": "slow-task"}
    t = Transcript(tmp_path / "t.jsonl", "sess-4", path)
    t.turn("prompt", "answer")
    memory_up.switch.set("slow")
    for event, payload in (
        ("stop", t.stop()),
        ("session-start", {"session_id": "sess-4", "cwd": str(path)}),
    ):
        done, took = run_hook(env, event, payload)
        assert done.returncode == 0 and done.stdout == "", done.stderr
        assert took < 2.0, f"{event} took {took:.2f}s"
    assert len(spooled(env)) == 1
    log = (Path(env["PROJECT_MEMORY_STATE_DIR"]) / "hook.log").read_text()
    assert "gave up after 1.5s" in log
    memory_up.switch.set("up")
    assert (
        run_hook(env, "session-start", {"session_id": "sess-4", "cwd": str(path)})[0].returncode
        == 0
    )
    assert spooled(env) == [] and len(memory_up.turns("slow-task")) == 1


def test_a_turn_sent_whose_answer_was_lost_is_not_sent_again(
    memory_up: Memory, agent_env: dict[str, str], tmp_path: Path
) -> None:
    path = tmp_path / "repo"
    git_repo(path)
    env = {**agent_env, "PROJECT_MEMORY_TASK": "lost-answer"}
    t = Transcript(tmp_path / "t.jsonl", "sess-5", path)
    t.turn("prompt", "answer")
    memory_up.switch.set("down")
    run_hook(env, "stop", t.stop())
    [entry] = spooled(env)
    record = json.loads(entry.read_text())
    # The server got it and the answer never came back: the turn is there, with its id.
    meta = {**record["meta"], "record_id": record["record_id"]}
    put = memory_up.api(
        "PUT", "/tasks/lost-answer/turns/0", json={"meta": meta, "summary_md": record["summary_md"]}
    )
    assert put.status_code == 200
    memory_up.switch.set("up")
    out = json.loads(cli(env, "agent", "flush", "--json").stdout)["data"]
    assert (out["sent"], out["already_recorded"]) == (0, 1)
    assert len(memory_up.turns("lost-answer")) == 1 and spooled(env) == []


def test_sessions_racing_on_one_task_never_overwrite_each_other(
    memory_up: Memory, agent_env: dict[str, str], tmp_path: Path
) -> None:
    path = tmp_path / "repo"
    git_repo(path)
    env = {**agent_env, "PROJECT_MEMORY_TASK": "race-task"}
    payloads = []
    for i in range(6):
        t = Transcript(tmp_path / f"t{i}.jsonl", f"race-{i}", path)
        t.turn(f"prompt of session {i}", f"answer of session {i}")
        payloads.append(t.stop())
    with ThreadPoolExecutor(6) as pool:
        results = list(pool.map(lambda p: run_hook(env, "stop", p)[0].returncode, payloads))
    assert results == [0] * 6
    turns = memory_up.turns("race-task")
    assert sorted(t["meta"]["claude_session_id"] for t in turns) == [f"race-{i}" for i in range(6)]
    assert [t["turn"] for t in turns] == list(range(6))
    for turn in turns:
        assert turn["meta"]["claude_session_id"].split("-")[1] in turn["summary_md"]


def test_two_flushes_at_once_send_each_turn_once(
    memory_up: Memory, agent_env: dict[str, str], tmp_path: Path
) -> None:
    path = tmp_path / "repo"
    git_repo(path)
    env = {**agent_env, "PROJECT_MEMORY_TASK": "flush-race"}
    memory_up.switch.set("down")
    for i in range(4):
        t = Transcript(tmp_path / f"t{i}.jsonl", f"fl-{i}", path)
        t.turn(f"prompt {i}", f"answer {i}")
        run_hook(env, "stop", t.stop())
    assert len(spooled(env)) == 4
    memory_up.switch.set("up")
    procs = [
        subprocess.Popen(
            [str(Path(sys.executable).parent / "project-memory"), "agent", "flush"],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        for _ in range(2)
    ]
    assert [p.wait(timeout=60) for p in procs] == [0, 0]
    turns = memory_up.turns("flush-race")
    assert sorted(t["meta"]["claude_session_id"] for t in turns) == [f"fl-{i}" for i in range(4)]
    assert spooled(env) == []


def test_session_start_gives_the_task_and_the_newest_digest(
    memory_up: Memory, agent_env: dict[str, str], tmp_path: Path
) -> None:
    path = tmp_path / "repo"
    git_repo(path)
    env = {
        **agent_env,
        "PROJECT_MEMORY_TASK": "context-task",
        "PROJECT_MEMORY_CONTEXT_BYTES": "1500",
    }
    for i in range(4):
        body = {
            "meta": {"agent_id": "claude-code", "model": "m"},
            "summary_md": f"# Step {i}\n\nturn {i} of the context task",
        }
        assert memory_up.api("PUT", f"/tasks/context-task/turns/{i}", json=body).status_code == 200
    for i in range(20):
        body = {"summary_md": f"Filler task {i}. " + "word " * 60}
        assert memory_up.api("PUT", f"/tasks/filler-{i:02d}/turns/0", json=body).status_code == 200
    done, _ = run_hook(
        env, "session-start", {"session_id": "s", "cwd": str(path), "source": "startup"}
    )
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout)["hookSpecificOutput"]
    assert out["hookEventName"] == "SessionStart"
    context = out["additionalContext"]
    assert "Task `context-task`" in context
    assert context.index("turn 3 of") < context.index("turn 2 of") < context.index("turn 1 of")
    assert "turn 0 of" not in context  # the last three turns only
    assert "### Step 3" in context  # its headings under the context's own
    digest = context.split("The newest sections of project.md", 1)[1]
    assert "## filler-19" in digest and "## filler-00" not in digest
    assert len(digest.split("To look further back")[0].encode()) <= 1500 + 100
    assert "mcp__project-memory__search" in context


def test_hooks_off_do_nothing(memory_up: Memory, agent_env: dict[str, str], tmp_path: Path) -> None:
    path = tmp_path / "repo"
    git_repo(path)
    env = {**agent_env, "PROJECT_MEMORY_TASK": "off-task", "PROJECT_MEMORY_HOOKS": "off"}
    t = Transcript(tmp_path / "t.jsonl", "off", path)
    t.turn("p", "a")
    done, _ = run_hook(env, "stop", t.stop())
    assert done.returncode == 0 and memory_up.task("off-task") is None and spooled(env) == []


def test_bad_input_never_fails_the_agent(agent_env: dict[str, str], tmp_path: Path) -> None:
    for event in ("session-start", "stop", "pre-compact"):
        for stdin in (
            "",
            "not json",
            "[1, 2]",
            json.dumps({"transcript_path": str(tmp_path / "none.jsonl")}),
        ):
            done = subprocess.run(
                [str(Path(sys.executable).parent / "project-memory"), "agent", "hook", event],
                input=stdin,
                capture_output=True,
                text=True,
                env=agent_env,
                timeout=30,
                check=False,
            )
            assert done.returncode == 0, (event, stdin, done.stderr)
    unset = {k: v for k, v in agent_env.items() if k != "PROJECT_MEMORY_TOKEN"}
    done = subprocess.run(
        [str(Path(sys.executable).parent / "project-memory"), "agent", "hook", "stop"],
        input="{}",
        capture_output=True,
        text=True,
        env=unset,
        timeout=30,
        check=False,
    )
    assert done.returncode == 0


def test_optional_artifacts(memory_up: Memory, agent_env: dict[str, str], tmp_path: Path) -> None:
    path = tmp_path / "repo"
    git_repo(path)
    (path / "notes.txt").write_text("hello\n")
    subprocess.run(["git", "add", "notes.txt"], cwd=path, check=True)
    env = {
        **agent_env,
        "PROJECT_MEMORY_TASK": "artifact-task",
        "PROJECT_MEMORY_ARTIFACTS": "transcript,diff",
    }
    t = Transcript(tmp_path / "t.jsonl", "art", path)
    t.turn("prompt with password=hunter2hunter2", "answer")
    assert run_hook(env, "stop", t.stop())[0].returncode == 0
    index: dict[str, Any] = memory_up.task("artifact-task") or {}
    assert sorted(index["turns"][0]["artifacts"]) == ["diff.patch", "transcript.jsonl"]
    diff = memory_up.api("GET", "/tasks/artifact-task/turns/0/artifacts/diff.patch")
    assert "+hello" in diff.text
    slice_ = memory_up.api("GET", "/tasks/artifact-task/turns/0/artifacts/transcript.jsonl").text
    assert "hunter2hunter2" not in slice_ and "[masked:secret-assignment]" in slice_
