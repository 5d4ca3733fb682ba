"""One server per storage root: a second one stops before touching anything, the first
keeps serving and keeps its crash recovery."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
import requests

from app.storage.tree.fs.txn import Key
from tests.e2e.conftest import REPO, VENV_BIN, free_port, start_server

pytestmark = pytest.mark.e2e
BASE = "/sandbox/memory/v1"


def _sentinel(root: Path) -> dict[str, object]:
    return dict(json.loads((root / ".server-running").read_text()))


def test_a_second_server_on_the_same_root_refuses_and_the_first_keeps_its_recovery(
    tmp_path: Path,
) -> None:
    first = start_server(tmp_path)
    try:
        secret = first.token("writer")
        auth = {"Authorization": f"Bearer {secret}"}
        r = requests.put(
            f"{first.url}{BASE}/tasks/t/turns/0",
            json={"summary_md": "one"},
            headers=auth,
            timeout=10,
        )
        assert r.status_code == 200
        before = _sentinel(first.root)
        assert before["pid"] == first.proc.pid

        env = {**first.env, "MEMORY_BIND": f"127.0.0.1:{free_port()}"}
        second = subprocess.run(
            [str(VENV_BIN / "gunicorn"), "-c", "gunicorn.conf.py", "wsgi:app"],
            cwd=REPO,
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert second.returncode == 2, second.stderr
        refusal = [line for line in second.stderr.splitlines() if "project-memory:" in line]
        assert len(refusal) == 1 and f"PID {first.proc.pid}" in refusal[0], second.stderr
        assert "Traceback" not in second.stderr

        # The first never noticed: it serves, and its sentinel still names it.
        assert (
            requests.get(f"{first.url}{BASE}/tasks/t", headers=auth, timeout=10).status_code == 200
        )
        assert _sentinel(first.root)["pid"] == first.proc.pid

        # Killed mid-write (a write left in flight, its index stale), the first server is
        # repaired when it starts again.
        first.kill()
        from app.storage.core.names import Scope
        from app.storage.tree.backend import TreeStorage

        scope = Scope("acme", "web")
        TreeStorage(first.root).tasks.txns.mark(Key(scope, "t"))
        (first.root / "acme" / "web" / "t" / "index.json").write_text("{}")
    finally:
        first.stop()
    again = start_server(tmp_path, root=first.root)
    try:
        log = again.log()
        assert "the server was killed" in log and "acme/web/t" in log, log
        r = requests.get(f"{again.url}{BASE}/tasks/t", headers=auth, timeout=10)
        assert r.status_code == 200 and r.json()["turns"][0]["turn"] == 0
        assert requests.get(f"{again.url}/readyz", timeout=10).status_code == 200
    finally:
        again.stop()
