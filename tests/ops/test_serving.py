"""The pieces of the gunicorn worker that need no server: the body floor, how far a body is read
ahead in the event loop, and the error answers."""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Iterator

import pytest

from app.ops.serving import ChunkScan, ReadAhead, body_framing, error_response, target_path
from app.web.body import READ_AHEAD_BYTES, BodyPace, ClientTooSlow, Limits


@pytest.fixture
def pair() -> Iterator[tuple[socket.socket, socket.socket]]:
    server, client = socket.socketpair()
    with server, client:
        yield server, client


def drip(sock: socket.socket, every: float, count: int) -> threading.Thread:
    """Send ``count`` bytes, byte i at ``every * (i + 1)`` seconds from now: on a schedule,
    so that a sleep a busy machine stretches is made up by the next, and the rate holds."""
    start = time.monotonic()

    def run() -> None:
        for i in range(count):
            time.sleep(max(0.0, start + every * (i + 1) - time.monotonic()))
            try:
                sock.sendall(b"x")
            except OSError:  # the test is over and closed the pair
                return

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


def test_a_gap_longer_than_the_body_timeout_is_cut_off(
    pair: tuple[socket.socket, socket.socket],
) -> None:
    server, client = pair
    pace = BodyPace(server, gap=0.3, min_rate=0)
    client.sendall(b"ab")
    assert pace.recv(10) == b"ab"
    started = time.monotonic()
    with pytest.raises(ClientTooSlow, match="no request body bytes for 0.3 s"):
        pace.recv(10)
    assert 0.25 < time.monotonic() - started < 1.0
    assert pace.cut_off == "no request body bytes for 0.3 s"
    assert server.gettimeout() is None  # writing the answer is not bounded by the floor


def test_a_body_below_the_minimum_rate_is_cut_off_though_no_gap_is_too_long(
    pair: tuple[socket.socket, socket.socket],
) -> None:
    server, client = pair
    # A byte every 0.2 s: no gap reaches 0.5 s, but 5 bytes/s is below 20 bytes/s, so after the
    # 0.5 s of slack the floor (t - 0.5) * 20 overtakes the bytes received.
    drip(client, 0.2, 20)
    pace = BodyPace(server, gap=0.5, min_rate=20)
    received = b""
    started = time.monotonic()
    with pytest.raises(ClientTooSlow, match="slower than 20 bytes/s"):
        while True:
            received += pace.recv(10)
    assert 0.5 < time.monotonic() - started < 1.5 and received


def test_a_body_at_the_rate_is_not_cut_off(pair: tuple[socket.socket, socket.socket]) -> None:
    server, client = pair
    drip(client, 0.02, 50)  # 50 bytes/s for a second
    pace = BodyPace(server, gap=0.3, min_rate=20)
    received = b""
    while len(received) < 50:
        received += pace.recv(10)
    assert pace.cut_off is None


def test_the_callers_own_deadline_is_no_verdict_on_the_client(
    pair: tuple[socket.socket, socket.socket],
) -> None:
    server, _ = pair
    pace = BodyPace(server, gap=5, min_rate=0)
    pace.settimeout(0.1)  # how gunicorn bounds its drain of an unread body
    with pytest.raises(TimeoutError) as caught:
        pace.recv(10)
    assert not isinstance(caught.value, ClientTooSlow) and pace.cut_off is None
    pace.settimeout(None)
    assert pace.gettimeout() is None


def test_each_request_starts_its_own_clock(pair: tuple[socket.socket, socket.socket]) -> None:
    server, client = pair
    pace = BodyPace(server, gap=0.2, min_rate=1000)
    time.sleep(0.3)  # the connection sat in keep-alive: no body was owed meanwhile
    pace.start()
    client.sendall(b"y")
    assert pace.recv(1) == b"y"


def test_limits_default_to_the_settings_table() -> None:
    assert Limits.from_config(None) == Limits(10.0, 30.0, 1024)
    assert Limits.from_config({"HEADER_TIMEOUT": 2.5}).header_timeout == 2.5


@pytest.mark.parametrize(
    ("head", "path"),
    [
        (b"GET /v1/memory_stores?limit=5 HTTP/1.1\r\nHost: x\r\n", "/v1/memory_stores"),
        (b"\r\nPUT /sandbox/memory/v1/tasks/t HTTP/1.1\r\n", "/sandbox/memory/v1/tasks/t"),
        (b"GET /v1/mem", "/v1/mem"),
        (b"GET", None),
        (b"", None),
    ],
)
def test_target_path_reads_the_request_line(head: bytes, path: str | None) -> None:
    assert target_path(head) == path


