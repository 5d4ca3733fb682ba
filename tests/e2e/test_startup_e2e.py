"""Starting the server: a bad setting is one line and exit status 2, every start says where
things are, the first token can stay unprinted, and each instance has its own control socket.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import stat
import subprocess
import tempfile
import time
from pathlib import Path

import pytest
import requests

from tests.e2e.conftest import REPO, VENV_BIN, free_port, start_server

pytestmark = pytest.mark.e2e

GUNICORN = [str(VENV_BIN / "gunicorn"), "-c", "gunicorn.conf.py", "wsgi:app"]
FLASK = [str(VENV_BIN / "flask"), "--app", "wsgi", "tokens", "list"]
BASE = "/sandbox/memory/v1"


def settings(tmp_path: Path, **extra: str) -> dict[str, str]:
    return {
        **os.environ,
        "MEMORY_STORAGE_ROOT": str(tmp_path / "storage"),
        "MEMORY_TOKENS_FILE": str(tmp_path / "tokens.json"),
        "MEMORY_BIND": f"127.0.0.1:{free_port()}",
        "MEMORY_WORKERS": "1",
        **extra,
    }


def run(argv: list[str], env: dict[str, str], prefix: list[str] | None = None):  # noqa: ANN201
    return subprocess.run(
        [*(prefix or []), *argv], cwd=REPO, env=env, capture_output=True, text=True, timeout=60
    )


def assert_one_line(result: subprocess.CompletedProcess[str], *words: str) -> None:
    assert result.returncode == 2, (result.returncode, result.stdout, result.stderr)
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("project-memory: "), lines[0]
    for word in words:
        assert word in lines[0], lines[0]
    assert "Traceback" not in result.stdout


@pytest.mark.parametrize(
    ("case", "variable"),
    [
        ("workers", "MEMORY_WORKERS"),
        ("root_is_a_file", "MEMORY_STORAGE_ROOT"),
        ("bind_without_port", "MEMORY_BIND"),
        ("tokens_under_a_file", "MEMORY_TOKENS_FILE"),
    ],
)
def test_a_bad_setting_is_one_line_and_exit_2(tmp_path: Path, case: str, variable: str) -> None:
    env = settings(tmp_path)
    if case == "workers":
        env["MEMORY_WORKERS"] = "two"
    elif case == "root_is_a_file":
        (tmp_path / "storage").write_text("not a directory")
    elif case == "bind_without_port":
        env["MEMORY_BIND"] = "localhost"
    else:
        (tmp_path / "etc").write_text("a file where a directory should be")
        env["MEMORY_TOKENS_FILE"] = str(tmp_path / "etc" / "tokens.json")
    for argv in (GUNICORN, FLASK):
        assert_one_line(run(argv, env), variable)
    # Stopped before anything was created.
    assert not (tmp_path / "tokens.json").exists()
    assert case == "root_is_a_file" or not (tmp_path / "storage").exists()


def test_a_port_in_use_stops_gunicorn_but_not_the_cli(tmp_path: Path) -> None:
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        env = settings(tmp_path, MEMORY_BIND=f"127.0.0.1:{holder.getsockname()[1]}")
        started = time.monotonic()
        assert_one_line(run(GUNICORN, env), "MEMORY_BIND", "in use")
        assert time.monotonic() - started < 20  # not gunicorn's retries
        # The CLI runs beside the server that holds the port.
        assert run(FLASK, env).returncode == 0


def test_a_tokens_file_the_service_user_cannot_write_is_one_line_and_exit_2() -> None:
    """The usual slip: the registry created by root, the service running as its own user."""
    work = Path(tempfile.mkdtemp(prefix="pm-perm-"))  # outside tmp_path: its parents are 0700
    try:
        os.chmod(work, 0o755)  # noqa: S103 - the service account must reach its files
        env = {
            **settings(work),
            "HOME": str(work),
            "MEMORY_WORKERS": "1",
        }
        created = run([*FLASK[:-1], "create", "--role", "admin"], env)
        assert created.returncode == 0, created.stderr
        tokens = work / "tokens.json"
        prefix: list[str] = []
        if os.geteuid() == 0:
            # root writes any file: run as nobody, as a service account would run.
            for path in [work / "storage", *(work / "storage").rglob("*")]:
                os.chown(path, 65534, 65534, follow_symlinks=False)
            prefix = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "--"]
        else:
            os.chmod(tokens, 0o400)
        for argv in (GUNICORN, FLASK):
            assert_one_line(run(argv, env, prefix), "MEMORY_TOKENS_FILE", str(tokens))
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _line_after(log: str, label: str) -> str:
    lines = log.splitlines()
    for i, line in enumerate(lines):
        if line.strip().startswith(label):
            rest = line.strip()[len(label) :].strip()
            return rest if rest.startswith("cd ") else lines[i + 1].strip()
    raise AssertionError(f"no {label!r} line in:\n{log}")


def _run_printed(command: str) -> str:
    """Run a printed command from a shell without any MEMORY_* setting, as an operator would."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith("MEMORY_")}
    result = subprocess.run(
        ["bash", "-c", command], env=clean, capture_output=True, text=True, timeout=60, cwd="/"
    )
    assert result.returncode == 0, result.stderr
    return result.stdout.strip().splitlines()[-1]


