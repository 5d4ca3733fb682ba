"""Slow and malformed clients against a real gunicorn (gunicorn.conf.py's worker, 2 workers).

* 50 connections trickling header lines and 9 authenticated uploads trickling a body byte every
  3 s leave /healthz answering in under 1 s throughout, and are all cut off with 408 JSON;
* 200 anonymous clients trickling bodies at 1.5 KB/s (the console's sign-in form, /mcp, the
  APIs) leave /healthz and another tenant's list under 1 s p99, on each backend;
* a small body is read before a thread serves its request, a larger one only for a known
  sender, and by at most half the threads at once: the others wait holding no thread;
* the answers gunicorn writes itself (414, 431, 400) are JSON in each API's error shape.

The first two and the "at most half the threads" case hold a server for 15 to 40 s each:
they run in `make slow` (CI runs it after `make test`), the rest in `make test`.
"""

from __future__ import annotations

import collections
import contextlib
import http.client
import itertools
import json
import re
import selectors
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from app.web.body import READ_AHEAD_BYTES
from tests.conftest import selected_backends
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


@pytest.mark.slow
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


def test_pipelined_requests_with_bodies_are_each_answered(edge: Server) -> None:
    # Each body is read ahead up to its end, and no further: the next request is the next
    # request, whole or in part.
    secret = edge.token("writer")
    one = (
        f"PUT {BASE}/tasks/pipe/turns/{{n}} HTTP/1.1\r\nHost: h\r\nAuthorization: Bearer {secret}"
        "\r\nContent-Type: application/json\r\nContent-Length: {length}\r\n{close}\r\n{body}"
    )
    sent = b""
    for n in range(3):
        body = json.dumps({"summary_md": f"turn {n} " + "p" * 3000})
        close = "Connection: close\r\n" if n == 2 else ""
        sent += one.format(n=n, length=len(body), close=close, body=body).encode()
    with socket.create_connection(address(edge), timeout=10) as sock:
        sock.sendall(sent[:5000])
        time.sleep(0.3)
        sock.sendall(sent[5000:])
        raw = b""
        while chunk := sock.recv(65536):
            raw += chunk
    assert raw.count(b"HTTP/1.1 200 OK") == 3, raw[:600]


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


# -- slow anonymous bodies ------------------------------------------------------------------
SLOW_RATE = 1536  # bytes/s: above the default floor of 1024 bytes/s, so never cut off
TICK = 0.2
# (method, path, content type) of the bodies a client with no credential can send.
ANONYMOUS_BODIES = (
    ("POST", "/console/signin", "application/x-www-form-urlencoded"),
    ("POST", "/mcp", "application/json"),
    ("PUT", f"{BASE}/tasks/slow/turns/0", "application/json"),
    ("POST", STORES, "application/json"),
)
# Small bodies take 5 to 40 s at SLOW_RATE; the large one is refused on its head.
SLOW_SIZES = (8 * 1024, 60 * 1024, 1 << 20)


