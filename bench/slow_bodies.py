"""Slow request bodies from anonymous clients, against /healthz and another tenant's list.

    python -m bench.slow_bodies [--base DIR] [--backends tree,pg] [--clients 200] [--rate 1536]
                                [--sizes 4096,1048576] [--seconds 40] [--warmup 5]

Each backend (the tree; PostgreSQL + SeaweedFS as tools/services.py starts them) gets a real
gunicorn from this checkout and, with ``--base``, from another checkout (its code, this venv's
packages), one after the other, with the default 2 workers of 16 threads. ``--clients`` slow
clients, driven by one thread, send a request head and then a body at ``--rate`` bytes/s each,
with no credential: ``POST /console/signin`` (a form), ``POST /mcp``, ``PUT`` of a turn and
``POST /v1/memory_stores``, each with a body of each of ``--sizes`` bytes in turn. A client that
is answered or cut off opens a new connection and starts again, so the load stays at
``--clients`` bodies in flight. Meanwhile one client asks for ``/healthz`` and for another
tenant's task list in turn, each on a new connection with a ``--poll-timeout`` second timeout
(a request that runs out counts as that many seconds), every 0.1 s.

Prints the p50, p99 and max of both, what the slow clients were answered, and with ``--base``
this / base of each p99. Never part of `make test`; nothing asserts on time.
"""

from __future__ import annotations

import argparse
import collections
import http.client
import itertools
import os
import selectors
import shutil
import socket
import statistics
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tools.services import Postgres, Seaweed, scratch_dir

from . import servers
from .run import machine

API = "/sandbox/memory/v1"
TICK = 0.2  # seconds between two sends of one client
# (method, path, content type) of each body an anonymous client can send.
TARGETS = (
    ("POST", "/console/signin", "application/x-www-form-urlencoded"),
    ("POST", "/mcp", "application/json"),
    ("PUT", f"{API}/tasks/slow/turns/0", "application/json"),
    ("POST", "/v1/memory_stores", "application/json"),
)


@dataclass
class Slow:
    """One slow client: its socket, what is left of its body, and when it sends next."""

    head: bytes
    size: int
    sock: socket.socket | None = None
    left: int = 0
    answer: bytes = b""
    due: float = 0.0


@dataclass
class SlowLoad:
    """``clients`` slow bodies in flight against ``address``, in one thread, until stopped."""

    address: tuple[str, int]
    clients: int
    rate: int
    sizes: list[int]
    answers: collections.Counter[str] = field(default_factory=collections.Counter)
    stop: threading.Event = field(default_factory=threading.Event)

    def run(self) -> None:
        plan = itertools.cycle(itertools.product(TARGETS, self.sizes))
        slows = []
        for _ in range(self.clients):
            (method, path, ctype), size = next(plan)
            head = (
                f"{method} {path} HTTP/1.1\r\nHost: {self.address[0]}\r\n"
                f"Content-Type: {ctype}\r\nContent-Length: {size}\r\n\r\n"
            ).encode()
            slows.append(Slow(head, size))
        step = max(1, int(self.rate * TICK))
        with selectors.DefaultSelector() as selector:
            started = time.monotonic()
            for i, slow in enumerate(slows):
                # Spread the first sends over one tick so the server never sees them in step.
                self._open(slow, selector, started + TICK * i / len(slows))
            while not self.stop.is_set():
                for key, _ in selector.select(TICK / 4):
                    self._readable(key.data, selector)
                now = time.monotonic()
                for slow in slows:
                    if slow.sock is None:
                        self._open(slow, selector, now)
                    elif slow.left and slow.due <= now:
                        piece = min(step, slow.left)
                        try:
                            slow.sock.send(b"a" * piece)
                        except OSError:
                            self._close(slow, selector, "reset while sending")
                            continue
                        slow.left -= piece
                        slow.due += TICK
            for slow in slows:
                if slow.sock is not None:
                    slow.sock.close()

    def _open(self, slow: Slow, selector: selectors.BaseSelector, due: float) -> None:
        try:
            sock = socket.create_connection(self.address, timeout=5)
            sock.sendall(slow.head)
        except OSError:
            self.answers["connect failed"] += 1
            return
        sock.setblocking(False)
        slow.sock, slow.left, slow.answer, slow.due = sock, slow.size, b"", due
        selector.register(sock, selectors.EVENT_READ, slow)

    def _readable(self, slow: Slow, selector: selectors.BaseSelector) -> None:
        assert slow.sock is not None
        try:
            data = slow.sock.recv(65536)
        except BlockingIOError:
            return
        except OSError:
            data = b""
        slow.answer += data
        if not data:
            status = slow.answer[9:12].decode("latin-1") if slow.answer else "closed unanswered"
            self._close(slow, selector, status)

    def _close(self, slow: Slow, selector: selectors.BaseSelector, outcome: str) -> None:
        assert slow.sock is not None
        selector.unregister(slow.sock)
        slow.sock.close()
        slow.sock = None
        self.answers[outcome] += 1


def timed_get(
    address: tuple[str, int], path: str, headers: dict[str, str], timeout: float
) -> float:
    """Seconds one GET on a new connection took; ``timeout`` when it failed or ran out."""
    started = time.perf_counter()
    conn = http.client.HTTPConnection(*address, timeout=timeout)
    try:
        conn.request("GET", path, headers=headers)
        resp = conn.getresponse()
        resp.read()
        if resp.status != 200:
            return timeout
    except OSError:
        return timeout
    finally:
        conn.close()
    return min(timeout, time.perf_counter() - started)


def p99(values: list[float]) -> float:
    return sorted(values)[max(0, int(len(values) * 0.99 + 0.5) - 1)]


