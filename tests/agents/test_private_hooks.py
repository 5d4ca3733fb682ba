"""The hooks writing a user's turns to their private space, and Claude Code's auto-memory
bound to a store of that space: ``agent install ... --private``, ``agent hook ... --private``,
against a real server (gunicorn), the hooks as processes as the agents run them."""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import Any

import pytest
import requests

from tests.agents.conftest import Memory, Work, cli, git_repo, run_hook

pytestmark = pytest.mark.e2e
PRIVATE = {"X-Sandbox-Visibility": "private"}


def as_ana(env: dict[str, str], memory: Memory) -> dict[str, str]:
    return {**env, "PROJECT_MEMORY_TOKEN": memory.ana}


def private_turns(memory: Memory, task_id: str) -> list[dict[str, Any]]:
    r = memory.api("GET", f"/tasks/{task_id}", memory.ana, headers=PRIVATE)
    if r.status_code == 404:
        return []
    r.raise_for_status()
    out = []
    for entry in r.json()["turns"]:
        turn = memory.api(
            "GET", f"/tasks/{task_id}/turns/{entry['turn']}", memory.ana, headers=PRIVATE
        )
        out.append(turn.json())
    return out


def test_install_private_sends_her_turns_to_her_space_and_the_team_sees_none(
    memory_up: Memory, work: Work
) -> None:
    env = as_ana(work.task("ana-private-task"), memory_up)
    done = cli(env, "agent", "install", "claude-code", "--private", "--json", cwd=work.repo)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "private space" in done.stdout
    # Nothing of it is in the repository, which teammates share: their hooks are unchanged.
    assert "--private" not in (work.repo / ".claude/settings.json").read_text()
    t = work.session("sess-private", ("a private prompt PRIV_MARK", "a private answer"))
    hooked, _ = run_hook(env, "stop", t.stop())
    assert hooked.returncode == 0 and hooked.stderr == "", hooked.stderr
    [turn] = private_turns(memory_up, "ana-private-task")
    assert "PRIV_MARK" in turn["summary_md"]
    # The team (a writer's token, and her own without asking for her space) sees nothing.
    assert memory_up.task("ana-private-task") is None
    assert memory_up.api("GET", "/tasks/ana-private-task", memory_up.ana).status_code == 404
    assert "PRIV_MARK" not in memory_up.api("GET", "/project.md").text
    # The session's context comes from her space.
    start, _ = run_hook(env, "session-start", work.start("sess-private-2"))
    assert start.returncode == 0 and "PRIV_MARK" in start.stdout, start.stdout
    # Installed again without --private: the turns are the team's again.
    done = cli(env, "agent", "install", "claude-code", "--json", cwd=work.repo)
    assert done.returncode == 0, done.stdout + done.stderr
    t.turn("a team prompt TEAM_MARK", "a team answer")
    assert run_hook(env, "stop", t.stop())[0].returncode == 0
    assert ["TEAM_MARK" in t_["summary_md"] for t_ in memory_up.turns("ana-private-task")] == [True]


def test_the_hook_flag_and_a_spooled_private_turn_go_only_to_her_space(
    memory_up: Memory, work: Work
) -> None:
    env = as_ana(work.task("ana-flag-task"), memory_up)
    t = work.session("sess-flag", ("flagged prompt FLAG_MARK", "answer"))
    memory_up.switch.set("down")
    done = _hook_private(env, t.stop())
    assert done.returncode == 0, done.stderr
    [entry] = work.spooled()
    assert json.loads(entry.read_text())["visibility"] == "private"
    memory_up.switch.set("up")
    flushed = json.loads(cli(env, "agent", "flush", "--json").stdout)["data"]
    assert flushed["sent"] == 0 and flushed["kept"] == 1
    assert memory_up.task("ana-flag-task") is None
    private_env = {**env, "PROJECT_MEMORY_VISIBILITY": "private"}
    flushed = json.loads(cli(private_env, "agent", "flush", "--json").stdout)["data"]
    assert flushed["sent"] == 1, flushed
    [turn] = private_turns(memory_up, "ana-flag-task")
    assert "FLAG_MARK" in turn["summary_md"]
    assert memory_up.task("ana-flag-task") is None


def _hook_private(env: dict[str, str], payload: dict[str, Any]) -> Any:
    return run_hook(env, "stop", payload, flags=("--private",))[0]


def test_install_private_needs_a_token_of_a_user(memory_up: Memory, work: Work) -> None:
    done = cli(work.env, "agent", "install", "claude-code", "--private", cwd=work.repo)
    assert done.returncode == 2, done.stdout + done.stderr
    assert "belongs to no user" in done.stderr + done.stdout
    assert not (work.repo / ".claude").exists()


def test_share_memory_private_binds_the_auto_memory_to_a_store_of_her_space(
    memory_up: Memory, agent_env: dict[str, str], tmp_path: Path
) -> None:
    repo = tmp_path / "repo"
    git_repo(repo)
    env = as_ana(agent_env, memory_up)
    name = f"ana's memory {uuid.uuid4().hex[:8]}"
    done = cli(
        env, "agent", "install", "claude-code", "--share-memory", name, "--private", "--json",
        cwd=repo,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    folder = Path(
        json.loads((repo / ".claude/settings.local.json").read_text())["autoMemoryDirectory"]
    )
    stores = memory_up.server.url + "/v1/memory_stores"
    mine = requests.get(
        stores, headers={"Authorization": f"Bearer {memory_up.ana}", **PRIVATE}, timeout=10
    ).json()["data"]
    [store] = [s for s in mine if s["name"] == name]
    team = requests.get(
        stores, headers={"Authorization": f"Bearer {memory_up.writer}"}, timeout=10
    ).json()["data"]
    assert name not in [s["name"] for s in team]
    (folder / "MEMORY.md").write_text("- private index PRIVATE_MEMORY_MARK\n")
    payload = {"session_id": "s-private-mem", "cwd": str(repo)}
    hooked, _ = run_hook(env, "stop", payload)
    assert hooked.returncode == 0 and hooked.stderr == "", hooked.stderr
    listed = requests.get(
        f"{stores}/{store['id']}/memories",
        headers={"Authorization": f"Bearer {memory_up.ana}", **PRIVATE},
        timeout=10,
    ).json()["data"]
    assert [m["path"] for m in listed if m["type"] == "memory"] == ["/MEMORY.md"]
    r = requests.get(
        f"{stores}/{store['id']}/memories",
        headers={"Authorization": f"Bearer {memory_up.writer}"},
        timeout=10,
    )
    assert r.status_code == 404
    log = Path(env["PROJECT_MEMORY_STATE_DIR"]) / "hook.log"
    assert not log.exists() or log.read_text() == ""


def test_status_says_the_turns_are_private(memory_up: Memory, work: Work) -> None:
    env = as_ana(work.env, memory_up)
    assert cli(env, "agent", "install", "codex", "--private", cwd=work.repo).returncode == 0
    status = cli(env, "agent", "status", "--json", cwd=work.repo)
    data = json.loads(status.stdout)["data"]
    assert data["private"] is True and data["shared_memory"] is None
    assert "private space" in cli(env, "agent", "status", cwd=work.repo).stdout
    assert cli(env, "agent", "uninstall", "codex", cwd=work.repo).returncode == 0
    data = json.loads(cli(env, "agent", "status", "--json", cwd=work.repo).stdout)["data"]
    assert data["private"] is False
