"""The client distribution stands alone: it needs httpx only, imports nothing of the server,
and its CLI starts without loading httpx or the client until a command talks to a server."""

from __future__ import annotations

import importlib.metadata as md
import json
import os
import pkgutil
import socket
import subprocess
import sys
from pathlib import Path

import project_memory_client
import pytest
from packaging.requirements import Requirement

SERVER_ONLY = {"app", "flask", "werkzeug", "gunicorn", "filelock", "ulid", "orjson", "marshmallow"}
SERVER_ONLY |= {"psycopg", "boto3", "requests"}


def _loaded(code: str) -> list[str]:
    run = subprocess.run(
        [sys.executable, "-c", code + "\nimport json, sys; print(json.dumps(sorted(sys.modules)))"],
        capture_output=True,
        text=True,
        check=True,
    )
    return list(json.loads(run.stdout.splitlines()[-1]))


def test_the_distribution_needs_httpx_and_its_sdk_extra_anthropic() -> None:
    base, extras = [], {}
    for line in md.requires("project-memory-client") or []:
        req = Requirement(line)
        if req.marker is not None and "extra" in str(req.marker):
            extras.setdefault(str(req.marker).split('"')[1], []).append(req.name)
        else:
            base.append((req.name, str(req.marker or "")))
    assert base == [("httpx", ""), ("tomli", 'python_version < "3.11"')]
    assert extras == {"sdk": ["anthropic"]}
    assert md.entry_points(group="console_scripts", name="project-memory")
    (script,) = md.entry_points(group="console_scripts", name="project-memory")
    assert script.value == "project_memory_client.cli:main"


def test_no_module_of_the_client_imports_the_server() -> None:
    modules = [
        m.name
        for m in pkgutil.walk_packages(project_memory_client.__path__, "project_memory_client.")
    ]
    assert "project_memory_client.mount.sync" in modules and len(modules) > 15
    loaded = _loaded("import " + ", ".join(modules))
    bad = sorted(m for m in loaded if m.split(".")[0] in SERVER_ONLY)
    assert bad == [], bad


def test_the_cli_starts_without_httpx() -> None:
    for argv in (
        [],
        ["turn", "get", "t", "0"],
        ["search", "x"],
        ["mount", "--help"],
        ["import", "--store", "s"],
        ["export", "--store", "s", "dir"],
    ):
        code = (
            "import sys\nfrom project_memory_client import cli\n"
            f"parser = cli.build_parser({argv!r})"
        )
        loaded = _loaded(code)
        assert "httpx" not in loaded and "project_memory_client.client" not in loaded, argv


@pytest.mark.parametrize(
    ("event", "stdin"),
    [("session-start", "{}"), ("user-prompt-submit", '{"prompt": "When does the key rotate?"}')],
)
def test_a_hook_loads_only_what_it_uses(tmp_path: Path, event: str, stdin: str) -> None:
    """A hook is a new process at every event, often on a busy machine: it imports what it
    uses, and speaks HTTP through agents/wire.py (it reaches the server here: a refused
    port, which it logs)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    env = {
        "PATH": os.environ.get("PATH", ""),
        "HOME": str(tmp_path),
        "PROJECT_MEMORY_URL": f"http://127.0.0.1:{port}",
        "PROJECT_MEMORY_TOKEN": "pm_" + "x" * 24,
        "PROJECT_MEMORY_STATE_DIR": str(tmp_path / "state"),
    }
    code = (
        "import json, sys\nfrom project_memory_client import cli\n"
        f"code = cli.main(['agent', 'hook', {event!r}])\n"
        "print(json.dumps([code, sorted(sys.modules)]))"
    )
    run = subprocess.run(
        [sys.executable, "-c", code],
        input=stdin,
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        check=True,
    )
    code_, loaded = json.loads(run.stdout.splitlines()[-1])
    assert code_ == 0
    assert "Connection refused" in (tmp_path / "state" / "hook.log").read_text()
    heavy = {"httpx", "argparse", "email", "http", "ssl", "socket", "dataclasses"}
    heavy |= {"project_memory_client.client", "project_memory_client.models"}
    assert sorted(m for m in loaded if m.split(".")[0] in heavy or m in heavy) == []
