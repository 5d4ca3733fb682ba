"""Uploads against a real gunicorn (one gthread worker): limit, memory, slow and cut-off clients.

* exactly 50 MiB, with Content-Length and chunked, is stored (200) and the worker's peak
  memory (VmHWM) grows by at most 16 MiB: the body is streamed, never buffered;
* 50 MiB + 1 is 413 in both modes, and nothing is left behind (no temp file, no record);
* a slow client (about 600 KB/s) finishes, even past the worker timeout;
* a client that hangs up half-way leaves nothing visible and no temp file.
"""

from __future__ import annotations

import hashlib
import json
import socket
import time
from collections.abc import Iterator
from typing import Any

import pytest
import requests

from tests.robust.helpers import BASE, Live, auth, start, temp_files

pytestmark = pytest.mark.e2e
MiB = 1 << 20
LIMIT = 50 * MiB
BLOCK = bytes(range(256)) * 256  # 64 KiB


def body(total: int, *, rate: float | None = None) -> Iterator[bytes]:
    """``total`` bytes in 64 KiB blocks; paced to ``rate`` bytes/s when given."""
    sent = 0
    started = time.monotonic()
    while sent < total:
        n = min(len(BLOCK), total - sent)
        yield BLOCK[:n]
        sent += n
        if rate:
            ahead = sent / rate - (time.monotonic() - started)
            if ahead > 0:
                time.sleep(ahead)


def digest(total: int) -> str:
    h = hashlib.sha256()
    for chunk in body(total):
        h.update(chunk)
    return h.hexdigest()


def vm_hwm_kib(pid: int) -> int:
    with open(f"/proc/{pid}/status", encoding="ascii") as fh:
        for line in fh:
            if line.startswith("VmHWM:"):
                return int(line.split()[1])
    raise AssertionError("no VmHWM")


def artifacts(server: Live, secret: str) -> list[str]:
    got = requests.get(f"{server.url}{BASE}/tasks/t/turns/0", headers=auth(secret), timeout=30)
    return sorted(a["name"] for a in got.json()["artifacts"])


def one_worker_settings() -> dict[str, Any]:
    return {"workers": 1, "threads": 4, "env_extra": {"MEMORY_WORKER_TIMEOUT": "2"}}


@pytest.fixture
def one_worker(live_factory: Any) -> tuple[Live, str]:
    return _warmed(live_factory(**one_worker_settings()))


@pytest.fixture(scope="module")
def one_worker_kept(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Live, str]]:
    """One server for the cases that each check they left it as they found it."""
    server = start(tmp_path_factory.mktemp("kept"), **one_worker_settings())
    try:
        yield _warmed(server)
    finally:
        server.stop()


def _warmed(server: Live) -> tuple[Live, str]:
    secret = server.token("writer")
    resp = requests.put(
        f"{server.url}{BASE}/tasks/t/turns/0", json={}, headers=auth(secret), timeout=30
    )
    assert resp.status_code == 200
    # Warm up the upload path so the first measurement is not import cost.
    url = f"{server.url}{BASE}/tasks/t/turns/0/artifacts/warm"
    assert requests.put(url, data=b"x" * MiB, headers=auth(secret), timeout=60).status_code == 200
    return server, secret


def test_exactly_the_limit_streams_in_both_modes_within_16_mib(
    one_worker: tuple[Live, str],
) -> None:
    server, secret = one_worker
    (pid,) = server.worker_pids()
    base = vm_hwm_kib(pid)
    url = f"{server.url}{BASE}/tasks/t/turns/0/artifacts"
    sized = requests.put(
        f"{url}/sized.bin", data=b"".join(body(LIMIT)), headers=auth(secret), timeout=300
    )
    assert sized.status_code == 200 and sized.json()["size"] == LIMIT, sized.text
    chunked = requests.put(
        f"{url}/chunked.bin", data=body(LIMIT), headers=auth(secret), timeout=300
    )
    assert chunked.status_code == 200 and chunked.json()["size"] == LIMIT, chunked.text
    grown = (vm_hwm_kib(pid) - base) / 1024
    assert grown <= 16, f"worker peak memory grew by {grown:.1f} MiB for 50 MiB uploads"
    want = digest(LIMIT)
    for name in ("sized.bin", "chunked.bin"):
        got = requests.get(f"{url}/{name}", headers=auth(secret), timeout=300)
        assert (
            got.headers["ETag"] == f'"{want}"' and hashlib.sha256(got.content).hexdigest() == want
        )