def test_error_answers_are_json_in_each_apis_shape() -> None:
    raw = error_response(408, "Request Timeout", "too slow", "/v1/memory_stores/memstore_x")
    head, _, body = raw.partition(b"\r\n\r\n")
    lines = head.decode().split("\r\n")
    headers = dict(line.split(": ", 1) for line in lines[1:])
    assert lines[0] == "HTTP/1.1 408 Request Timeout" and headers["Connection"] == "close"
    assert headers["Content-Type"] == "application/json"
    assert int(headers["Content-Length"]) == len(body)
    assert json.loads(body) == {
        "type": "error",
        "error": {"type": "timeout_error", "message": "too slow"},
        "request_id": f"req_{headers['x-correlation-id']}",
    }
    for path in ("/sandbox/memory/v1/tasks", None):
        plain = error_response(431, "Request Header Fields Too Large", "big", path)
        assert json.loads(plain.partition(b"\r\n\r\n")[2]) == {"detail": "big"}


def test_the_loop_and_a_thread_keep_the_same_floor(
    pair: tuple[socket.socket, socket.socket],
) -> None:
    server, _ = pair
    pace = BodyPace(server, gap=10, min_rate=100)
    pace.received = 500  # 5 s of floor earned
    deadline, reason = pace.due(pace.started)
    assert deadline == pytest.approx(pace.started + 10) and reason.startswith("no request body")
    deadline, reason = pace.due(pace.started + 8)
    assert deadline == pytest.approx(pace.started + 15)
    assert reason == "request body slower than 100 bytes/s"


def head(*fields: str, line: str = "POST /console/signin HTTP/1.1") -> bytes:
    return "\r\n".join([line, "Host: h", *fields, "", ""]).encode()


@pytest.mark.parametrize(
    ("request_head", "framing"),
    [
        (head(), None),
        (head("Content-Length: 0"), None),
        (head("Content-Length: 12"), (12, False)),
        (head("content-length:\t70000 "), (70000, False)),
        (head("Transfer-Encoding: chunked"), (None, False)),
        (head("Transfer-Encoding: gzip, Chunked"), (None, False)),
        (head("Content-Length: 5", "Expect: 100-Continue"), (5, True)),
        (head("Content-Length: 5", "Expect: 100-continue", line="POST / HTTP/1.0"), (5, False)),
        (b"\r\n" + head("Content-Length: 3"), (3, False)),
    ],
)
def test_body_framing_reads_the_length_or_chunks(
    request_head: bytes, framing: tuple[int | None, bool] | None
) -> None:
    assert body_framing(request_head) == framing


@pytest.mark.parametrize(
    "request_head",
    [
        head("Content-Length: 5", "Content-Length: 5"),
        head("Content-Length: +5"),
        head("Content-Length: 5", "Transfer-Encoding: chunked"),
        head("Transfer-Encoding: chunked, gzip"),
        head("Transfer-Encoding: chunked", line="POST / HTTP/1.0"),
        head("Content-Length: 5", "Expect: something"),
        head("No colon here"),
        b"POST / HTTP/1.1\r\nHost: h\nContent-Length: 5\r\n\r\n",
    ],
)
def test_a_framing_gunicorn_refuses_is_not_read_ahead(request_head: bytes) -> None:
    with pytest.raises(ValueError):
        body_framing(request_head)


CHUNKED = b"5;ext=1\r\nhello\r\n1a\r\n" + b"z" * 26 + b"\r\n0\r\nX-Trailer: t\r\n\r\n"


@pytest.mark.parametrize("step", [1, 2, 7, len(CHUNKED)])
def test_a_chunked_body_ends_where_its_last_chunk_and_trailers_do(step: int) -> None:
    data = bytearray(b"HEAD")
    scan = ChunkScan(len(data))
    for at in range(0, len(CHUNKED), step):
        assert scan.ended(data) is False
        data += CHUNKED[at : at + step]
    assert scan.ended(data) is True and scan.pos == len(data)


def test_the_chunk_scan_resumes_where_it_stopped() -> None:
    # A size line trickled a byte at a time is searched once, not once per byte.
    data = bytearray()
    scan = ChunkScan(0)
    for byte in b"0" * 5000:
        data.append(byte)
        assert scan.ended(data) is False
        assert scan.searched == len(data)
    data += b"\r\n\r\n"
    assert scan.ended(data) is True


@pytest.mark.parametrize(
    "body",
    [b"zz\r\nab\r\n0\r\n\r\n", b"2\r\nabc\r\n0\r\n\r\n", b"-1\r\n", b"\r\n"],
)
def test_a_malformed_chunked_body_stops_the_read_ahead(body: bytes) -> None:
    ahead = ReadAhead(0, None)
    assert ahead.ended(bytearray(body)) is None


def test_a_read_ahead_stops_at_its_bound() -> None:
    ahead = ReadAhead(4, 10)
    assert ahead.ended(bytearray(b"HEADshort")) is False
    assert ahead.ended(bytearray(b"HEAD0123456789")) is True
    chunks = ReadAhead(0, None)
    body = bytearray(b"%x\r\n" % (2 * READ_AHEAD_BYTES))
    while len(body) <= READ_AHEAD_BYTES:
        assert chunks.ended(body) is False
        body += b"c" * 4096
    assert chunks.ended(body) is None  # handed on: the thread reads the rest
