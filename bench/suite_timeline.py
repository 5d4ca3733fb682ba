"""Where a parallel test run's wall time goes: each xdist worker's busy time and its tail.

A pytest plugin that appends, per worker, when each test started and ended, and a report
over those files. ``make test`` is timed as a whole; this tells a run whose workers were
busy throughout from one where a worker idled while another finished its share:

    rm -rf /tmp/suite && PYTHONPATH=bench MEMORY_TEST_BACKENDS=tree,pg \\
        SUITE_TIMELINE=/tmp/suite make test PYTEST_ARGS="-p suite_timeline"
    python -m bench.suite_timeline /tmp/suite

The report gives each worker's first and last test (seconds after the earliest start), the
sum of its tests' durations, and the slowest tests of the run.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Any

_out: Any = None


def _write(event: dict[str, Any]) -> None:
    global _out
    if _out is None:
        folder = Path(os.environ.get("SUITE_TIMELINE", "/tmp/suite-timeline"))
        folder.mkdir(parents=True, exist_ok=True)
        worker = os.environ.get("PYTEST_XDIST_WORKER", "main")
        _out = (folder / f"{worker}.jsonl").open("a")
    _out.write(json.dumps({**event, "t": time.time()}) + "\n")
    _out.flush()


def pytest_runtest_logstart(nodeid: str, location: Any) -> None:
    _write({"ev": "start", "id": nodeid})


def pytest_runtest_logfinish(nodeid: str, location: Any) -> None:
    _write({"ev": "end", "id": nodeid})


def report(folder: Path, slowest: int = 15) -> None:
    workers: dict[str, list[tuple[float, float, str]]] = {}
    for path in sorted(folder.glob("gw*.jsonl")):
        began: dict[str, float] = {}
        rows = workers.setdefault(path.stem, [])
        for line in path.read_text().splitlines():
            event = json.loads(line)
            if event["ev"] == "start":
                began[event["id"]] = event["t"]
            elif event["id"] in began:
                rows.append((began[event["id"]], event["t"], event["id"]))
    if not workers:
        sys.exit(f"no gw*.jsonl under {folder}")
    t0 = min(row[0] for rows in workers.values() for row in rows)
    print(f"{'worker':8} {'first':>7} {'last':>7} {'busy':>7} {'tests':>6}")
    for name, rows in workers.items():
        busy = sum(end - start for start, end, _ in rows)
        first, last = min(r[0] for r in rows) - t0, max(r[1] for r in rows) - t0
        print(f"{name:8} {first:7.1f} {last:7.1f} {busy:7.1f} {len(rows):6}")
    every = sorted((end - start, nid) for rows in workers.values() for start, end, nid in rows)
    print(f"\nslowest {slowest}:")
    for took, nid in every[::-1][:slowest]:
        print(f"{took:7.1f}  {nid}")


if __name__ == "__main__":
    report(Path(sys.argv[1] if len(sys.argv) > 1 else "/tmp/suite-timeline"))
