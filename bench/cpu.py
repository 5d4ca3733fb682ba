"""Where the CPU of one workload goes, per operation: our workers, the load generator, the rest.

    python -m bench.cpu [record|read|list] [--duration 6] [--reps 3]

Throughput on this 2-core machine moves with whatever else runs, but the CPU one operation
costs its server barely does; that is the figure each write-path fix was judged by. Runs the
server as `make bench` does (storage roots under $TMPDIR), drives it with the same 8 clients,
and reads /proc: the workers' user and kernel time, and the whole machine's user, system,
softirq, iowait and idle time (the load generator, jbd2 and the loop device are in "machine"),
and the write requests and KiB the storage root's block device received.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
from pathlib import Path

from . import loadgen, servers, workloads as w


def machine_cpu() -> dict[str, float]:
    names = ["user", "nice", "system", "idle", "iowait", "irq", "softirq"]
    values = Path("/proc/stat").read_text().splitlines()[0].split()[1:8]
    tick = os.sysconf("SC_CLK_TCK")
    return {n: int(v) / tick for n, v in zip(names, values, strict=True)}


def disk_writes(path: Path) -> tuple[int, int]:
    """(write requests, KiB written) of the block device holding ``path`` (0s if unknown)."""
    dev = os.stat(path).st_dev
    stat = Path(f"/sys/dev/block/{os.major(dev)}:{os.minor(dev)}/stat")
    try:
        fields = stat.read_text().split()
    except OSError:
        return 0, 0
    return int(fields[4]), int(fields[6]) // 2  # sectors of 512 bytes


OPS = {
    "record": lambda: w.ours_record("cpu"),
    "read": w.ours_read,
    "list": w.ours_list,
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("workload", nargs="?", default="record", choices=sorted(OPS))
    parser.add_argument("--duration", type=float, default=6.0)
    parser.add_argument("--reps", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="pm-cpu-") as tmp:
        server = servers.start_ours(Path(tmp) / "ours")
        try:
            headers = {"Authorization": f"Bearer {server.token()}"}
            if args.workload != "record":
                session = loadgen.Session(server.host, server.port, headers)
                w.ours_preload(session)
                session.close()
            rows = []
            for _ in range(args.reps):
                pids = server.worker_pids()
                before = [servers.proc_cpu(p) for p in pids]
                m0, d0 = machine_cpu(), disk_writes(Path(tmp))
                res = loadgen.run(
                    server.host, server.port, OPS[args.workload](), headers=headers,
                    duration=args.duration, warmup=0.0,
                )  # fmt: skip
                m1, d1 = machine_cpu(), disk_writes(Path(tmp))
                after = [servers.proc_cpu(p) for p in pids]
                ops = max(res.ops, 1)
                user = sum(a[0] - b[0] for a, b in zip(after, before, strict=True))
                kern = sum(a[1] - b[1] for a, b in zip(after, before, strict=True))
                delta = {k: m1[k] - m0[k] for k in m0}
                busy = delta["user"] + delta["nice"] + delta["system"] + delta["softirq"]
                busy += delta["irq"]
                rows.append(
                    {
                        "op/s": res.throughput,
                        "worker user ms": user / ops * 1e3,
                        "worker kernel ms": kern / ops * 1e3,
                        "machine busy ms": busy / ops * 1e3,
                        "idle %": 100 * delta["idle"] / sum(delta.values()),
                        "iowait %": 100 * delta["iowait"] / sum(delta.values()),
                        "disk writes": (d1[0] - d0[0]) / ops,
                        "disk KiB": (d1[1] - d0[1]) / ops,
                    }
                )
                if res.errors:
                    print(f"  !! {res.errors} errors, first: {res.first_error}")
        finally:
            server.stop()
    print(f"{args.workload}: {args.reps} x {args.duration:g} s, per operation, storage {tmp}")
    for key in rows[0]:
        values = [r[key] for r in rows]
        print(
            f"  {key:<17} median {statistics.median(values):8.2f}   "
            + " ".join(f"{v:8.2f}" for v in values)
        )


if __name__ == "__main__":
    main()
