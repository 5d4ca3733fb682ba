"""Costs that grow with the tree, at 1,000 / 10,000 / 50,000 tasks, for one checkout.

Every figure runs the code of the checkout named by --checkout (this repo at any commit):
each command and server is a subprocess with cwd and PYTHONPATH set to it, so an old commit
can be measured by the harness of a new one. For each size it builds one storage root (3
turns per task, ~1.5 KB summaries, tasks spread over the past week) through the checkout's
own TaskStore.put_turn, with bench.loader's unsafe_fast_mode when the checkout has it, and
reuses that root for every row:

* a crash restart (2 workers; one write, SIGKILL of the whole process group, restart): until
  the port accepts a TCP connection, and until /readyz answers 200;
* GET project.md after one write and again without one (1 worker): time to first byte and the
  worker's CPU (utime + stime of /proc/<pid>/stat around the request, and schedstat's ns);
* the CLI's export of the project, its import into an empty root, and fsck (read-only): wall
  time, and peak RSS (ru_maxrss of a wrapper process whose only child is the command);
* disk blocks and inodes per turn, walked after the server rows (so the derived files a
  server renders on first use are counted).

The page cache stays warm throughout: dropping it needs root, so there is no cold-cache row.
Not a test: it asserts nothing about time, never runs in CI, prints a table, writes JSON.

    python -m bench.scale --checkout DIR --sizes 1000,10000 --out FILE.json [--tmp DIR] [--reps N]
    python -m bench.scale --compare BEFORE.json AFTER.json
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import http.client
import json
import os
import platform
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from . import scale_report as table
from .run import storage_fs
from .servers import Server, free_port, proc_cpu

TENANT = PROJECT = "bench"
SCOPE_ARGS = ("--tenant", TENANT, "--project", PROJECT)
TURNS = 3
API = "/sandbox/memory/v1"
MiB = 1 << 20

# Runs inside the checkout: the tree is whatever that commit's TaskStore writes. The text is
# seeded per turn, so both checkouts store the same bytes and gzip/search see varied words.
BUILD = """
import json, random, sys, time
from datetime import UTC, datetime, timedelta
from pathlib import Path
import app
try:
    from app.storage.tree.tasks import TaskStore
except ImportError:  # a checkout from before app/storage/tree/
    from app.storage import TaskStore
try:
    from app.storage.core.names import Scope
except ImportError:  # a checkout from before app/storage/core/
    from app.storage import Scope
try:
    import bench.loader as loader
except ImportError:
    loader = None
root, count, turns, words = Path(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4].split()
fast = hasattr(loader, "unsafe_fast_mode")
if fast:
    loader.unsafe_fast_mode()
step = timedelta(days=7) / (count * turns)
start = datetime.now(UTC) - step * (count * turns)
tick = [0]
store = TaskStore(root, clock=lambda: start + step * tick[0])
scope = Scope("bench", "bench")
t0 = time.perf_counter()
for i in range(count):
    for turn in range(turns):
        rnd = random.Random(i * turns + turn)
        text = f"## t{i:06d} turn {turn}\\n\\n"
        while len(text) < 1500:
            text += " ".join(rnd.choice(words) for _ in range(12)) + ".\\n"
        meta = {"model": "claude-sonnet-4-5", "exit_code": turn % 2, "job_id": f"job-{i}",
                "started_at": (start + step * tick[0]).strftime("%Y-%m-%dT%H:%M:%SZ")}
        store.put_turn(scope, f"t{i:06d}", turn, meta=meta, summary_md=text, actor="loader")
        tick[0] += 1
print(json.dumps({"seconds": time.perf_counter() - t0, "fast_mode": fast, "app": app.__file__}))
"""
WORDS = (
    "upload test flaky stream body temp file session ttl login cache index listing digest "
    "retry lock timeout worker thread fsync rename journal sqlite query cursor page token "
    "role tenant project artifact summary meta turn task sweep expire repair archive import "
    "export manifest checksum gzip header range etag conflict merge branch commit review"
)

# ru_maxrss of RUSAGE_CHILDREN is the peak of the one command this wrapper waits for.
WRAP = """
import json, resource, subprocess, sys, time
t0 = time.perf_counter()
p = subprocess.run(sys.argv[1:], capture_output=True, text=True)
wall = time.perf_counter() - t0
ru = resource.getrusage(resource.RUSAGE_CHILDREN)
print(json.dumps({"wall_s": wall, "peak_kib": ru.ru_maxrss, "cpu_s": ru.ru_utime + ru.ru_stime,
                  "rc": p.returncode, "out": p.stdout[-600:], "err": p.stderr[-600:]}))
