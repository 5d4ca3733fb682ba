"""A real gunicorn on 127.0.0.1 (free port), started the way `make run` starts it."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import requests

REPO = Path(__file__).resolve().parents[2]
VENV_BIN = Path(sys.executable).parent


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def flask_cli(env: dict[str, str], *args: str) -> str:
    """Run `flask --app wsgi ARGS` with ``env``; return stdout (AssertionError with what it
    printed when it fails: `fsck` exits 1 when it finds problems)."""
    result = subprocess.run(
        [str(VENV_BIN / "flask"), "--app", "wsgi", *args],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, (
        f"flask {' '.join(args)} exited {result.returncode}:\n{result.stdout}{result.stderr}"
    )
    return result.stdout


@dataclass
class Server:
    """A running gunicorn: ``url``, its environment, and helpers to make tokens."""

    url: str
    env: dict[str, str]
    root: Path
    proc: subprocess.Popen[bytes]
    log_path: Path
    extra_args: list[str] = field(default_factory=list)

    def token(self, role: str, tenant: str | None = "acme", project: str | None = "web") -> str:
        args = ["tokens", "create", "--role", role]
        if tenant:
            args += ["--tenant", tenant]
        if project:
            args += ["--project", project]
        return flask_cli(self.env, *args).strip().splitlines()[-1]

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def worker_pids(self) -> list[int]:
        out = subprocess.run(
            ["pgrep", "-P", str(self.proc.pid)], capture_output=True, text=True, check=False
        ).stdout
        return [int(p) for p in out.split()]

    def kill(self) -> None:
        """SIGKILL the master and its workers at once, as a crash would stop them."""
        workers = self.worker_pids()  # before the master dies and they are reparented
        self.proc.send_signal(signal.SIGKILL)
        for pid in workers:
            os.kill(pid, signal.SIGKILL)
        self.proc.wait(timeout=10)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def start_server(
    tmp_path: Path,
    *,
    workers: int = 2,
    threads: int | None = 4,
    worker_class: str = "gthread",
    env_extra: dict[str, str] | None = None,
    root: Path | None = None,
) -> Server:
    port = free_port()
    root = root or tmp_path / "storage"
    env = {
        **os.environ,
        "MEMORY_STORAGE_ROOT": str(root),
        "MEMORY_TOKENS_FILE": str(tmp_path / "tokens.json"),
        "MEMORY_BIND": f"127.0.0.1:{port}",
        "MEMORY_WORKERS": str(workers),
        "MEMORY_LOG_LEVEL": "WARNING",
        **(env_extra or {}),
    }
    if threads is not None:  # None: gunicorn.conf.py's default
        env["MEMORY_THREADS"] = str(threads)
    log_path = tmp_path / f"gunicorn-{port}.log"
    args = [str(VENV_BIN / "gunicorn"), "-c", "gunicorn.conf.py", "wsgi:app"]
    if worker_class != "gthread":
        args += ["-k", worker_class]
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(args, cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"gunicorn exited early:\n{log_path.read_text()}")
        try:
            if requests.get(f"{url}/healthz", timeout=1).status_code == 200:
                break
        except requests.RequestException:
            # Not listening yet, or a busy machine answering after the timeout: ask again (a
            # server that died is caught by poll() above).
            time.sleep(0.1)
    else:
        proc.kill()
        raise RuntimeError(f"gunicorn did not come up:\n{log_path.read_text()}")
    return Server(url=url, env=env, root=root, proc=proc, log_path=log_path)


def serving(factory: pytest.TempPathFactory, name: str, **kwargs: Any) -> Iterator[Server]:
    """Body of a module-scoped server fixture: ``yield from serving(tmp_path_factory, "x")``."""
    srv = start_server(factory.mktemp(name), **kwargs)
    try:
        yield srv
    finally:
        srv.stop()


@pytest.fixture
def server(tmp_path: Path) -> Iterator[Server]:
    srv = start_server(tmp_path)
    try:
        yield srv
    finally:
        srv.stop()
