"""Rate limits on a real gunicorn (2 gthread workers): one budget for the whole server.

Each test uses projects and tokens of its own, so budgets never carry over between tests.
Tokens are created through the registry file the server reads (the CLI does the same, slower).
"""

from __future__ import annotations

import http.client
import json
import os
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import requests

from app.storage.core.limits import RateOverride
from app.storage.tree.limits import LimitsFile
from app.storage.tree.tokens import TokenRegistry
from tests.e2e.conftest import Server, flask_cli, start_server

API = "/sandbox/memory/v1"
RPS, BURST, WINDOW = 50, 10, 4.0
KiB = 1024
pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    tmp = tmp_path_factory.mktemp("ratelimit")
    # Every project of tenant "slow" gets a budget that refills once in 10 s: what a test
    # does with it in a second cannot depend on timing.
    LimitsFile(tmp / "storage").set_rate("slow", None, RateOverride(rps=0.1, burst=3))
    srv = start_server(
        tmp,
        workers=2,
        env_extra={
            "MEMORY_RATE_LIMIT_RPS": str(RPS),
            "MEMORY_RATE_LIMIT_BURST": str(BURST),
            "MEMORY_RATE_LIMIT_UPLOAD_BPS": "64KiB",
            "MEMORY_RATE_LIMIT_UPLOAD_BURST": "256KiB",
            # The tests hold keep-alive connections idle across a `flask` CLI run and a wait
            # for the workers to see the limits file; gunicorn closes a connection idle for
            # its keepalive (2 s by default), which a CLI run on a loaded machine outlasts.
            "GUNICORN_CMD_ARGS": "--keep-alive 60",
        },
    )
    try:
        yield srv
    finally:
        srv.stop()


def writer(server: Server, project: str, tenant: str = "acme") -> dict[str, str]:
    registry = TokenRegistry(Path(server.env["MEMORY_TOKENS_FILE"]))
    _, secret = registry.create(role="writer", tenant=tenant, project=project)
    return {"Authorization": f"Bearer {secret}"}


_open: list[Conn] = []


@pytest.fixture(autouse=True)
def _close_connections() -> Iterator[None]:
    yield
    while _open:
        _open.pop().http.close()


class Conn:
    """One keep-alive HTTP/1.1 connection (closed after the test)."""

    def __init__(self, server: Server) -> None:
        host, port = server.url.removeprefix("http://").split(":")
        self.http = http.client.HTTPConnection(host, int(port), timeout=30)
        self.server_port = int(port)
        _open.append(self)

    def request(
        self, method: str, path: str, headers: dict[str, str], body: bytes | None = None
    ) -> tuple[int, dict[str, str], bytes]:
        self.http.request(method, path, body=body, headers=headers)
        resp = self.http.getresponse()
        return resp.status, dict(resp.getheaders()), resp.read()

    def worker(self, pids: list[int]) -> int | None:
        """The gunicorn worker holding the server side of this connection (from /proc)."""
        assert self.http.sock is not None
        client_port = self.http.sock.getsockname()[1]
        inode = None
        with open("/proc/net/tcp") as fh:
            for line in fh.readlines()[1:]:
                fields = line.split()
                local, remote = fields[1], fields[2]
                if (
                    int(local.split(":")[1], 16) == self.server_port
                    and int(remote.split(":")[1], 16) == client_port
                ):
                    inode = fields[9]
        for pid in pids:
            for fd in os.listdir(f"/proc/{pid}/fd"):
                try:
                    if os.readlink(f"/proc/{pid}/fd/{fd}") == f"socket:[{inode}]":
                        return pid
                except OSError:
                    continue
        return None


