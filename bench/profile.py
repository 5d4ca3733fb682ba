"""Profile one workload on our gunicorn workers with py-spy (wall clock, idle frames included).

    python -m bench.profile record|read|list|digest [--seconds 8] [--gil]

py-spy comes from bench/.venv-prof (``make bench-profile-tools`` is not needed: the script says
how to create it). Prints the frames of app/ code with the largest inclusive share of samples,
and leaves the raw collapsed stacks in bench/results/profile-<workload>-<pid>.txt.
"""

from __future__ import annotations

import argparse
import collections
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

from . import loadgen, servers, workloads as w

PYSPY = servers.REPO / "bench" / ".venv-prof" / "bin" / "py-spy"
RESULTS = servers.REPO / "bench" / "results"


def summarize(path: Path, top: int) -> None:
    inclusive: collections.Counter[str] = collections.Counter()
    leaf: collections.Counter[str] = collections.Counter()
    total = 0
    for line in path.read_text().splitlines():
        stack, _, count_s = line.rpartition(" ")
        if not count_s.isdigit():
            continue  # the tail of a frame name that held a line break, not a stack
        count = int(count_s)
        frames = stack.split(";")
        # Only request-handling threads: skip the gunicorn main loop and idle pollers.
        if not any("handle_request" in f for f in frames):
            continue
        total += count
        seen = set()
        for f in frames:
            name = f.split(" (")[0] + " (" + f.split(" (")[-1].split(":")[0].split("/")[-1] + ")"
            if name not in seen:
                inclusive[name] += count
                seen.add(name)
        leaf[frames[-1].split(" (")[0] + " " + frames[-1].split("/")[-1]] += count
    print(f"{path.name}: {total} samples in request threads")
    print("  inclusive (share of request time):")
    for name, count in inclusive.most_common(top):
        print(f"    {count / total:6.1%}  {name}")
    print("  leaf frames:")
    for name, count in leaf.most_common(15):
        print(f"    {count / total:6.1%}  {name}")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument(
        "workload", choices=["record", "record-one", "read", "list", "digest", "put_turn"]
    )
    parser.add_argument("--seconds", type=float, default=8.0)
    parser.add_argument("--gil", action="store_true", help="only samples holding the GIL (CPU)")
    parser.add_argument("--top", type=int, default=40)
    args = parser.parse_args()
    if not PYSPY.exists():
        sys.exit(
            "py-spy missing: python3 -m venv bench/.venv-prof && "
            "bench/.venv-prof/bin/pip install py-spy pyinstrument"
        )
    RESULTS.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="pm-prof-") as tmp:
        ours = servers.start_ours(Path(tmp))
        try:
            auth = {"Authorization": f"Bearer {ours.token()}"}
            s = loadgen.Session(ours.host, ours.port, auth)
            w.ours_preload(s)
            s.close()
            op = {
                "record": w.ours_record("prof"),
                "record-one": w.ours_record_one("prof1"),
                "read": w.ours_read(),
                "list": w.ours_list(),
                "digest": w.ours_digest(),
                "put_turn": w.ours_put_turn("pre-{client}"),
            }[args.workload]
            outs = []
            procs = []
            for pid in ours.worker_pids():
                out = RESULTS / f"profile-{args.workload}-{pid}.txt"
                cmd = [str(PYSPY), "record", "-p", str(pid), "-d", str(int(args.seconds))]
                cmd += ["-f", "raw", "-o", str(out), "-r", "200", "--threads", "--nonblocking"]
                if not args.gil:
                    cmd.append("--idle")
                else:
                    cmd.append("--gil")
                procs.append(subprocess.Popen(cmd, stdout=subprocess.DEVNULL))
                outs.append(out)
            result: list[loadgen.Result] = []
            t = threading.Thread(
                target=lambda: result.append(
                    loadgen.run(ours.host, ours.port, op, headers=auth, duration=args.seconds)
                )
            )
            t.start()
            t.join()
            for p in procs:
                p.wait(timeout=60)
            print(
                f"{args.workload}: {result[0].throughput:.0f} op/s under py-spy, "
                f"p50 {result[0].median_ms:.2f} ms, errors {result[0].errors} {result[0].first_error or ''}"
            )
            for out in outs:
                if out.exists():
                    summarize(out, args.top)
        finally:
            ours.stop()


if __name__ == "__main__":
    main()
