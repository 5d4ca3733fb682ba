"""Start and stop the servers under test, each on a free 127.0.0.1 port of its own.

* ours: ``gunicorn -c gunicorn.conf.py wsgi:app``, exactly what ``make run`` starts;
* hello: ``gunicorn -c gunicorn.conf.py bench.hello:app``, the same settings and a one-line app;
* floor: ``gunicorn -c gunicorn.conf.py bench.floor:app``, the same settings and the fewest
  moves that record a turn as ours does (bench/floor.py);
* mlflow: ``mlflow server`` (SQLite backend, --serve-artifacts, 2 workers) from its own venv.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
VENV_BIN = Path(sys.executable).parent
MLFLOW_BIN = REPO / "bench" / ".venv-mlflow" / "bin"


def proc_cpu(pid: int) -> tuple[float, float]:
    """(user, kernel) CPU seconds of one process, its threads included (/proc/<pid>/stat)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    tick = os.sysconf("SC_CLK_TCK")
    return int(fields[11]) / tick, int(fields[12]) / tick


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass
class Server:
    name: str
    port: int
    proc: subprocess.Popen[bytes]
    env: dict[str, str]
    log_path: Path

    host = "127.0.0.1"

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def worker_pids(self) -> list[int]:
        """Direct children of the master (gunicorn workers), oldest first."""
        out = subprocess.run(
            ["pgrep", "-P", str(self.proc.pid)], capture_output=True, text=True, check=False
        ).stdout
        return sorted(int(p) for p in out.split())

    def token(
        self, role: str = "writer", tenant: str = "bench", project: str | None = "bench"
    ) -> str:
        """Create a token with the service's own CLI; the last stdout line is the secret."""
        args = [str(VENV_BIN / "flask"), "--app", "wsgi", "tokens", "create", "--role", role]
        args += ["--tenant", tenant]
        if project:
            args += ["--project", project]
        out = subprocess.run(
            args, cwd=REPO, env=self.env, capture_output=True, text=True, timeout=60, check=True
        ).stdout
        return out.strip().splitlines()[-1]

    def cpu_seconds(self) -> float:
        """User + system CPU of every process in the server's process group so far."""
        out = subprocess.run(
            ["pgrep", "-g", str(self.proc.pid)], capture_output=True, text=True, check=False
        ).stdout
        total = 0.0
        for pid in out.split():
            try:
                total += sum(proc_cpu(int(pid)))
            except OSError:
                continue  # exited meanwhile
        return total

    def idle_cpu(self, seconds: float = 3.0) -> float:
        """Percent of one core the server uses with no request in flight."""
        before, started = self.cpu_seconds(), time.monotonic()
        time.sleep(seconds)
        return 100 * (self.cpu_seconds() - before) / (time.monotonic() - started)

    def settle(self, below: float = 5.0, limit: float = 120.0) -> float:
        """Wait until the server idles under ``below`` % of a core; return the seconds waited."""
        started = time.monotonic()
        while self.idle_cpu(2.0) >= below and time.monotonic() - started < limit:
            pass
        return time.monotonic() - started

    def pause(self) -> None:
        """SIGSTOP the whole process group: an idle server must not take CPU from the one
        measured (MLflow's job consumers poll at ~1 core even when idle, bench/README.md)."""
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGSTOP)

    def resume(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGCONT)

    def stop(self) -> None:
        self.resume()  # a stopped group would never see the SIGTERM
        if self.proc.poll() is None:
            # Our own process group (start_new_session): reaches the master and its workers.
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()


