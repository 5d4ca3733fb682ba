"""How long the server takes to start after an unclean stop, and after a power loss.

    python -m bench.recovery [--tasks 1000 10000] [--reps 3]

For each size, a project of that many tasks (one turn each, bench/loader.py), then the real
server (``gunicorn -c gunicorn.conf.py``, 2 workers) timed from its spawn to ``/readyz``
answering 200, in three states of the storage root:

* clean: the last server stopped cleanly;
* killed: the last server was SIGKILLed (the running sentinel is left); nothing is stale;
* power loss, nothing stale: killed, then the files of the lock tree (the journals of writes
  in flight, the recovery's canary) lose their contents, as after a cut that came long
  enough after the last write for the kernel to have flushed every derived file: the full
  check runs and finds nothing to repair;
* power loss, every derived file lost: killed, then every file the service writes without
  fsync loses what a cut takes when none of it reached the disk: each ``index.json``,
  ``summary.md``, ``_project.md`` and memory live file is empty, the lock tree's files are
  empty, and the SQLite listings are gone. The records stay, as they do (they are fsynced
  before the answer); the full check rebuilds everything else.

The figures depend on the filesystem of ``$TMPDIR`` (see bench/README.md). Prints one table.
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import tempfile
import time
from pathlib import Path

from app.storage.core.names import (
    LOCKS_DIR,
    MEMORIES_DIR,
    PROJECT_DIGEST,
    PROJECT_LISTING,
    STORE_INDEX,
    TASK_INDEX,
    TURN_SUMMARY,
)

from . import loader, servers

SQLITE_SUFFIXES = ("", "-wal", "-shm", "-journal")
EMPTIED = {TASK_INDEX, TURN_SUMMARY, PROJECT_DIGEST}
REMOVED = {base + s for base in (PROJECT_LISTING, STORE_INDEX) for s in SQLITE_SUFFIXES}


def lose_unsynced(root: Path, *, derived: bool) -> tuple[int, int]:
    """Empty the lock tree's files and, with ``derived``, empty or remove every derived file;
    return (emptied, removed)."""
    emptied = removed = 0
    for dirpath, _, filenames in os.walk(root):
        here = Path(dirpath)
        in_locks = LOCKS_DIR in here.relative_to(root).parts
        live = MEMORIES_DIR in here.relative_to(root).parts
        for name in filenames:
            path = here / name
            if derived and name in REMOVED:
                path.unlink()
                removed += 1
            elif in_locks or (derived and (name in EMPTIED or live)):
                os.truncate(path, 0)
                emptied += 1
    return emptied, removed


def start_timed(work: Path) -> tuple[servers.Server, float]:
    """Spawn the server; seconds until /readyz answers 200 (recovery included)."""
    work.mkdir(parents=True, exist_ok=True)
    port = servers.free_port()
    env = servers.gunicorn_env(work, port)
    args = [str(servers.VENV_BIN / "gunicorn"), "-c", "gunicorn.conf.py", "wsgi:app"]
    started = time.monotonic()
    server = servers._spawn("ours", args, env, work, port)
    servers._wait_up(server.proc, f"{server.url}/readyz", server.log_path, 3600)
    return server, time.monotonic() - started


def kill(server: servers.Server) -> None:
    os.killpg(server.proc.pid, signal.SIGKILL)
    server.proc.wait()
    while True:
        try:
            os.killpg(server.proc.pid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.01)


def said(server: servers.Server) -> str:
    """What the server logged about its recovery (the full check logs once it is ready)."""
    time.sleep(1.0)
    lines = server.log_path.read_text(errors="replace").splitlines()
    found = [ln for ln in lines if "shut down cleanly" in ln or "full check" in ln]
    return "; ".join(ln.split("] ", 3)[-1].strip() for ln in found) or "(nothing)"


def measure(work: Path, tasks: int, reps: int) -> dict[str, list[float]]:
    root = work / "storage"
    loader.load(root, "bench", "bench", tasks)
    times: dict[str, list[float]] = {"clean": [], "killed": [], "cut": [], "cut, all lost": []}
    for rep in range(reps):
        server, seconds = start_timed(work)
        times["clean"].append(seconds)
        kill(server)
        server, seconds = start_timed(work)
        times["killed"].append(seconds)
        kill(server)
        for state, derived in (("cut", False), ("cut, all lost", True)):
            emptied, removed = lose_unsynced(root, derived=derived)
            server, seconds = start_timed(work)
            times[state].append(seconds)
            if rep == 0:
                print(
                    f"  {tasks} tasks, {state}: {emptied} emptied, {removed} removed: {said(server)}"
                )
            kill(server)
        server, _ = start_timed(work)
        server.stop()
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", type=int, nargs="+", default=[1000, 10000])
    parser.add_argument("--reps", type=int, default=3)
    args = parser.parse_args()
    rows = []
    for tasks in args.tasks:
        with tempfile.TemporaryDirectory(prefix="bench_startup_") as tmp:
            times = measure(Path(tmp), tasks, args.reps)
        rows.append((tasks, times))
        print(f"{tasks} tasks: " + ", ".join(f"{k} {v}" for k, v in times.items()), flush=True)
    print(
        f"\nstart to /readyz, median of {args.reps} (seconds), root under {tempfile.gettempdir()}"
    )
    print(
        "| tasks | after a clean stop | after a kill | after a power loss, nothing stale"
        " | after a power loss, every derived file lost |"
    )
    print("|---:|---:|---:|---:|---:|")
    for tasks, times in rows:
        cells = " | ".join(f"{statistics.median(times[k]):.1f}" for k in times)
        print(f"| {tasks:,} | {cells} |")


if __name__ == "__main__":
    main()
