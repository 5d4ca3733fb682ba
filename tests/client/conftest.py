"""One real gunicorn (2 workers x 4 threads) for the client's tests, and the CLI as a process.

The server lives for the test session (one per xdist worker); each test writes under task
ids of its own, and the tests that need a project to themselves get a token for one.
The CLI runs with a config directory of its own, so no file of the person running the
tests is read.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from project_memory_client import Client

from tests.e2e.conftest import Server, serving

CLI = str(Path(sys.executable).parent / "project-memory")


@pytest.fixture(scope="session")
def pm_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    yield from serving(
        tmp_path_factory,
        "client-server",
        workers=2,
        threads=4,
        env_extra={"MEMORY_EMBEDDER": "bundled"},  # the default of a server, searched by mode
    )


@pytest.fixture(scope="session")
def writer(pm_server: Server) -> str:
    """A writer token of acme/web."""
    return pm_server.token("writer")


@pytest.fixture
def pm(pm_server: Server, writer: str) -> Iterator[Client]:
    with Client(pm_server.url, writer) as client:
        yield client


@dataclass
class Ran:
    code: int
    stdout: str
    stderr: str

    def json(self) -> Any:
        return json.loads(self.stdout)


@dataclass
class Cli:
    """``project-memory`` with PROJECT_MEMORY_URL and _TOKEN set and a private config dir."""

    env: dict[str, str]
    cwd: Path

    def __call__(self, *args: str, input: str | None = None, timeout: float = 60) -> Ran:
        run = subprocess.run(
            [CLI, *args],
            env=self.env,
            cwd=self.cwd,
            input=input,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
        return Ran(run.returncode, run.stdout, run.stderr)


def cli_env(url: str, token: str, config_home: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PROJECT_MEMORY_")}
    env.update(PROJECT_MEMORY_URL=url, PROJECT_MEMORY_TOKEN=token, XDG_CONFIG_HOME=str(config_home))
    return env


@pytest.fixture
def cli(pm_server: Server, writer: str, tmp_path: Path) -> Cli:
    work = tmp_path / "work"
    work.mkdir()
    return Cli(cli_env(pm_server.url, writer, tmp_path / "config"), work)
