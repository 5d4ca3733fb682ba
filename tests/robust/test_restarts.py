"""Restarts after a kill leave nothing behind (docs/guarantees.md, "Faults").

- When the gunicorn master dies (SIGKILL, the OOM killer), its workers stop answering
  within a second, and a new server on the same root and port starts at once.
- A kill during a digest compaction leaves no large temp file in the tree.
- A killed upload's bytes leave the disk within seconds, not at the sweep after the grace
  period.
"""

from __future__ import annotations

import contextlib
import os
import socket
import time
from pathlib import Path

import pytest
import requests

from tests.e2e.conftest import free_port
from tests.robust.faultkit import PM
from tests.robust.helpers import Live, auth

pytestmark = pytest.mark.e2e
MiB = 1 << 20


def _answers(session: requests.Session, url: str) -> bool:
    try:
        return session.get(f"{url}/readyz", timeout=0.5).status_code in (200, 503)
    except requests.RequestException:
        return False


@pytest.mark.faults
def test_a_dead_masters_workers_stop_and_a_new_server_starts_at_once(tmp_path: Path) -> None:
    server = Live(tmp_path=tmp_path, root=tmp_path / "storage", workers=2, port=free_port())
    try:
        for _ in range(3):
            server.start()
            secret = server.token("writer")
            kept = requests.Session()  # a client's kept-alive connection to one of the workers
            assert kept.put(
                f"{server.url}{PM}/tasks/t/turns/0",
                headers=auth(secret),
                json={"summary_md": "before the kill"},
                timeout=30,
            ).ok
            server.kill_master()
            killed = time.monotonic()
            last = killed
            while time.monotonic() - killed < 1.5:
                if _answers(kept, server.url) or _answers(requests.Session(), server.url):
                    last = time.monotonic()
                elif time.monotonic() - last > 0.3:
                    break
                time.sleep(0.02)
            assert last - killed < 1.0, f"an orphaned worker answered {last - killed:.2f}s after"
            server.start()  # same root, same port, right away: must come up at the first try
            got = requests.get(
                f"{server.url}{PM}/tasks/t/turns/0", headers=auth(secret), timeout=30
            )
            assert got.status_code == 200 and got.json()["summary_md"] == "before the kill"
            server.kill_master()
            server.stop()  # and its orphans
    finally:
        server.stop()


def _big_temp_files(root: Path, at_least: int = MiB) -> list[str]:
    found = []
    for dirpath, _, names in os.walk(root):
        for name in names:
            path = Path(dirpath) / name
            if name.startswith(".~tmp") and path.stat().st_size >= at_least:
                found.append(f"{path.relative_to(root)} ({path.stat().st_size} bytes)")
    return found


def _compacting(pids: list[int], project: Path, at_least: int = MiB) -> bool:
    """Whether a worker holds a file open in the project directory that is not one of its
    named files, with ``at_least`` bytes written to it already: a temp file (named, or
    O_TMPFILE, which /proc shows as ``#<inode>``) well into the compaction."""
    for pid in pids:
        try:
            fds = os.listdir(f"/proc/{pid}/fd")
        except FileNotFoundError:
            continue
        for fd in fds:
            try:
                target = os.readlink(f"/proc/{pid}/fd/{fd}")
            except OSError:
                continue
            if target.startswith(f"{project}/") and ("/.~tmp" in target or "/#" in target):
                with contextlib.suppress(OSError):
                    if os.stat(f"/proc/{pid}/fd/{fd}").st_size >= at_least:
                        return True
    return False


@pytest.mark.faults
def test_a_kill_during_a_digest_compaction_leaves_no_temp_file(tmp_path: Path) -> None:
    server = Live(tmp_path=tmp_path, root=tmp_path / "storage", workers=1).start()
    try:
        h = auth(server.token("writer"))
        big = "lorem ipsum dolor sit amet " * 11_000  # ~300 KB a section
        with requests.Session() as session:
            for n in range(100):
                r = session.put(
                    f"{server.url}{PM}/tasks/t{n:03d}/turns/0",
                    headers=h,
                    json={"summary_md": f"# task {n}\n{big}"},
                    timeout=60,
                )
                assert r.ok, r.text
        project = server.root / "acme" / "web"
        pids = server.worker_pids()
        # The first read renders ~30 MB of project.md into the base: kill while it writes.
        with socket.create_connection(("127.0.0.1", int(server.url.rsplit(":", 1)[1]))) as sock:
            sock.sendall(
                f"GET {PM}/project.md HTTP/1.1\r\nHost: x\r\nAuthorization: {h['Authorization']}"
                "\r\n\r\n".encode()
            )
            deadline = time.monotonic() + 60
            while not _compacting(pids, project):
                assert time.monotonic() < deadline, "no compaction seen"
                time.sleep(0.005)
            server.kill_all()
        assert _big_temp_files(server.root) == []
        server.start()
        got = requests.get(f"{server.url}{PM}/project.md", headers=h, timeout=120)
        assert got.status_code == 200 and got.text.count("# task") >= 100
    finally:
        server.stop()


def test_a_killed_uploads_bytes_leave_the_disk_within_seconds(tmp_path: Path) -> None:
    server = Live(tmp_path=tmp_path, root=tmp_path / "storage", workers=1).start()
    try:
        h = auth(server.token("writer"))
        assert requests.put(
            f"{server.url}{PM}/tasks/t/turns/0", headers=h, json={"summary_md": "x"}, timeout=30
        ).ok
        size = 40 * MiB
        sock = socket.create_connection(("127.0.0.1", int(server.url.rsplit(":", 1)[1])))
        sock.sendall(
            f"PUT {PM}/tasks/t/turns/0/artifacts/big.bin HTTP/1.1\r\nHost: x\r\n"
            f"Authorization: {h['Authorization']}\r\nContent-Length: {size}\r\n\r\n".encode()
        )
        chunk = os.urandom(MiB)
        for _ in range(20):
            sock.sendall(chunk)
        deadline = time.monotonic() + 30
        while not _big_temp_files(server.root, 8 * MiB) and not _staging(server):
            assert time.monotonic() < deadline, "the upload was not staged"
            time.sleep(0.05)
        (worker,) = server.worker_pids()
        os.kill(worker, 9)
        sock.close()
        killed = time.monotonic()
        while _big_temp_files(server.root) and time.monotonic() - killed < 10:
            time.sleep(0.2)
        assert _big_temp_files(server.root) == [], "a killed upload's bytes stayed on disk"
    finally:
        server.stop()


def _staging(server: Live) -> bool:
    """The worker holds a large unnamed (O_TMPFILE) file open in the tree."""
    for pid in server.worker_pids():
        try:
            for fd in os.listdir(f"/proc/{pid}/fd"):
                target = os.readlink(f"/proc/{pid}/fd/{fd}")
                if target.startswith(f"{server.root}/") and "/#" in target:
                    st = os.stat(f"/proc/{pid}/fd/{fd}")
                    if st.st_size >= 8 * MiB:
                        return True
        except OSError:
            continue
    return False
