"""Quotas against a real gunicorn with 2 workers: concurrent writers spread over both workers
never go over the quota; a 50 MiB artifact over quota is refused before its body is stored
(the worker's peak memory and the disk unchanged), chunked too; a worker killed while it holds
a reservation gives it back at once; request counts reach the usage report."""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import signal
import socket
import sqlite3
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests

from tests.e2e.conftest import Server, flask_cli, start_server
from tests.storage._helpers import temp_files

pytestmark = pytest.mark.e2e
PM = "/sandbox/memory/v1"
MiB = 1 << 20


# The quotas of the projects the tests below write, in place before the server starts (the
# CLI that writes them is tested in tests/ops/test_usage_ops.py).
QUOTAS = {"race": 2 * MiB, "big": 10 * MiB, "killed": 2 * MiB, "reported": 4 * MiB}


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    tmp = tmp_path_factory.mktemp("quota")
    root = tmp / "storage"
    root.mkdir()
    doc = {
        "version": 1,
        "tenants": {},
        "projects": {f"acme/{p}": {"quota": {"bytes": n}} for p, n in QUOTAS.items()},
    }
    (root / ".limits.json").write_text(json.dumps(doc))
    srv = start_server(tmp, workers=2, threads=8, root=root)
    try:
        yield srv
    finally:
        srv.stop()


@pytest.fixture(scope="module")
def token(server: Server) -> str:
    """A tenant_admin token of acme: it names the project of each request."""
    return server.token("tenant_admin", project=None)


def headers(token: str, project: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}", "X-Sandbox-Project-Id": project}


def usage(srv: Server, token: str, project: str) -> Any:
    r = requests.get(f"{srv.url}{PM}/usage", headers=headers(token, project), timeout=30)
    assert r.status_code == 200, r.text
    return r.json()


def project_bytes(srv: Server, project: str) -> int:
    """Bytes of every file of a project's tasks (temp files included)."""
    total = 0
    for dirpath, _, files in os.walk(srv.root / "acme" / project):
        for name in files:
            if not name.startswith("_listing"):
                total += os.lstat(os.path.join(dirpath, name)).st_size
    return total


def vm_hwm_kib(pid: int) -> int:
    with open(f"/proc/{pid}/status", encoding="ascii") as fh:
        for line in fh:
            if line.startswith("VmHWM:"):
                return int(line.split()[1])
    raise AssertionError("no VmHWM")


