"""A closed-loop HTTP load generator: N clients, each with one keep-alive connection.

Clients are threads spread over a few forked processes (the GIL of one process would cap the
client side before a 2-core server), each running ``op(session, client, seq)`` in a loop. An
op is one unit of work (a "turn" may be several requests); we count ops and time each op.
Durations and op counts are bounded; only 127.0.0.1 servers started by the bench are loaded.

An op counts in the timed window when it *ends* in it (completions per second: the window's
edges cut as many ops at its start as at its end, however long an op takes). Counting only
the ops that both start and end in the window, as this file once did, drops up to one op per
client at each edge: nothing for an op of a few ms, most of them when an op takes as long as
the window (MLflow's records under load took 0.5-3.8 s against a 3 s window). That older
count is kept beside the new one (``Result.ops_inside``) so the two can be compared.
"""

from __future__ import annotations

import http.client
import multiprocessing as mp
import statistics
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


class BadStatus(Exception):
    pass


class Session:
    """One persistent HTTP/1.1 connection with default headers; reconnects when dropped."""

    def __init__(self, host: str, port: int, headers: dict[str, str] | None = None) -> None:
        self.host, self.port = host, port
        self.headers = headers or {}
        self.conn: http.client.HTTPConnection | None = None

    def _connect(self) -> http.client.HTTPConnection:
        if self.conn is None:
            self.conn = http.client.HTTPConnection(self.host, self.port, timeout=60)
        return self.conn

    def request(
        self,
        method: str,
        path: str,
        body: bytes | None = None,
        headers: dict[str, str] | None = None,
        expect: tuple[int, ...] = (200, 201),
    ) -> bytes:
        hdrs = {**self.headers, **(headers or {})}
        for attempt in (0, 1):
            conn = self._connect()
            try:
                conn.request(method, path, body=body, headers=hdrs)
                resp = conn.getresponse()
                data = resp.read()
                break
            except (http.client.RemoteDisconnected, ConnectionResetError, BrokenPipeError):
                # The server closed an idle keep-alive connection: reconnect once.
                conn.close()
                self.conn = None
                if attempt:
                    raise
        if resp.status not in expect:
            raise BadStatus(f"{method} {path} -> {resp.status}: {data[:200]!r}")
        if resp.getheader("Connection", "").lower() == "close":
            conn.close()
            self.conn = None
        return data

    def ttfb(self, method: str, path: str) -> tuple[float, float, int]:
        """Time to first byte and to last byte of one request (seconds), and the body size."""
        conn = self._connect()
        started = time.perf_counter()
        conn.request(method, path, headers=self.headers)
        resp = conn.getresponse()
        first = resp.read(1)
        ttfb = time.perf_counter() - started
        size = len(first)
        while chunk := resp.read(1 << 16):
            size += len(chunk)
        total = time.perf_counter() - started
        if resp.status != 200:
            raise BadStatus(f"{method} {path} -> {resp.status}")
        return ttfb, total, size

    def close(self) -> None:
        if self.conn is not None:
            self.conn.close()
            self.conn = None


Op = Callable[[Session, int, int], Any]


@dataclass
class Result:
    ops: int  # ops that ended in the timed window without error
    errors: int
    seconds: float
    latencies_ms: list[float]  # of those ops
    first_error: str | None = None
    ops_inside: int = 0  # ops that started and ended in the window (the older count)
    clients: int = 0
    samples: tuple[Any, Any] | None = None  # sample() at the window's start and its end

    @property
    def throughput(self) -> float:
        return self.ops / self.seconds if self.seconds else 0.0

    @property
    def throughput_inside(self) -> float:
        """The older count: ops that started and ended in the window, per second."""
        return self.ops_inside / self.seconds if self.seconds else 0.0

    @property
    def throughput_little(self) -> float:
        """Little's law on the completed ops: clients / mean latency (closed loop, no think
        time, so every client always has one op in flight)."""
        if not self.latencies_ms:
            return 0.0
        return self.clients / (statistics.fmean(self.latencies_ms) / 1000)

    @property
    def median_ms(self) -> float:
        return statistics.median(self.latencies_ms) if self.latencies_ms else float("nan")

    @property
    def p99_ms(self) -> float:
        lat = sorted(self.latencies_ms)
        return lat[min(len(lat) - 1, int(len(lat) * 0.99))] if lat else float("nan")


