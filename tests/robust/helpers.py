"""Shared tools of the robustness tests: a real gunicorn we can kill, faults, tree checks."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import requests

from app.storage.core.names import TMP_PREFIX
from app.storage.tree.tasks import TaskStore
from app.storage.tree.tokens import TokenRegistry
from tests.e2e.conftest import REPO, VENV_BIN, free_port
from tests.storage._helpers import Fault, temp_files  # noqa: F401 - shared with tests/robust

BASE = "/sandbox/memory/v1"


@dataclass
class Live:
    """A gunicorn on 127.0.0.1 started by the test; it may be killed and started again."""

    tmp_path: Path
    root: Path
    app: str = "wsgi:app"
    workers: int = 2
    threads: int = 4
    worker_class: str = "gthread"
    env_extra: dict[str, str] = field(default_factory=dict)
    prefix: list[str] = field(default_factory=list)  # e.g. setpriv's, before gunicorn
    port: int = 0  # 0: a free one at each start
    proc: subprocess.Popen[bytes] | None = None
    url: str = ""
    env: dict[str, str] = field(default_factory=dict)
    log_path: Path | None = None
    starts: int = 0

    @property
    def tokens_file(self) -> Path:
        return self.tmp_path / "tokens.json"

    def start(self) -> Live:
        port = self.port or free_port()
        self.env = {
            **os.environ,
            "MEMORY_STORAGE_ROOT": str(self.root),
            "MEMORY_TOKENS_FILE": str(self.tokens_file),
            "MEMORY_BIND": f"127.0.0.1:{port}",
            "MEMORY_WORKERS": str(self.workers),
            "MEMORY_THREADS": str(self.threads),
            "MEMORY_LOG_LEVEL": "WARNING",
            "MEMORY_SWEEP_INTERVAL": "0",
            **self.env_extra,
        }
        self.starts += 1
        self.log_path = self.tmp_path / f"gunicorn-{self.starts}-{port}.log"
        args = [*self.prefix, str(VENV_BIN / "gunicorn"), "-c", "gunicorn.conf.py"]
        if self.worker_class != "gthread":  # gthread: the gthread-based worker the config names
            args += ["-k", self.worker_class]
        args.append(self.app)
        with open(self.log_path, "wb") as log:
            # A session of its own: the whole server (master and workers) can be killed at once
            # by process group, without touching any other gunicorn on the machine.
            self.proc = subprocess.Popen(
                args,
                cwd=REPO,
                env=self.env,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        self.url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"gunicorn exited early:\n{self.log()}")
            try:
                if requests.get(f"{self.url}/healthz", timeout=1).status_code == 200:
                    return self
            except requests.RequestException:
                # A busy machine, or a server killed mid-answer (the power-loss cycles kill
                # it while it starts): ask again; a dead server is caught by poll() above.
                time.sleep(0.1)
        self.kill_all()
        raise RuntimeError(f"gunicorn did not come up:\n{self.log()}")

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path else ""

    def registry(self) -> TokenRegistry:
        return TokenRegistry(self.tokens_file)

    def token(self, role: str, tenant: str | None = "acme", project: str | None = "web") -> str:
        """A new token, written to the registry file every worker reads (no CLI start-up)."""
        _, secret = self.registry().create(role=role, tenant=tenant, project=project)
        return secret

    def worker_pids(self) -> list[int]:
        assert self.proc is not None
        out = subprocess.run(
            ["pgrep", "-P", str(self.proc.pid)], capture_output=True, text=True, check=False
        ).stdout
        return [int(p) for p in out.split()]

    def kill_master(self) -> None:
        """SIGKILL the master only (its workers are orphaned, as when the OOM killer picks it)."""
        assert self.proc is not None
        self.proc.kill()
        self.proc.wait(timeout=30)

    def kill_all(self) -> None:
        """SIGKILL the master and every worker at once (its own process group)."""
        if self.proc is None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(timeout=30)

    def stop(self) -> None:
        if self.proc is None:
            return
        if self.proc.poll() is not None:
            # The master is gone; what is left of its session (orphaned workers) goes too.
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)
            return
        self.proc.send_signal(signal.SIGTERM)
        try:
            # Longer than gunicorn's graceful_timeout (30 s): a worker still finishing then is
            # killed by its master, which goes on to its on_exit (the clean stop's sentinel
            # removal). Killing the master at the same moment would make it an unclean stop.
            self.proc.wait(timeout=45)
        except subprocess.TimeoutExpired:
            self.kill_all()
        # Workers of a stopped master must be gone before the tree is inspected.
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                os.killpg(self.proc.pid, 0)
            except ProcessLookupError:
                return
            time.sleep(0.05)
        self.kill_all()


def start(tmp_path: Path, **kwargs: Any) -> Live:
    root = kwargs.pop("root", None) or tmp_path / "storage"
    return Live(tmp_path=tmp_path, root=root, **kwargs).start()


@pytest.fixture
def live_factory(tmp_path: Path):  # noqa: ANN201
    """Start servers on demand; every one of them is stopped at the end of the test."""
    started: list[Live] = []

    def make(**kwargs: Any) -> Live:
        server = start(tmp_path, **kwargs)
        started.append(server)
        return server

    yield make
    for server in started:
        server.stop()


def auth(secret: str, **extra: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {secret}", **extra}


# -- tree checks --------------------------------------------------------------------------------
def json_files_parse(root: Path) -> list[str]:
    """Every meta.json / index.json / task.json under root: the ones that are empty or torn."""
    bad = []
    for dirpath, _, filenames in os.walk(root):
        for name in filenames:
            if name.endswith(".json") and not name.startswith(TMP_PREFIX):
                path = Path(dirpath) / name
                data = path.read_bytes()
                try:
                    json.loads(data)
                except ValueError:
                    bad.append(f"{path} ({len(data)} bytes)")
    return bad


def tree_outside(path: Path) -> set[str]:
    """Names under ``path`` (used to prove nothing was created outside the storage root)."""
    return {str(p.relative_to(path)) for p in path.rglob("*")}


def store_for(root: Path) -> TaskStore:
    return TaskStore(root, lock_timeout=10.0)
