"""A writer killed mid-write leaves nothing stale behind (docs/guarantees.md, "Faults").

The writer is held between its commit point and its derived files the way a real one can
be: the project's listing is kept busy by another connection (as a long backup or search
holds it), so a delete has renamed its task into the trash and waits to drop the task's
listing rows. Then it is SIGKILLed.

- a gunicorn worker killed there: its master, reaping it, repairs what its journal slot
  names, so the deleted text leaves ``project.md``, search and the task list at once, not
  at the next write that happens to take the same lock stripe;
- a writer process killed there while no server runs: the next start repairs it, though
  the last server stopped cleanly, and empties the trash it left (never following a link
  planted there, and keeping an export's snapshot that may still be read).
"""

from __future__ import annotations

import contextlib
import os
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import requests

from tests.e2e.conftest import REPO
from tests.robust.faultkit import PM
from tests.robust.helpers import Live, auth

pytestmark = pytest.mark.e2e
SECRET_WORD = "quetzalcoatlus"  # only in the task that is deleted


@contextlib.contextmanager
def listing_held(root: Path) -> Iterator[None]:
    """The project's listing busy with another connection's write transaction."""
    conn = sqlite3.connect(root / "acme" / "web" / "_listing.sqlite3", isolation_level=None)
    try:
        conn.execute("BEGIN IMMEDIATE")
        yield
    finally:
        with contextlib.suppress(sqlite3.Error):
            conn.execute("ROLLBACK")
        conn.close()


def _wait_for(what: str, done: object, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not done():  # type: ignore[operator]
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)


def _seed(server: Live, secret: str) -> None:
    for task, text in (("gone", f"the {SECRET_WORD} flies"), ("kept", "an ordinary turn")):
        r = requests.put(
            f"{server.url}{PM}/tasks/{task}/turns/0",
            headers=auth(secret),
            json={"summary_md": text},
            timeout=30,
        )
        assert r.status_code == 200, r.text


def _deleted_text_is_gone(url: str, secret: str) -> list[str]:
    """What still shows the deleted task: project.md, search, the task list."""
    h = auth(secret)
    left = []
    digest = requests.get(f"{url}{PM}/project.md", headers=h, timeout=30)
    assert digest.status_code == 200, digest.text
    if SECRET_WORD in digest.text or "## gone" in digest.text:
        left.append("project.md")
    found = requests.get(f"{url}{PM}/search", params={"q": SECRET_WORD}, headers=h, timeout=30)
    assert found.status_code == 200, found.text
    if found.json()["hits"]:
        left.append("search")
    listed = requests.get(f"{url}{PM}/tasks", headers=h, timeout=30)
    assert listed.status_code == 200, listed.text
    if "gone" in [t["task_id"] for t in listed.json()["tasks"]]:
        left.append("the task list")
    return left


def test_a_worker_killed_mid_delete_is_repaired_by_its_master(tmp_path: Path) -> None:
    server = Live(tmp_path=tmp_path, root=tmp_path / "storage", workers=2).start()
    try:
        secret = server.token("writer")
        _seed(server, secret)
        workers = server.worker_pids()
        answers: list[object] = []
        with listing_held(server.root):
            deleting = threading.Thread(
                target=lambda: answers.append(
                    _try(
                        lambda: requests.delete(
                            f"{server.url}{PM}/tasks/gone", headers=auth(secret), timeout=60
                        )
                    )
                ),
                daemon=True,
            )
            deleting.start()
            task_dir = server.root / "acme" / "web" / "gone"
            # Renamed into the trash: the worker is past its commit point, waiting for the
            # listing.
            _wait_for("the delete's rename", lambda: not task_dir.exists())
            for pid in workers:  # the one deleting among them
                os.kill(pid, signal.SIGKILL)
        deleting.join(60)
        assert answers and not isinstance(answers[0], requests.Response), answers
        _wait_for(
            "new workers",
            lambda: len(set(server.worker_pids()) - set(workers)) == 2 and _healthy(server.url),
        )
        assert _deleted_text_is_gone(server.url, secret) == []
        assert "repaired 1 write(s) a dead worker left in flight: acme/web/gone" in server.log()
    finally:
        server.stop()


def _try(call: object) -> object:
    try:
        return call()  # type: ignore[operator]
    except requests.RequestException as exc:
        return exc


def _healthy(url: str) -> bool:
    try:
        return requests.get(f"{url}/healthz", timeout=2).status_code == 200
    except requests.RequestException:
        return False


# A writer of its own: the storage engine in a process no gunicorn master watches.
_DELETE = """
import sys
from pathlib import Path
from app.storage.core.names import Scope
from app.storage.tree.tasks import TaskStore

TaskStore(Path(sys.argv[1]), lock_timeout=60).delete_task(Scope("acme", "web"), "gone")
"""


def _killed_delete(root: Path) -> None:
    """Delete task ``gone`` in a process killed after its rename into the trash."""
    with listing_held(root):
        writer = subprocess.Popen(
            [sys.executable, "-c", _DELETE, str(root)],
            cwd=REPO,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        try:
            _wait_for("the delete's rename", lambda: not (root / "acme" / "web" / "gone").exists())
        finally:
            writer.kill()
            writer.wait(30)


def test_a_write_killed_after_a_clean_stop_is_repaired_by_the_next_start(tmp_path: Path) -> None:
    server = Live(tmp_path=tmp_path, root=tmp_path / "storage", workers=2).start()
    secret = server.token("writer")
    _seed(server, secret)
    server.stop()  # clean: the running sentinel is removed
    assert not (server.root / ".server-running").exists()
    _killed_delete(server.root)
    server.start()
    try:
        assert _deleted_text_is_gone(server.url, secret) == []
        assert "repaired 1 write(s) left in flight" in server.log()
    finally:
        server.stop()


def test_the_start_empties_the_trash_a_killed_delete_left(tmp_path: Path) -> None:
    server = Live(tmp_path=tmp_path, root=tmp_path / "storage", workers=2).start()
    secret = server.token("writer")
    _seed(server, secret)
    server.stop()
    _killed_delete(server.root)
    trash = server.root / ".trash"
    [left] = [p.name for p in trash.iterdir()]
    assert left.endswith("-gone")
    # Also there: a link planted by hand, and the snapshot of an export running beside.
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "keep.txt").write_text("not the service's")
    (trash / "01J00000000000000000000000-planted").symlink_to(outside)
    from ulid import ULID

    snapshot = trash / f"{ULID()}-snapshot-kept"
    snapshot.mkdir()
    server.start()
    try:
        assert sorted(p.name for p in trash.iterdir()) == sorted(
            ["01J00000000000000000000000-planted", snapshot.name]
        )
        assert (outside / "keep.txt").read_text() == "not the service's"
        assert "emptied 1 deletion(s) left in the trash" in server.log()
        assert ".trash/01J00000000000000000000000-planted is a symlink" in server.log()
    finally:
        server.stop()
