"""A write cut at a chosen point of its protocol, then the real start-up recovery.

The cycles (harness.py) kill the server at random moments; here a writer dies at one exact
point. The real server acknowledges the state before and is SIGKILLed; a writer process is
killed at that point (as a worker of the killed server would have been); the power may be
cut; the server starts again on the same root, and once its recovery is done (``/readyz``)
it must serve the acknowledged state.
"""

from __future__ import annotations

import hashlib
import subprocess
import sys
from pathlib import Path

import pytest
import requests

from tests.powerloss.harness import kill_server, wait_ready
from tests.powerloss.mount import REPO, PowerLossMount
from tests.robust.helpers import BASE, Live, auth

pytestmark = pytest.mark.powerloss

# put_artifact killed after it published the new bytes (and kept the old ones aside) and
# before meta.json, the commit point, names them.
_REPLACE_KILLED_BEFORE_COMMIT = """
import io, os, signal, sys
from pathlib import Path
from app.storage.core.names import Scope
from app.storage.tree import artifacts
from app.storage.tree.tasks import TaskStore

def write_json(path, obj, *, durable=True):
    if path.name == "meta.json":
        os.kill(os.getpid(), signal.SIGKILL)

artifacts.write_json = write_json
TaskStore(Path(sys.argv[1])).put_artifact(
    Scope("acme", "web"), "t", 0, "a.bin", io.BytesIO(b"new" * 1000), content_type="x/new"
)
"""


@pytest.mark.parametrize(
    "cut",
    [
        pytest.param(False, id="killed"),
        pytest.param(True, id="killed-then-power-cut"),
    ],
)
def test_artifact_replacement_killed_before_its_commit_keeps_the_acknowledged_bytes(
    plfs: PowerLossMount, area: Path, tmp_path: Path, cut: bool
) -> None:
    server = Live(tmp_path=tmp_path, root=area / "storage").start()
    old = b"old" * 1000
    try:
        headers = auth(server.token("writer"))
        path = f"{BASE}/tasks/t/turns/0"
        put = requests.put(
            f"{server.url}{path}", json={"meta": {}, "summary_md": "s"}, headers=headers, timeout=30
        )
        assert put.status_code == 200, put.text
        put = requests.put(
            f"{server.url}{path}/artifacts/a.bin",
            data=old,
            headers={**headers, "Content-Type": "x/old"},
            timeout=30,
        )
        assert put.status_code == 200, put.text
        kill_server(server)
        killed = subprocess.run(
            [sys.executable, "-c", _REPLACE_KILLED_BEFORE_COMMIT, str(server.root)],
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        assert killed.returncode == -9, killed.stderr
        if cut:
            plfs.cut_power()
        server.start()
        wait_ready(server)
        got = requests.get(f"{server.url}{path}/artifacts/a.bin", headers=headers, timeout=30)
    finally:
        server.stop()
    assert got.status_code == 200, got.text
    assert hashlib.sha256(got.content).hexdigest() == hashlib.sha256(old).hexdigest()
    assert got.headers["ETag"] == put.headers["ETag"]
