"""A real gunicorn, started the way `make run` starts it, sweeps expired data by itself."""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path
from typing import Any

import pytest
import requests

from tests.e2e.conftest import Server, start_server

pytestmark = [pytest.mark.e2e, pytest.mark.slow]  # waits out a retention: `make slow`

API = "/sandbox/memory/v1"
INTERVAL = 1.0
RETENTION_DAYS = 0.0001  # 8.64 s


def runs(root: Path) -> list[dict[str, Any]]:
    try:
        state = json.loads((root / ".sweeper.json").read_text())
    except FileNotFoundError:
        return []
    recent: list[dict[str, Any]] = state["recent"]
    return recent


def wait_for(predicate: Any, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}")


def assert_one_sweeper_at_a_time(history: list[dict[str, Any]]) -> None:
    for before, after in zip(history, history[1:], strict=False):
        # Never two at once, and never two in one interval (5% slack for timer jitter).
        assert after["started_epoch"] >= before["finished_epoch"], (before, after)
        assert after["started_epoch"] - before["started_epoch"] >= INTERVAL * 0.95, (
            before,
            after,
        )


def test_expired_data_disappears_with_no_manual_step_and_one_sweeper_runs(
    tmp_path: Path,
) -> None:
    srv: Server = start_server(
        tmp_path,
        workers=3,
        threads=2,
        env_extra={
            "MEMORY_RETENTION_DAYS": str(RETENTION_DAYS),
            "MEMORY_SWEEP_INTERVAL": str(INTERVAL),
        },
    )
    try:
        auth = {"Authorization": f"Bearer {srv.token('writer')}"}
        url = f"{srv.url}{API}/tasks/ephemeral/turns/0"
        body = {"meta": {"model": "e2e"}, "summary_md": "gone soon"}
        assert requests.put(url, json=body, headers=auth, timeout=10).status_code in (200, 201)
        r = requests.put(
            f"{url}/artifacts/blob.bin",
            data=os.urandom(4096),
            headers={**auth, "Content-Type": "application/octet-stream"},
            timeout=10,
        )
        assert r.status_code in (200, 201), r.text
        task_dir = srv.root / "acme" / "web" / "ephemeral"
        assert (task_dir / "0000-turn" / "artifacts" / "blob.bin").exists()
        written = time.monotonic()

        wait_for(lambda: not task_dir.exists(), 40, "the sweeper to delete the expired task")
        assert time.monotonic() - written >= RETENTION_DAYS * 86400 - 1, "deleted too early"
        listing = requests.get(f"{srv.url}{API}/tasks", headers=auth, timeout=10).json()
        assert listing["total"] == 0
        digest = requests.get(f"{srv.url}{API}/project.md", headers=auth, timeout=10).text
        assert "ephemeral" not in digest
        # The task leaves its directory for the trash, which the same sweep then empties.
        trash = srv.root / ".trash"
        wait_for(lambda: not any(trash.iterdir()), 20, "the sweep to empty the trash")

        # The task leaves its directory mid-run; the run is recorded when the whole sweep
        # (digest compaction, search purge, memory stores) is done.
        wait_for(lambda: sum(r["tasks"] for r in runs(srv.root)) >= 1, 20, "the run to be recorded")
        history = runs(srv.root)
        workers = srv.worker_pids()
        assert len(workers) == 3
        leaders = {r["pid"] for r in history}
        assert len(leaders) == 1 and leaders <= set(workers), (leaders, workers)
        assert sum(r["tasks"] for r in history) == 1
        assert_one_sweeper_at_a_time(history)

        # Kill the leader: the kernel frees its lock and another worker takes over, keeping
        # the rhythm (the last run's time is on disk, not in the dead worker's memory).
        (leader,) = leaders
        os.kill(leader, signal.SIGKILL)
        wait_for(
            lambda: any(r["pid"] != leader for r in runs(srv.root)),
            30,
            "another worker to take over the sweeps",
        )
        history = runs(srv.root)
        assert_one_sweeper_at_a_time(history)
        elapsed = history[-1]["started_epoch"] - history[0]["started_epoch"]
        assert len(history) <= elapsed / INTERVAL + 1
    finally:
        srv.stop()
    assert not (srv.root / ".server-running").exists(), "clean shutdown removes the sentinel"
