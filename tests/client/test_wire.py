"""The hooks' HTTP/1.1 (agents/wire.py) against servers on 127.0.0.1 that answer the ways a
server, a proxy in front of it, or a broken one can: real sockets, one thread each."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable, Iterator

import pytest
from project_memory_client.agents.wire import Connection, HookClient
from project_memory_client.errors import NotFound, ServerUnreachable
from project_memory_client.settings import Settings

Handler = Callable[[socket.socket, int], None]


def _read_request(conn: socket.socket) -> bytes:
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = conn.recv(65536)
        if not chunk:
            return data
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    for line in head.split(b"\r\n"):
        if line.lower().startswith(b"content-length:"):
            length = int(line.split(b":", 1)[1])
            while len(body) < length:
                body += conn.recv(65536)
    return head


@pytest.fixture
def serve() -> Iterator[Callable[[Handler], tuple[str, list[bytes]]]]:
    """A server that runs ``handler(connection, n)`` for its n-th connection."""
    listeners: list[socket.socket] = []

    def start(handler: Handler) -> tuple[str, list[bytes]]:
        heads: list[bytes] = []
        sock = socket.socket()
        sock.bind(("127.0.0.1", 0))
        sock.listen(8)
        listeners.append(sock)

        def loop() -> None:
            n = 0
            while True:
                try:
                    conn, _ = sock.accept()
                except OSError:
                    return
                threading.Thread(target=handler, args=(conn, n), daemon=True).start()
                n += 1

        threading.Thread(target=loop, daemon=True).start()
        return f"http://127.0.0.1:{sock.getsockname()[1]}", heads

    yield start
    for sock in listeners:
        sock.close()


def _answer(body: bytes, extra: str = "") -> bytes:
    return (
        f"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {len(body)}\r\n"
        f"{extra}\r\n"
    ).encode() + body


def test_answers_with_a_length_chunked_and_to_the_close(serve) -> None:  # type: ignore[no-untyped-def]
    def handler(conn: socket.socket, n: int) -> None:
        with conn:
            _read_request(conn)
            conn.sendall(_answer(b'{"a": 1}'))
            _read_request(conn)
            conn.sendall(
                b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
                b'3;x=y\r\n{"b\r\n5\r\n": 2}\r\n0\r\nTrailer: t\r\n\r\n'
            )
            _read_request(conn)
            conn.sendall(b"HTTP/1.1 200 OK\r\n\r\nto the end")

    url, _ = serve(handler)
    connection = Connection(url)
    assert connection.request("GET", "/x", {}, None, 5).json() == {"a": 1}
    assert connection.request("GET", "/x", {}, None, 5).json() == {"b": 2}
    assert connection.request("GET", "/x", {}, None, 5).body == b"to the end"
    assert connection.sock is None  # an answer read to the close ends the connection


def test_a_connection_closed_while_idle_is_opened_again(serve) -> None:  # type: ignore[no-untyped-def]
    """Keep-alive: the server may close an idle connection at any time; a request that found
    it closed never reached the server, and goes again on a new one."""
    seen: list[int] = []

    def handler(conn: socket.socket, n: int) -> None:
        with conn:
            _read_request(conn)
            seen.append(n)
            conn.sendall(_answer(b"{}"))  # and closes, without saying so

    url, _ = serve(handler)
    connection = Connection(url)
    for _ in range(3):
        assert connection.request("PUT", "/x", {}, b"body", 5).status == 200
        time.sleep(0.05)
    connection.close()
    assert seen == [0, 1, 2]


def test_no_answer_and_a_broken_one_are_unreachable(serve) -> None:  # type: ignore[no-untyped-def]
    held: list[socket.socket] = []

    def silent(conn: socket.socket, n: int) -> None:
        held.append(conn)  # reads nothing, answers nothing

    def garbage(conn: socket.socket, n: int) -> None:
        with conn:
            _read_request(conn)
            conn.sendall(b"SSH-2.0-OpenSSH_9.6\r\n\r\n")

    settings = Settings(url=serve(silent)[0], token="pm_" + "x" * 24)
    started = time.monotonic()
    client = HookClient(settings, deadline=time.monotonic() + 0.5)
    with pytest.raises(ServerUnreachable, match="no answer within the hook's time"):
        client.get_task("t")
    assert 0.4 < time.monotonic() - started < 2.0
    with pytest.raises(ServerUnreachable, match="time is up"):
        client.get_task("t")  # past the deadline: not even tried
    broken = HookClient(
        Settings(url=serve(garbage)[0], token="pm_" + "x" * 24), deadline=time.monotonic() + 5
    )
    with pytest.raises(ServerUnreachable, match="not an HTTP answer"):
        broken.get_task("t")
    refused = socket.socket()
    refused.bind(("127.0.0.1", 0))
    port = refused.getsockname()[1]
    refused.close()
    nobody = HookClient(
        Settings(url=f"http://127.0.0.1:{port}", token="pm_" + "x" * 24),
        deadline=time.monotonic() + 5,
    )
    with pytest.raises(ServerUnreachable, match="refused"):
        nobody.get_task("t")
    for each in (client, broken, nobody):
        each.close()
    for conn in held:
        conn.close()


def test_errors_are_the_clients_own(serve) -> None:  # type: ignore[no-untyped-def]
    def handler(conn: socket.socket, n: int) -> None:
        with conn:
            head = _read_request(conn)
            assert b"Authorization: Bearer pm_" in head and b"Host: 127.0.0.1:" in head
            body = b'{"detail": "task t not found"}'
            conn.sendall(
                f"HTTP/1.1 404 Not Found\r\nContent-Length: {len(body)}\r\n"
                "x-correlation-id: 01KCORR\r\n\r\n".encode()
                + body
            )

    client = HookClient(
        Settings(url=serve(handler)[0], token="pm_" + "x" * 24), deadline=time.monotonic() + 5
    )
    with pytest.raises(NotFound) as caught:
        client.get_task("t")
    assert caught.value.message == "task t not found"
    assert caught.value.correlation_id == "01KCORR"
    client.close()