def spread_connections(server: Server, per_worker: int) -> list[Conn]:
    """``per_worker`` keep-alive connections held by each worker (checked in /proc)."""
    deadline = time.monotonic() + 30
    while len(pids := server.worker_pids()) < 2 and time.monotonic() < deadline:
        time.sleep(0.1)  # the master forks its workers one after the other
    assert len(pids) == 2
    held: dict[int, list[Conn]] = {pid: [] for pid in pids}
    for _ in range(200):
        if all(len(c) == per_worker for c in held.values()):
            break
        conn = Conn(server)
        assert conn.request("GET", "/healthz", {})[0] == 200  # not limited; makes it accepted
        pid = conn.worker(pids)
        if pid is not None and len(held[pid]) < per_worker:
            held[pid].append(conn)
        else:
            conn.http.close()
    assert all(len(c) == per_worker for c in held.values()), "could not spread the connections"
    return [conn for conns in held.values() for conn in conns]


def hammer(conns: list[Conn], path: str, headers: dict[str, str], seconds: float) -> list[int]:
    """Every connection sends requests back to back for ``seconds``; return all statuses."""
    statuses: list[int] = []
    lock = threading.Lock()
    deadline = time.monotonic() + seconds

    def run(conn: Conn) -> None:
        mine = []
        while time.monotonic() < deadline:
            mine.append(conn.request("GET", path, headers)[0])
        with lock:
            statuses.extend(mine)

    threads = [threading.Thread(target=run, args=(c,)) for c in conns]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return statuses


def test_one_connection_and_eight_over_both_workers_get_the_same_budget(server: Server) -> None:
    expected = BURST + RPS * WINDOW
    one = hammer([Conn(server)], f"{API}/tasks?limit=1", writer(server, "budget-one"), WINDOW)
    eight = hammer(
        spread_connections(server, 4), f"{API}/tasks?limit=1", writer(server, "budget-8"), WINDOW
    )
    for statuses in (one, eight):
        assert set(statuses) == {200, 429}, "the clients must ask for more than the budget"
    admitted_one, admitted_eight = one.count(200), eight.count(200)
    seen = f"admitted in {WINDOW:g} s: one connection {admitted_one}, eight {admitted_eight}"
    print(seen)
    assert abs(admitted_eight - admitted_one) <= 0.1 * admitted_one, seen
    # ... and that budget is the configured one, not one per worker.
    assert abs(admitted_one - expected) <= 0.1 * expected, seen
    assert abs(admitted_eight - expected) <= 0.1 * expected, seen


def test_a_429_in_each_api_shape_and_other_projects_unaffected(server: Server) -> None:
    auth = writer(server, "spent", tenant="slow")
    conn = Conn(server)
    statuses = [conn.request("GET", f"{API}/tasks", auth)[0] for _ in range(4)]
    assert statuses == [200, 200, 200, 429]
    status, headers, body = conn.request("GET", f"{API}/tasks", auth)
    assert status == 429
    assert 1 <= int(headers["Retry-After"]) <= 10
    assert headers["RateLimit"] == (
        f'"project";r=0;t={headers["Retry-After"]}, "token";r=0;t={headers["Retry-After"]}'
    )
    assert headers["RateLimit-Policy"] == (
        '"project";q=3;w=30, "token";q=3;w=30, '
        '"project-upload";q=262144;w=4;qu="content-bytes", '
        '"token-upload";q=262144;w=4;qu="content-bytes"'
    )
    assert json.loads(body) == {
        "detail": "rate limit exceeded for project slow/spent: 0.1 requests/s, burst 3; "
        f"retry in {headers['Retry-After']} s"
    }

    status, headers, body = conn.request("GET", "/v1/memory_stores", auth)
    assert status == 429
    error = json.loads(body)
    assert error["type"] == "error" and error["error"]["type"] == "rate_limit_error"
    assert error["error"]["message"].startswith("rate limit exceeded for project slow/spent")
    assert error["request_id"].startswith("req_")
    assert {"Retry-After", "RateLimit", "RateLimit-Policy"} <= set(headers)

    # Meanwhile another project of the same tenant, on every worker, has its whole budget.
    others = spread_connections(server, 1)
    other = writer(server, "bystander", tenant="slow")
    answers = [c.request("GET", f"{API}/tasks", other) for c in others]
    answers.append(others[0].request("GET", f"{API}/tasks", other))
    assert [status for status, _, _ in answers] == [200, 200, 200]
    assert answers[-1][1]["RateLimit"] == '"project";r=0;t=30, "token";r=0;t=30'
    assert conn.request("GET", f"{API}/tasks", auth)[0] == 429