def test_every_start_says_where_things_are_and_never_a_secret_after_the_first(
    tmp_path: Path,
) -> None:
    first = start_server(tmp_path, workers=1)
    first.stop()
    srv = start_server(tmp_path, workers=1)
    try:
        log = srv.log()
        assert f"URL             {srv.url}" in log
        assert f"storage root    {tmp_path / 'storage'}" in log
        assert f"token registry  {tmp_path / 'tokens.json'} (1 token, 1 usable)" in log
        assert f"control socket  {tmp_path / 'storage' / '.gunicorn.ctl'}" in log
        assert "pm_" not in log
        secret = _run_printed(_line_after(log, "new admin token"))
        assert secret.startswith("pm_")
        scope = {"X-Sandbox-Tenant-Id": "acme", "X-Sandbox-Project-Id": "web"}
        listed = requests.get(
            f"{srv.url}{BASE}/tasks",
            headers={"Authorization": f"Bearer {secret}", **scope},
            timeout=10,
        )
        assert listed.status_code == 200, listed.text
    finally:
        srv.stop()


def test_first_token_off_prints_no_secret_and_the_printed_command_makes_the_first(
    tmp_path: Path,
) -> None:
    srv = start_server(tmp_path, workers=1, env_extra={"MEMORY_FIRST_TOKEN": "off"})
    try:
        log = srv.log()
        assert "pm_" not in log and "First start" not in log
        assert "(no tokens yet)" in log and "MEMORY_FIRST_TOKEN=off" in log
        assert not (tmp_path / "tokens.json").exists()  # no token was made
        secret = _run_printed(_line_after(log, "first token"))
        put = requests.put(
            f"{srv.url}{BASE}/tasks/hello/turns/0",
            json={"summary_md": "made with the printed command"},
            headers={
                "Authorization": f"Bearer {secret}",
                "X-Sandbox-Tenant-Id": "acme",
                "X-Sandbox-Project-Id": "web",
            },
            timeout=10,
        )
        assert put.status_code in (200, 201), put.text
    finally:
        srv.stop()


def _control(path: Path, command: str) -> dict[str, object]:
    out = subprocess.run(
        [str(VENV_BIN / "gunicornc"), "-s", str(path), "-c", command, "-j"],
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    ).stdout
    return dict(json.loads(out))


def _wait_for_socket(path: Path) -> None:
    deadline = time.monotonic() + 15
    while not (path.exists() and stat.S_ISSOCK(path.stat().st_mode)):
        assert time.monotonic() < deadline, f"no control socket at {path}"
        time.sleep(0.1)


def test_two_instances_on_two_roots_have_their_own_control_socket(tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.mkdir()
    # gunicorn's default would be $XDG_RUNTIME_DIR/gunicorn.ctl, else ~/.gunicorn/gunicorn.ctl.
    env = {"HOME": str(home), "XDG_RUNTIME_DIR": ""}
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    a = start_server(tmp_path / "a", workers=1, env_extra=env)
    try:
        b = start_server(tmp_path / "b", workers=1, env_extra=env)
        try:
            sockets = {}
            for srv in (a, b):
                sockets[srv.url] = srv.root / ".gunicorn.ctl"
                _wait_for_socket(sockets[srv.url])
                listeners = _control(sockets[srv.url], "show listeners")["listeners"]
                assert [x["address"] for x in listeners] == [srv.url]  # type: ignore[index]
            a.stop()
            assert not sockets[a.url].exists()
            listeners = _control(sockets[b.url], "show listeners")["listeners"]
            assert [x["address"] for x in listeners] == [b.url]  # type: ignore[index]
        finally:
            b.stop()
    finally:
        a.stop()
    assert not (home / ".gunicorn").exists()


def test_a_reload_rereads_the_settings_without_probing_its_own_port(tmp_path: Path) -> None:
    """SIGHUP (systemctl reload) runs gunicorn.conf.py again while the port is ours."""
    srv = start_server(tmp_path, workers=1)
    try:
        before = srv.worker_pids()
        srv.proc.send_signal(signal.SIGHUP)
        deadline = time.monotonic() + 20
        while not (set(srv.worker_pids()) - set(before)):
            assert srv.proc.poll() is None, srv.log()
            assert time.monotonic() < deadline, srv.log()
            time.sleep(0.1)
        assert requests.get(f"{srv.url}/readyz", timeout=10).status_code == 200
        assert srv.proc.poll() is None and "project-memory:" not in srv.log()
    finally:
        srv.stop()
