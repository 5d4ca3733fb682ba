"""The real Codex CLI (pinned: tests/agents/npm) in a repository set up by
``project-memory agent install codex``, against a stub of OpenAI's Responses API.

Codex reads a project's ``.codex/`` only in a trusted project (``codex exec --trust`` saves
that, as a person would once) and runs a new hook only once the person trusted it in the
TUI's ``/hooks``; this run stands in for that review with
``--dangerously-bypass-hook-trust``. The model provider is the stub, named in the
isolated CODEX_HOME's config.toml, with plugins and analytics off (else it calls home).
"""

from __future__ import annotations

import fcntl
import json
import os
import pty
import re
import select
import struct
import subprocess
import termios
import time
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

from tests.agents.conftest import Memory, cli, default_timeout, git_repo
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
    # Codex, too, gives the model a result's structured content in place of its text.
    hit = '"task_id":"codex-earlier","turn":0'
    assert answer and hit in answer[-1]
    calls = [r["body"] for r in stub.requests if r["method"] == "POST"]
    first = json.dumps(calls[0]["input"])
    assert "# Project memory" in first and "CODEX_MARK_4410" in first  # SessionStart context
    tools = {t.get("name"): t for t in calls[0]["tools"]}
    listed = [t["name"] for t in tools["mcp__project_memory"]["tools"]]
    assert "search" in listed and "record_turn" in listed
    outputs: list[Any] = [
        i.get("output") for i in calls[-1]["input"] if i.get("type") == "function_call_output"
    ]
    assert any(json.dumps(hit)[1:-1] in json.dumps(o) for o in outputs)
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


def _codex_home(env: dict[str, str], stub: ResponsesStub) -> Path:
    codex_home = Path(env["HOME"]) / ".codex"
    codex_home.mkdir(parents=True, exist_ok=True)
    (codex_home / "config.toml").write_text(
        'model = "gpt-stub"\nmodel_provider = "stub"\ncheck_for_update_on_startup = false\n\n'
        '[model_providers.stub]\nname = "stub"\n'
        f'base_url = "{stub.url}/v1"\nwire_api = "responses"\nenv_key = "STUB_API_KEY"\n'
        "\n[features]\nplugins = false\n\n[analytics]\nenabled = false\n"
    )
    return codex_home


# Codex's TUI asks the terminal what it is before it draws; these are a terminal's answers.
_ANSWERS = {
    b"\x1b[6n": b"\x1b[1;1R",
    b"]10;?": b"\x1b]10;rgb:ffff/ffff/ffff\x1b\\",
    b"]11;?": b"\x1b]11;rgb:0000/0000/0000\x1b\\",
    b"[?1007$p": b"\x1b[?1007;2$y",
    b"[?u": b"\x1b[?0u",
}


def trust_hooks_in_the_tui(codex: Path, repo: Path, env: dict[str, str]) -> None:
    """What a person does once: start ``codex`` in the repository and, asked about its new
    hooks, choose "Trust all and continue" (the second choice)."""
    config = Path(env["CODEX_HOME"]) / "config.toml"
    pid, fd = pty.fork()
    if pid == 0:  # the child: codex in the repository, on a terminal
        os.chdir(repo)
        # Without --no-daemon the TUI leaves a shared app-server running after the test,
        # whose control socket (under /tmp, named by a hash) a later TUI can find in use.
        os.execve(str(codex), [str(codex), "--no-daemon"], {**env, "TERM": "xterm-256color"})  # noqa: S606
    # A terminal of 40 x 120: a TUI on a terminal of no size draws no dialog.
    fcntl.ioctl(fd, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 120, 0, 0))
    screen = b""
    chose = False
    try:
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline and "[hooks.state" not in config.read_text():
            ready, _, _ = select.select([fd], [], [], 0.2)
            if not ready:
                continue
            try:
                data = os.read(fd, 65536)
            except OSError:
                break
            for asked, answer in _ANSWERS.items():
                if asked in data:
                    os.write(fd, answer)
            screen += data
            plain = b" ".join(re.sub(rb"\x1b\[[0-9;?>]*[a-zA-Z$]", b" ", screen).split())
            if not chose and b"Trust all and continue" in plain:
                time.sleep(0.5)
                os.write(fd, b"\x1b[B")  # down, to "Trust all and continue"
                time.sleep(0.5)
                os.write(fd, b"\r")
                chose = True
    finally:
        os.kill(pid, 9)
        os.waitpid(pid, 0)
        os.close(fd)
        # Kept with the test's directory when it fails: the whole screen, escapes and all.
        (repo.parent / "tui-screen.bin").write_bytes(screen)
    plain_tail = re.sub(rb"\x1b\[[0-9;?>]*[a-zA-Z$ ]", b" ", screen[-4000:]).decode(
        errors="replace"
    )
    assert "[hooks.state" in config.read_text(), plain_tail