"""


class NotMeasured(Exception):
    """A row this checkout cannot produce; the message says why."""


class Checkout:
    """A checkout of this repo at any commit, run by one interpreter (whose venv it shares)."""

    def __init__(self, path: Path, python: Path) -> None:
        self.path, self.python = path.resolve(), python

    def env(self, root: Path, **extra: str) -> dict[str, str]:
        # Inherited MEMORY_* settings would make the figures depend on the shell.
        env = {k: v for k, v in os.environ.items() if not k.startswith("MEMORY_")}
        env.pop("PROMETHEUS_MULTIPROC_DIR", None)
        return {
            **env,
            # Ahead of the venv's own editable install, so `app` is this checkout's (build()
            # checks it: without an app/ here, the venv's would be imported instead).
            "PYTHONPATH": str(self.path),
            "MEMORY_STORAGE_ROOT": str(root),
            "MEMORY_TOKENS_FILE": f"{root}.tokens.json",
            # The retention sweep walks every task in the background: not a cost of any row.
            "MEMORY_SWEEP_INTERVAL": "0",
            **extra,
        }

    def run(self, root: Path, *args: str) -> str:
        proc = subprocess.run(
            [str(self.python), *args],
            cwd=self.path,
            env=self.env(root),
            capture_output=True,
            text=True,
            timeout=4 * 3600,
        )
        if proc.returncode != 0:
            what = " ".join("<script>" if "\n" in a else a[:40] for a in args[:6])
            raise NotMeasured(f"{what} exited {proc.returncode}: {proc.stderr[-400:]}")
        return proc.stdout

    def flask(self, root: Path, *cli: str, check: bool = True) -> dict[str, Any]:
        """Run `flask --app wsgi CLI...` in the wrapper: wall, peak RSS, CPU, exit status."""
        wrapped = ["-c", WRAP, str(self.python), "-m", "flask", "--app", "wsgi", *cli]
        got: dict[str, Any] = json.loads(self.run(root, *wrapped))
        if check and got["rc"] != 0:
            raise NotMeasured(f"flask {cli[0]} exited {got['rc']}: {got['err']}")
        return got

    def commit(self) -> dict[str, Any]:
        def git(*args: str) -> str:
            cmd = ["git", "-C", str(self.path), *args]
            return subprocess.run(cmd, capture_output=True, text=True, check=False).stdout.strip()

        # A working tree mid-edit is measured as it stands: the JSON names what differs from
        # the commit, and a fingerprint of those changes tells whether they moved mid-run.
        changed = git("status", "--porcelain").splitlines()
        digest = hashlib.sha256(git("diff", "HEAD").encode())
        for name in git("ls-files", "--others", "--exclude-standard").splitlines():
            with contextlib.suppress(OSError):
                digest.update(name.encode() + (self.path / name).read_bytes())
        return {"commit": git("rev-parse", "HEAD"), "dirty": changed, "tree": digest.hexdigest()}


def row(samples: list[list[float]], units: list[str], detail: str = "") -> dict[str, Any]:
    """Medians of each metric over the repetitions, with the samples they come from."""
    values = [statistics.median(column) for column in zip(*samples, strict=True)]
    return {"values": values, "units": units, "samples": samples, "detail": detail}


def walk(paths: list[Path]) -> tuple[int, int]:
    """Allocated bytes (st_blocks * 512) and distinct inodes of every file and dir under paths."""
    seen: dict[tuple[int, int], int] = {}
    for top in paths:
        for dirpath, dirnames, filenames in os.walk(top):
            for name in [".", *dirnames, *filenames]:
                st = os.lstat(os.path.join(dirpath, name))
                seen[(st.st_dev, st.st_ino)] = st.st_blocks * 512
    return sum(seen.values()), len(seen)


# -- the server --------------------------------------------------------------------------------
def spawn(co: Checkout, root: Path, port: int, workers: int) -> Server:
    """The checkout's server as its `make run` starts it, on 127.0.0.1:port."""
    env = co.env(root, MEMORY_BIND=f"127.0.0.1:{port}", MEMORY_WORKERS=str(workers))
    log_path = root.parent / "server.log"
    with open(log_path, "ab") as log:
        proc = subprocess.Popen(
            [str(co.python), "-m", "gunicorn", "-c", "gunicorn.conf.py", "wsgi:app"],
            cwd=co.path,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # its own process group: one killpg reaches every worker
        )
    return Server("checkout", port, proc, env, log_path)