def test_one_byte_over_is_413_in_both_modes_and_leaves_nothing(
    one_worker: tuple[Live, str],
) -> None:
    server, secret = one_worker
    url = f"{server.url}{BASE}/tasks/t/turns/0/artifacts"
    for name, data in [("sized.bin", b"".join(body(LIMIT + 1))), ("chunked.bin", body(LIMIT + 1))]:
        try:
            resp = requests.put(f"{url}/{name}", data=data, headers=auth(secret), timeout=300)
            assert resp.status_code == 413, (name, resp.status_code, resp.text)
            assert set(resp.json()) == {"detail"}
        except requests.ConnectionError:
            # The server may answer 413 and close before the client finished sending.
            pass
    assert artifacts(server, secret) == ["warm"]
    assert temp_files(server.root) == []


def test_slow_client_finishes_past_the_worker_timeout(one_worker: tuple[Live, str]) -> None:
    server, secret = one_worker
    size, rate = 2 * MiB, 600_000  # about 3.5 s, longer than the 2 s worker timeout
    started = time.monotonic()
    resp = requests.put(
        f"{server.url}{BASE}/tasks/t/turns/0/artifacts/slow.bin",
        data=body(size, rate=rate),
        headers=auth(secret),
        timeout=120,
    )
    assert time.monotonic() - started > 2
    assert resp.status_code == 200 and resp.json()["size"] == size, resp.text
    assert "WORKER TIMEOUT" not in server.log()


def test_upload_cut_off_half_way_leaves_nothing(one_worker: tuple[Live, str]) -> None:
    server, secret = one_worker
    host, port = server.url.removeprefix("http://").split(":")
    head = (
        f"PUT {BASE}/tasks/t/turns/0/artifacts/cut.bin HTTP/1.1\r\n"
        f"Host: {host}\r\nAuthorization: Bearer {secret}\r\n"
        f"Content-Type: application/octet-stream\r\nContent-Length: {10 * MiB}\r\n\r\n"
    ).encode()
    with socket.create_connection((host, int(port)), timeout=30) as sock:
        sock.sendall(head)
        for chunk in body(5 * MiB):
            sock.sendall(chunk)
        time.sleep(0.3)  # let the worker write what it got into its temp file
    deadline = time.monotonic() + 20
    while temp_files(server.root) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert temp_files(server.root) == []
    assert artifacts(server, secret) == ["warm"]
    got = requests.get(
        f"{server.url}{BASE}/tasks/t/turns/0/artifacts/cut.bin", headers=auth(secret), timeout=30
    )
    assert got.status_code == 404
    # The worker is still serving.
    again = requests.put(
        f"{server.url}{BASE}/tasks/t/turns/0/artifacts/after.bin",
        data=b"ok",
        headers=auth(secret),
        timeout=30,
    )
    assert again.status_code == 200


def _exchange(server: Live, request: bytes, *, half_close: bool = False) -> bytes:
    """Send ``request`` on one connection and read until the server closes it."""
    host, port = server.url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=30) as sock:
        sock.sendall(request)
        if half_close:
            sock.shutdown(socket.SHUT_WR)
        received = b""
        while chunk := sock.recv(65536):
            received += chunk
    return received


@pytest.mark.parametrize(
    ("label", "chunks", "half_close"),
    [
        ("a chunk size that is no number", b"ZZ\r\nHELLO\r\n0\r\n\r\n", False),
        ("a negative chunk size", b"-1\r\nHELLO\r\n0\r\n\r\n", False),
        ("a chunk without its CRLF", b"5\r\nHELLOXX0\r\n\r\n", False),
        ("a body that ends before its last chunk", b"5\r\nHEL", True),
    ],
)
def test_a_malformed_chunked_body_is_400_and_ends_the_connection(
    one_worker_kept: tuple[Live, str], label: str, chunks: bytes, half_close: bool
) -> None:
    server, secret = one_worker_kept
    host = server.url.removeprefix("http://")
    head = (
        f"PUT {BASE}/tasks/t/turns/0/artifacts/bad.bin HTTP/1.1\r\n"
        f"Host: {host}\r\nAuthorization: Bearer {secret}\r\n"
        "Content-Type: application/octet-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
    ).encode()
    # A second, well-formed request follows on the same connection: after a broken body
    # nothing on it can be read as a request, so it gets no answer.
    follow = f"GET {BASE}/tasks/t HTTP/1.1\r\nHost: {host}\r\n\r\n".encode()
    received = _exchange(
        server, head + chunks + (b"" if half_close else follow), half_close=half_close
    )
    status_line, _, rest = received.partition(b"\r\n")
    assert status_line.startswith(b"HTTP/1.1 400"), (label, received[:300])
    assert rest.count(b"HTTP/1.1 ") == 0, (label, received[:600])
    body_text = rest.partition(b"\r\n\r\n")[2]
    detail = json.loads(body_text)["detail"]
    assert half_close or detail.startswith("malformed request body"), (label, detail)
    assert artifacts(server, secret) == ["warm"]
    assert temp_files(server.root) == []
    assert "unhandled error" not in server.log()


