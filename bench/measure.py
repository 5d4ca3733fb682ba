"""One measurement: one workload on one server, the others paused; throughput, latency, CPU.

CPU is read from /proc when the timed window starts and when it ends (bench.loadgen calls
back at both instants), and divided by the ops that ended in the window: no scaling for a
warm-up, and the same window for the count and the CPU. Three CPU figures per op:

* ``worker_cpu_ms``: the server's workers (the master's direct children: gunicorn's workers);
* ``server_cpu_ms``: every process of the server's process group (MLflow's uvicorn workers,
  its job consumers and whatever it spawns; for gunicorn, the workers and the idle master);
* ``machine_cpu_ms``: the whole machine's busy time (the load generator, jbd2, kworkers and
  anything else running, so noisy on a shared machine).

The first two are what survive a noisy machine: a busy neighbour slows a request down, but
barely changes the CPU it takes.
"""

from __future__ import annotations

import os
import statistics
import sys
from collections.abc import Iterable
from typing import Any

from . import loadgen, servers
from .cpu import machine_cpu


def _sample(server: servers.Server, pids: list[int]) -> dict[str, float]:
    workers = 0.0
    for pid in pids:
        try:
            workers += sum(servers.proc_cpu(pid))
        except OSError:
            continue  # exited meanwhile
    m = machine_cpu()
    busy = sum(m[k] for k in ("user", "nice", "system", "irq", "softirq"))
    return {"workers": workers, "group": server.cpu_seconds(), "machine": busy}


def measure(
    server: servers.Server,
    op: loadgen.Op,
    headers: dict[str, str],
    *,
    clients: int,
    duration: float,
    warmup: float,
    paused: Iterable[servers.Server] = (),
) -> dict[str, Any]:
    """Run ``op`` against ``server`` with every server of ``paused`` stopped (SIGSTOP)."""
    others = list(paused)
    load_at_start = os.getloadavg()[0]
    for other in others:
        other.pause()
    try:
        pids = server.worker_pids()
        res = loadgen.run(
            server.host, server.port, op, headers=headers, clients=clients,
            duration=duration, warmup=warmup, sample=lambda: _sample(server, pids),
        )  # fmt: skip
    finally:
        for other in others:
            other.resume()
    if res.errors:
        print(f"  !! {server.name}: {res.errors} errors, first: {res.first_error}", file=sys.stderr)
    assert res.samples is not None
    before, after = res.samples
    ops = max(res.ops, 1)
    return {
        "throughput": res.throughput,
        "throughput_inside": res.throughput_inside,
        "throughput_little": res.throughput_little,
        "p50_ms": res.median_ms,
        "p99_ms": res.p99_ms,
        "worker_cpu_ms": (after["workers"] - before["workers"]) / ops * 1e3,
        "server_cpu_ms": (after["group"] - before["group"]) / ops * 1e3,
        "machine_cpu_ms": (after["machine"] - before["machine"]) / ops * 1e3,
        "ops": res.ops,
        "errors": res.errors,
        # The 1-minute load average as the measurement started and as it ended.
        "load_at_start": load_at_start,
        "load_at_end": os.getloadavg()[0],
    }


def spread(values: Iterable[float]) -> dict[str, float]:
    """Median and range of one figure over repetitions."""
    got = sorted(values)
    return {"median": statistics.median(got), "min": got[0], "max": got[-1]}


def fmt_spread(s: dict[str, float], digits: int = 2) -> str:
    return f"{s['median']:.{digits}f} ({s['min']:.{digits}f}-{s['max']:.{digits}f})"