class SlowBodies(threading.Thread):
    """``count`` connections, each sending a request head and then its body at SLOW_RATE; one
    that is answered starts again on a new connection half a second later. One thread."""

    def __init__(self, server: Server, count: int) -> None:
        super().__init__(daemon=True)
        self.address = address(server)
        plan = itertools.cycle(itertools.product(ANONYMOUS_BODIES, SLOW_SIZES))
        self.heads = []
        for _ in range(count):
            (method, path, ctype), size = next(plan)
            self.heads.append(
                (
                    f"{method} {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: {ctype}\r\n"
                    f"Content-Length: {size}\r\n\r\n"
                ).encode()
            )
        self.answers: collections.Counter[str] = collections.Counter()
        self.stop = threading.Event()
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            self._run()
        except BaseException as exc:  # noqa: BLE001 - reported by the test
            self.error = exc

    def _run(self) -> None:
        step = int(SLOW_RATE * TICK)
        # Per connection: [socket or None, body bytes left, next send, answer so far]
        state: list[list[Any]] = []
        with selectors.DefaultSelector() as selector:
            now = time.monotonic()
            for i in range(len(self.heads)):
                state.append([None, 0, now + TICK * i / len(self.heads), b""])
            while not self.stop.is_set():
                for key, _ in selector.select(TICK / 4):
                    entry = state[key.data]
                    try:
                        chunk = entry[0].recv(65536)
                    except OSError:
                        chunk = b""
                    entry[3] += chunk
                    if not chunk:
                        selector.unregister(entry[0])
                        entry[0].close()
                        self.answers[entry[3][9:12].decode() or "closed unanswered"] += 1
                        entry[:] = [None, 0, time.monotonic() + 0.5, b""]
                now = time.monotonic()
                for i, entry in enumerate(state):
                    if entry[2] > now:
                        continue
                    if entry[0] is None:
                        sock = socket.create_connection(self.address, timeout=10)
                        sock.sendall(self.heads[i])
                        sock.setblocking(False)
                        selector.register(sock, selectors.EVENT_READ, i)
                        length = int(self.heads[i].split(b"Content-Length: ")[1].split(b"\r")[0])
                        entry[:] = [sock, length, now + TICK, b""]
                    elif entry[1]:
                        piece = min(step, entry[1])
                        try:
                            entry[0].send(b"a" * piece)
                        except BlockingIOError:
                            pass  # the server is not reading it: a refused body
                        except OSError:
                            continue  # reset after an answer; the selector sees the close
                        else:
                            entry[1] -= piece
                        entry[2] += TICK
            for entry in state:
                if entry[0] is not None:
                    entry[0].close()