def _doctor(env: dict[str, str], repo: Path) -> tuple[int, list[str]]:
    done = cli(env, "agent", "doctor", cwd=repo)
    lines = (done.stdout + done.stderr).splitlines()
    return done.returncode, [line for line in lines if line.startswith("problem ")]


def test_hooks_codex_has_not_trusted_do_not_run_and_the_doctor_says_so(
    codex: Path, memory_up: Memory, agent_env: dict[str, str], tmp_path: Path, egress: EgressProbe,
    load: str,
) -> None:  # fmt: skip
    """``codex exec --trust`` trusts the project, not its hooks: they do not run, and the
    doctor exits 1 naming them. Trusted once in the TUI, they run, and it exits 0."""
    repo = tmp_path / "repo"
    git_repo(repo, "codex-trust")
    assert cli(agent_env, "agent", "install", "codex", cwd=repo).returncode == 0
    mark = f"TRUST_MARK_{load}"
    assert memory_up.api("PUT", f"/tasks/trust-{load}/turns/0", json={"summary_md": mark}).ok
    stub = ResponsesStub({"steps": [], "final": "ok"})
    codex_home = _codex_home(agent_env, stub)
    env = {**default_timeout(agent_env), "CODEX_HOME": str(codex_home), "STUB_API_KEY": "stub",
           **egress.env()}  # fmt: skip

    def session() -> str:
        done = subprocess.run(
            [str(codex), "exec", "--json", "--trust", "Hello."],
            cwd=repo, env=env, capture_output=True, text=True, timeout=120, check=False,
        )  # fmt: skip
        assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
        calls = [r["body"] for r in stub.requests if r["method"] == "POST"]
        return json.dumps(calls[-1]["input"])

    try:
        assert mark not in session()  # the project trusted, the hooks not: no context
        code, problems = _doctor(env, repo)
        assert code == 1 and [p for p in problems if "codex hook trust" in p], problems
        assert not [p for p in problems if "codex trust:" in p], problems
        assert egress.attempts == []
        # The person's step: the TUI also asks GitHub for a tip of the day (refused here).
        trust_hooks_in_the_tui(codex, repo, env)
        egress.attempts.clear()
        code, problems = _doctor(env, repo)
        assert (code, problems) == (0, []), problems
        assert mark in session()  # the hooks run now
    finally:
        stub.close()
    assert egress.attempts == []


# -- the prompt hook: the project's memory about each prompt ---------------------------------
def _exec(codex: Path, repo: Path, env: dict[str, str], prompt: str) -> None:
    done = subprocess.run(
        [str(codex), "exec", "--json", "--trust", "--dangerously-bypass-hook-trust", prompt],
        cwd=repo, env=env, capture_output=True, text=True, timeout=120, check=False,
        stdin=subprocess.DEVNULL,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]


def _texts(request: dict[str, Any]) -> list[str]:
    """The text of each message of a Responses request's input, in order."""
    return [
        "".join(str(c.get("text", "")) for c in item.get("content") or [] if isinstance(c, dict))
        for item in request["input"]
        if item.get("type") == "message"
    ]


