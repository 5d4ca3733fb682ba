"""The background sweeper's leader election, in one process (threads exclude each other
through separate flock descriptors just as workers do); the gunicorn version is in
tests/e2e/test_sweeper_e2e.py."""

from __future__ import annotations

import json
import time
from pathlib import Path

from flask import Flask

from app.ops import sweeper as sweeper_module
from app.ops.sweeper import STATE_FILE, Sweeper, start_for_worker


def history(root: Path) -> list[dict[str, float]]:
    try:
        return list(json.loads((root / STATE_FILE).read_text())["recent"])
    except FileNotFoundError:
        return []


def test_one_leader_sweeps_each_interval_and_a_standby_takes_over(app: Flask) -> None:
    root = Path(app.config["STORAGE_ROOT"])
    interval = 0.3
    sweepers = [Sweeper(app, interval, poll=0.05).start() for _ in range(3)]
    try:
        deadline = time.monotonic() + 10
        while len(history(root)) < 3 and time.monotonic() < deadline:
            time.sleep(0.05)
        leaders = [s for s in sweepers if s.is_leader]
        assert len(leaders) == 1
        runs = history(root)
        assert len(runs) >= 3
        for before, after in zip(runs, runs[1:], strict=False):
            assert after["started_epoch"] >= before["finished_epoch"]
            assert after["started_epoch"] - before["started_epoch"] >= interval * 0.95

        leaders[0].stop()  # releases the leader lock, like a dead worker's kernel would
        count = len(history(root))
        deadline = time.monotonic() + 10
        while len(history(root)) < count + 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert len([s for s in sweepers if s.is_leader]) == 1
        runs = history(root)
        assert len(runs) >= count + 2
        for before, after in zip(runs, runs[1:], strict=False):
            assert after["started_epoch"] - before["started_epoch"] >= interval * 0.95
    finally:
        for s in sweepers:
            s.stop()


def test_interval_zero_never_sweeps(tmp_path: Path) -> None:
    from app import create_app

    app = create_app(
        {
            "TESTING": True,
            "STORAGE_ROOT": str(tmp_path / "root"),
            "TOKENS_FILE": str(tmp_path / "tokens.json"),
            "SWEEP_INTERVAL": 0,
        }
    )
    housekeeper = start_for_worker(app)  # it still runs recoveries and renews the canary
    assert housekeeper is not None
    try:
        deadline = time.monotonic() + 5
        while not housekeeper.is_leader and time.monotonic() < deadline:
            time.sleep(0.05)
        assert housekeeper.is_leader
        time.sleep(0.3)
        assert not (tmp_path / "root" / STATE_FILE).exists()
    finally:
        housekeeper.stop()
        sweeper_module._started = None