def _client_loop(
    host: str,
    port: int,
    headers: dict[str, str],
    op: Op,
    client: int,
    start_at: float,
    record_from: float,
    end_at: float,
    max_ops: int,
    out: list[Any],
) -> None:
    session = Session(host, port, headers)
    lat: list[float] = []
    errors, inside, seq, first_error = 0, 0, 0, None
    while time.time() < start_at:
        time.sleep(0.001)
    while len(lat) < max_ops:
        t0 = time.time()
        if t0 >= end_at:
            break
        p0 = time.perf_counter()
        try:
            op(session, client, seq)
            ok = True
        except Exception as exc:  # noqa: BLE001 - counted and reported, never hidden
            ok = False
            first_error = first_error or repr(exc)[:300]
            session.close()
        elapsed = time.perf_counter() - p0
        seq += 1
        ended = t0 + elapsed
        if record_from <= ended <= end_at:
            if ok:
                lat.append(elapsed * 1000)
                inside += t0 >= record_from
            else:
                errors += 1
    session.close()
    out.append((lat, errors, first_error, inside))


def _proc_main(args: tuple[Any, ...], clients: list[int], queue: Any) -> None:
    host, ports, headers, op, start_at, record_from, end_at, max_ops = args
    out: list[Any] = []
    threads = [
        threading.Thread(
            target=_client_loop,
            args=(
                host,
                ports[c % len(ports)],  # several ports: the clients split over the servers
                headers,
                op,
                c,
                start_at,
                record_from,
                end_at,
                max_ops,
                out,
            ),
        )
        for c in clients
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    queue.put(out)


def run(
    host: str,
    port: int | list[int],
    op: Op,
    *,
    headers: dict[str, str] | None = None,
    clients: int = 8,
    procs: int = 2,
    duration: float = 3.0,
    warmup: float = 0.5,
    max_ops_per_client: int = 100_000,
    sample: Callable[[], Any] | None = None,
) -> Result:
    """Run ``clients`` closed-loop clients for ``warmup + duration`` seconds; time the last part.

    With several ports, client ``c`` talks to ``port[c % len(port)]`` (servers of one
    deployment, the load split evenly). ``sample`` is called when the timed window starts
    and when it ends (CPU counters, say); both values are in ``Result.samples``."""
    ctx = mp.get_context("fork")  # ops are closures: fork shares them without pickling
    queue = ctx.Queue()
    start_at = time.time() + 0.3
    record_from = start_at + warmup
    end_at = record_from + duration
    ports = port if isinstance(port, list) else [port]
    args = (host, ports, headers or {}, op, start_at, record_from, end_at, max_ops_per_client)
    groups = [list(range(clients))[i::procs] for i in range(procs)]
    groups = [g for g in groups if g]
    workers = [ctx.Process(target=_proc_main, args=(args, g, queue)) for g in groups]
    for w in workers:
        w.start()
    samples = None
    if sample is not None:
        _sleep_until(record_from)
        first = sample()
        _sleep_until(end_at)
        samples = (first, sample())
    outs = [queue.get(timeout=duration + warmup + 120) for _ in workers]
    for w in workers:
        w.join()
    lat: list[float] = []
    errors, inside, first_error = 0, 0, None
    for out in outs:
        for client_lat, client_errors, err, client_inside in out:
            lat.extend(client_lat)
            errors += client_errors
            inside += client_inside
            first_error = first_error or err
    return Result(len(lat), errors, duration, lat, first_error, inside, clients, samples)


def _sleep_until(when: float) -> None:
    while (left := when - time.time()) > 0:
        time.sleep(min(left, 0.05))
