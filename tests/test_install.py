"""What each install brings, in fresh venvs: `make run` installs the server and no test or
lint tools; `pip install ./client` gives the client and its CLI, which work against a real
server without Flask, gunicorn or any module of the server.

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

from tests.client.mount.helpers import Remote, local_tree
from tests.e2e.conftest import REPO, free_port, start_server

pytestmark = [pytest.mark.install, pytest.mark.slow]  # pip, twice: `make slow`

DEV_TOOLS = {"pytest", "pytest-xdist", "ruff", "mypy", "hypothesis", "schemathesis", "anthropic"}
SERVER_ONLY = {"flask", "werkzeug", "gunicorn", "filelock", "python-ulid", "orjson", "marshmallow"}


def copy_checkout(dest: Path) -> Path:
    dest.mkdir()
    for name in ("Makefile", "pyproject.toml", "README.md", "wsgi.py", "gunicorn.conf.py"):
        shutil.copy2(REPO / name, dest / name)
    shutil.copytree(REPO / "app", dest / "app", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copytree(
        REPO / "client",
        dest / "client",
        ignore=shutil.ignore_patterns("__pycache__", "*.egg-info", "build"),
    )
    return dest


def installed(python: Path) -> set[str]:
    out = subprocess.run(
        [str(python), "-m", "pip", "list", "--format=freeze", "--disable-pip-version-check"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return {line.split("==")[0].lower().replace("_", "-") for line in out.splitlines() if line}


def test_make_run_installs_the_server_and_the_client_without_test_or_lint_tools(
    tmp_path: Path,
) -> None:
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
    # The client too, and the lines that point a shell (an agent's) at both.
    assert "project-memory-client" in packages
    log = log_path.read_text()
    bin_dir = checkout / ".venv" / "bin"
    assert f'  export PATH="{bin_dir}:$PATH"' in log, log
    assert f"  export PROJECT_MEMORY_URL={url}\n" in log, log
    shell = subprocess.run(
        ["bash", "-c", f'export PATH="{bin_dir}:$PATH"; project-memory --version'],
        capture_output=True,
        text=True,
        check=False,
    )
    assert shell.returncode == 0 and "project-memory" in shell.stdout, shell.stderr


def copy_client(dest: Path) -> Path:
    shutil.copytree(
        REPO / "client",
        dest,
        ignore=shutil.ignore_patterns("__pycache__", "*.egg-info", "build"),
    )
    return dest


def test_the_client_installs_alone_and_works_against_a_real_server(tmp_path: Path) -> None:
    client_src = copy_client(tmp_path / "client")
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    python, cli = venv / "bin" / "python", str(venv / "bin" / "project-memory")

    def pip_install(spec: str) -> None:
        subprocess.run(
            [str(python), "-m", "pip", "install", "-q", "--disable-pip-version-check", spec],
            check=True,
            capture_output=True,
            timeout=300,
        )

    pip_install(str(client_src))
    packages = installed(python)
    assert "project-memory-client" in packages
    assert packages & (SERVER_ONLY | DEV_TOOLS | {"project-memory", "requests"}) == set()
    # No module of the server comes with it, whatever the current directory holds.
    for module in ("flask", "app"):
        imported = subprocess.run(
            [str(python), "-c", f"import {module}"], cwd=tmp_path, capture_output=True, text=True
        )
        assert imported.returncode == 1 and "ModuleNotFoundError" in imported.stderr, module
    helped = subprocess.run([cli, "--help"], capture_output=True, text=True, cwd=tmp_path)
    assert helped.returncode == 0 and "mount" in helped.stdout, helped.stderr
    # The secret rules are package data: without them the hooks could not mask a turn.
    masked = subprocess.run(
        [str(python), "-c", "from project_memory_client.agents.secrets import mask;"
         " print(mask('key ghp_' + 'Ab1' * 12))"],
        cwd=tmp_path, capture_output=True, text=True,
    )  # fmt: skip
    assert masked.stdout == "key [secret:github-token]\n", masked.stderr

    (tmp_path / "server").mkdir()
    srv = start_server(tmp_path / "server")
    work = tmp_path / "work"
    work.mkdir()
    (work / "test.log").write_text("collected 12 items\n12 passed in 0.4s\n")
    try:
        secret = srv.token("writer")
        remote = Remote(srv, secret)
        store_id = remote.store("Lean Client")
        remote.put(store_id, "/hello.md", "from the server\n")
        remote.close()
        env = {k: v for k, v in os.environ.items() if not k.startswith("PROJECT_MEMORY_")}
        env.update(
            PROJECT_MEMORY_URL=srv.url,
            PROJECT_MEMORY_TOKEN=secret,
            XDG_CONFIG_HOME=str(tmp_path / "config"),
        )
        commands = [
            ["whoami"],
            ["turn", "put", "fix-login", "next", "--summary", "Root cause: the session TTL."],
            ["turn", "get", "fix-login", "0"],
            ["artifact", "put", "fix-login", "0", "test.log"],
            ["artifact", "get", "fix-login", "0", "test.log", "-o", "back.log"],
            ["tasks"],
            ["task", "show", "fix-login"],
            ["digest"],
            ["search", "session"],
            ["usage"],
            ["mount", "--once", "--store", store_id, "mnt"],
            ["task", "delete", "fix-login"],
        ]
        for args in commands:
            ran = subprocess.run(
                [cli, *args], env=env, cwd=work, capture_output=True, text=True, timeout=60
            )
            assert ran.returncode == 0, (args, ran.stdout, ran.stderr)
        assert (work / "back.log").read_text() == (work / "test.log").read_text()
        assert local_tree(work / "mnt" / "lean-client") == {"/hello.md": "from the server\n"}

        # The sdk extra: the memory tool class, and the SDK as the memory-stores client.
        pip_install(f"{client_src}[sdk]")
        assert installed(python) & SERVER_ONLY == set()
        code = (
            "from project_memory_client.sdk_tool import ProjectMemoryTool\n"
            "from project_memory_client.stores import anthropic_client\n"
            "stores = anthropic_client(max_retries=0).beta.memory_stores\n"
            "print(ProjectMemoryTool.__name__, [s.name for s in stores.list()])\n"
        )
        ran = subprocess.run(
            [str(python), "-c", code], env=env, cwd=tmp_path, capture_output=True, text=True
        )
        assert ran.returncode == 0, ran.stderr
        assert ran.stdout.strip() == "ProjectMemoryTool ['Lean Client']"
    finally:
        srv.stop()
