"""``agent hook user-prompt-submit`` as the agents run it (a process, JSON on stdin) against
a real server behind a switch: what the project's memory holds about the prompt, the task's
own turns first, within its budget; nothing when nothing matches; within a second whatever
the server does; nothing recorded, the spool untouched, the prompt written nowhere."""

from __future__ import annotations

import json
import subprocess
import uuid
from pathlib import Path
from typing import Any

import pytest
from project_memory_client.agents.prompt import LIMIT

from tests.agents.conftest import CLI, Memory, Work, run_hook

pytestmark = pytest.mark.e2e
EVENT = "user-prompt-submit"


def fact(mark: str) -> str:
    return f"The {mark} vault rotates its quokka key every Tuesday at 04:00 UTC."


def prompt_event(work: Work, prompt: str, session: str = "ps") -> dict[str, Any]:
    """A UserPromptSubmit event, as Claude Code and Codex send it."""
    return {
        "session_id": session,
        "transcript_path": None,
        "cwd": str(work.repo),
        "hook_event_name": "UserPromptSubmit",
        "prompt": prompt,
        "model": "m",
        "permission_mode": "default",
        "turn_id": "t1",
    }


def context_of(done: subprocess.CompletedProcess[str]) -> str:
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout)["hookSpecificOutput"]
    assert out["hookEventName"] == "UserPromptSubmit"
    return str(out["additionalContext"])


def put(memory: Memory, task: str, turn: int, summary: str) -> None:
    r = memory.api("PUT", f"/tasks/{task}/turns/{turn}", json={"summary_md": summary})
    assert r.status_code == 200, r.text


def log_of(env: dict[str, str]) -> str:
    path = Path(env["PROJECT_MEMORY_STATE_DIR"]) / "hook.log"
    return path.read_text() if path.exists() else ""


@pytest.mark.parametrize("agent", ["claude-code", "codex"])
def test_a_prompt_gets_what_another_task_recorded_its_own_task_first(
    memory_up: Memory, work: Work, agent: str
) -> None:
    mark = f"zephyr{uuid.uuid4().hex[:8]}"  # a word of this test's own
    put(
        memory_up,
        f"vault-{mark}",
        0,
        f"## Prompt\n\nSet up the vault.\n\n## Answer\n\n{fact(mark)}",
    )
    own = f"own-{uuid.uuid4().hex[:8]}"  # not the word: a task id is searched too
    put(memory_up, own, 0, "Looked at the quokka key loader first.")
    put(memory_up, own, 1, "Unrelated step.")
    put(memory_up, own, 2, f"The quokka key loader reads the {mark} vault now.")
    env = work.task(own)
    done, _ = run_hook(env, EVENT, prompt_event(work, f"When does the {mark} quokka key rotate?"), agent)  # fmt: skip
    context = context_of(done)
    assert context.startswith("# Project memory on this prompt\n") and fact(mark) in context
    lines = [line for line in context.splitlines() if line.startswith("- <stored-text")]
    assert f"turn 2 of task {own}, this task" in lines[0]
    assert f"turn 0 of task {own}, this task" in lines[1]
    assert f"of task vault-{mark}" in lines[2]
    assert "Unrelated step" not in context and len(context) <= 1_500
    assert memory_up.turns(own)[-1]["turn"] == 2  # nothing recorded
    # Without PROJECT_MEMORY_TASK, the branch is the task, as for the other hooks.
    done, _ = run_hook(work.env, EVENT, prompt_event(work, f"{mark} quokka rotation?"), agent)
    assert "this task" not in context_of(done) and fact(mark) in context_of(done)


def test_nothing_matching_adds_nothing(memory_up: Memory, work: Work) -> None:
    # Words of this test's own: the server is every test's, and the agents' tests record
    # their prompts.
    word = uuid.uuid4().hex[:8]
    for prompt in (f"Frob{word} the xylo{word} fimble{word}.", "Please do it now, thanks!", ""):
        done, _ = run_hook(work.env, EVENT, prompt_event(work, prompt))
        assert (done.returncode, done.stdout, done.stderr) == (0, "", ""), prompt
    assert log_of(work.env) == ""