def _length(raw: bytes) -> int:
    for line in raw.partition(b"\r\n\r\n")[0].split(b"\r\n"):
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            return int(value)
    return 0


def test_an_upload_over_budget_is_refused_before_its_body_is_sent(server: Server) -> None:
    auth = writer(server, "uploads")
    artifact = f"{server.url}{API}/tasks/t/turns/0/artifacts/blob.bin"
    r = requests.put(
        f"{server.url}{API}/tasks/t/turns/0", json={"summary_md": "x"}, headers=auth, timeout=30
    )
    assert r.status_code == 200, r.text
    r = requests.put(artifact, data=b"a" * 200 * KiB, headers=auth, timeout=30)
    assert r.status_code == 200, r.text
    # 56 KiB of the 256 KiB burst are left: announce 200 KiB more and send none of it.
    host, port = server.url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        sock.sendall(
            (
                f"PUT {API}/tasks/t/turns/0/artifacts/more.bin HTTP/1.1\r\nHost: {host}\r\n"
                f"Authorization: {auth['Authorization']}\r\n"
                f"Content-Length: {200 * KiB}\r\nContent-Type: application/octet-stream\r\n\r\n"
            ).encode()
        )
        raw = b""
        while b"\r\n\r\n" not in raw or len(raw.partition(b"\r\n\r\n")[2]) < _length(raw):
            chunk = sock.recv(65536)  # the head and the body may come in separate segments
            if not chunk:
                break
            raw += chunk
    head, _, body = raw.decode().partition("\r\n\r\n")
    assert head.startswith("HTTP/1.1 429"), head
    assert 'RateLimit: "project-upload";r=0;t=' in head and "Retry-After: " in head
    assert "request bodies" in json.loads(body)["detail"]


def test_a_chunked_upload_is_charged_by_what_it_sent(server: Server) -> None:
    auth = writer(server, "chunked")
    r = requests.put(
        f"{server.url}{API}/tasks/t/turns/0", json={"summary_md": "x"}, headers=auth, timeout=30
    )
    assert r.status_code == 200

    def body() -> Iterator[bytes]:
        for _ in range(8):
            yield b"c" * 64 * KiB

    url = f"{server.url}{API}/tasks/t/turns/0/artifacts/big.bin"
    r = requests.put(url, data=body(), headers=auth, timeout=30)  # 512 KiB, no Content-Length
    assert r.status_code == 200 and r.json()["size"] == 512 * KiB, r.text
    # 512 KiB at 64 KiB/s borrowed 8 s against a 4 s burst: overdrawn for about 4 s more.
    r = requests.put(url, data=b"small", headers=auth, timeout=30)
    assert r.status_code == 429
    assert int(r.headers["Retry-After"]) >= 3


def test_a_cli_override_applies_on_every_worker_without_restart(server: Server) -> None:
    auth = writer(server, "override")
    conns = spread_connections(server, 2)
    flask_cli(
        server.env,
        *("ratelimit", "set", "--tenant", "acme", "--project", "override"),
        *("--rps", "0.5", "--burst", "3"),
    )
    time.sleep(1.2)  # each worker looks at the file's stat once a second
    answers = [c.request("GET", f"{API}/tasks", auth) for c in conns for _ in range(2)]
    assert [s for s, _, _ in answers] == [200, 200, 200, 429, 429, 429, 429, 429]
    assert answers[2][1]["RateLimit-Policy"].startswith('"project";q=3;w=6, "token";q=3;w=6, ')
    flask_cli(server.env, "ratelimit", "clear", "--tenant", "acme", "--project", "override")
    time.sleep(1.2)
    assert [c.request("GET", f"{API}/tasks", auth)[0] for c in conns] == [200] * 4