def test_a_prompt_about_another_sessions_fact_brings_it_to_codex(
    codex: Path, memory_up: Memory, agent_env: dict[str, str], tmp_path: Path, egress: EgressProbe
) -> None:
    repo = tmp_path / "repo"
    git_repo(repo, "codex-prompt")
    assert cli(agent_env, "agent", "install", "codex", cwd=repo).returncode == 0
    mark = f"zephyr{time.monotonic_ns()}"
    fact = f"The {mark} vault rotates its quokka key every Tuesday at 04:00 UTC."
    assert memory_up.api("PUT", f"/tasks/other-session-{mark}/turns/0",
                         json={"summary_md": fact}).ok  # fmt: skip
    stub = ResponsesStub({"steps": [], "final": "ok"})
    env = {**agent_env, "CODEX_HOME": str(_codex_home(agent_env, stub)), "STUB_API_KEY": "stub",
           **egress.env()}  # fmt: skip
    try:
        _exec(codex, repo, env, f"When does the {mark} quokka key rotate?")
        # Words of this run's own: the server is every test's, and records each prompt.
        nothing = f"Frob{mark} the xylo{mark} fimble{mark}."
        _exec(codex, repo, env, nothing)
    finally:
        stub.close()
    first, second = (
        r["body"] for r in stub.requests if r["method"] == "POST" and r["body"].get("input")
    )
    # The prompt, then the hook's context as a message of its own right after it.
    texts = _texts(first)
    asked = texts.index(f"When does the {mark} quokka key rotate?")
    added = texts[asked + 1]
    assert added.startswith("# Project memory on this prompt\n") and fact in added
    # Nothing matches the second prompt: nothing follows it, not even a header.
    texts = _texts(second)
    assert texts[-1] == nothing
    assert not any("Project memory on this prompt" in t for t in texts)
    assert egress.attempts == []


@pytest.mark.parametrize("state", ["down", "slow"])
def test_with_the_server_down_or_hung_codex_sends_the_prompt_at_once(
    codex: Path, memory_up: Memory, agent_env: dict[str, str], tmp_path: Path, egress: EgressProbe,
    state: str,
) -> None:  # fmt: skip
    """The prompt reaches the model, and Codex waited less than a second for the prompt hook:
    from the turn's start (``turn_context`` in its rollout) to the prompt's message, which
    Codex records once its UserPromptSubmit hooks are done. The other hooks are taken out of
    .codex/hooks.json here, so that the time between the two is the prompt hook's alone."""
    repo = tmp_path / "repo"
    git_repo(repo, f"codex-{state}")
    assert cli(agent_env, "agent", "install", "codex", cwd=repo).returncode == 0
    hooks_file = repo / ".codex" / "hooks.json"
    hooks = json.loads(hooks_file.read_text())
    hooks["hooks"] = {"UserPromptSubmit": hooks["hooks"]["UserPromptSubmit"]}
    hooks_file.write_text(json.dumps(hooks))
    stub = ResponsesStub({"steps": [], "final": "ok"})
    codex_home = _codex_home(agent_env, stub)
    env = {**agent_env, "CODEX_HOME": str(codex_home), "STUB_API_KEY": "stub", **egress.env()}
    prompt = f"When does the quokka key rotate ({state})?"
    memory_up.switch.set(state)
    try:
        _exec(codex, repo, env, prompt)
    finally:
        memory_up.switch.set("up")
        stub.close()
    [request] = [r["body"] for r in stub.requests if r["method"] == "POST"]
    assert _texts(request)[-1] == prompt
    [rollout] = (codex_home / "sessions").rglob("rollout-*.jsonl")
    lines = [json.loads(line) for line in rollout.read_text().splitlines()]
    [turn] = [line for line in lines if line.get("type") == "turn_context"]
    [asked] = [
        line for line in lines
        if line.get("type") == "response_item" and line["payload"].get("role") == "user"
        and prompt in json.dumps(line["payload"].get("content"))
    ]  # fmt: skip

    def at(line: dict[str, Any]) -> float:
        stamp = datetime.fromisoformat(line["timestamp"].replace("Z", "+00:00"))
        return stamp.timestamp()

    waited = at(asked) - at(turn)
    assert waited < 1.0, f"Codex waited {waited:.2f}s for the prompt hook"
    assert egress.attempts == []
