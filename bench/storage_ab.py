"""The task engine of two checkouts side by side, in process: CPU per call, no HTTP, no Flask.

    python -m bench.storage_ab --base /path/to/other/checkout [--reps 5] [--n 3000]

What `bench.ab` measures over HTTP includes everything a request does besides storage
(authentication, rate limits, traffic counts, logging). This isolates the storage engine:
each repetition runs one fresh process per checkout (interleaved: this, base, this, ...),
with that checkout first on ``sys.path``, and times with ``time.process_time`` (CPU of the
process, so a busy machine moves it little):

* ``get_turn`` of 64 tasks in turn;
* ``list_tasks(limit=50)`` of a project of 1,000 tasks;
* ``put_turn`` upserting turn 1 of its own task (the records fsynced; the CPU, not the wait).

Both checkouts must construct ``TaskStore(root)`` and take ``put_turn(scope, task, turn,
meta=, summary_md=)``; every commit since the listing was introduced does.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from . import workloads as w

WORKER = r"""
import json, sys, tempfile, time
from pathlib import Path
try:
    from app.storage.tree.tasks import TaskStore
except ImportError:  # a checkout from before app/storage/tree/
    from app.storage import TaskStore
try:
    from app.storage.core.names import Scope
except ImportError:  # a checkout from before app/storage/core/
    from app.storage import Scope

n = int(sys.argv[1])
meta = json.loads(sys.argv[2])
summary = sys.argv[3]
root = Path(tempfile.mkdtemp(dir=sys.argv[4])) / "root"
store = TaskStore(root)
scope = Scope("bench", "bench")
for i in range(1000):
    store.put_turn(scope, f"pre-{i}", 0, meta=meta, summary_md=summary)
store.put_turn(scope, "upsert", 1, meta=meta, summary_md=summary)

def timed(call, count):
    for i in range(min(count, 200)):
        call(i)
    start = time.process_time()
    for i in range(count):
        call(i)
    return (time.process_time() - start) / count * 1e6

out = {
    "get_turn": timed(lambda i: store.get_turn(scope, f"pre-{i % 64}", 0), n),
    "list_tasks": timed(lambda i: store.list_tasks(scope, limit=50), n // 4),
    "put_turn": timed(
        lambda i: store.put_turn(scope, "upsert", 1, meta=meta, summary_md=summary), n // 6
    ),
}
print(json.dumps(out))
"""


def run_once(checkout: Path, n: int, tmp: Path) -> dict[str, float]:
    args = [sys.executable, "-c", WORKER, str(n), json.dumps(w.meta(0, 0)), w.SUMMARY, str(tmp)]
    done = subprocess.run(
        args,
        cwd=checkout,
        env={"PYTHONPATH": str(checkout), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        check=True,
        timeout=900,
    )
    result: dict[str, float] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base", type=Path, required=True, help="the other checkout")
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--n", type=int, default=3000)
    args = parser.parse_args()
    this = Path(__file__).resolve().parent.parent
    rows: dict[str, list[tuple[float, float]]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for rep in range(args.reps):
            ours = run_once(this, args.n, Path(tmp))
            base = run_once(args.base.resolve(), args.n, Path(tmp))
            for name in ours:
                rows.setdefault(name, []).append((ours[name], base[name]))
            print(
                f"  rep {rep} " + "  ".join(f"{k} {ours[k]:.0f} / {base[k]:.0f} us" for k in ours),
                flush=True,
            )
    print(f"storage_ab: this = {this}, base = {args.base}; CPU per call, median of {args.reps}")
    print_pairs(rows, "us", 1)


def print_pairs(rows: dict[str, list[tuple[float, float]]], unit: str, digits: int) -> None:
    """One line per call: both sides' medians, the median of this/base, each rep's ratio."""
    print(f"{'call':<12}{'this ' + unit:>10}{'base ' + unit:>10}{'this/base':>11}   per rep")
    for name, pairs in rows.items():
        mine = statistics.median(p[0] for p in pairs)
        theirs = statistics.median(p[1] for p in pairs)
        ratio = statistics.median(p[0] / p[1] for p in pairs)
        per = ", ".join(f"{p[0] / p[1]:.2f}" for p in pairs)
        print(f"{name:<12}{mine:>10.{digits}f}{theirs:>10.{digits}f}{ratio:>11.2f}   {per}")


if __name__ == "__main__":
    main()
