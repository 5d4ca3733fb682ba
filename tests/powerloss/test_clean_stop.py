"""A clean stop, then a power cut, on a filesystem where sync(2) does not reach the disk (a
FUSE filesystem: the power-loss filesystem itself). Derived files are written without fsync
and a clean stop syncs them; where that sync makes nothing durable, the next start must still
find out what the cut took, and repair it."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import requests

from tests.e2e.conftest import flask_cli, start_server
from tests.powerloss.mount import PowerLossMount

pytestmark = pytest.mark.powerloss
API = "/sandbox/memory/v1"


def _wait_ready(url: str) -> None:
    deadline = time.monotonic() + 120
    while requests.get(f"{url}/readyz", timeout=10).status_code != 200:
        assert time.monotonic() < deadline, "not ready 120 s after its start"
        time.sleep(0.1)


def test_a_clean_stop_then_a_power_cut_loses_nothing(
    plfs: PowerLossMount, area: Path, tmp_path: Path
) -> None:
    root = area / "root"
    first = start_server(tmp_path, root=root)
    try:
        auth = {"Authorization": f"Bearer {first.token('writer')}"}
        for i in range(8):
            for turn in range(2):
                r = requests.put(
                    f"{first.url}{API}/tasks/t{i}/turns/{turn}",
                    json={"summary_md": f"task {i} turn {turn}", "meta": {"i": i}},
                    headers=auth,
                    timeout=30,
                )
                assert r.status_code == 200, r.text
    finally:
        first.stop()  # SIGTERM: the clean stop
    assert first.proc.returncode == 0, first.log()
    plfs.cut_power()

    again = start_server(tmp_path, root=root)
    try:
        _wait_ready(again.url)
        assert "the last stop was clean, but a cut since lost writes" in again.log(), again.log()
        with requests.Session() as http:
            for i in range(8):
                r = http.get(f"{again.url}{API}/tasks/t{i}", headers=auth, timeout=30)
                assert r.status_code == 200, r.text
                assert [t["turn"] for t in r.json()["turns"]] == [0, 1], r.text
                r = http.get(f"{again.url}{API}/tasks/t{i}/turns/1", headers=auth, timeout=30)
                assert r.json()["summary_md"] == f"task {i} turn 1", r.text
            page = http.get(f"{again.url}{API}/tasks", headers=auth, timeout=30).json()
            assert page["total"] == 8, page
            digest = http.get(f"{again.url}{API}/project.md", headers=auth, timeout=30).text
            assert all(f"task {i} turn 1" in digest for i in range(8)), digest
    finally:
        again.stop()
    assert "fsck: clean" in flask_cli(again.env, "fsck")
