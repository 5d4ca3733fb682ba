"""Hooks never drop nor merge a turn, whatever the server and the machine do (docs/agents.md).

- 60 Stop hooks of 4 Claude Code sessions (one task), each a process of its own with the
  hooks' own time limit and with a short one, on a machine kept busy by two CPU hogs, while
  the server (a real gunicorn) is up, stopped cleanly, frozen with SIGSTOP (it takes
  connections and never answers) or SIGKILLed in the middle of the hooks' requests. Once it is back and the spool
  is flushed, every turn is on the server once, as a turn of its own.
- A Stop hook whose state directory is on a full disk (a loop-mounted ext4) sends its turn
  directly; one that can neither spool nor send leaves its turn to the next hook, which
  sends it apart from its own.
"""

from __future__ import annotations

import json
import os
import random
import signal
import statistics
import subprocess
import threading
from collections import Counter
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
import requests

from tests.agents.conftest import (
    VENV_BIN,
    Memory,
    Transcript,
    Work,
    cli,
    git_repo,
    run_hook,
)
from tests.e2e.conftest import free_port
from tests.robust.faultkit import fill_bytes, fill_inodes, small_ext4, unfill
from tests.robust.helpers import Live

pytestmark = [pytest.mark.e2e, pytest.mark.faults]
SESSIONS = 4
ROUNDS = 15  # turns per session: 60 Stop hooks
# What the server does while each round's hooks run.
SCHEDULE = (
    "up",
    "down",
    "down",
    "up",
    "frozen",
    "frozen",
    "up",
    "killed",
    "up",
    "down",
    "frozen",
    "up",
    "killed",
    "down",
    "killed",
)
TASK = "spool-acceptance"


def _prompts(turn: dict[str, Any]) -> list[str]:
    parts = turn["summary_md"].split("## Prompt\n\n")[1:]
    return [p.split("\n\n", 1)[0].strip() for p in parts]


class Server:
    """The gunicorn the hooks talk to, on one port through stops, freezes and kills."""

    def __init__(self, tmp_path: Path) -> None:
        self.live = Live(tmp_path=tmp_path, root=tmp_path / "storage", port=free_port())
        self.frozen = False

    @property
    def running(self) -> bool:
        return self.live.proc is not None and self.live.proc.poll() is None

    def set(self, state: str) -> None:
        if self.frozen:
            os.killpg(self.live.proc.pid, signal.SIGCONT)  # type: ignore[union-attr]
            self.frozen = False
        if state == "down":
            self.live.stop()
            return
        if not self.running:
            self.live.start()
        if state == "frozen":
            os.killpg(self.live.proc.pid, signal.SIGSTOP)  # type: ignore[union-attr]
            self.frozen = True

    def kill_soon(self, after: float) -> threading.Timer:
        """SIGKILL the whole server ``after`` seconds from now (the hooks' requests in flight)."""
        timer = threading.Timer(after, self.live.kill_all)
        timer.start()
        return timer


def _hogs(n: int) -> list[subprocess.Popen[bytes]]:
    return [subprocess.Popen(["yes"], stdout=subprocess.DEVNULL) for _ in range(n)]


def _env(tmp_path: Path, url: str, token: str) -> dict[str, str]:
    home = tmp_path / "home"
    home.mkdir(exist_ok=True)
    keep = {k: v for k, v in os.environ.items() if not k.startswith("PROJECT_MEMORY_")}
    return {
        **keep,
        "HOME": str(home),
        "XDG_CONFIG_HOME": str(home / ".config"),
        "PATH": f"{VENV_BIN}{os.pathsep}{os.environ.get('PATH', '')}",
        "PROJECT_MEMORY_URL": url,
        "PROJECT_MEMORY_TOKEN": token,
        "PROJECT_MEMORY_STATE_DIR": str(tmp_path / "state"),
        "PROJECT_MEMORY_TASK": TASK,
    }


