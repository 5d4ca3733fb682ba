"""The hooks as the agents run them (a process each, JSON on stdin) against a real server.

Claude Code's transcripts here are written line by line in its format (see
shared/reference/claude-code-harness/samples); tests/agents/test_claude_code.py has the
real CLI write them.
"""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from project_memory_client.agents.hooks import AGENT_LIMIT, SESSION_START_TIMEOUT, STOP_TIMEOUT

from tests.agents.conftest import CLI, Memory, Work, cli, default_timeout, git_repo, run_hook

pytestmark = pytest.mark.e2e


def test_stop_records_the_turn(
    memory_up: Memory, agent_env: dict[str, str], tmp_path: Path
) -> None:
    repo = tmp_path / "repo"
    head = git_repo(repo, "feature/login+fix")
    work = Work(repo, head, agent_env, tmp_path)
    token = agent_env["PROJECT_MEMORY_TOKEN"]
    prompt = f"Fix the login; the key is sk-ant-api03-{'x' * 30} and my token {token}"
    t = work.session("sess-1", (prompt, "Done: the TTL was 0."))
    done, _ = run_hook(agent_env, "stop", t.stop("Done: the TTL was 0."))
    assert done.returncode == 0 and done.stdout == "", done.stderr
    [turn] = memory_up.turns("feature-login-fix")  # the branch made into a task id
    meta = turn["meta"]
    assert meta["agent_id"] == "claude-code" and meta["model"] == "claude-test-1"
    assert meta["claude_session_id"] == "sess-1" and meta["commit"] == head
    assert meta["branch"] == "feature/login+fix" and meta["cwd"] == str(repo)
    assert meta["started_at"] == "2026-12-01T10:00:01.000Z" and meta["ended_at"].endswith("Z")
    # Two API messages: the tool-call message's two lines count once.
    assert meta["tokens"] == {"input": 200, "output": 30, "cache_read": 2000, "cache_creation": 10}
    assert len(meta["record_id"]) == 32
    summary = turn["summary_md"]
    assert (
        "## Prompt\n\nFix the login" in summary and "## Answer\n\nDone: the TTL was 0." in summary
    )
    assert "[secret:anthropic-key]" in summary and "sk-ant-api03" not in summary
    assert token not in json.dumps(turn)
    assert work.spooled() == []


def test_each_turn_once_and_the_next_turn_apart(memory_up: Memory, work: Work) -> None:
    env = work.task("once-task")
    t = work.session("sess-2", ("first prompt", "first answer"))
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
    memory_up: Memory, work: Work
) -> None:
    env = default_timeout(work.task("down-task"))
    t = work.session("sess-3", ("while the server is down", "answer kept"))
    memory_up.switch.set("down")
    done, took = run_hook(env, "stop", t.stop())
    assert done.returncode == 0 and done.stdout == "" and took < 2.0, (took, done.stderr)
    [entry] = work.spooled()
    assert stat.S_IMODE(entry.stat().st_mode) == 0o600
    assert stat.S_IMODE(entry.parent.stat().st_mode) == 0o700
    assert env["PROJECT_MEMORY_TOKEN"] not in entry.read_text()
    start, took = run_hook(env, "session-start", work.start("sess-3"))
    assert start.returncode == 0 and start.stdout == "" and took < 2.0
    assert memory_up.task("down-task") is None
    memory_up.switch.set("up")
    flushed = cli(env, "agent", "flush", "--json")
    assert flushed.returncode == 0, flushed.stdout + flushed.stderr
    assert json.loads(flushed.stdout)["data"]["sent"] == 1
    again = json.loads(cli(env, "agent", "flush", "--json").stdout)["data"]
    assert again["sent"] == 0 and work.spooled() == []
    [turn] = memory_up.turns("down-task")
    assert "while the server is down" in turn["summary_md"]


