"""A clock that steps never deletes what retention keeps (docs/guarantees.md, "Faults").

The process's wall clock is stepped with libfaketime (its offset in a file the test rewrites;
the monotonic clock stays real, as in a real step). What must hold:

- stepped forward past the retention, the sweeper removes nothing: what it would expire is
  most of what is stored, and the clock is far ahead of the last sweep. It says why, in
  the CLI's output and in the housekeeper's log; ``sweep --force`` sweeps anyway;
- writes made after the step (an agent's next Stop hook) change nothing of that, whether
  the step came while the server ran or with a restart before its first sweep, on every
  backend the step lets run (an object store refuses a client 31 days ahead);
- days that pass honestly, in steps inside the margin with the housekeeper sweeping, see
  what comes due swept without ``--force``, a whole session at once included;
- stepped back, the housekeeper keeps sweeping every interval (its rhythm is monotonic).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import requests

from app.storage.backends import open_backend
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
        clock.served(f"{server.url}/healthz", 0)  # the clock is right again: all still there
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


# -- writes after the step, and days that pass honestly, on every backend ---------------------
DAY = 86_400.0


class Deployment:
    """A real gunicorn on the selected backend under a :class:`SteppedClock`, and the same
    backend opened in this process (on the real clock) to look at what is stored."""

    def __init__(
        self, tmp_path: Path, backend_config: dict[str, Any], clock: SteppedClock, **env: str
    ) -> None:
        self.clock = clock
        self.offset_days = 0.0
        self.seen: dict[float, dict[str, Any]] = {}
        self.root = tmp_path / "root"
        self.live = Live(
            tmp_path=tmp_path,
            root=self.root,
            workers=2,
            env_extra={
                **{f"MEMORY_{k}": str(v) for k, v in backend_config.items()},
                "MEMORY_LOG_LEVEL": "INFO",
                **env,
                **clock.env(),
            },
        )
        self.storage = open_backend(
            {
                "STORAGE_ROOT": str(self.root),
                "TOKENS_FILE": str(self.live.tokens_file),
                "RETENTION_DAYS": 30.0,
                "LOCK_TIMEOUT": 10.0,
                "MAX_ARTIFACT_BYTES": 1 << 20,
                **backend_config,
            }
        )
        _, secret = self.storage.token_registry(self.live.tokens_file).create(
            role="project_admin", tenant="acme", project="web"
        )
        self.headers = {"Authorization": f"Bearer {secret}"}

    def put(self, task: str, turn: int) -> None:
        r = requests.put(
            f"{self.live.url}{PM}/tasks/{task}/turns/{turn}",
            json={"summary_md": f"{task} {turn}"},
            headers=self.headers,
            timeout=60,
        )
        assert r.status_code == 200, r.text

    def tasks(self) -> list[str]:
        r = requests.get(f"{self.live.url}{PM}/tasks?limit=100", headers=self.headers, timeout=60)
        assert r.status_code == 200, r.text
        return sorted(t["task_id"] for t in r.json()["tasks"])

    def step(self, days: float) -> None:
        """Step the server's clock to ``days`` from the real one, and wait for a sweep that
        started after it saw the step (the housekeeper runs every second) and for the
        workers to show it: the housekeeper seeing it says nothing of a worker."""
        self.clock.step(days)
        self.offset_days = days
        self.sweeps_after(time.time() + days * DAY)
        self.clock.served(f"{self.live.url}/healthz", days)

    def runs(self) -> list[dict[str, Any]]:
        """The housekeeper's runs so far (turns, tasks and bytes each removed): its state
        keeps the last 50, gathered here as they come."""
        state = self.storage.load_state("sweeper") or {}
        for run in state.get("recent", []):
            self.seen[run["started_epoch"]] = run
        return [self.seen[k] for k in sorted(self.seen)]

    def sweeps_after(self, epoch: float, count: int = 1) -> None:
        """Wait for ``count`` sweeps run by the server that started within an hour after
        ``epoch`` on its own clock (the steps here are hours apart or more, so a run on the
        clock before a step back does not count)."""
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if sum(epoch <= r["started_epoch"] < epoch + 3600 for r in self.runs()) >= count:
                return
            time.sleep(0.2)
        pytest.fail(f"no sweep after {epoch}:\n{self.live.log()[-3000:]}")

    def server_now(self) -> datetime:
        return datetime.now(UTC) + timedelta(days=self.offset_days)

    def expired_still_stored(self) -> int:
        """Turns past their retain_until on the server's clock that are still stored (a forced
        dry run counts them and changes nothing)."""
        return self.storage.sweep(now=self.server_now(), dry_run=True, force=True).tasks.turns

    def close(self) -> None:
        self.live.stop()
        self.storage.close()


@pytest.fixture
def deployment(
    backend_config: dict[str, Any], tmp_path: Path
) -> Iterator[Callable[..., Deployment]]:
    made: list[Deployment] = []

    def make(**env: str) -> Deployment:
        made.append(Deployment(tmp_path, backend_config, SteppedClock(tmp_path), **env))
        return made[-1]

    yield make
    for found in made:
        found.close()


@pytest.mark.faults
@pytest.mark.all_backends
def test_writes_after_a_step_forward_do_not_open_the_housekeepers_sweep(
    deployment: Callable[..., Deployment],
) -> None:
    """12 tasks; the clock steps 31 days forward while the server runs; agents go on writing
    (turns only: an object store refuses a client 31 days ahead). The housekeeper sweeps
    every second and removes nothing, whatever is written after the step."""
    d = deployment(MEMORY_SWEEP_INTERVAL="1")
    d.live.start()
    for n in range(12):
        d.put(f"task-{n}", 0)
        d.put(f"task-{n}", 1)
    d.sweeps_after(time.time())  # a sweep after the writes keeps the clock
    d.step(31)
    written = time.time() + 31 * DAY
    for n in range(5):  # the agents' next Stop hooks
        d.put(f"after-{n}", 0)
    d.sweeps_after(written, count=3)
    assert d.expired_still_stored() == 24, d.live.log()[-3000:]
    assert "sweep refused" in d.live.log() and "--force" in d.live.log()
    d.step(0)  # the clock is put right: everything is there
    assert d.tasks() == sorted([f"task-{n}" for n in range(12)] + [f"after-{n}" for n in range(5)])


@pytest.mark.faults
@pytest.mark.all_backends
def test_turns_coming_due_as_days_pass_are_swept_without_force(
    deployment: Callable[..., Deployment],
) -> None:
    """Days pass in steps of 0.4 day (inside the 1-day margin), the housekeeper sweeping
    every second meanwhile, with a 2-day retention: the turns of a session written at the
    start all come due at once, 14 of the 16 stored, then the last 2. Both sweeps remove
    them without --force, though nothing was written for 1.6 days before. (On PostgreSQL
    the object store refuses a client hours ahead: the orphan part of each sweep reports
    an error, and the turns go all the same.)"""
    d = deployment(MEMORY_SWEEP_INTERVAL="1", MEMORY_RETENTION_DAYS="2")
    d.live.start()
    for n in range(6):  # one session
        d.put(f"burst-{n}", 0)
        d.put(f"burst-{n}", 1)
    d.put("day-0", 0)
    d.put("day-0", 1)
    d.step(0.4)
    d.put("day-1", 0)
    d.put("day-1", 1)
    for k in range(2, 9):  # 0.8 to 3.2 days in: nothing written, a sweep at each step
        d.step(round(0.4 * k, 1))
        assert d.expired_still_stored() == 0, (k, d.live.log()[-3000:])
    assert d.tasks() == []
    assert "sweep refused" not in d.live.log()
    assert [r["turns"] for r in d.runs() if r["turns"]] == [14, 2]


@pytest.mark.faults
def test_a_restart_under_a_step_then_one_write_leaves_the_cli_sweep_refused(
    tmp_path: Path,
) -> None:
    """The case as reported: 12 tasks, a restart under +31 days, one PUT (an agent's next
    Stop hook), then `flask --app wsgi sweep`. No sweep ran before the step (the housekeeper
    is off): the server's first start kept the clock. Tree only: a PostgreSQL server does
    not start 31 days ahead, its object store refusing requests signed that far ahead."""
    clock = SteppedClock(tmp_path)
    d = Deployment(tmp_path, {}, clock)  # MEMORY_SWEEP_INTERVAL=0: Live's default
    try:
        d.live.start()
        for n in range(12):
            d.put(f"task-{n}", 0)
            d.put(f"task-{n}", 1)
        d.live.stop()
        clock.step(31)
        d.offset_days = 31
        d.live.start()
        d.put("next", 0)
        env = {**d.live.env, **clock.env(), "MEMORY_LOG_LEVEL": "WARNING"}
        for args in (("sweep",), ("sweep", "--dry-run")):
            done = flask(env, *args)
            out = done.stdout + done.stderr
            assert done.returncode == 1, out
            assert "clock" in out and "--force" in out and "24 of 24" in out, out
        assert d.expired_still_stored() == 24
        assert all((d.root / "acme" / "web" / f"task-{n}").is_dir() for n in range(12))
        done = flask(env, "sweep", "--force")
        assert done.returncode == 0, done.stdout + done.stderr
        assert d.expired_still_stored() == 0 and d.tasks() == ["next"]
    finally:
        d.close()