@pytest.mark.parametrize("limit", ["0.3", ""], ids=["0.3 s limit", "own limit"])
def test_sixty_stop_hooks_through_stops_freezes_and_kills_under_load(
    tmp_path: Path, limit: str
) -> None:
    """With 0.3 s to send, the hooks have little time for the network: every turn must be
    spooled, and arrive with the flush. With their own limit (8 s from their first request)
    they send through the stops, freezes and kills themselves."""
    server = Server(tmp_path)
    server.set("up")
    token = server.live.token("writer")
    env = _env(tmp_path, server.live.url, token)
    if limit:
        env["PROJECT_MEMORY_HOOK_TIMEOUT"] = limit
    repo = tmp_path / "repo"
    git_repo(repo)
    sessions = [
        Transcript(tmp_path / f"session-{s}.jsonl", f"session-{s}", repo) for s in range(SESSIONS)
    ]
    for t in sessions:
        start = {"session_id": t.session_id, "cwd": str(repo), "source": "startup"}
        assert (
            run_hook(env, "session-start", {**start, "transcript_path": str(t.path)})[0].returncode
            == 0
        )
    took: list[float] = []
    rng = random.Random(39)
    hogs = _hogs(2)
    load: list[float] = []
    try:
        with ThreadPoolExecutor(SESSIONS) as pool:
            for rnd, state in enumerate(SCHEDULE):
                server.set("up" if state == "killed" else state)
                # Killed at a moment of the round: before, while or after the hooks send.
                timer = server.kill_soon(rng.uniform(0.5, 3.0)) if state == "killed" else None

                def stop(s: int, rnd: int = rnd) -> tuple[int, float]:
                    t = sessions[s]
                    t.turn(f"s{s} r{rnd} prompt", f"s{s} r{rnd} answer")
                    done, seconds = run_hook(env, "stop", t.stop(f"s{s} r{rnd} answer"))
                    assert done.stdout == "", done.stdout
                    return done.returncode, seconds

                results = list(pool.map(stop, range(SESSIONS)))
                if timer is not None:
                    timer.join()
                assert [code for code, _ in results] == [0] * SESSIONS
                took += [seconds for _, seconds in results]
                load.append(os.getloadavg()[0])
    finally:
        for hog in hogs:
            hog.kill()
            hog.wait()
        server.set("up")
    try:
        spooled = len(list((tmp_path / "state" / "spool").glob("*.json")))
        flushed = cli(env, "agent", "flush", "--json")
        assert flushed.returncode == 0, flushed.stdout + flushed.stderr
        index = server.live.url + f"/sandbox/memory/v1/tasks/{TASK}"
        headers = {"Authorization": f"Bearer {token}"}
        listed = requests.get(index, headers=headers, timeout=30).json()["turns"]
        turns = [
            requests.get(f"{index}/turns/{e['turn']}", headers=headers, timeout=30).json()
            for e in listed
        ]
    finally:
        server.live.stop()
    wanted = [f"s{s} r{r} prompt" for s in range(SESSIONS) for r in range(ROUNDS)]
    seen = Counter(p for turn in turns for p in _prompts(turn))
    merged = [turn["turn"] for turn in turns if len(_prompts(turn)) != 1]
    lost = [p for p in wanted if seen[p] == 0]
    doubled = [p for p in wanted if seen[p] > 1]
    figures = {
        "hooks": len(took),
        "arrived": len(wanted) - len(lost),
        "lost": len(lost),
        "duplicated": len(doubled),
        "merged": len(merged),
        "turns on the server": len(turns),
        "hook limit": limit or "own (8 s from the first request)",
        "spooled after the last hook": spooled,
        "hook seconds median / max": (round(statistics.median(took), 2), round(max(took), 2)),
        "load average 1 min, max": round(max(load), 1),
    }
    print("hook spool figures:", json.dumps(figures))
    assert (lost, doubled, merged) == ([], [], []), figures
    assert len(turns) == len(wanted), figures
    for turn in turns:
        [prompt] = _prompts(turn)
        answer = prompt.replace("prompt", "answer")
        assert turn["summary_md"].endswith(f"## Answer\n\n{answer}\n"), turn["summary_md"]
    # Each session's turns in its own order.
    for s in range(SESSIONS):
        mine = [_prompts(t)[0] for t in turns if _prompts(t)[0].startswith(f"s{s} ")]
        assert mine == [f"s{s} r{r} prompt" for r in range(ROUNDS)], mine


@pytest.fixture
def full_state_dir(tmp_path: Path, agent_env: dict[str, str]) -> Iterator[Path]:
    with small_ext4(tmp_path / "state-disk", size=8 << 20) as disk:
        agent_env["PROJECT_MEMORY_STATE_DIR"] = str(disk / "state")
        yield disk


@pytest.mark.parametrize("fill", [fill_bytes, fill_inodes], ids=["0 bytes", "0 inodes"])
def test_a_full_disk_sends_turns_directly_each_as_its_own(
    memory_up: Memory, work: Work, full_state_dir: Path, fill: Callable[[Path], Path]
) -> None:
    env = work.task(f"full-{fill.__name__}")
    task = env["PROJECT_MEMORY_TASK"]
    t = work.session(f"fd-{fill.__name__}")
    start = {**work.start(t.session_id), "transcript_path": str(t.path)}
    assert run_hook(env, "session-start", start)[0].returncode == 0  # while there is room
    filler = fill(full_state_dir)
    try:
        memory_up.switch.set("down")
        t.turn("prompt 1: no spool, no server", "answer 1")
        assert run_hook(env, "stop", t.stop("answer 1"))[0].returncode == 0
        assert memory_up.task(task) is None
        memory_up.switch.set("up")
        t.turn("prompt 2", "answer 2")
        assert run_hook(env, "stop", t.stop("answer 2"))[0].returncode == 0
        assert [_prompts(x) for x in memory_up.turns(task)] == [
            ["prompt 1: no spool, no server"],
            ["prompt 2"],
        ]
        t.turn("prompt 3", "answer 3")  # its state still where the session began
        assert run_hook(env, "stop", t.stop("answer 3"))[0].returncode == 0
        assert len(memory_up.turns(task)) == 3
    finally:
        unfill(filler)
    t.turn("prompt 4", "answer 4")
    assert run_hook(env, "stop", t.stop("answer 4"))[0].returncode == 0
    turns = memory_up.turns(task)
    assert [_prompts(x) for x in turns] == [
        ["prompt 1: no spool, no server"],
        ["prompt 2"],
        ["prompt 3"],
        ["prompt 4"],
    ]
    for n, turn in enumerate(turns, 1):
        assert turn["summary_md"].endswith(f"## Answer\n\nanswer {n}\n"), turn["summary_md"]
    assert work.spooled() == []