def test_the_budget_is_the_environments(memory_up: Memory, work: Work) -> None:
    mark = f"BUDGET_{uuid.uuid4().hex[:8]}"
    for n in range(8):
        put(memory_up, f"budget-{mark}-{n}", 0, f"{mark} gazebo lanterns. " + "Filler text. " * 200)
    default = context_of(run_hook(work.env, EVENT, prompt_event(work, f"{mark} gazebo"))[0])
    assert 1_200 < len(default) <= 1_500
    env = {**work.env, "PROJECT_MEMORY_PROMPT_CONTEXT_CHARS": "600"}
    small = context_of(run_hook(env, EVENT, prompt_event(work, f"{mark} gazebo"))[0])
    assert 300 < len(small) <= 600 and small.count("<stored-text from=") == 1
    for wrong, bound in (("12", 500), ("999999", 10_000), ("x", 1_500)):
        env = {**work.env, "PROJECT_MEMORY_PROMPT_CONTEXT_CHARS": wrong}
        assert (
            len(context_of(run_hook(env, EVENT, prompt_event(work, f"{mark} gazebo"))[0])) <= bound
        )


def test_it_can_be_turned_off(memory_up: Memory, work: Work) -> None:
    mark = f"OFF_{uuid.uuid4().hex[:8]}"
    put(memory_up, f"off-{mark}", 0, f"{mark} is here.")
    assert mark in context_of(run_hook(work.env, EVENT, prompt_event(work, mark))[0])
    for extra in ({"PROJECT_MEMORY_PROMPT_CONTEXT": "off"}, {"PROJECT_MEMORY_HOOKS": "off"}):
        done, _ = run_hook({**work.env, **extra}, EVENT, prompt_event(work, mark))
        assert (done.returncode, done.stdout) == (0, ""), extra


@pytest.mark.parametrize("state", ["down", "slow"])
def test_a_server_down_or_hung_never_holds_the_prompt(
    memory_up: Memory, work: Work, state: str, load: str
) -> None:
    """The hook is gone within a second of its start, whatever the server does, and says
    why in its log (never with the prompt)."""
    secret_word = f"wombatphrase{uuid.uuid4().hex[:6]}"
    memory_up.switch.set(state)
    took = []
    for _ in range(3):
        done, wall = run_hook(work.env, EVENT, prompt_event(work, f"Where is the {secret_word}?"))
        assert (done.returncode, done.stdout) == (0, ""), done.stderr
        took.append(wall)
    # The wall time also holds the process's spawn and exit, which a machine busy with the
    # rest of the suite can stretch past the second on one run: the hook's own limit shows
    # in the fastest run, and a hook that waited on the server in every run.
    assert min(took) < 1.0 and max(took) < 2.0, took
    log = log_of(work.env)
    assert log.count(EVENT) == 3 and secret_word not in log
    if state == "slow":
        assert f"gave up {LIMIT:g}s after the hook started" in log
    else:
        assert "Connection refused" in log


def test_it_records_nothing_and_sends_nothing_of_the_spool(memory_up: Memory, work: Work) -> None:
    env = work.task(f"spool-{uuid.uuid4().hex[:8]}")
    t = work.session("sp", ("a prompt kept in the spool", "its answer"))
    memory_up.switch.set("down")
    assert run_hook(env, "stop", t.stop())[0].returncode == 0
    memory_up.switch.set("up")
    state = Path(env["PROJECT_MEMORY_STATE_DIR"])

    def files() -> dict[str, bytes]:
        return {str(p.relative_to(state)): p.read_bytes() for p in state.rglob("*") if p.is_file()}

    before = files()
    assert len(work.spooled()) == 1 and any(name.startswith("sessions/") for name in before)
    done, _ = run_hook(env, EVENT, prompt_event(work, "a prompt kept in the spool", "sp"))
    assert done.returncode == 0
    assert files() == before  # the spool, the session's state, the log: as they were
    assert memory_up.task(env["PROJECT_MEMORY_TASK"]) is None


def test_a_refusal_is_one_line_without_the_prompt(memory_up: Memory, work: Work) -> None:
    env = {**work.env, "PROJECT_MEMORY_TOKEN": "pm_" + "r" * 40}
    done, _ = run_hook(env, EVENT, prompt_event(work, "the capybara passphrase"))
    assert (done.returncode, done.stdout) == (0, "")
    [line] = log_of(env).splitlines()
    assert "refused POST /recall: 401" in line and "capybara" not in line


def test_bad_input_never_fails_the_prompt(work: Work) -> None:
    for stdin in ("not json", "[1, 2]", '{"prompt": 5}', '{"prompt": null}', "[" * 100_000):
        done = subprocess.run(
            [CLI, "agent", "hook", EVENT, "--agent", "codex"],
            input=stdin,
            capture_output=True,
            text=True,
            env=work.env,
            timeout=30,
            check=False,
        )
        assert (done.returncode, done.stdout, done.stderr) == (0, "", ""), stdin[:20]
