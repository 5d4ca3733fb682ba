"""What each install brings, in fresh venvs: `make run` installs the server and no test or
lint tools; `pip install '.[mount]'` gives a client that works without Flask or gunicorn.

Each test copies the checkout's installable files to tmp_path (the build writes build/ and
*.egg-info beside its sources) and installs from there with pip, resolving real
dependencies (pip's cache and the package registry).
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import requests

from tests.e2e.conftest import REPO, free_port, start_server
from tests.mount.helpers import Remote, local_tree

pytestmark = pytest.mark.install

DEV_TOOLS = {"pytest", "pytest-xdist", "ruff", "mypy", "hypothesis", "schemathesis", "anthropic"}
SERVER_ONLY = {"flask", "werkzeug", "gunicorn", "filelock", "python-ulid", "orjson", "marshmallow"}


def copy_checkout(dest: Path) -> Path:
    dest.mkdir()
    for name in ("Makefile", "pyproject.toml", "README.md", "wsgi.py", "gunicorn.conf.py"):
        shutil.copy2(REPO / name, dest / name)
    shutil.copytree(REPO / "app", dest / "app", ignore=shutil.ignore_patterns("__pycache__"))
    return dest


def installed(python: Path) -> set[str]:
    out = subprocess.run(
        [str(python), "-m", "pip", "list", "--format=freeze", "--disable-pip-version-check"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return {line.split("==")[0].lower().replace("_", "-") for line in out.splitlines() if line}


def test_make_run_installs_the_server_without_test_or_lint_tools(tmp_path: Path) -> None:
    checkout = copy_checkout(tmp_path / "checkout")
    port = free_port()
    env = {**os.environ, "MEMORY_BIND": f"127.0.0.1:{port}", "MEMORY_LOG_LEVEL": "WARNING"}
    env.pop("MEMORY_STORAGE_ROOT", None)
    env.pop("MEMORY_TOKENS_FILE", None)
    log_path = tmp_path / "make-run.log"
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(
            ["make", "run"],
            cwd=checkout,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # make and its gunicorn stop together, by group
        )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while True:
            assert proc.poll() is None, log_path.read_text()
            assert time.monotonic() < deadline, log_path.read_text()
            try:
                if requests.get(f"{url}/healthz", timeout=1).status_code == 200:
                    break
            except requests.ConnectionError:
                time.sleep(0.2)
        # The lean install serves a real, authenticated write with the first-start token.
        secret = re.search(r"^\s+(pm_\S+)$", log_path.read_text(), re.M)
        assert secret, log_path.read_text()
        put = requests.put(
            f"{url}/sandbox/memory/v1/tasks/t/turns/0",
            json={"summary_md": "lean"},
            headers={"Authorization": f"Bearer {secret.group(1)}"},
            timeout=10,
        )
        assert put.status_code in (200, 201), put.text
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=40)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
    packages = installed(checkout / ".venv" / "bin" / "python")
    assert {"flask", "gunicorn", "marshmallow", "project-memory"} <= packages
    assert packages & DEV_TOOLS == set()


def test_the_mount_extra_installs_a_working_client_without_the_server(tmp_path: Path) -> None:
    checkout = copy_checkout(tmp_path / "checkout")
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    python, bin_dir = venv / "bin" / "python", venv / "bin"

    def pip_install(spec: str) -> None:
        subprocess.run(
            [str(python), "-m", "pip", "install", "-q", "--disable-pip-version-check", spec],
            check=True,
            capture_output=True,
            timeout=300,
        )

    pip_install(f"{checkout}[mount]")
    assert installed(python) & (SERVER_ONLY | DEV_TOOLS) == set()
    helped = subprocess.run(
        [str(bin_dir / "project-memory"), "mount", "--help"], capture_output=True, text=True
    )
    assert helped.returncode == 0, helped.stderr
    assert "--store" in helped.stdout
    # And it syncs a real store, from a directory where no `app` package shadows the install.
    (tmp_path / "server").mkdir()
    srv = start_server(tmp_path / "server")
    try:
        secret = srv.token("writer")
        remote = Remote(srv, secret)
        store_id = remote.store("Lean Client")
        remote.put(store_id, "/hello.md", "from the server\n")
        remote.close()
        synced = subprocess.run(
            [str(bin_dir / "project-memory"), "mount", "--once", "--server", srv.url]
            + ["--store", store_id, str(tmp_path / "mnt")],
            env={**os.environ, "PROJECT_MEMORY_TOKEN": secret},
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=60,
        )
    finally:
        srv.stop()
    assert synced.returncode == 0, synced.stderr
    assert local_tree(tmp_path / "mnt" / "lean-client") == {"/hello.md": "from the server\n"}

    pip_install(f"{checkout}[sdk]")
    assert installed(python) & SERVER_ONLY == set()
    imported = subprocess.run(
        [str(python), "-c", "import app.sdk_tool as t; print(t.ProjectMemoryTool.__name__)"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
    )
    assert imported.returncode == 0, imported.stderr
    assert imported.stdout.strip() == "ProjectMemoryTool"
