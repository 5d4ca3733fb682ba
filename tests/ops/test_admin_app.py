"""An admin command builds the app without what only serving needs; everything else gets it all.

``flask --app wsgi tokens list`` reaches the storage and the token registry and serves
nothing, so the routes, the request hooks and the imports behind them (the schemas, the
console, the metrics) are left out; gunicorn, ``flask run`` and ``flask routes`` get the
whole app.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from app.ops.startup import admin_command

REPO = Path(__file__).resolve().parents[2]
CLI = {"FLASK_RUN_FROM_CLI": "true"}


@pytest.mark.parametrize(
    ("argv", "environ", "admin"),
    [
        (["/venv/bin/flask", "--app", "wsgi", "tokens", "list"], CLI, True),
        (["/venv/bin/flask", "-A", "wsgi", "--debug", "fsck", "--repair"], CLI, True),
        (["/venv/bin/flask", "--app=wsgi", "export", "out.tar"], CLI, True),
        (["/lib/flask/__main__.py", "--app", "wsgi", "sweep"], CLI, True),
        (["/venv/bin/flask", "--app", "wsgi", "run"], CLI, False),
        (["/venv/bin/flask", "--app", "wsgi", "routes"], CLI, False),
        (["/venv/bin/flask", "--app", "wsgi", "shell"], CLI, False),
        (["/venv/bin/flask", "--app", "tokens", "run"], CLI, False),  # an app named like one
        (["/venv/bin/flask", "--app", "wsgi", "tokens", "list"], {}, False),  # not the CLI
        (["/venv/bin/gunicorn", "-c", "gunicorn.conf.py", "tokens"], CLI, False),
        ([], CLI, False),
    ],
)
def test_which_processes_are_admin_commands(
    argv: list[str], environ: dict[str, str], admin: bool
) -> None:
    assert admin_command(argv, environ) is admin


def _flask(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {
        **os.environ,
        "MEMORY_STORAGE_ROOT": str(tmp_path / "root"),
        "MEMORY_TOKENS_FILE": str(tmp_path / "tokens" / "tokens.json"),
        "PYTHONPATH": str(REPO),
    }
    return subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "flask", "--app", "wsgi", *args],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip


def _imported(stderr: str) -> set[str]:
    return {line.rsplit("|", 1)[-1].strip() for line in stderr.splitlines() if "|" in line}


def test_an_admin_command_imports_neither_the_console_nor_the_schemas(tmp_path: Path) -> None:
    created = _flask(tmp_path, "tokens", "create", "--role", "reader", "--tenant", "acme")
    assert created.returncode == 0, created.stderr[-2000:]
    listed = _flask(tmp_path, "tokens", "list")
    assert listed.returncode == 0, listed.stderr[-2000:]
    assert "\treader\ttenant=acme" in listed.stdout
    imported = _imported(listed.stderr)
    assert {"app.storage.tree.backend", "app.ops.cli"} <= imported
    left_out = {"app.console", "app.api.project_memory", "marshmallow", "prometheus_client"}
    assert imported & left_out == set()


def test_routes_lists_the_whole_app(tmp_path: Path) -> None:
    routes = _flask(tmp_path, "routes")
    assert routes.returncode == 0, routes.stderr[-2000:]
    assert "/sandbox/memory/v1/tasks/<task_id>/turns/<turn>" in routes.stdout
    assert "/console/" in routes.stdout