def measure(server: servers.Server, token: str, args: argparse.Namespace) -> dict[str, Any]:
    address = (server.host, server.port)
    load = SlowLoad(address, args.clients, args.rate, args.sizes)
    driver = threading.Thread(target=load.run, daemon=True)
    driver.start()
    time.sleep(args.warmup)
    auth = {"Authorization": f"Bearer {token}"}
    health: list[float] = []
    lists: list[float] = []
    deadline = time.monotonic() + args.seconds
    while time.monotonic() < deadline:
        health.append(timed_get(address, "/healthz", {}, args.poll_timeout))
        lists.append(timed_get(address, f"{API}/tasks?limit=5", auth, args.poll_timeout))
        time.sleep(0.1)
    load.stop.set()
    driver.join(timeout=30)
    return {
        "healthz": {"p50": statistics.median(health), "p99": p99(health), "max": max(health)},
        "list": {"p50": statistics.median(lists), "p99": p99(lists), "max": max(lists)},
        "polls": len(health),
        "slow_answers": dict(load.answers),
        "load_avg": os.getloadavg(),
    }


def start(name: str, checkout: Path, workdir: Path, env: dict[str, str]) -> servers.Server:
    import subprocess

    workdir.mkdir(parents=True, exist_ok=True)
    port = servers.free_port()
    full = servers.gunicorn_env(workdir, port, PYTHONPATH=str(checkout), **env)
    args = [str(servers.VENV_BIN / "gunicorn"), "-c", "gunicorn.conf.py", "wsgi:app"]
    log_path = workdir / f"{name}-{port}.log"
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(
            args, cwd=checkout, env=full, stdout=log, stderr=subprocess.STDOUT,
            start_new_session=True,
        )  # fmt: skip
    server = servers.Server(name, port, proc, full, log_path)
    servers._wait_up(proc, f"{server.url}/healthz", log_path, 60)
    return server


def other_tenant(server: servers.Server, checkout: Path) -> str:
    """A writer token of another tenant, with one task to list."""
    import subprocess

    args = [str(servers.VENV_BIN / "flask"), "--app", "wsgi", "tokens", "create"]
    args += ["--role", "writer", "--tenant", "other", "--project", "web"]
    out = subprocess.run(
        args, cwd=checkout, env=server.env, capture_output=True, text=True, timeout=60, check=True
    ).stdout
    token = out.strip().splitlines()[-1]
    conn = http.client.HTTPConnection(server.host, server.port, timeout=30)
    conn.request(
        "PUT",
        f"{API}/tasks/t/turns/0",
        body=b'{"summary_md": "one turn"}',
        headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"},
    )
    assert conn.getresponse().status == 200
    conn.close()
    return token


def run_backend(name: str, sides: dict[str, Path], args: argparse.Namespace) -> dict[str, Any]:
    workdir = scratch_dir("pm-bench-slow-") if name == "pg" else Path(tempfile.mkdtemp())
    env = {"MEMORY_WORKERS": "2", "MEMORY_THREADS": "16"}
    services: list[Any] = []
    results: dict[str, Any] = {}
    try:
        if name == "pg":
            pg = Postgres(workdir / "pg", durable=False).start()
            s3 = Seaweed(workdir / "s3").start()
            services += [s3, pg]
            os.environ.update(s3.env())
        for side, checkout in sides.items():
            if name == "pg":
                env |= {
                    "MEMORY_DATABASE_URL": pg.database(f"slow_{side}"),
                    "MEMORY_BLOB_URL": f"s3://{s3.bucket}/{side}",
                    "MEMORY_S3_ENDPOINT_URL": s3.endpoint,
                }
            server = start(side, checkout, workdir / side, env)
            try:
                results[side] = measure(server, other_tenant(server, checkout), args)
            finally:
                server.stop()
            got = results[side]
            print(
                f"{name} {side}: {args.clients} slow bodies at {args.rate} B/s;"
                f" /healthz p50 {got['healthz']['p50']:.3f} p99 {got['healthz']['p99']:.3f}"
                f" max {got['healthz']['max']:.2f} s; other tenant's list p50"
                f" {got['list']['p50']:.3f} p99 {got['list']['p99']:.3f}"
                f" max {got['list']['max']:.2f} s ({got['polls']} polls each, load"
                f" {got['load_avg'][0]:.1f}); slow clients answered {got['slow_answers']}"
            )
    finally:
        for service in services:
            service.stop()
        shutil.rmtree(workdir, ignore_errors=True)
    if "base" in results:
        for what in ("healthz", "list"):
            ratio = results["this"][what]["p99"] / results["base"][what]["p99"]
            print(f"{name} {what} p99 this / base: {ratio:.3f}")
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--base", type=Path, help="another checkout, measured after this one")
    parser.add_argument("--backends", default="tree,pg")
    parser.add_argument("--clients", type=int, default=200)
    parser.add_argument("--rate", type=int, default=1536, help="bytes/s of each slow client")
    parser.add_argument("--sizes", default="4096,1048576", help="body sizes, bytes")
    parser.add_argument("--seconds", type=float, default=40.0)
    parser.add_argument("--warmup", type=float, default=5.0)
    parser.add_argument("--poll-timeout", type=float, default=10.0)
    args = parser.parse_args()
    args.sizes = [int(s) for s in args.sizes.split(",")]
    sides = {"this": servers.REPO}
    if args.base:
        sides["base"] = args.base.resolve()
    print(f"machine: {machine()}")
    for name in args.backends.split(","):
        run_backend(name, sides, args)


if __name__ == "__main__":
    main()