def auth_of(secret: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {secret}"}


def timed_get(server: Server, path: str, headers: dict[str, str]) -> float:
    """Seconds a GET on a new connection took (10 s when it failed or ran out)."""
    started = time.monotonic()
    conn = http.client.HTTPConnection(*address(server), timeout=10)
    try:
        conn.request("GET", path, headers=headers)
        resp = conn.getresponse()
        resp.read()
        if resp.status != 200:
            return 10.0
    except OSError:
        return 10.0
    finally:
        conn.close()
    return time.monotonic() - started


def p99(values: list[float]) -> float:
    return sorted(values)[max(0, round(len(values) * 0.99) - 1)]


@pytest.fixture(params=selected_backends())
def default_server(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Server]:
    """2 workers of the default 16 threads, the default body floor, on each backend."""
    env = {"MEMORY_SWEEP_INTERVAL": "0"}
    if request.param == "pg":
        services = request.getfixturevalue("services")
        env |= {f"MEMORY_{k}": v for k, v in services.settings().items()}
    srv = start_server(tmp_path, workers=2, threads=None, env_extra=env)
    try:
        yield srv
    finally:
        srv.stop()


@pytest.mark.slow
def test_slow_anonymous_bodies_leave_health_and_another_tenants_list_answering(
    default_server: Server,
) -> None:
    server = default_server
    other = {"Authorization": f"Bearer {server.token('writer', tenant='other', project='p')}"}
    put = http.client.HTTPConnection(*address(server), timeout=30)
    put.request("PUT", f"{BASE}/tasks/t/turns/0", body=b"{}", headers=other)
    assert put.getresponse().status == 200
    put.close()

    slow = SlowBodies(server, 200)
    slow.start()
    time.sleep(3)  # every connection open and sending
    health: list[float] = []
    lists: list[float] = []
    window = time.monotonic() + 30
    while time.monotonic() < window:
        health.append(timed_get(server, "/healthz", {}))
        lists.append(timed_get(server, f"{BASE}/tasks?limit=5", other))
        time.sleep(0.1)
    slow.stop.set()
    slow.join(timeout=30)

    print(
        f"200 slow anonymous bodies: /healthz p99 {p99(health):.3f} s max {max(health):.3f} s,"
        f" another tenant's list p99 {p99(lists):.3f} s max {max(lists):.3f} s"
        f" ({len(health)} polls each); slow clients answered {dict(slow.answers)}"
    )
    assert slow.error is None, slow.error
    assert len(health) >= 50, len(health)
    assert p99(health) < 1.0 and p99(lists) < 1.0, (p99(health), p99(lists))
    # Every slow client was answered, and none with a server error: the small bodies once
    # whole (401, 403 from the sign-in form's check), the large ones on their head (401, 413).
    assert slow.answers and set(slow.answers) <= {"401", "403", "413"}, slow.answers
    assert slow.answers["413"] and slow.answers["403"], slow.answers


@pytest.fixture(scope="module")
def one_thread(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """One worker of one thread: whatever holds that thread stops every other request."""
    srv = start_server(tmp_path_factory.mktemp("one-thread"), workers=1, threads=1)
    try:
        yield srv
    finally:
        srv.stop()


def test_a_small_body_is_read_before_a_thread_serves_its_request(one_thread: Server) -> None:
    secret = one_thread.token("writer")
    # The sign-in form, sent a few bytes at a time over 3 s: the one thread stays free.
    page = http.client.HTTPConnection(*address(one_thread), timeout=10)
    page.request("GET", "/console/signin")
    resp = page.getresponse()
    cookie = resp.getheader("Set-Cookie", "").split(";", 1)[0]
    match = re.search(r'name="csrf" value="([^"]+)"', resp.read().decode())
    page.close()
    assert match is not None and cookie
    form = f"csrf={match.group(1)}&token={secret}".encode()
    with socket.create_connection(address(one_thread), timeout=10) as sock:
        sock.sendall(
            (
                f"POST /console/signin HTTP/1.1\r\nHost: 127.0.0.1\r\nCookie: {cookie}\r\n"
                "Content-Type: application/x-www-form-urlencoded\r\n"
                f"Content-Length: {len(form)}\r\nConnection: close\r\n\r\n"
            ).encode()
        )
        step = len(form) // 6 + 1
        for at in range(0, len(form), step):
            assert healthz_latency(one_thread) < 2.0
            sock.sendall(form[at : at + step])
            time.sleep(0.5)
        raw = b""
        while chunk := sock.recv(65536):
            raw += chunk
    status, headers, _ = parse_answer(raw)
    assert status == 303 and headers["location"].startswith("/console"), raw[:300]

    # A chunked JSON body, trickled the same way, is stored whole.
    body = json.dumps({"summary_md": "trickled " * 100}).encode()
    chunks = [body[i : i + 150] for i in range(0, len(body), 150)]
    with socket.create_connection(address(one_thread), timeout=10) as sock:
        sock.sendall(
            (
                f"PUT {BASE}/tasks/chunked/turns/0 HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                f"Authorization: Bearer {secret}\r\nContent-Type: application/json\r\n"
                "Transfer-Encoding: chunked\r\nConnection: close\r\n\r\n"
            ).encode()
        )
        for chunk in chunks:
            sock.sendall(b"%x\r\n%s\r\n" % (len(chunk), chunk))
            time.sleep(0.3)
            assert healthz_latency(one_thread) < 2.0
        sock.sendall(b"0\r\n\r\n")
        raw = b""
        while piece := sock.recv(65536):
            raw += piece
    status, _, answer = parse_answer(raw)
    assert status == 200 and json.loads(answer)["summary_md"] == "trickled " * 100, raw[:300]


def test_a_large_body_is_read_only_for_a_known_sender(one_thread: Server) -> None:
    def head_only(head: str) -> tuple[float, bytes]:
        started = time.monotonic()
        with socket.create_connection(address(one_thread), timeout=10) as sock:
            sock.sendall(head.encode())
            raw = b""
            while chunk := sock.recv(65536):
                raw += chunk
        return time.monotonic() - started, raw

    # The sign-in form reads its body before any credential: a large one is refused unread,
    # at once, and a client waiting for "100 Continue" is told to send without waiting.
    took, raw = head_only(
        "POST /console/signin HTTP/1.1\r\nHost: h\r\n"
        "Content-Type: application/x-www-form-urlencoded\r\nContent-Length: 1048576\r\n\r\n"
    )
    assert raw.startswith(b"HTTP/1.1 413") and took < 5, (took, raw[:300])
    assert b"is read only with a credential" in raw
    took, raw = head_only(
        "POST /console/signin HTTP/1.1\r\nHost: h\r\nExpect: 100-continue\r\n"
        "Content-Type: application/x-www-form-urlencoded\r\nContent-Length: 20\r\n\r\n"
    )
    assert raw.startswith(b"HTTP/1.1 417") and took < 5, (took, raw[:300])
    # The APIs check the credential before they read: 401, unread.
    for method, path in (("POST", "/mcp"), ("PUT", f"{BASE}/tasks/t/turns/0"), ("POST", STORES)):
        took, raw = head_only(
            f"{method} {path} HTTP/1.1\r\nHost: h\r\nContent-Type: application/json\r\n"
            "Content-Length: 1048576\r\n\r\n"
        )
        assert raw.startswith(b"HTTP/1.1 401") and took < 5, (path, took, raw[:300])
    assert healthz_latency(one_thread) < 2.0


class Upload(threading.Thread):
    """PUT ``size`` bytes of artifact ``name``, ``rate`` bytes/s (None: at once)."""

    def __init__(self, server: Server, secret: str, name: str, size: int, rate: float | None):
        super().__init__(daemon=True)
        self.server, self.secret, self.name, self.size, self.rate = server, secret, name, size, rate
        self.answer = b""
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            with socket.create_connection(address(self.server), timeout=60) as sock:
                sock.sendall(
                    (
                        f"PUT {BASE}/tasks/t/turns/0/artifacts/{self.name} HTTP/1.1\r\n"
                        f"Host: h\r\nAuthorization: Bearer {self.secret}\r\n"
                        f"Content-Length: {self.size}\r\nConnection: close\r\n\r\n"
                    ).encode()
                )
                piece = self.size if self.rate is None else int(self.rate / 4)
                with contextlib.suppress(OSError):  # answered before the end: read the answer
                    for at in range(0, self.size, piece):
                        sock.sendall(b"u" * min(piece, self.size - at))
                        if self.rate is not None:
                            time.sleep(0.25)
                while chunk := sock.recv(65536):
                    self.answer += chunk
        except BaseException as exc:  # noqa: BLE001 - reported by the test
            self.error = exc

    def status(self) -> int:
        self.join(timeout=60)
        assert self.error is None and self.answer, (self.name, self.error)
        return parse_answer(self.answer)[0]


@pytest.mark.slow
def test_at_most_half_the_threads_wait_on_request_bodies(tmp_path: Path) -> None:
    # One worker of two threads: one may read a body still coming from its client.
    server = start_server(tmp_path, workers=1, threads=2, env_extra={"MEMORY_BODY_TIMEOUT": "8"})
    try:
        secret = server.token("writer")
        turn = http.client.HTTPConnection(*address(server), timeout=10)
        turn.request("PUT", f"{BASE}/tasks/t/turns/0", body=b"{}", headers=auth_of(secret))
        assert turn.getresponse().status == 200
        turn.close()

        size = 2 * READ_AHEAD_BYTES
        first = Upload(server, secret, "first.bin", size, rate=size / 14)  # 14 s
        first.start()
        time.sleep(1)
        waits_too_long = Upload(server, secret, "late.bin", size, rate=size / 14)
        waits_too_long.start()
        started = time.monotonic()
        latencies = []
        while time.monotonic() - started < 9:  # the second waits, the other thread serves
            latencies.append(healthz_latency(server))
            time.sleep(0.2)
        assert max(latencies) < 1.0, max(latencies)
        # Past MEMORY_BODY_TIMEOUT of waiting: 503, JSON, Retry-After.
        assert waits_too_long.status() == 503
        _, headers, body = parse_answer(waits_too_long.answer)
        assert headers["retry-after"] == "1" and "retry shortly" in json.loads(body)["detail"]
        # One that waits less is served once the first is done.
        queued = Upload(server, secret, "queued.bin", size, rate=None)
        queued.start()
        assert healthz_latency(server) < 1.0
        assert first.status() == 200 and queued.status() == 200
    finally:
        server.stop()
