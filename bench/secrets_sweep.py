"""`secrets scan` and `secrets purge` over a large project: time, CPU and peak memory.

    python -m bench.secrets_sweep [--tasks 10000 100000] [--secrets 50]

For each size, builds a project of that many tasks through the engine (bench/loader.py: one
turn each, ~1 KB summary, fsync off in the loader only), plants ``--secrets`` turns holding a
made-up token, then runs in a fresh child process the scan and then the purge
(services/secret_sweep.py, as the CLI does) and prints wall time, CPU and the child's peak
RSS, so that "bounded in memory" is a figure, not a promise.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
from pathlib import Path

CHILD = r"""
import json, sys, time, resource
from pathlib import Path
from app.services.secret_sweep import Sweep
from app.storage.backends import open_backend
from app.storage.core.names import Scope

root, purge = Path(sys.argv[1]), sys.argv[2] == "purge"
storage = open_backend({
    "STORAGE_ROOT": str(root), "TOKENS_FILE": str(root.parent / "tokens.json"),
    "RETENTION_DAYS": 30.0, "LOCK_TIMEOUT": 10.0, "MAX_ARTIFACT_BYTES": 50 << 20,
})
found = []
start, cpu = time.perf_counter(), time.process_time()
tally = Sweep(storage, purge=purge, report=found.append).run([Scope("bench", "big")])
if purge:
    storage.flush_derived()
    storage.scrub_replaced(Scope("bench", "big"))
print(json.dumps({
    "wall_s": time.perf_counter() - start,
    "cpu_s": time.process_time() - cpu,
    "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
    "found": tally.found, "turns": tally.turns, "purged": tally.purged,
}))
"""

TOKEN = "ghp_" + "Z" * 36  # a GitHub token's shape


def build(root: Path, tasks: int, secrets: int) -> float:
    """The project, and ``secrets`` of its turns rewritten to hold a token; seconds taken."""
    from app.storage.core.names import Scope
    from app.storage.tree.tasks import TaskStore

    from . import loader

    took = loader.load(root, "bench", "big", tasks)
    store, scope = TaskStore(root), Scope("bench", "big")
    for i in range(0, tasks, max(1, tasks // secrets)):
        store.put_turn(
            scope, loader.task_id(i), 0, meta={}, summary_md=f"pasted {TOKEN} by mistake"
        )
    return took


def run(root: Path, mode: str) -> dict[str, float]:
    here = Path(__file__).resolve().parent.parent
    env = {**os.environ, "PYTHONPATH": str(here)}
    done = subprocess.run(
        [sys.executable, "-c", CHILD, str(root), mode],
        cwd=here,
        env=env,
        capture_output=True,
        text=True,
        check=True,
        timeout=7200,
    )
    result: dict[str, float] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", type=int, nargs="+", default=[10_000])
    parser.add_argument("--secrets", type=int, default=50)
    args = parser.parse_args()
    print(f"load average {os.getloadavg()[0]:.1f}")
    for count in args.tasks:
        with tempfile.TemporaryDirectory(prefix="pm-secrets-sweep-") as tmp:
            root = Path(tmp) / "root"
            built = build(root, count, args.secrets)
            scan = run(root, "scan")
            purge = run(root, "purge")
            again = run(root, "scan")
            print(
                f"{count:>7} tasks (built in {built:.0f} s): scan {scan['wall_s']:.1f} s wall,"
                f" {scan['cpu_s']:.1f} s CPU, peak {scan['peak_rss_mib']:.0f} MiB,"
                f" {scan['found']:.0f} found; purge {purge['wall_s']:.1f} s,"
                f" {purge['purged']:.0f} purged, peak {purge['peak_rss_mib']:.0f} MiB;"
                f" scan after: {again['found']:.0f} found"
            )
    print(
        f"load average {os.getloadavg()[0]:.1f}; this process peak"
        f" {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f} MiB"
    )


if __name__ == "__main__":
    main()