def poll(server: Server, ready: Callable[[], bool], timeout: float = 3600) -> float:
    """Seconds until ready() holds, counted from now; a server that exits is not measured."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        if server.proc.poll() is not None:
            tail = server.log_path.read_text(errors="replace")[-600:]
            raise NotMeasured(f"server exited {server.proc.returncode}: {tail}")
        if ready():
            return time.monotonic() - t0
        time.sleep(0.005)
    raise NotMeasured(f"server not ready after {timeout:.0f} s")


def port_open(port: int) -> bool:
    with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=1):
        return True
    return False


def status(port: int, path: str) -> int:
    """Status of GET path (0: no answer yet)."""
    try:
        return int(request(port, "GET", path, {})[0])
    except OSError:
        return 0


def wait_ready(server: Server) -> tuple[float, str]:
    """Seconds until /readyz is 200, or /healthz on a checkout without /readyz (404)."""
    seconds = poll(server, lambda: status(server.port, "/readyz") in (200, 404))
    if status(server.port, "/readyz") == 200:
        return seconds, "/readyz"
    more = poll(server, lambda: status(server.port, "/healthz") == 200)
    return seconds + more, "/healthz (this checkout has no /readyz)"


def request(port: int, method: str, path: str, headers: dict[str, str], body: bytes = b"") -> Any:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
    try:
        conn.request(method, path, body=body or None, headers=headers)
        resp = conn.getresponse()
        return resp.status, resp.read()
    finally:
        conn.close()


def kill_group(server: Server) -> None:
    """SIGKILL master and workers at once; return when none of them holds a descriptor."""
    pids = [server.proc.pid, *server.worker_pids()]
    os.killpg(server.proc.pid, signal.SIGKILL)
    server.proc.wait()
    for pid in pids:  # reparented workers may stay zombies, which hold no files or sockets
        stat = Path(f"/proc/{pid}/stat")
        with contextlib.suppress(OSError):
            while stat.read_text().rpartition(")")[2].split()[0] != "Z":
                time.sleep(0.005)


def worker_cpu(server: Server) -> tuple[float, float]:
    """(utime + stime, on-CPU time summed over its threads' schedstat) of the one worker, s."""
    (pid,) = server.worker_pids()
    sched = 0
    for thread in Path(f"/proc/{pid}/task").iterdir():
        with contextlib.suppress(OSError):
            sched += int((thread / "schedstat").read_text().split()[0])
    return sum(proc_cpu(pid)), sched / 1e9


def timed(server: Server, action: Callable[[], float]) -> list[float]:
    """[ms the action reports, worker CPU ms from /proc stat, the same from schedstat]."""
    before = worker_cpu(server)
    ms = action()
    time.sleep(0.02)  # the worker writes its request log line after the last byte
    after = worker_cpu(server)
    return [ms, (after[0] - before[0]) * 1000, (after[1] - before[1]) * 1000]


class Size:
    """One project of ``count`` tasks built by one checkout, and the rows measured on it."""

    def __init__(self, co: Checkout, work: Path, count: int, reps: int) -> None:
        self.co, self.count, self.reps = co, count, reps
        self.root = work / f"n{count}" / "storage"
        self.task = f"t{count // 2:06d}"  # the task every measured write adds a turn to
        self.written = 0
        self.auth: dict[str, str] = {}

    def build(self) -> dict[str, Any]:
        self.root.parent.mkdir(parents=True)
        t0 = time.monotonic()
        out = self.co.run(
            self.root, "-c", BUILD, str(self.root), str(self.count), str(TURNS), WORDS
        )
        info: dict[str, Any] = {**json.loads(out.strip().splitlines()[-1])}
        info["wall_s"] = time.monotonic() - t0
        if not Path(info["app"]).is_relative_to(self.co.path):
            raise NotMeasured(f"the build imported {info['app']}, not the checkout's app")
        # A writer token from the checkout's own CLI: the secret is the last line it prints.
        create = ["-m", "flask", "--app", "wsgi", "tokens", "create", "--role", "writer"]
        out = self.co.run(self.root, *create, *SCOPE_ARGS)
        self.auth = {"Authorization": f"Bearer {out.strip().splitlines()[-1]}"}
        return info

    def put_turn(self, port: int) -> float:
        """PUT a new turn of self.task; milliseconds until the answer."""
        turn, self.written = TURNS + self.written, self.written + 1
        body = {"meta": {"exit_code": 0}, "summary_md": f"## {self.task} turn {turn}\n\n" * 40}
        headers = {**self.auth, "Content-Type": "application/json"}
        t0 = time.perf_counter()
        path = f"{API}/tasks/{self.task}/turns/{turn}"
        code, data = request(port, "PUT", path, headers, json.dumps(body).encode())
        if code not in (200, 201):
            raise NotMeasured(f"PUT turn -> {code}: {data[:200]!r}")
        return (time.perf_counter() - t0) * 1000

    def ttfb(self, port: int) -> float:
        """Milliseconds from sending GET project.md to its first body byte; reads the rest."""
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
        t0 = time.perf_counter()
        conn.request("GET", f"{API}/project.md", headers=self.auth)
        resp = conn.getresponse()
        resp.read(1)
        first = time.perf_counter() - t0
        self.digest_bytes = 1 + len(resp.read())
        conn.close()
        if resp.status != 200:
            raise NotMeasured(f"GET project.md -> {resp.status}")
        return first * 1000

    def restart(self) -> dict[str, Any]:
        samples, probe = [], ""
        server = spawn(self.co, self.root, free_port(), 2)
        try:
            wait_ready(server)
            for rep in range(self.reps):
                self.put_turn(server.port)
                kill_group(server)
                server.proc = spawn(self.co, self.root, server.port, 2).proc
                port_s = poll(server, lambda: port_open(server.port))
                ready_s, probe = wait_ready(server)
                samples.append([port_s, port_s + ready_s])
                print(f"  restart {rep}: port {port_s:.2f} s, ready {port_s + ready_s:.2f} s")
        finally:
            server.stop()
        return {
            table.PORT_ROW: row(
                [s[:1] for s in samples], ["s"], "2 workers; one write, then SIGKILL"
            ),
            table.READY_ROW: row(
                [s[1:] for s in samples], ["s"], f"from the restart; probe {probe}"
            ),
        }

    def digest(self) -> dict[str, Any]:
        first, repeat, put = [], [], []
        server = spawn(self.co, self.root, free_port(), 1)
        try:
            start_s, probe = wait_ready(server)
            self.ttfb(server.port)  # warm: imports, connections, the rendered digest
            for _ in range(self.reps):
                put.append(timed(server, lambda: self.put_turn(server.port)))
                first.append(timed(server, lambda: self.ttfb(server.port)))
                repeat.append(timed(server, lambda: self.ttfb(server.port)))
        finally:
            server.stop()
        # /proc stat counts CPU in clock ticks (10 ms here), coarse for one GET at 1k tasks;
        # schedstat's nanoseconds of the same threads are the third figure.
        units = ["ms", "ms CPU", "ms sched"]
        return {
            table.DIGEST_ROW: row(
                first, units, f"1 worker; body {self.digest_bytes / MiB:.1f} MiB"
            ),
            table.REPEAT_ROW: row(repeat, units, "1 worker"),
            table.PUT_ROW: row(
                put, units, f"not in the issue's table; clean start {start_s:.2f} s"
            ),
        }

    def disk(self) -> dict[str, Any]:
        """Per turn, walked after the server rows: derived files rendered on first use count."""
        project = self.root / TENANT / PROJECT
        shared = sorted(p for p in project.iterdir() if p.name.startswith(("_", ".")))
        tasks = [p for p in project.iterdir() if p not in shared]
        # The root holds this one project, so every lock file under .locks is its share.
        locks = self.root / ".locks"
        turns = self.count * TURNS + self.written
        out = {}
        for name, paths in ((table.DISK_ROW, [project, locks]), (table.DISK_TASKS_ROW, tasks)):
            size, inodes = walk(paths)
            out[name] = row([[size / turns, inodes / turns]], ["B", "inodes"])
        names = ", ".join(p.name for p in shared)
        out[table.DISK_ROW]["detail"] = (
            f"{turns} turns; project-level: {names}, .locks ({walk([locks])[1]} inodes)"
        )
        return out

    def cli(self) -> dict[str, Any]:
        archive, imported = self.root.parent / "export.tar.gz", self.root.parent / "imported"
        exports, imports, checks = [], [], []
        for _ in range(self.reps):
            got = self.co.flask(self.root, "export", *SCOPE_ARGS, str(archive))
            exports.append([got["peak_kib"] / 1024, got["wall_s"]])
            got = self.co.flask(imported, "import", str(archive))
            imports.append([got["wall_s"], got["wall_s"] * 1000 / self.count])
            shutil.rmtree(imported)
            got = self.co.flask(self.root, "fsck", check=False)  # exit 1: problems, reported
            checks.append([got["peak_kib"] / 1024, got["wall_s"]])
        mib = archive.stat().st_size / MiB
        last = (got["out"].strip().splitlines() or [""])[-1][:120]
        return {
            table.EXPORT_ROW: row(exports, ["MiB", "s"], f"one project; archive {mib:.1f} MiB"),
            table.IMPORT_ROW: row(imports, ["s", "ms/task"], "the archive, into an empty root"),
            table.FSCK_ROW: row(checks, ["MiB", "s"], f"read-only; exit {got['rc']}: {last}"),
        }

    def measure(self) -> dict[str, Any]:
        rows: dict[str, Any] = {}
        result: dict[str, Any] = {"rows": rows}
        steps: list[tuple[list[str], Callable[[], dict[str, Any]]]] = [
            ([table.PORT_ROW, table.READY_ROW], self.restart),
            ([table.DIGEST_ROW, table.REPEAT_ROW, table.PUT_ROW], self.digest),
            ([table.DISK_ROW, table.DISK_TASKS_ROW], self.disk),
            ([table.EXPORT_ROW, table.IMPORT_ROW, table.FSCK_ROW], self.cli),
        ]
        try:
            result["build"] = self.build()
            print(f"{self.count} tasks built in {result['build']['wall_s']:.0f} s", file=sys.stderr)
        except (NotMeasured, OSError, ValueError, subprocess.TimeoutExpired) as exc:
            steps, why = [], f"build failed: {exc}"[:600]
            rows.update({name: {"na": why} for name in table.ROWS})
        for names, step in steps:
            # A checkout that cannot produce a group of rows gets "n/a" and the reason.
            try:
                rows.update(step())
            except (NotMeasured, OSError, ValueError, subprocess.TimeoutExpired) as exc:
                print(f"  n/a: {', '.join(names)}: {exc}", file=sys.stderr)
                rows.update({name: {"na": str(exc)[:600]} for name in names})
        shutil.rmtree(self.root.parent, ignore_errors=True)
        return result


# -- main --------------------------------------------------------------------------------------
def fs_type(path: Path) -> str:
    out = subprocess.run(["stat", "-f", "-c", "%T", str(path)], capture_output=True, text=True)
    return out.stdout.strip() or "unknown"


def run(args: argparse.Namespace) -> dict[str, Any]:
    co = Checkout(args.checkout, args.python)
    work = Path(tempfile.mkdtemp(prefix="pm-scale-", dir=args.tmp))
    report: dict[str, Any] = {
        "kind": "scale",
        "checkout": str(co.path),
        **co.commit(),
        "started": time.strftime("%Y%m%dT%H%M%SZ", time.gmtime()),
        "machine": {
            "load_avg_start": os.getloadavg(),
            "python": platform.python_version(),
            "interpreter": str(args.python),
            "cores": os.cpu_count(),
            "fs_type": fs_type(work),
            "storage": storage_fs(work),
        },
        "settings": {"sizes": args.sizes, "reps": args.reps, "turns_per_task": TURNS},
        "notes": [
            "page cache warm throughout: dropping it needs root, so no cold-cache rows",
            f"worker CPU: utime + stime of /proc/<pid>/stat ({1000 / os.sysconf('SC_CLK_TCK'):.0f}"
            " ms ticks), then the sum of its threads' /proc/<pid>/task/*/schedstat (ns)",
        ],
        "sizes": {},
    }
    try:
        for count in args.sizes:
            report["sizes"][str(count)] = Size(co, work, count, args.reps).measure()
    finally:
        shutil.rmtree(work, ignore_errors=True)
    report["machine"]["load_avg_end"] = os.getloadavg()
    end = co.commit()
    if (end["commit"], end["tree"]) != (report["commit"], report["tree"]):
        report["notes"].append("THE CHECKOUT CHANGED DURING THE RUN: rows may mix two versions")
    return report


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--checkout", type=Path, help="a checkout of this repo (any commit)")
    parser.add_argument("--sizes", default="1000,10000", help="tasks per project, e.g. 1000,50000")
    parser.add_argument("--out", type=Path, help="the JSON file to write")
    parser.add_argument("--tmp", type=Path, help="where the roots are built (default: $TMPDIR)")
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--python", type=Path, default=Path(sys.executable))
    parser.add_argument("--compare", nargs=2, type=Path, metavar=("BEFORE", "AFTER"))
    args = parser.parse_args()
    if args.compare:
        table.compare(*args.compare)
        return
    if not args.checkout or not args.out:
        parser.error("--checkout and --out are required (or --compare BEFORE AFTER)")
    args.sizes = [int(n) for n in args.sizes.split(",")]
    report = run(args)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=1))
    print()
    table.print_report(report)
    print(f"JSON: {args.out}")


if __name__ == "__main__":
    main()