def test_a_hung_server_is_given_up_on_before_the_agent_gives_up(
    memory_up: Memory, work: Work
) -> None:
    """The network part has its own time, counted from when its first request can start,
    and the hook ends before the agent's 10 s are up."""
    env = default_timeout(work.task("slow-task"))
    t = work.session("sess-4", ("prompt", "answer"))
    memory_up.switch.set("slow")
    for event, payload, budget in (
        ("stop", t.stop(), STOP_TIMEOUT),
        ("session-start", work.start("sess-4"), SESSION_START_TIMEOUT),
    ):
        done, took = run_hook(env, event, payload)
        assert done.returncode == 0 and done.stdout == "", done.stderr
        assert budget <= took < AGENT_LIMIT, f"{event} took {took:.2f}s"
    assert len(work.spooled()) == 1
    log = (Path(env["PROJECT_MEMORY_STATE_DIR"]) / "hook.log").read_text()
    assert f"stop: gave up after {STOP_TIMEOUT:g}s" in log
    assert f"session-start: gave up after {SESSION_START_TIMEOUT:g}s" in log
    memory_up.switch.set("up")
    assert run_hook(env, "session-start", work.start("sess-4"))[0].returncode == 0
    assert work.spooled() == [] and len(memory_up.turns("slow-task")) == 1


def test_a_turn_sent_whose_answer_was_lost_is_not_sent_again(memory_up: Memory, work: Work) -> None:
    env = work.task("lost-answer")
    t = work.session("sess-5", ("prompt", "answer"))
    memory_up.switch.set("down")
    run_hook(env, "stop", t.stop())
    [entry] = work.spooled()
    record = json.loads(entry.read_text())
    # The server got it and the answer never came back: the turn is there, with its id.
    meta = {**record["meta"], "record_id": record["record_id"]}
    body = {"meta": meta, "summary_md": record["summary_md"]}
    assert memory_up.api("PUT", "/tasks/lost-answer/turns/0", json=body).status_code == 200
    memory_up.switch.set("up")
    out = json.loads(cli(env, "agent", "flush", "--json").stdout)["data"]
    assert (out["sent"], out["already_recorded"]) == (0, 1)
    assert len(memory_up.turns("lost-answer")) == 1 and work.spooled() == []


