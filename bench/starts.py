"""How fast the service starts: an admin command, and a restart after a clean stop.

    python -m bench.starts [--base DIR] [--tasks 1000 10000] [--reps 5]
    python -m bench.starts --install [--reps 5]

* ``flask --app wsgi tokens list``: wall time from spawn to exit, over an empty root (the
  command every operator runs first); and which of the heavy libraries it imported
  (``python -X importtime``: boto3, psycopg, apispec, the console's templates ...), with the
  import time of ``wsgi`` as a whole.
* restart to ``/readyz``: a project of N tasks (bench/loader.py), the server
  (``gunicorn -c gunicorn.conf.py wsgi:app``, 2 workers) started and stopped cleanly once,
  then timed from spawn to ``/readyz`` answering 200, and stopped cleanly again, ``--reps``
  times.

With ``--base``, the same for another checkout (its code, this venv's packages), interleaved
(this, base, base, this, ...) on the same roots. Prints one table of medians and ranges.

``--install``: ``tokens list`` as docs/deploy.md installs the server: the checkout's files
(``git archive HEAD``) in a scratch directory, ``pip install '.[server]'`` into a fresh venv
there, the command run from that directory (its ``app`` is the one imported). Timed as the
service's user meets it, with PYTHONDONTWRITEBYTECODE and no bytecode in the checkout
(it cannot write there), then after the recipe's ``compileall`` line; interleaved.

Each checkout is byte-compiled first, and the commands run without PYTHONDONTWRITEBYTECODE:
as a deployment runs them (its first start writes the .pyc files), where compiling the app
from source on every start would be a tenth of a second that no user pays.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

from . import servers

HEAVY = (
    "boto3",
    "botocore",
    "psycopg",
    "psycopg_pool",
    "apispec",
    "marshmallow",
    "jinja2",
    "prometheus_client",
    "sqlite3",
    "app.console",
)


def _env(checkout: Path, work: Path) -> dict[str, str]:
    env = servers.gunicorn_env(work, 0, PYTHONPATH=str(checkout))
    env.pop("MEMORY_BIND")
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    return env


def compile_checkout(checkout: Path) -> None:
    args = [sys.executable, "-m", "compileall", "-q", "app", "wsgi.py", "gunicorn.conf.py"]
    subprocess.run(args, cwd=checkout, check=True, stdout=subprocess.DEVNULL)


def cli_seconds(checkout: Path, work: Path) -> tuple[float, float]:
    """Wall time and CPU (user + system) of one ``flask --app wsgi tokens list``."""
    args = [str(servers.VENV_BIN / "flask"), "--app", "wsgi", "tokens", "list"]
    before = os.times()
    started = time.perf_counter()
    subprocess.run(
        args, cwd=checkout, env=_env(checkout, work), capture_output=True, check=True, timeout=120
    )
    wall = time.perf_counter() - started
    after = os.times()
    cpu = (
        after.children_user - before.children_user + after.children_system - before.children_system
    )
    return wall, cpu


_IMPORT_LINE = re.compile(r"import time:\s+(\d+) \|\s+(\d+) \|(\s*)(\S+)")


def cli_imports(checkout: Path, work: Path) -> tuple[float, dict[str, float]]:
    """``tokens list`` under ``-X importtime``: ms to import wsgi, and ms of each heavy
    library it imported (cumulative, at its first import)."""
    code = "import sys; from flask.cli import main; sys.argv[0] = 'flask'; main()"
    args = [sys.executable, "-X", "importtime", "-c", code, "--app", "wsgi", "tokens", "list"]
    done = subprocess.run(
        args, cwd=checkout, env=_env(checkout, work), capture_output=True, text=True, timeout=120
    )
    heavy: dict[str, float] = {}
    wsgi = 0.0
    for line in done.stderr.splitlines():
        m = _IMPORT_LINE.match(line)
        if not m:
            continue
        cumulative, name = int(m.group(2)) / 1000, m.group(4)
        if name == "wsgi":
            wsgi = cumulative
        top = next((h for h in HEAVY if name == h), None)
        if top is not None and top not in heavy:
            heavy[top] = cumulative
    return wsgi, heavy


def install_rows(reps: int) -> None:
    """``tokens list`` in a fresh non-editable install, before and after ``compileall``."""
    with tempfile.TemporaryDirectory(prefix="pm-install-") as tmp:
        site = Path(tmp) / "project-memory"
        site.mkdir()
        archive = subprocess.run(
            ["git", "archive", "HEAD"], cwd=servers.REPO, capture_output=True, check=True
        )
        subprocess.run(["tar", "-x", "-C", str(site)], input=archive.stdout, check=True)
        venv = site / ".venv"
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
        pip = [str(venv / "bin" / "pip"), "install", "-q", "--disable-pip-version-check"]
        subprocess.run([*pip, ".[server]"], cwd=site, check=True)
        shutil.rmtree(site / "build", ignore_errors=True)  # what pip's build left beside it
        compiled = Path(tmp) / "compiled"
        shutil.copytree(site, compiled, ignore=shutil.ignore_patterns(".venv"))
        python = str(venv / "bin" / "python")
        subprocess.run(
            [python, "-m", "compileall", "-q", "app", "wsgi.py"], cwd=compiled, check=True
        )
        work = Path(tmp) / "work"
        work.mkdir()
        env = {**servers.gunicorn_env(work, 0), "PYTHONDONTWRITEBYTECODE": "1"}
        env.pop("MEMORY_BIND")
        args = [str(venv / "bin" / "flask"), "--app", "wsgi", "tokens", "list"]
        sides = {"as installed": site, "after compileall": compiled}
        timed: dict[str, list[float]] = {name: [] for name in sides}
        for rep in range(reps + 1):
            order = list(sides.items()) if rep % 2 == 0 else list(sides.items())[::-1]
            for name, cwd in order:
                started = time.perf_counter()
                subprocess.run(args, cwd=cwd, env=env, capture_output=True, check=True)
                if rep:  # the first round warms the page cache
                    timed[name].append(time.perf_counter() - started)
        assert not list(site.glob("app/**/__pycache__")), "the service's user writes no bytecode"
        print(
            f"tokens list in a fresh install: median (min-max) of {reps} interleaved reps, s;",
            end=" ",
        )
        print(f"load average {os.getloadavg()[0]:.1f}")
        for name, values in timed.items():
            print(f"  {name:<18} {fmt(values)}")


def start_seconds(checkout: Path, work: Path) -> float:
    """Spawn the server from ``checkout`` on ``work``; seconds until /readyz; stop it cleanly."""
    port = servers.free_port()
    env = servers.gunicorn_env(work, port, PYTHONPATH=str(checkout))
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    args = [str(servers.VENV_BIN / "gunicorn"), "-c", "gunicorn.conf.py", "wsgi:app"]
    log_path = work / f"start-{port}.log"
    started = time.monotonic()
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(
            args, cwd=checkout, env=env, stdout=log, stderr=subprocess.STDOUT,
            start_new_session=True,
        )  # fmt: skip
    server = servers.Server("start", port, proc, env, log_path)
    try:
        deadline = started + 600
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                raise RuntimeError(f"server exited early:\n{log_path.read_text(errors='replace')}")
            try:
                with urllib.request.urlopen(f"{server.url}/readyz", timeout=2) as resp:  # noqa: S310
                    if resp.status == 200:
                        return time.monotonic() - started
            except OSError:
                time.sleep(0.01)  # a poll this often: the figure is to ~10 ms
        raise RuntimeError(f"not ready in 600 s:\n{log_path.read_text(errors='replace')}")
    finally:
        server.stop()


def load(work: Path, tasks: int) -> None:
    args = [sys.executable, "-m", "bench.loader", str(work / "storage"), "bench", "bench"]
    subprocess.run([*args, str(tasks)], cwd=servers.REPO, check=True, stdout=subprocess.DEVNULL)


def fmt(values: list[float]) -> str:
    return f"{statistics.median(values):.3f} ({min(values):.3f}-{max(values):.3f})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base", type=Path, help="another checkout, measured interleaved")
    parser.add_argument("--tasks", type=int, nargs="*", default=[1000, 10000])
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--install", action="store_true", help="a fresh install (see above)")
    args = parser.parse_args()
    if args.install:
        install_rows(args.reps)
        return
    sides = {"this": servers.REPO}
    if args.base:
        sides["base"] = args.base.resolve()
    load_avg = [os.getloadavg()[0]]
    cli: dict[str, list[tuple[float, float]]] = {k: [] for k in sides}
    starts: dict[tuple[str, int], list[float]] = {}
    imports = {}
    with tempfile.TemporaryDirectory(prefix="pm-starts-") as tmp:
        empty = Path(tmp) / "empty"
        empty.mkdir()
        for name, checkout in sides.items():
            compile_checkout(checkout)
            cli_seconds(checkout, empty)  # warm: the page cache
            imports[name] = cli_imports(checkout, empty)
        for rep in range(args.reps):
            order = list(sides.items()) if rep % 2 == 0 else list(sides.items())[::-1]
            for name, checkout in order:
                cli[name].append(cli_seconds(checkout, empty))
        for tasks in args.tasks:
            work = Path(tmp) / f"t{tasks}"
            work.mkdir()
            load(work, tasks)
            for checkout in sides.values():
                start_seconds(checkout, work)  # the first start after the load, untimed
            for rep in range(args.reps):
                order = list(sides.items()) if rep % 2 == 0 else list(sides.items())[::-1]
                for name, checkout in order:
                    starts.setdefault((name, tasks), []).append(start_seconds(checkout, work))
                load_avg.append(os.getloadavg()[0])
            print(f"  {tasks} tasks done, load {load_avg[-1]:.1f}", file=sys.stderr)
    print(f"starts: median (min-max) of {args.reps} interleaved reps, seconds;", end=" ")
    print(f"load average {min(load_avg):.1f}-{max(load_avg):.1f}")
    for name, checkout in sides.items():
        print(f"{name} = {checkout}")
        print(f"  flask --app wsgi tokens list   {fmt([w for w, _ in cli[name]])} wall,", end=" ")
        print(f"{fmt([c for _, c in cli[name]])} CPU")
        wsgi, heavy = imports[name]
        libs = ", ".join(f"{k} {v:.0f}" for k, v in heavy.items()) or "none"
        print(f"  import wsgi {wsgi:.0f} ms; heavy libraries imported (ms): {libs}")
        for tasks in args.tasks:
            print(f"  restart to /readyz, {tasks:>6} tasks   {fmt(starts[(name, tasks)])}")


if __name__ == "__main__":
    main()