def _wait_up(proc: subprocess.Popen[bytes], url: str, log_path: Path, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited early:\n{log_path.read_text(errors='replace')}")
        try:
            with urllib.request.urlopen(url, timeout=2) as resp:  # noqa: S310 - our 127.0.0.1 server
                if resp.status == 200:
                    return
        except OSError:
            time.sleep(0.2)
    os.killpg(proc.pid, signal.SIGKILL)
    raise RuntimeError(f"server did not come up:\n{log_path.read_text(errors='replace')}")


def _spawn(name: str, args: list[str], env: dict[str, str], workdir: Path, port: int) -> Server:
    log_path = workdir / f"{name}-{port}.log"
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(
            args, cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
    return Server(name, port, proc, env, log_path)


def gunicorn_env(workdir: Path, port: int, **extra: str) -> dict[str, str]:
    return {
        **os.environ,
        "MEMORY_STORAGE_ROOT": str(workdir / "storage"),
        "MEMORY_TOKENS_FILE": str(workdir / "tokens.json"),
        "MEMORY_BIND": f"127.0.0.1:{port}",
        "MEMORY_WORKERS": os.environ.get("MEMORY_WORKERS", "2"),
        "MEMORY_THREADS": os.environ.get("MEMORY_THREADS", "4"),
        # The hourly retention sweep starts at once on a new root and walks every task: a
        # background job, kept out of the request figures (set it to measure it alongside).
        "MEMORY_SWEEP_INTERVAL": os.environ.get("BENCH_SWEEP_INTERVAL", "0"),
        **extra,
    }


def start_ours(workdir: Path, **env_extra: str) -> Server:
    """The service as `make run` starts it (its request log goes to the log file)."""
    workdir.mkdir(parents=True, exist_ok=True)
    port = free_port()
    env = gunicorn_env(workdir, port, **env_extra)
    args = [str(VENV_BIN / "gunicorn"), "-c", "gunicorn.conf.py", "wsgi:app"]
    server = _spawn("ours", args, env, workdir, port)
    _wait_up(server.proc, f"{server.url}/healthz", server.log_path, 60)
    return server


def start_hello(workdir: Path) -> Server:
    """The framework ceiling: a hello-world Flask app on the identical gunicorn settings."""
    return _start_bench_app("hello", "bench.hello:app", "/hello", workdir)


def start_floor(workdir: Path) -> Server:
    """The floor of this design: bench/floor.py on the identical gunicorn settings."""
    return _start_bench_app("floor", "bench.floor:app", "/healthz", workdir)


def _start_bench_app(name: str, target: str, probe: str, workdir: Path) -> Server:
    workdir.mkdir(parents=True, exist_ok=True)
    port = free_port()
    env = gunicorn_env(workdir, port)
    args = [str(VENV_BIN / "gunicorn"), "-c", "gunicorn.conf.py", target]
    server = _spawn(name, args, env, workdir, port)
    _wait_up(server.proc, f"{server.url}{probe}", server.log_path, 60)
    return server


def start_mlflow(workdir: Path, workers: int = 2) -> Server:
    """MLflow tracking server: default SQLite backend, proxied artifacts, 2 workers."""
    workdir.mkdir(parents=True, exist_ok=True)
    port = free_port()
    env = {**os.environ, "MLFLOW_HOME": str(workdir)}
    args = [
        str(MLFLOW_BIN / "mlflow"),
        "server",
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--backend-store-uri",
        f"sqlite:///{workdir / 'mlflow.db'}",
        "--serve-artifacts",
        "--artifacts-destination",
        str(workdir / "mlartifacts"),
        "--workers",
        str(workers),
    ]
    server = _spawn("mlflow", args, env, workdir, port)
    _wait_up(server.proc, f"{server.url}/health", server.log_path, 180)
    return server


def vm_kib(pid: int, field: str) -> int:
    """A VmHWM / VmRSS figure of ``pid`` in KiB, from /proc/<pid>/status."""
    with open(f"/proc/{pid}/status", encoding="ascii") as fh:
        for line in fh:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise KeyError(field)


def reset_hwm(pid: int) -> None:
    """Reset the peak RSS of ``pid`` to its current RSS (Linux: write 5 to clear_refs)."""
    with open(f"/proc/{pid}/clear_refs", "w", encoding="ascii") as fh:
        fh.write("5")
