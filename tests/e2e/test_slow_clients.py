"""Slow and malformed clients against a real gunicorn (gunicorn.conf.py's worker, 2 workers).

* 50 connections trickling header lines and 9 authenticated uploads trickling a body byte every
  3 s leave /healthz answering in under 1 s throughout, and are all cut off with 408 JSON;
* the answers gunicorn writes itself (414, 431, 400) are JSON in each API's error shape.
"""

from __future__ import annotations

import http.client
import json
import selectors
import socket
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from tests.e2e.conftest import Server, start_server

pytestmark = pytest.mark.e2e
BASE = "/sandbox/memory/v1"
STORES = "/v1/memory_stores"
HEADER_TIMEOUT = 12
BODY_TIMEOUT = 10
BODY_MIN_RATE = 1  # bytes/s: a byte every 3 s falls below it after about 16 s


@pytest.fixture(scope="module")
def edge(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    srv = start_server(
        tmp_path_factory.mktemp("edge"),
        threads=None,  # the default of gunicorn.conf.py
        env_extra={
            "MEMORY_HEADER_TIMEOUT": str(HEADER_TIMEOUT),
            "MEMORY_BODY_TIMEOUT": str(BODY_TIMEOUT),
            "MEMORY_BODY_MIN_RATE": str(BODY_MIN_RATE),
        },
    )
    try:
        yield srv
    finally:
        srv.stop()


def address(server: Server) -> tuple[str, int]:
    host, port = server.url.removeprefix("http://").split(":")
    return host, int(port)


def parse_answer(raw: bytes) -> tuple[int, dict[str, str], Any]:
    head, _, body = raw.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    headers = dict(line.split(": ", 1) for line in lines[1:])
    return int(lines[0].split(" ")[1]), {k.lower(): v for k, v in headers.items()}, body


def exchange(server: Server, request: bytes) -> tuple[int, dict[str, str], Any]:
    """Send raw bytes, read the answer to EOF; return status, headers and the JSON body."""
    with socket.create_connection(address(server), timeout=10) as sock:
        sock.sendall(request)
        raw = b""
        while chunk := sock.recv(65536):
            raw += chunk
    status, headers, body = parse_answer(raw)
    assert headers["content-type"] == "application/json", raw[:300]
    return status, headers, json.loads(body)


class Trickler(threading.Thread):
    """Send ``head``, then ``drip`` every ``every`` seconds until the server answers."""

    def __init__(self, server: Server, head: bytes, drip: bytes, every: float) -> None:
        super().__init__(daemon=True)
        self.server, self.head, self.drip, self.every = server, head, drip, every
        self.answer = b""
        self.after = 0.0
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            with (
                socket.create_connection(address(self.server), timeout=60) as sock,
                selectors.DefaultSelector() as selector,  # select() fails past fd 1023
            ):
                selector.register(sock, selectors.EVENT_READ)
                started = time.monotonic()
                sock.sendall(self.head)
                while time.monotonic() - started < 60:
                    if selector.select(self.every):
                        while chunk := sock.recv(65536):
                            self.answer += chunk
                        self.after = time.monotonic() - started
                        return
                    sock.sendall(self.drip)
        except BaseException as exc:  # noqa: BLE001 - reported by the test
            self.error = exc


def healthz_latency(server: Server) -> float:
    started = time.monotonic()
    conn = http.client.HTTPConnection(*address(server), timeout=5)
    try:
        conn.request("GET", "/healthz")
        resp = conn.getresponse()
        assert resp.status == 200 and json.loads(resp.read()) == {"status": "ok"}
    finally:
        conn.close()
    return time.monotonic() - started


def test_slow_clients_hold_no_thread_and_are_cut_off_with_408(edge: Server) -> None:
    secret = edge.token("writer")
    host = "127.0.0.1"
    turn = http.client.HTTPConnection(*address(edge), timeout=10)
    turn.request(
        "PUT",
        f"{BASE}/tasks/t/turns/0",
        body=b"{}",
        headers={"Authorization": f"Bearer {secret}", "Content-Type": "application/json"},
    )
    assert turn.getresponse().status == 200
    turn.close()

    header_tricklers = [
        Trickler(
            edge,
            f"GET {STORES if i % 2 else BASE + '/tasks'} HTTP/1.1\r\nHost: {host}\r\n".encode(),
            f"X-Slow-{i}: y\r\n".encode(),
            every=1.0,
        )
        for i in range(50)
    ]
    uploads = [
        Trickler(
            edge,
            (
                f"PUT {BASE}/tasks/t/turns/0/artifacts/slow-{i}.bin HTTP/1.1\r\nHost: {host}\r\n"
                f"Authorization: Bearer {secret}\r\nContent-Length: 1000\r\n\r\nx"
            ).encode(),
            b"x",
            every=3.0,
        )
        for i in range(8)
    ]
    store_create = Trickler(
        edge,
        (
            f"POST {STORES} HTTP/1.1\r\nHost: {host}\r\nx-api-key: {secret}\r\n"
            f"Content-Type: application/json\r\nContent-Length: 1000\r\n\r\n{{"
        ).encode(),
        b" ",
        every=3.0,
    )
    everyone = [*header_tricklers, *uploads, store_create]
    for t in everyone:
        t.start()
    latencies = []
    window = time.monotonic() + 40
    while any(t.is_alive() for t in everyone) and time.monotonic() < window:
        latencies.append(healthz_latency(edge))
        time.sleep(0.1)
    for t in everyone:
        t.join(timeout=5)

    for t in everyone:
        assert t.error is None and t.answer, (t.error, t.answer[:200])
    # /healthz was measured through the whole window: until the last trickler was cut off.
    assert len(latencies) > 50 and max(latencies) < 1.0, (len(latencies), max(latencies))
    for i, t in enumerate(header_tricklers):
        status, headers, body = parse_answer(t.answer)
        assert status == 408 and headers["content-type"] == "application/json"
        assert HEADER_TIMEOUT - 1 <= t.after <= HEADER_TIMEOUT + 3, t.after
        shape = json.loads(body)
        if i % 2:
            assert shape["type"] == "error" and shape["error"]["type"] == "timeout_error"
            assert shape["request_id"] == f"req_{headers['x-correlation-id']}"
        else:
            assert set(shape) == {"detail"} and "headers" in shape["detail"]
    for t in uploads:
        status, headers, body = parse_answer(t.answer)
        assert status == 408 and headers["content-type"] == "application/json"
        assert headers["connection"] == "close"
        assert json.loads(body) == {"detail": f"request body slower than {BODY_MIN_RATE} bytes/s"}
        assert BODY_TIMEOUT < t.after < 22, t.after
    status, headers, body = parse_answer(store_create.answer)
    shape = json.loads(body)
    assert status == 408 and shape["error"]["type"] == "timeout_error", shape
    # Nothing of the cut-off uploads was stored.
    listing = http.client.HTTPConnection(*address(edge), timeout=10)
    listing.request("GET", f"{BASE}/tasks/t/turns/0", headers={"Authorization": f"Bearer {secret}"})
    assert json.loads(listing.getresponse().read())["artifacts"] == []
    listing.close()


def test_request_line_too_long_is_414_json_in_each_apis_shape(edge: Server) -> None:
    long = "a" * 5000
    status, _, body = exchange(
        edge, f"GET {BASE}/tasks?x={long} HTTP/1.1\r\nHost: h\r\n\r\n".encode()
    )
    assert (
        status == 414 and set(body) == {"detail"} and "Request Line is too large" in body["detail"]
    )
    status, headers, body = exchange(
        edge, f"GET {STORES}?x={long} HTTP/1.1\r\nHost: h\r\n\r\n".encode()
    )
    assert status == 414 and body["error"]["type"] == "invalid_request_error"
    assert body["type"] == "error" and body["request_id"] == f"req_{headers['x-correlation-id']}"


@pytest.mark.parametrize(
    "headers",
    [
        pytest.param("X-Big: " + "b" * 9000 + "\r\n", id="one-field-too-large"),
        pytest.param("".join(f"X-{i}: {'c' * 8000}\r\n" for i in range(9)), id="head-over-64k"),
        pytest.param("".join(f"X-{i}: c\r\n" for i in range(101)), id="too-many-fields"),
    ],
)
def test_header_fields_too_large_is_431_json(edge: Server, headers: str) -> None:
    for path, stores in ((f"{BASE}/tasks", False), (f"{STORES}/x", True)):
        status, _, body = exchange(
            edge, f"GET {path} HTTP/1.1\r\nHost: h\r\n{headers}\r\n".encode()
        )
        assert status == 431, body
        if stores:
            assert body["error"]["type"] == "invalid_request_error", body
        else:
            assert set(body) == {"detail"} and body["detail"], body


@pytest.mark.parametrize(
    "request_bytes",
    [
        pytest.param(b"GET /healthz HTTP/9.9\r\nHost: h\r\n\r\n", id="version"),
        pytest.param(b"GET /healthz HTTP/1.1\nHost: h\n\n", id="bare-lf"),
        pytest.param(b"GET /healthz HTTP/1.1\r\nBad Header: x\r\n\r\n", id="header-name"),
    ],
)
def test_bad_request_is_400_json(edge: Server, request_bytes: bytes) -> None:
    status, _, body = exchange(edge, request_bytes)
    assert status == 400 and set(body) == {"detail"} and body["detail"].startswith("Bad Request")


def test_keep_alive_and_pipelined_requests_still_work(edge: Server) -> None:
    one = b"GET /healthz HTTP/1.1\r\nHost: h\r\n\r\n"
    with socket.create_connection(address(edge), timeout=10) as sock:
        sock.sendall(one * 3 + one[:10])  # three whole requests and the start of a fourth
        time.sleep(0.3)
        sock.sendall(one[10:-2] + b"Connection: close\r\n\r\n")
        raw = b""
        while chunk := sock.recv(65536):
            raw += chunk
    assert raw.count(b"HTTP/1.1 200 OK") == 4, raw


def test_a_body_at_an_ordinary_pace_is_stored(edge: Server) -> None:
    secret = edge.token("writer")
    head = (
        f"PUT {BASE}/tasks/p/turns/0/artifacts/a.bin HTTP/1.1\r\nHost: h\r\n"
        f"Authorization: Bearer {secret}\r\nContent-Length: 3000\r\nConnection: close\r\n\r\n"
    ).encode()
    turn = http.client.HTTPConnection(*address(edge), timeout=10)
    turn.request(
        "PUT", f"{BASE}/tasks/p/turns/0", body=b"{}", headers={"Authorization": f"Bearer {secret}"}
    )
    assert turn.getresponse().status == 200
    turn.close()
    with socket.create_connection(address(edge), timeout=30) as sock:
        sock.sendall(head)
        for _ in range(3):  # 1000 bytes/s: above the floor, with pauses under the gap
            sock.sendall(b"z" * 1000)
            time.sleep(1)
        raw = b""
        while chunk := sock.recv(65536):
            raw += chunk
    status, _, body = parse_answer(raw)
    assert status == 200 and json.loads(body)["size"] == 3000, raw
