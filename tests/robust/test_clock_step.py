"""A clock that steps never deletes what retention keeps (docs/guarantees.md, "Faults").

The process's wall clock is stepped with libfaketime (its offset in a file the test rewrites;
the monotonic clock stays real, as in a real step). What must hold:

- stepped forward past the retention, the sweeper removes nothing: what it would expire is
  most of what is stored, and the clock is far ahead of the newest record. It says why, in
  the CLI's output and in the housekeeper's log; ``sweep --force`` sweeps anyway;
- stepped back, the housekeeper keeps sweeping every interval (its rhythm is monotonic).
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
import requests

from tests.robust.faultkit import PM, Seeded, SteppedClock, flask, seed
from tests.robust.helpers import Live

pytestmark = pytest.mark.e2e


@pytest.fixture
def seeded(tmp_path: Path) -> Seeded:
    return seed(tmp_path / "root", tmp_path / "tokens.json")


def _tasks(seeded: Seeded) -> list[str]:
    with seeded.client() as c:
        got = c.get(f"{PM}/tasks", headers=seeded.headers)
        return sorted(t["task_id"] for t in got.json["tasks"])


def test_a_sweep_with_the_clock_past_the_retention_removes_nothing(
    seeded: Seeded, tmp_path: Path
) -> None:
    clock = SteppedClock(tmp_path)
    clock.step(31)
    env = seeded.env(**clock.env())
    for args in (("sweep", "--dry-run"), ("sweep",)):
        done = flask(env, *args)
        out = done.stdout + done.stderr
        assert done.returncode == 1, out
        assert "Traceback" not in out, out
        assert "clock" in out and "--force" in out, out
    assert _tasks(seeded) == ["t", "u"]
    assert (seeded.turn("t", 0) / "meta.json").exists()
    done = flask(env, "sweep", "--force")
    assert done.returncode == 0, done.stdout + done.stderr
    assert not seeded.task("t").exists() and not seeded.task("u").exists()


def _server(seeded: Seeded, tmp_path: Path, clock: SteppedClock) -> Live:
    return Live(
        tmp_path=tmp_path,
        root=seeded.root,
        workers=2,
        env_extra={
            "MEMORY_TOKENS_FILE": str(seeded.tokens_file),
            "MEMORY_SWEEP_INTERVAL": "1",
            "MEMORY_LOG_LEVEL": "INFO",
            **clock.env(),
        },
    ).start()


def _runs(root: Path) -> int:
    try:
        return int(json.loads((root / ".sweeper.json").read_text())["runs"])
    except (FileNotFoundError, ValueError, KeyError):
        return 0


def _wait_runs(root: Path, count: int, timeout: float) -> int:
    deadline = time.monotonic() + timeout
    while _runs(root) < count and time.monotonic() < deadline:
        time.sleep(0.2)
    return _runs(root)


@pytest.mark.faults
def test_the_housekeeper_keeps_what_a_clock_step_forward_would_expire(
    seeded: Seeded, tmp_path: Path
) -> None:
    clock = SteppedClock(tmp_path)
    server = _server(seeded, tmp_path, clock)
    try:
        first = _wait_runs(seeded.root, 1, 30)
        assert first >= 1, server.log()[-3000:]
        clock.step(31)
        _wait_runs(seeded.root, first + 3, 30)  # three sweeps with the clock ahead
        clock.step(0)
        time.sleep(1.5)  # the clock is right again: everything is still there
        got = requests.get(f"{server.url}{PM}/tasks", headers=seeded.headers, timeout=30)
        assert got.status_code == 200
        assert sorted(t["task_id"] for t in got.json()["tasks"]) == ["t", "u"], server.log()[-3000:]
        assert "clock" in server.log() and "--force" in server.log(), server.log()[-3000:]
    finally:
        server.stop()


@pytest.mark.faults
def test_the_housekeeper_keeps_its_rhythm_after_a_step_back(seeded: Seeded, tmp_path: Path) -> None:
    clock = SteppedClock(tmp_path)
    server = _server(seeded, tmp_path, clock)
    try:
        first = _wait_runs(seeded.root, 1, 30)
        assert first >= 1, server.log()[-3000:]
        clock.step(-2)
        time.sleep(1.5)  # every process sees the step
        stepped = _runs(seeded.root)
        assert _wait_runs(seeded.root, stepped + 3, 30) >= stepped + 3, server.log()[-3000:]
    finally:
        server.stop()
