"""What an agent waits for when it starts ``project-memory mcp`` (the stdio relay): whole
processes, in fresh non-editable installs of the client.

    python -m bench.relay [--runs 15] [--base REF] [--hogs N]

Builds the client of this checkout (and with ``--base REF`` that commit's) into fresh venvs
twice, as bench/agent_hooks.py does: ``compiled`` as pip installs it (bytecode written),
``source`` with ``pip install --no-compile`` and run with PYTHONDONTWRITEBYTECODE, so every
module is compiled at every start. Starts the service (bench/servers.py ``start_ours``) with
a writer's token, then, interleaved run by run across the installs, spawns the relay as an
agent does, writes ``initialize`` at once and measures:

* ``initialize``: wall ms from spawn to the answer's line on stdout;
* ``tools/list``: wall ms from spawn to the answer of the first ``tools/list`` (sent with
  ``notifications/initialized`` after the first answer);
* ``cpu``: user + system ms of the whole process (stdin closed after the list; wait4).

Prints p50/p95 of each, the ratio of each p50 to the base's, the load average before and
after, and what each install imports on the way (``python -X importtime``: the modules of
:data:`HEAVY` it loaded, and the sum of all import times); writes
bench/results/relay-<time>.json.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import select
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.agent_hooks import client_venv, hogs, pct
from bench.servers import REPO, start_ours

INITIALIZE = {
    "jsonrpc": "2.0",
    "id": 0,
    "method": "initialize",
    "params": {
        "protocolVersion": "2025-11-25",
        "capabilities": {},
        "clientInfo": {"name": "bench", "version": "1"},
    },
}
INITIALIZED = {"jsonrpc": "2.0", "method": "notifications/initialized"}
TOOLS_LIST = {"jsonrpc": "2.0", "id": 1, "method": "tools/list"}
# Libraries an answer on stdio does not need; the relay's start-up before this change loaded
# all of them (tests/agents/test_mcp_bridge.py keeps them off the path).
HEAVY = (
    "httpx",
    "httpcore",
    "h11",
    "anyio",
    "certifi",
    "ssl",
    "email",
    "http.client",
    "urllib.request",
    "concurrent.futures",
    "logging",
    "argparse",
    "dataclasses",
    "project_memory_client.command_line",
)


def _line(message: dict[str, Any]) -> bytes:
    return (json.dumps(message) + "\n").encode("utf-8")


def _read_line(fd: int, buffer: bytearray, deadline: float) -> bytes:
    """The next line of ``fd`` (a pipe), waiting until ``deadline`` at most."""
    while b"\n" not in buffer:
        left = deadline - time.monotonic()
        if left <= 0 or not select.select([fd], [], [], left)[0]:
            raise TimeoutError("the relay did not answer within 60 s")
        data = os.read(fd, 65536)
        if not data:
            raise EOFError("the relay closed its stdout before answering")
        buffer += data
    line, _, rest = bytes(buffer).partition(b"\n")
    buffer[:] = rest
    return line


def start_once(cli: Path, env: dict[str, str], cwd: Path) -> tuple[float, float, float]:
    """Wall ms to the ``initialize`` answer and to the ``tools/list`` answer, and CPU ms of
    the whole process."""
    with tempfile.TemporaryFile() as err:
        started = time.perf_counter()
        proc = subprocess.Popen(
            [str(cli), "mcp"], stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=err,
            env=env, cwd=cwd,
        )  # fmt: skip
        assert proc.stdin is not None and proc.stdout is not None
        try:
            proc.stdin.write(_line(INITIALIZE))
            proc.stdin.flush()
            buffer = bytearray()
            deadline = time.monotonic() + 60
            first = json.loads(_read_line(proc.stdout.fileno(), buffer, deadline))
            to_init = (time.perf_counter() - started) * 1000
            proc.stdin.write(_line(INITIALIZED) + _line(TOOLS_LIST))
            proc.stdin.flush()
            listed = json.loads(_read_line(proc.stdout.fileno(), buffer, deadline))
            to_list = (time.perf_counter() - started) * 1000
            proc.stdin.close()
            _, status, usage = os.wait4(proc.pid, 0)
            proc.returncode = os.waitstatus_to_exitcode(status)
        except BaseException:
            proc.kill()
            proc.wait()
            raise
        finally:
            proc.stdout.close()
        if "result" not in first or not listed.get("result", {}).get("tools"):
            err.seek(0)
            raise RuntimeError(f"not an answer: {first} {listed}\n{err.read().decode()}")
    return to_init, to_list, (usage.ru_utime + usage.ru_stime) * 1000


_IMPORT_LINE = re.compile(r"import time:\s+(\d+) \|\s+(\d+) \|\s*(\S+)")


def imports(cli: Path, env: dict[str, str], cwd: Path) -> tuple[float, list[str]]:
    """One start under ``-X importtime`` (``initialize``, then stdin closed): ms of all
    imports (their own times summed), and the :data:`HEAVY` modules loaded."""
    python = cli.parent / "python"
    args = [str(python), "-X", "importtime", "-m", "project_memory_client.cli", "mcp"]
    done = subprocess.run(
        args, input=_line(INITIALIZE), capture_output=True, env=env, cwd=cwd, timeout=60,
        check=True,
    )  # fmt: skip
    total = 0.0
    loaded = set()
    for line in done.stderr.decode(errors="replace").splitlines():
        m = _IMPORT_LINE.match(line)
        if m:
            total += int(m.group(1)) / 1000
            loaded.add(m.group(3))
    return total, [name for name in HEAVY if name in loaded]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=15, help="runs of each install")
    parser.add_argument("--hogs", type=int, default=0, help="yes > /dev/null processes beside")
    parser.add_argument("--base", default=None, help="a commit whose client is measured too")
    args = parser.parse_args()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(1))
    work = Path(tempfile.mkdtemp(prefix="bench-relay-"))
    refs: dict[str, str | None] = {"this": None}
    if args.base:
        refs["base"] = args.base
    installs: dict[str, Path] = {}
    for side, ref in refs.items():
        for kind in ("compiled", "source"):
            name = f"{side} {kind}"
            venv_name = f"{side}-{kind}"
            installs[name] = client_venv(work, venv_name, ref, compile=kind == "compiled")
    server = start_ours(work / "server")
    figures: dict[str, dict[str, list[float]]] = {name: {} for name in installs}
    loads = [os.getloadavg()[0]]
    imported: dict[str, tuple[float, list[str]]] = {}
    try:
        sys.path.insert(0, str(REPO))
        from app.storage.tree.tokens import TokenRegistry

        token = TokenRegistry(work / "server" / "tokens.json").create(
            role="writer", tenant="bench", project="bench"
        )[1]
        base_env = {k: v for k, v in os.environ.items() if not k.startswith("PROJECT_MEMORY_")}
        base_env.pop("PYTHONPATH", None)  # the installed client, not a checkout's
        env = {**base_env, "HOME": str(work), "PROJECT_MEMORY_URL": server.url,
               "PROJECT_MEMORY_TOKEN": token}  # fmt: skip
        envs = {
            name: {**env, "PYTHONDONTWRITEBYTECODE": "1"} if name.endswith("source") else env
            for name in installs
        }
        for name, cli in installs.items():
            start_once(cli, envs[name], work)  # warm: the page cache, the server's first call
            imported[name] = imports(cli, envs[name], work)
        names = list(installs)
        with hogs(args.hogs):
            for run in range(args.runs):
                # Each install first, last and in between in turn.
                order = names[run % len(names) :] + names[: run % len(names)]
                for name in order:
                    to_init, to_list, cpu = start_once(installs[name], envs[name], work)
                    figures[name].setdefault("initialize", []).append(to_init)
                    figures[name].setdefault("tools/list", []).append(to_list)
                    figures[name].setdefault("cpu", []).append(cpu)
                loads.append(os.getloadavg()[0])
    finally:
        server.stop()
        shutil.rmtree(work, ignore_errors=True)
    rows = []
    print(f"{'install':<16} {'figure':<11} {'p50 ms':>8} {'p95 ms':>8} {'p50 / base':>10}")
    for name, by_figure in figures.items():
        side, kind = name.split()
        for figure, values in by_figure.items():
            row: dict[str, Any] = {"install": name, "figure": figure, "runs": len(values),
                                   "p50_ms": round(statistics.median(values), 1),
                                   "p95_ms": round(pct(values, 0.95), 1)}  # fmt: skip
            line = f"{name:<16} {figure:<11} {row['p50_ms']:>8.0f} {row['p95_ms']:>8.0f}"
            other = figures.get(f"base {kind}", {}).get(figure)
            if side == "this" and other:
                row["p50_over_base"] = round(row["p50_ms"] / statistics.median(other), 2)
                line += f" {row['p50_over_base']:>10.2f}"
            rows.append(row)
            print(line)
    for name, (total, heavy) in imported.items():
        print(f"{name:<16} imports {total:.0f} ms; of HEAVY: {', '.join(heavy) or 'none'}")
    load = {"before": round(loads[0], 1), "after": round(loads[-1], 1),
            "min": round(min(loads), 1), "max": round(max(loads), 1)}  # fmt: skip
    print(f"(load average {load}; {args.hogs} hog(s); {args.runs} interleaved runs)")
    out = (
        REPO / "bench" / "results" / f"relay-{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime())}.json"
    )
    out.parent.mkdir(exist_ok=True)
    out.write_text(json.dumps({"rows": rows, "load_average": load, "hogs": args.hogs,
                               "runs": args.runs, "base": args.base,
                               "imports": {k: {"ms": round(t, 1), "heavy": h}
                                           for k, (t, h) in imported.items()}},
                              indent=2))  # fmt: skip


if __name__ == "__main__":
    main()
