"""The upload budget is charged by the bytes received (real gunicorn, 2 workers): a claimed
Content-Length never sent costs nothing, and concurrent uploads cannot together take more
than the burst."""

from __future__ import annotations

import concurrent.futures
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import requests

from app.storage.tree.tokens import TokenRegistry
from tests.e2e.conftest import Server, start_server

pytestmark = pytest.mark.e2e
API = "/sandbox/memory/v1"
KiB = 1024
MiB = 1024 * KiB
BURST = 200 * KiB


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    srv = start_server(
        tmp_path_factory.mktemp("uploads"),
        workers=2,
        threads=8,
        env_extra={
            "MEMORY_RATE_LIMIT_UPLOAD_BPS": "100KiB",
            "MEMORY_RATE_LIMIT_UPLOAD_BURST": "200KiB",
            "MEMORY_SWEEP_INTERVAL": "0",
        },
    )
    try:
        yield srv
    finally:
        srv.stop()


def writer(server: Server, project: str) -> dict[str, str]:
    registry = TokenRegistry(Path(server.env["MEMORY_TOKENS_FILE"]))
    _, secret = registry.create(role="writer", tenant="acme", project=project)
    return {"Authorization": f"Bearer {secret}"}


def a_turn(server: Server, auth: dict[str, str]) -> None:
    r = requests.put(
        f"{server.url}{API}/tasks/t/turns/0", json={"summary_md": "x"}, headers=auth, timeout=30
    )
    assert r.status_code == 200, r.text


def test_a_claimed_length_never_sent_costs_nothing(server: Server) -> None:
    auth, other = writer(server, "claims"), writer(server, "claims")
    a_turn(server, auth)
    host, port = server.url.removeprefix("http://").split(":")
    # 50 MiB announced (the artifact limit, so the route reads it), not one byte sent.
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        sock.sendall(
            (
                f"PUT {API}/tasks/t/turns/0/artifacts/never.bin HTTP/1.1\r\nHost: {host}\r\n"
                f"Authorization: {auth['Authorization']}\r\n"
                f"Content-Length: {50 * MiB}\r\nContent-Type: application/octet-stream\r\n\r\n"
            ).encode()
        )
        time.sleep(0.5)  # admitted, and waiting for the body
    time.sleep(0.5)  # the server saw the close
    for who in (auth, other):
        r = requests.put(
            f"{server.url}{API}/tasks/t/turns/0/artifacts/small.bin",
            data=b"s" * KiB,
            headers=who,
            timeout=30,
        )
        assert r.status_code == 200, r.text
    gone = requests.get(
        f"{server.url}{API}/tasks/t/turns/0/artifacts/never.bin", headers=auth, timeout=30
    )
    assert gone.status_code == 404


def test_concurrent_chunked_uploads_cannot_overdraw_the_burst(server: Server) -> None:
    auth = writer(server, "concurrent")
    a_turn(server, auth)

    def body() -> Iterator[bytes]:
        for _ in range(16):
            yield b"c" * 64 * KiB  # 1 MiB in all, no Content-Length

    def upload(i: int) -> int:
        try:
            return requests.put(
                f"{server.url}{API}/tasks/t/turns/0/artifacts/up-{i}.bin",
                data=body(),
                headers=auth,
                timeout=60,
            ).status_code
        except requests.ConnectionError:
            return 0  # answered (429) and closed while the body was still coming

    with concurrent.futures.ThreadPoolExecutor(6) as pool:
        statuses = list(pool.map(upload, range(6)))
    assert set(statuses) <= {200, 429, 0}, statuses
    stored = 0
    for i in range(6):
        r = requests.get(
            f"{server.url}{API}/tasks/t/turns/0/artifacts/up-{i}.bin", headers=auth, timeout=30
        )
        if r.status_code == 200:
            stored += len(r.content)
    # One upload may overdraw the budget by its own bytes, as one announced with a length
    # may; together they get no more than the burst besides.
    assert stored <= 1 * MiB + BURST, (stored, statuses)
    assert statuses.count(200) <= 1, statuses