def test_a_write_refused_before_its_body_says_close_and_the_session_goes_on(
    one_worker: tuple[Live, str],
) -> None:
    """A refused write leaves its body unread, and gunicorn drains at most 64 KiB of it before
    the next request: past that the connection closes, so the answer must say so, or a
    keep-alive client meets a closed connection on its next request."""
    server, secret = one_worker
    session = requests.Session()
    url = f"{server.url}{BASE}/tasks"
    refused = [
        # no such turn: 404 before the body is read
        session.put(f"{url}/t/turns/9/artifacts/a.bin", data=b"y" * 300_000, headers=auth(secret)),
        # a bad credential: 401 before the body is read
        session.put(f"{url}/t/turns/0/artifacts/b.bin", data=b"y" * 300_000, headers=auth("x")),
    ]
    for resp in refused:
        assert resp.status_code in (401, 404), resp.text
        assert resp.headers["Connection"] == "close"
    for i in range(6):
        resp = session.put(f"{url}/t/turns/0/artifacts/n{i}.bin", data=b"ok", headers=auth(secret))
        assert resp.status_code == 200, resp.text
        resp = session.put(
            f"{url}/t/turns/9/artifacts/a.bin", data=b"y" * 300_000, headers=auth(secret)
        )
        assert resp.status_code == 404
    # A body that was read whole keeps the connection.
    kept = session.put(
        f"{url}/t/turns/0/artifacts/k.bin", data=b"y" * 300_000, headers=auth(secret)
    )
    assert kept.status_code == 200 and kept.headers["Connection"] == "keep-alive"


def _head_then(server: Live, head: bytes, body: bytes) -> tuple[bytes, bytes]:
    """Send ``head``, read what the server says before any body, then send ``body`` (if it
    asked for it) and read the rest: (first answer, what followed)."""
    host, port = server.url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=30) as sock:
        sock.sendall(head)
        first = sock.recv(65536)
        rest = b""
        if first.startswith(b"HTTP/1.1 100"):
            sock.sendall(body)
            while chunk := sock.recv(65536):
                rest += chunk
                if b"\r\n\r\n" in rest:
                    break
    return first, rest


def test_100_continue_is_sent_only_when_the_body_is_wanted(one_worker: tuple[Live, str]) -> None:
    """gunicorn says "100 Continue" before the credential or the length is checked; a refusal
    must come instead of it, and an accepted write gets it, then its answer."""
    server, secret = one_worker
    host = server.url.removeprefix("http://")

    def head(token: str, length: int) -> bytes:
        return (
            f"PUT {BASE}/tasks/t/turns/0/artifacts/c.bin HTTP/1.1\r\nHost: {host}\r\n"
            f"Authorization: Bearer {token}\r\nContent-Type: application/octet-stream\r\n"
            f"Content-Length: {length}\r\nExpect: 100-continue\r\nConnection: close\r\n\r\n"
        ).encode()

    refused, _ = _head_then(server, head("pm_not-a-token", 5), b"hello")
    assert refused.startswith(b"HTTP/1.1 401"), refused[:200]
    too_large, _ = _head_then(server, head(secret, LIMIT + 1), b"")
    assert too_large.startswith(b"HTTP/1.1 413"), too_large[:200]
    go_on, answer = _head_then(server, head(secret, 5), b"hello")
    assert go_on.startswith(b"HTTP/1.1 100 Continue"), go_on[:200]
    assert answer.startswith(b"HTTP/1.1 200"), answer[:300]
    got = requests.get(
        f"{server.url}{BASE}/tasks/t/turns/0/artifacts/c.bin", headers=auth(secret), timeout=30
    )
    assert got.content == b"hello"
