"""Record latency while a neighbour dirties the same filesystem: group commit against fsync.

    python -m bench.neighbour [--rate 100] [--reps 5] [--duration 5] [--workloads record ...]

Two servers of this checkout side by side (bench.ab's), one with group commit (one
``syncfs`` shared by the writers waiting: ``MEMORY_GROUP_COMMIT=true``, the default) and one
with an fsync of each file and directory (``MEMORY_GROUP_COMMIT=false``), their storage roots
under $TMPDIR. Each workload is measured on both, with no neighbour and with one: a process
writing ``--rate`` MB/s of new data to files on the same filesystem, never synced (what a
build, a test suite or a log shipper does), rotating through a few files so the disk does
not fill. ``syncfs`` has to write back everything dirty on the filesystem, the neighbour's
pages included; an fsync writes back the file's own pages (and commits the journal).
Interleaved: each repetition measures every (mode, neighbour) pair in a rotating order.
Reports throughput, p50, p99 and worker CPU per op, medians over repetitions, and the
neighbour's achieved rate and the machine's dirty and writeback memory while it ran.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import multiprocessing as mp
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from . import servers
from .ab import ops_for, start, token
from .measure import measure
from .run import RESULTS, machine

MODES = {"syncfs": "MEMORY_GROUP_COMMIT=true", "fsync": "MEMORY_GROUP_COMMIT=false"}
CHUNK = 1 << 20


def _neighbour(directory: str, rate_mb: float, stop: Any, done: Any) -> None:
    """Write ``rate_mb`` MB/s of fresh bytes into rotating files in ``directory``, unsynced."""
    block = os.urandom(CHUNK)
    files = [os.path.join(directory, f"neighbour-{i}.bin") for i in range(4)]
    per_file = 256 * CHUNK
    written, current, started = 0, 0, time.monotonic()
    fd = os.open(files[0], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    in_file = 0
    while not stop.is_set():
        due = started + written / (rate_mb * 1e6)
        wait = due - time.monotonic()
        if wait > 0:
            time.sleep(min(wait, 0.05))
            continue
        os.write(fd, block)
        written += CHUNK
        in_file += CHUNK
        if in_file >= per_file:
            os.close(fd)
            current = (current + 1) % len(files)
            # A new inode each time: its pages are new dirty data, as a build's would be.
            with contextlib.suppress(FileNotFoundError):
                os.unlink(files[current])
            fd = os.open(files[current], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            in_file = 0
    os.close(fd)
    done.put(written / (time.monotonic() - started) / 1e6)


def meminfo() -> dict[str, int]:
    """Dirty and Writeback memory now, in KiB."""
    out = {}
    for line in Path("/proc/meminfo").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("Dirty", "Writeback"):
            out[key] = int(value.split()[0])
    return out


class Neighbour:
    """The dirtying process, started for one measurement and stopped after it."""

    def __init__(self, directory: Path, rate_mb: float) -> None:
        ctx = mp.get_context("fork")
        self.stop = ctx.Event()
        self.done = ctx.Queue()
        self.proc = ctx.Process(
            target=_neighbour, args=(str(directory), rate_mb, self.stop, self.done)
        )
        self.directory = directory
        self.dirty: list[int] = []

    def __enter__(self) -> Neighbour:
        self.proc.start()
        time.sleep(1.0)  # let the dirty pages build up before the window
        self.dirty.append(meminfo()["Dirty"])
        return self

    def __exit__(self, *exc: object) -> None:
        self.dirty.append(meminfo()["Dirty"])
        self.stop.set()
        self.rate = self.done.get(timeout=30)
        self.proc.join()
        for name in os.listdir(self.directory):
            os.unlink(self.directory / name)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rate", type=float, default=100.0, help="neighbour MB/s")
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--duration", type=float, default=5.0)
    parser.add_argument("--warmup", type=float, default=0.5)
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--workloads", nargs="*", default=["record", "put-turn"])
    args = parser.parse_args()
    started = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    at_start = machine()
    this = servers.REPO
    cases = [(mode, near) for mode in MODES for near in (False, True)]
    data: dict[tuple[str, str, bool], list[dict[str, Any]]] = {}
    rates: list[float] = []
    dirty: list[int] = []
    with tempfile.TemporaryDirectory(prefix="pm-neighbour-") as tmp:
        work = Path(tmp)
        (work / "neighbour").mkdir()
        running = {mode: start(mode, this, work / mode, [env]) for mode, env in MODES.items()}
        try:
            auth = {m: {"Authorization": f"Bearer {token(s, this)}"} for m, s in running.items()}
            ops = {m: ops_for(s, auth[m]) for m, s in running.items()}
            for rep in range(args.reps):
                order = cases[rep % len(cases) :] + cases[: rep % len(cases)]
                for name in args.workloads:
                    for mode, near in order:

                        def once(mode: str = mode, name: str = name, rep: int = rep) -> Any:
                            others = [s for m, s in running.items() if m != mode]
                            return measure(
                                running[mode], ops[mode][name](rep), auth[mode],
                                clients=args.clients, duration=args.duration,
                                warmup=args.warmup, paused=others,
                            )  # fmt: skip

                        if near:
                            with Neighbour(work / "neighbour", args.rate) as n:
                                got = once()
                            rates.append(n.rate)
                            dirty.extend(n.dirty)
                        else:
                            got = once()
                        data.setdefault((name, mode, near), []).append(got)
                        print(
                            f"  rep {rep} {name:<8} {mode:<6} neighbour {'on ' if near else 'off'}"
                            f" {got['throughput']:6.0f} op/s p50 {got['p50_ms']:6.1f}"
                            f" p99 {got['p99_ms']:7.1f} ms cpu {got['worker_cpu_ms']:5.2f} ms"
                            f"  load {os.getloadavg()[0]:.1f}",
                            file=sys.stderr,
                        )
        finally:
            for server in running.values():
                server.stop()
    rows = []
    for (name, mode, near), runs in data.items():
        row: dict[str, Any] = {"workload": name, "mode": mode, "neighbour": near}
        for key in ("throughput", "p50_ms", "p99_ms", "worker_cpu_ms"):
            row[key] = statistics.median(r[key] for r in runs)
        row["p99_range"] = (min(r["p99_ms"] for r in runs), max(r["p99_ms"] for r in runs))
        row["reps"] = runs
        rows.append(row)
    report = {
        "kind": "neighbour",
        "started": started,
        "machine": at_start,
        "settings": vars(args),
        "neighbour_rate_mb_s": rates,
        "dirty_kib": dirty,
        "load_avg_at_end": os.getloadavg(),
        "rows": rows,
    }
    RESULTS.mkdir(parents=True, exist_ok=True)
    out = RESULTS / f"neighbour-{started}.json"
    out.write_text(json.dumps(report, indent=1, default=str))
    load = ", ".join(f"{x:.1f}" for x in at_start["load_avg_at_start"])
    print(
        f"neighbour: {args.reps} interleaved reps of {args.duration:g} s, {args.clients} clients;"
    )
    print(f"storage roots: {at_start['storage']}")
    print(f"load average at start {load}; at end {report['load_avg_at_end'][0]:.1f}")
    if rates:
        print(
            f"neighbour wrote {statistics.median(rates):.0f} MB/s (asked {args.rate:g});"
            f" Dirty {min(dirty) // 1024}-{max(dirty) // 1024} MiB while it ran"
        )
    print(f"{'workload':<10}{'mode':<8}{'neighbour':<11}{'op/s':>7}{'p50 ms':>9}{'p99 ms':>9}"
          f"{'p99 range':>18}{'cpu ms':>8}")  # fmt: skip
    for r in sorted(rows, key=lambda r: (r["workload"], r["mode"], r["neighbour"])):
        lo, hi = r["p99_range"]
        print(
            f"{r['workload']:<10}{r['mode']:<8}{'on' if r['neighbour'] else 'off':<11}"
            f"{r['throughput']:>7.0f}{r['p50_ms']:>9.1f}{r['p99_ms']:>9.1f}"
            f"{f'{lo:.1f}-{hi:.1f}':>18}{r['worker_cpu_ms']:>8.2f}"
        )
    print(f"JSON: {out.relative_to(servers.REPO)}")


if __name__ == "__main__":
    main()