def test_concurrent_writers_on_both_workers_never_overshoot(server: Server, token: str) -> None:
    h = headers(token, "race")
    assert requests.put(f"{server.url}{PM}/tasks/t/turns/0", json={}, headers=h, timeout=30).ok
    limit = QUOTAS["race"]
    size = 96 << 10
    refused = 0
    lock = threading.Lock()

    host, port = server.url.removeprefix("http://").split(":")

    def writer(n: int) -> None:
        nonlocal refused
        for i in range(12):
            chunked = (n + i) % 3 == 0
            conn = http.client.HTTPConnection(host, int(port), timeout=60)
            try:
                conn.request(
                    "PUT",
                    f"{PM}/tasks/t/turns/0/artifacts/w{n}-{i}",
                    body=iter([b"w" * size]) if chunked else b"w" * size,
                    headers=h,
                    encode_chunked=chunked,
                )
                status = conn.getresponse().status
            except (ConnectionError, http.client.HTTPException):
                # Refused before the body was read: the server may close before the client
                # finished sending (docs/operations.md).
                status = 507
            finally:
                conn.close()
            with lock:
                if status != 200:
                    assert status == 507, status
                    refused += 1

    threads = [threading.Thread(target=writer, args=(n,)) for n in range(12)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    body = usage(server, token, "race")["usage"]
    turn = requests.get(f"{server.url}{PM}/tasks/t/turns/0", headers=h, timeout=30).json()
    assert refused > 0
    # Never over the quota, and the counters are what is stored, exactly.
    assert body["bytes"] <= limit
    assert body["artifacts"] == len(turn["artifacts"])
    assert body["artifact_bytes"] == sum(a["size"] for a in turn["artifacts"])
    # Little left unused: the refused writers did not reserve the room away.
    assert body["bytes"] > limit - 2 * size
    assert temp_files(server.root) == []


def _put_raw(
    srv: Server, path: str, head: dict[str, str], body: Iterator[bytes]
) -> tuple[int, str]:
    """Send a request, then its body while the server has not answered; return the status
    and the body of the answer (the server may answer before the body is sent)."""
    host, port = srv.url.removeprefix("http://").split(":")
    sock = socket.create_connection((host, int(port)), timeout=60)
    lines = [f"PUT {path} HTTP/1.1", f"Host: {host}", "Connection: close"]
    lines += [f"{k}: {v}" for k, v in head.items()]
    sock.sendall(("\r\n".join(lines) + "\r\n\r\n").encode())
    sock.setblocking(False)
    answer = b""
    try:
        for chunk in body:
            with contextlib.suppress(BlockingIOError):
                answer += sock.recv(65536)
            if answer:
                break
            try:
                sock.setblocking(True)
                sock.sendall(chunk)
                sock.setblocking(False)
            except (BrokenPipeError, ConnectionResetError):
                break
        sock.setblocking(True)
        sock.settimeout(30)
        while True:
            try:
                data = sock.recv(65536)
            except ConnectionResetError:
                break
            if not data:
                break
            answer += data
    finally:
        sock.close()
    status = int(answer.split(b" ", 2)[1])
    return status, answer.split(b"\r\n\r\n", 1)[1].decode(errors="replace")


def test_a_50_mib_artifact_over_quota_is_refused_before_its_body_is_stored(
    server: Server, token: str
) -> None:
    h = headers(token, "big")
    assert requests.put(f"{server.url}{PM}/tasks/t/turns/0", json={}, headers=h, timeout=30).ok
    # Warm both workers up (imports, the first upload), then measure.
    for i in range(4):
        requests.put(
            f"{server.url}{PM}/tasks/t/turns/0/artifacts/warm{i}",
            data=b"x" * MiB,
            headers=h,
            timeout=60,
        )
    pids = server.worker_pids()
    peak = {pid: vm_hwm_kib(pid) for pid in pids}
    on_disk = project_bytes(server, "big")
    before = usage(server, token, "big")["usage"]
    path = f"{PM}/tasks/t/turns/0/artifacts/huge"
    sent = {"n": 0}

    def blocks(total: int) -> Iterator[bytes]:
        block = b"h" * (256 << 10)
        while sent["n"] < total:
            sent["n"] += len(block)
            yield block

    head = {**h, "Content-Length": str(50 * MiB), "Content-Type": "application/octet-stream"}
    status, text = _put_raw(server, path, head, blocks(50 * MiB))
    assert status == 507, text
    assert "over its storage quota" in json.loads(text)["detail"]
    # Answered before the body: the client had sent a small part of it at most.
    assert sent["n"] < 50 * MiB
    # Chunked: charged as it streams, refused where it crosses the quota.
    sent["n"] = 0

    def chunked(total: int) -> Iterator[bytes]:
        for block in blocks(total):
            yield f"{len(block):x}\r\n".encode() + block + b"\r\n"
        yield b"0\r\n\r\n"

    head = {**h, "Transfer-Encoding": "chunked", "Content-Type": "application/octet-stream"}
    status, text = _put_raw(server, path, head, chunked(50 * MiB))
    assert status == 507, text
    assert sent["n"] < 50 * MiB
    assert usage(server, token, "big")["usage"] == before
    assert project_bytes(server, "big") == on_disk
    assert temp_files(server.root) == []
    grown = max(vm_hwm_kib(pid) - peak[pid] for pid in pids) / 1024
    assert grown <= 16, f"a worker's peak memory grew by {grown:.1f} MiB"


def test_a_killed_workers_reservation_is_given_back_at_once(server: Server, token: str) -> None:
    h = headers(token, "killed")
    assert requests.put(f"{server.url}{PM}/tasks/t/turns/0", json={}, headers=h, timeout=30).ok
    # An upload of 1.5 MiB that sends its head and stalls: its worker reserved what it
    # declared before reading the body, and waits for the body.
    host, port = server.url.removeprefix("http://").split(":")
    url = f"{server.url}{PM}/tasks/t/turns/0/artifacts/probe"
    probe = {**h, "If-Match": '"no-such-version"'}
    listing = server.root / "acme" / "killed" / "_listing.sqlite3"
    old = server.worker_pids()
    with socket.create_connection((host, int(port)), timeout=60) as stalled:
        head = [f"PUT {PM}/tasks/t/turns/0/artifacts/stalled HTTP/1.1", f"Host: {host}"]
        head += [f"{k}: {v}" for k, v in h.items()] + [f"Content-Length: {3 * MiB // 2}", "", ""]
        stalled.sendall("\r\n".join(head).encode())
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and _reserved(listing) < 3 * MiB // 2:
            time.sleep(0.05)
        assert _reserved(listing) == 3 * MiB // 2
        # A probe of 1 MiB: refused while the reservation counts (507); admitted once it is
        # gone, then refused by its precondition (412), so that it never stores anything.
        r = requests.put(url, data=b"a" * MiB, headers=probe, timeout=30)
        assert r.status_code == 507, r.text
        # Kill every worker (one of them holds the reservation); gunicorn starts new ones.
        for pid in old:
            os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        new = server.worker_pids()
        if len(new) == 2 and not set(new) & set(old):
            break
        time.sleep(0.1)
    r = requests.put(url, data=b"a" * MiB, headers=probe, timeout=30)
    assert r.status_code == 412, r.text  # admitted: the dead worker's reservation is gone


def _reserved(listing: Path) -> int:
    """Bytes the reservations in a project's listing hold (alive or not)."""
    with contextlib.closing(sqlite3.connect(f"file:{listing}?mode=ro", uri=True)) as conn:
        return int(
            conn.execute("SELECT coalesce(sum(bytes), 0) FROM usage_reservations").fetchone()[0]
        )


def test_request_counts_reach_the_usage_report(server: Server, token: str) -> None:
    h = headers(token, "counted")
    for _ in range(10):
        assert requests.get(f"{server.url}{PM}/tasks", headers=h, timeout=30).status_code == 200
    # A graceful restart of the workers (SIGHUP) writes what each counted as it exits.
    old = server.worker_pids()
    os.kill(server.proc.pid, signal.SIGHUP)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and set(server.worker_pids()) & set(old):
        time.sleep(0.1)
    rows = usage(server, token, "counted")["traffic"]
    assert sum(r["requests"] for r in rows if r["project"] == "counted") == 10
    # The command line sees what the server stored and counted: a project of this test's own
    # (xdist may run the module's other tests, and their server, in another process).
    stored = headers(token, "reported")
    turn = f"{server.url}{PM}/tasks/t/turns/0"
    assert requests.put(turn, json={}, headers=stored, timeout=30).ok
    assert requests.put(f"{turn}/artifacts/a.bin", data=b"x" * 1024, headers=stored, timeout=30).ok
    out = json.loads(flask_cli(server.env, "usage", "--tenant", "acme", "--json"))
    projects = {p["project"]: p for p in out["tenants"][0]["projects"]}
    assert projects["reported"]["quota"]["bytes"] == QUOTAS["reported"]
    assert projects["reported"]["usage"]["artifacts"] > 0