def test_sessions_racing_on_one_task_never_overwrite_each_other(
    memory_up: Memory, work: Work
) -> None:
    env = work.task("race-task")
    stops = [
        work.session(f"race-{i}", (f"prompt of session {i}", f"answer {i}")).stop()
        for i in range(6)
    ]
    with ThreadPoolExecutor(6) as pool:
        results = list(pool.map(lambda p: run_hook(env, "stop", p)[0].returncode, stops))
    assert results == [0] * 6
    # On a loaded machine some hooks run out of time before they send: what they spooled
    # goes now, in three flushes at once (each entry by one of them; all on the one task).
    flushes = [
        subprocess.Popen(
            [CLI, "agent", "flush"], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
        for _ in range(3)
    ]
    assert [p.wait(timeout=60) for p in flushes] == [0, 0, 0]
    turns = memory_up.turns("race-task")
    assert sorted(t["meta"]["claude_session_id"] for t in turns) == [f"race-{i}" for i in range(6)]
    assert [t["turn"] for t in turns] == list(range(6))
    for turn in turns:
        assert f"session {turn['meta']['claude_session_id'][5:]}" in turn["summary_md"]


def test_two_flushes_at_once_send_each_turn_once(memory_up: Memory, work: Work) -> None:
    env = work.task("flush-race")
    memory_up.switch.set("down")
    for i in range(4):
        run_hook(env, "stop", work.session(f"fl-{i}", (f"prompt {i}", f"answer {i}")).stop())
    assert len(work.spooled()) == 4
    memory_up.switch.set("up")
    flushes = [
        subprocess.Popen(
            [CLI, "agent", "flush"], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
        for _ in range(2)
    ]
    assert [p.wait(timeout=60) for p in flushes] == [0, 0]
    turns = memory_up.turns("flush-race")
    assert sorted(t["meta"]["claude_session_id"] for t in turns) == [f"fl-{i}" for i in range(4)]
    assert work.spooled() == []


def test_session_start_gives_the_task_and_the_newest_digest(memory_up: Memory, work: Work) -> None:
    env = work.task("context-task", PROJECT_MEMORY_CONTEXT_BYTES="1500")
    for i in range(4):
        body = {
            "meta": {"agent_id": "claude-code", "model": "m"},
            "summary_md": f"# Step {i}\n\nturn {i} of the context task",
        }
        assert memory_up.api("PUT", f"/tasks/context-task/turns/{i}", json=body).status_code == 200
    for i in range(20):
        body = {"summary_md": f"Filler task {i}. " + "word " * 60}
        assert memory_up.api("PUT", f"/tasks/filler-{i:02d}/turns/0", json=body).status_code == 200
    done, _ = run_hook(env, "session-start", work.start("s"))
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout)["hookSpecificOutput"]
    assert out["hookEventName"] == "SessionStart"
    context = out["additionalContext"]
    assert "Task `context-task`" in context
    assert context.index("turn 3 of") < context.index("turn 2 of") < context.index("turn 1 of")
    assert "turn 0 of" not in context  # the last three turns only
    assert '<stored-text from="turn 3 of task context-task (claude-code, m)">\n# Step 3' in context
    digest = context.split("The newest sections of project.md", 1)[1]
    assert "## filler-19" in digest and "## filler-00" not in digest
    assert len(context.encode()) <= 1500  # the whole context, the search line included
    assert context.endswith(
        "mcp__project-memory__search tool of the project-memory MCP server"
        " (then read_task / read_turn for a task's history)."
    )


def test_hooks_off_do_nothing(memory_up: Memory, work: Work) -> None:
    env = work.task("off-task", PROJECT_MEMORY_HOOKS="off")
    done, _ = run_hook(env, "stop", work.session("off", ("p", "a")).stop())
    assert done.returncode == 0 and memory_up.task("off-task") is None and work.spooled() == []


def test_bad_input_never_fails_the_agent(work: Work) -> None:
    no_token = {k: v for k, v in work.env.items() if k != "PROJECT_MEMORY_TOKEN"}
    cases = [
        ("session-start", "not json", work.env),
        ("stop", "[1, 2]", work.env),
        ("pre-compact", json.dumps({"transcript_path": str(work.tmp / "none.jsonl")}), work.env),
        ("stop", json.dumps(work.session("nt", ("p", "a")).stop()), no_token),
    ]
    for event, stdin, env in cases:
        done = subprocess.run(
            [CLI, "agent", "hook", event],
            input=stdin,
            capture_output=True,
            text=True,
            env=env,
            timeout=30,
            check=False,
        )
        assert done.returncode == 0, (event, stdin, done.stderr)
        if event != "session-start":  # which may still give the context from the server
            assert done.stdout == ""


def test_optional_artifacts(memory_up: Memory, work: Work) -> None:
    (work.repo / "notes.txt").write_text("hello\n")
    subprocess.run(["git", "add", "notes.txt"], cwd=work.repo, check=True)
    env = work.task("artifact-task", PROJECT_MEMORY_ARTIFACTS="transcript,diff")
    t = work.session("art", ("prompt with password=hunter2hunter2", "answer"))
    assert run_hook(env, "stop", t.stop())[0].returncode == 0
    index: dict[str, Any] = memory_up.task("artifact-task") or {}
    assert sorted(index["turns"][0]["artifacts"]) == ["diff.patch", "transcript.jsonl"]
    diff = memory_up.api("GET", "/tasks/artifact-task/turns/0/artifacts/diff.patch")
    assert "+hello" in diff.text
    slice_ = memory_up.api("GET", "/tasks/artifact-task/turns/0/artifacts/transcript.jsonl").text
    assert "hunter2hunter2" not in slice_ and "[secret:secret-assignment]" in slice_


def test_a_spooled_turn_goes_only_to_the_server_and_project_it_was_recorded_for(
    memory_up: Memory, work: Work
) -> None:
    # A token of every project of the tenant: the project is the client's setting.
    env = work.task(
        "scoped-task", PROJECT_MEMORY_TOKEN=memory_up.tenant_writer, PROJECT_MEMORY_PROJECT="web"
    )
    memory_up.switch.set("down")
    run_hook(env, "stop", work.session("sc", ("prompt", "answer")).stop())
    memory_up.switch.set("up")
    for changed in (
        {"PROJECT_MEMORY_PROJECT": "mobile"},
        {"PROJECT_MEMORY_URL": memory_up.server.url},
    ):
        out = json.loads(cli({**env, **changed}, "agent", "flush", "--json").stdout)["data"]
        assert (out["sent"], out["kept"]) == (0, 1)
    mobile = memory_up.api(
        "GET",
        "/tasks/scoped-task",
        headers={"X-Sandbox-Project-Id": "mobile"},
        token=memory_up.tenant_writer,
    )
    assert mobile.status_code == 404 and memory_up.task("scoped-task") is None
    assert json.loads(cli(env, "agent", "flush", "--json").stdout)["data"]["sent"] == 1
    assert len(memory_up.turns("scoped-task")) == 1


def test_codex_context_stays_under_its_limit(memory_up: Memory, work: Work) -> None:
    # Codex 0.171 passes a hook's additionalContext whole up to 10,000 characters and cuts a
    # longer one (measured against the Responses stub): the hook keeps within it.
    env = work.task("codex-context", PROJECT_MEMORY_CONTEXT_BYTES="50000")
    for i in range(30):
        body = {"summary_md": f"Big task {i}. " + "word " * 400}
        assert memory_up.api("PUT", f"/tasks/big-{i:02d}/turns/0", json=body).status_code == 200
    done, _ = run_hook(env, "session-start", work.start("cx"), agent="codex")
    context = json.loads(done.stdout)["hookSpecificOutput"]["additionalContext"]
    assert 5_000 < len(context) <= 10_000 and "## big-29" in context


def _prompts(turn: dict[str, Any]) -> list[str]:
    """The prompts a recorded turn's summary holds."""
    parts = turn["summary_md"].split("## Prompt\n\n")[1:]
    return [p.split("\n\n## ", 1)[0].split("\n\n", 1)[0].strip() for p in parts]


def _slow_git(tmp_path: Path, seconds: float) -> str:
    """A PATH whose ``git`` takes ``seconds`` before it runs the real one (git on a loaded
    machine, a large repository or a network filesystem)."""
    real = shutil.which("git")
    assert real is not None
    bin_dir = tmp_path / "slow-bin"
    bin_dir.mkdir()
    script = bin_dir / "git"
    script.write_text(f'#!/bin/sh\nsleep {seconds}\nexec {real} "$@"\n')
    script.chmod(0o755)
    return str(bin_dir)


def test_a_stop_hook_out_of_time_before_it_spools_loses_no_turn(
    memory_up: Memory, work: Work, tmp_path: Path
) -> None:
    """A local part slower than the network part's whole time (git slow, a short limit):
    every turn of the session, its first included, is spooled and arrives once, as its own
    turn."""
    slow = work.task(
        "slow-git",
        PATH=f"{_slow_git(tmp_path, 1.0)}{os.pathsep}{work.env['PATH']}",
        PROJECT_MEMORY_HOOK_TIMEOUT="0.5",
    )
    t = work.session("sg")
    start = {**work.start("sg"), "transcript_path": str(t.path)}
    assert run_hook(slow, "session-start", start)[0].returncode == 0
    took = []
    for n in range(3):
        t.turn(f"slow prompt {n}", f"slow answer {n}")
        done, seconds = run_hook(slow, "stop", t.stop())
        assert done.returncode == 0 and done.stdout == "", done.stderr
        took.append(seconds)
    flushed = cli(work.task("slow-git"), "agent", "flush", "--json")
    assert flushed.returncode == 0, flushed.stdout + flushed.stderr
    turns = memory_up.turns("slow-git")
    assert [_prompts(turn) for turn in turns] == [[f"slow prompt {n}"] for n in range(3)]
    assert [f"slow answer {n}" in turn["summary_md"] for n, turn in enumerate(turns)] == [True] * 3
    assert work.spooled() == []
    # A git call of 1 s, twice the network part's whole time: the local part is never cut,
    # and the network part's time starts after it.
    assert min(took) > 1.0, took


def test_a_turn_whose_hook_never_ran_arrives_as_its_own_turn(memory_up: Memory, work: Work) -> None:
    """A hook killed before it spooled (here: never run) loses nothing: the next hook of the
    session reads that turn too, apart from its own; a session's first turn included."""
    env = work.task("never-ran")
    t = work.session("nr")
    start = {**work.start("nr"), "transcript_path": str(t.path)}
    assert run_hook(env, "session-start", start)[0].returncode == 0
    t.turn("first prompt, its hook killed", "first answer")
    t.turn("second prompt", "second answer")
    assert run_hook(env, "stop", t.stop("second answer"))[0].returncode == 0
    t.turn("third prompt, its hook killed", "third answer")
    t.turn("fourth prompt", "fourth answer")
    assert run_hook(env, "stop", t.stop("fourth answer"))[0].returncode == 0
    turns = memory_up.turns("never-ran")
    assert [_prompts(turn) for turn in turns] == [
        ["first prompt, its hook killed"],
        ["second prompt"],
        ["third prompt, its hook killed"],
        ["fourth prompt"],
    ]
    answers = ["first answer", "second answer", "third answer", "fourth answer"]
    for turn, answer in zip(turns, answers, strict=True):
        assert turn["summary_md"].endswith(f"## Answer\n\n{answer}\n"), turn["summary_md"]
    # Each has its own record id, and the hooks that ran recorded nothing twice.
    assert len({turn["meta"]["record_id"] for turn in turns}) == 4
    assert run_hook(env, "stop", t.stop("fourth answer"))[0].returncode == 0
    assert len(memory_up.turns("never-ran")) == 4


def test_refused_entries_are_counted_and_logged_and_stray_temp_files_go(
    memory_up: Memory, work: Work
) -> None:
    env = work.task("refusals")
    state = Path(env["PROJECT_MEMORY_STATE_DIR"])
    spool = state / "spool"
    spool.mkdir(parents=True, mode=0o700)
    # An entry the server refuses for good (a task id it cannot take) and one torn in two.
    refused = {
        "record_id": "r" * 32,
        "agent": "claude-code",
        "url": memory_up.url,
        "tenant": None,
        "project": None,
        "task_id": "not a task id",
        "meta": {},
        "summary_md": "refused",
    }
    (spool / f"{'r' * 32}.json").write_text(json.dumps(refused))
    (spool / f"{'t' * 32}.json").write_text('{"record_id": "tttt", "agent"')
    # Temp files of writes a killed hook left, and one of a write in flight now.
    for where in (spool, state / "sessions"):
        where.mkdir(exist_ok=True, mode=0o700)
        stale = where / ".tmp-0123456789ab"
        stale.write_bytes(b"left by a killed hook")
        os.utime(stale, (time.time() - 3600, time.time() - 3600))
    (spool / ".tmp-ba9876543210").write_bytes(b"being written")
    t = work.session("rf", ("a prompt", "an answer"))
    assert run_hook(env, "stop", t.stop())[0].returncode == 0
    [turn] = memory_up.turns("refusals")
    assert _prompts(turn) == ["a prompt"]
    log = (state / "hook.log").read_text()
    assert "stop: 2 turn(s) refused for good, moved to" in log, log
    assert "unreadable entry" in log and "422" in log, log
    status = json.loads(cli(env, "agent", "status", "--json").stdout)["data"]
    assert (status["spool"]["queued"], status["spool"]["rejected"]) == (0, 2)
    left = sorted(p.name for p in [*spool.iterdir(), *(state / "sessions").iterdir()])
    assert ".tmp-0123456789ab" not in left and ".tmp-ba9876543210" in left, left


def test_deeply_nested_input_never_fails_the_agent(memory_up: Memory, work: Work) -> None:
    """JSON nested past Python's recursion limit, on stdin or in a transcript line: the hook
    exits 0 with nothing on stderr, and the turn around such a line is still recorded."""
    env = work.task("deep-input")
    for stdin in ("[" * 200_000, '{"a": ' * 100_000 + "1" + "}" * 100_000):
        for event in ("session-start", "stop", "pre-compact"):
            done = subprocess.run(
                [CLI, "agent", "hook", event],
                input=stdin,
                capture_output=True,
                text=True,
                env=env,
                timeout=60,
                check=False,
            )
            assert (done.returncode, done.stderr) == (0, ""), (event, done.stderr[-500:])
            if event != "session-start":
                assert done.stdout == ""
    t = work.session("deep")
    t.prompt("a prompt before a deep line")
    with open(t.path, "a", encoding="utf-8") as fh:
        fh.write("[" * 200_000 + "\n")
    t.assistant("m-deep", [{"type": "text", "text": "the answer after it"}], {"output_tokens": 1})
    done, _ = run_hook(env, "stop", t.stop())
    assert (done.returncode, done.stderr) == (0, ""), done.stderr[-500:]
    [turn] = memory_up.turns("deep-input")
    assert "a prompt before a deep line" in turn["summary_md"]
    assert "the answer after it" in turn["summary_md"]


def test_a_refused_token_is_one_line_in_the_log(memory_up: Memory, work: Work) -> None:
    env = work.task("refused", PROJECT_MEMORY_TOKEN="pm_" + "r" * 40)
    done, _ = run_hook(env, "session-start", work.start("rf"))
    assert done.returncode == 0 and done.stdout == ""
    log = (Path(env["PROJECT_MEMORY_STATE_DIR"]) / "hook.log").read_text().splitlines()
    assert len(log) == 1 and "refused GET /context" in log[0] and "401" in log[0], log
