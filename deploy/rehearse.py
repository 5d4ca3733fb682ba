"""Run the deployment recipes as far as a machine without Docker or systemd as PID 1 can.

    python deploy/rehearse.py container   # the Dockerfile's steps, without an engine
    python deploy/rehearse.py systemd     # the unit's ExecStart with its Environment=

container: copies what the Dockerfile COPYs into a scratch WORKDIR, creates a venv and runs
its `pip install` line there, then starts its CMD with its ENV (and compose.yaml's
environment), /data in a temp directory and the port moved to a free one on 127.0.0.1. It
waits for the HEALTHCHECK command, checks that the start printed no secret, creates the first
admin token with the command docs/deploy.md gives, makes an authenticated request and stops
the server with SIGTERM (a clean stop: exit 0, no running sentinel left).

systemd: the same with the unit's ExecStart, WorkingDirectory and Environment= lines, its
paths moved into a temp directory, and the token command the server printed at start.

Neither runs as the recipes' own user, under systemd's sandbox or in a container: that
needs an engine or systemd, which this check does not pretend to have.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
DEPLOY = REPO / "deploy"
INSTALL_DIR = "/opt/project-memory"  # as written in the unit
STATE_DIR = "/var/lib/project-memory"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def say(line: str) -> None:
    print(f"  {line}", flush=True)


# -- reading the recipes ---------------------------------------------------------------------
def dockerfile_instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) with continuations joined and comments dropped."""
    out: list[tuple[str, str]] = []
    pending = ""
    for raw in (DEPLOY / "Dockerfile").read_text().splitlines():
        line = raw.strip()
        if not pending and (not line or line.startswith("#")):
            continue
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        line = pending + line
        pending = ""
        word, _, rest = line.partition(" ")
        out.append((word.upper(), rest.strip()))
    return out


def dockerfile_env(instructions: list[tuple[str, str]]) -> dict[str, str]:
    env: dict[str, str] = {}
    for word, rest in instructions:
        if word == "ENV":
            for item in shlex.split(rest):
                key, _, value = item.partition("=")
                env[key] = value
    return env


def unit_settings() -> tuple[dict[str, str], str, str]:
    """The unit's Environment= pairs, ExecStart and WorkingDirectory."""
    env: dict[str, str] = {}
    exec_start = workdir = ""
    for raw in (DEPLOY / "project-memory.service").read_text().splitlines():
        line = raw.strip()
        if line.startswith("Environment="):
            key, _, value = line[len("Environment=") :].partition("=")
            env[key] = value
        elif line.startswith("ExecStart="):
            exec_start = line[len("ExecStart=") :]
        elif line.startswith("WorkingDirectory="):
            workdir = line[len("WorkingDirectory=") :]
    return env, exec_start, workdir


# -- running -----------------------------------------------------------------------------------
def wait_ready(command: list[str], env: dict[str, str], proc: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"the server exited with status {proc.returncode}")
        if subprocess.run(command, env=env, capture_output=True).returncode == 0:
            return
        time.sleep(0.3)
    raise SystemExit("the health check never passed")


def request(url: str, secret: str) -> int:
    req = urllib.request.Request(  # noqa: S310 - http on 127.0.0.1
        url,
        headers={
            "Authorization": f"Bearer {secret}",
            "X-Sandbox-Tenant-Id": "acme",
            "X-Sandbox-Project-Id": "web",
        },
    )
    try:
        with urllib.request.urlopen(req, timeout=10) as response:  # noqa: S310
            return int(response.status)
    except urllib.error.HTTPError as exc:
        return exc.code


def stop(proc: subprocess.Popen[bytes], root: Path) -> None:
    proc.send_signal(signal.SIGTERM)
    code = proc.wait(timeout=60)
    if code != 0:
        raise SystemExit(f"the server exited with status {code} on SIGTERM")
    if (root / ".server-running").exists():
        raise SystemExit("the stop was not clean: .server-running is still there")
    say("SIGTERM: clean stop (exit 0, running sentinel removed)")


def check_log(log: Path) -> str:
    text = log.read_text(errors="replace")
    if re.search(r"\bpm_[A-Za-z0-9_-]{20,}", text):
        raise SystemExit(f"a secret was printed at start:\n{text}")
    if "Traceback" in text:
        raise SystemExit(f"a traceback at start:\n{text}")
    say("the start printed where things are and no secret")
    return text


def container(work: Path) -> None:
    instructions = dockerfile_instructions()
    workdir = work / "srv"
    workdir.mkdir()
    for word, rest in instructions:
        if word == "COPY":
            *sources, dest = rest.split()
            into = dest.endswith("/") or len(sources) > 1  # Docker's rule for a directory
            for source in sources:
                target = workdir / dest / Path(source).name if into else workdir / dest
                target.parent.mkdir(parents=True, exist_ok=True)
                if (REPO / source).is_dir():
                    shutil.copytree(
                        REPO / source, target, ignore=shutil.ignore_patterns("__pycache__")
                    )
                else:
                    shutil.copy2(REPO / source, target)
    say("COPY: every source exists; copied into a scratch WORKDIR")
    venv = work / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    (pip_line,) = [rest for word, rest in instructions if word == "RUN" and "pip install" in rest]
    argv = shlex.split(pip_line)
    argv[0] = str(venv / "bin" / "pip")
    subprocess.run(argv, cwd=workdir, check=True, capture_output=True)
    listed = subprocess.run(
        [str(venv / "bin" / "pip"), "list", "--format=json"], capture_output=True, check=True
    )
    names = {p["name"].lower() for p in json.loads(listed.stdout)}
    for tool in ("pytest", "ruff", "mypy"):
        if tool in names:
            raise SystemExit(f"the image would carry {tool}")
    say(f"RUN {pip_line!r}: installed, no test or lint tools")
    env = dockerfile_env(instructions)
    compose = yaml.safe_load((DEPLOY / "compose.yaml").read_text())
    env.update({k: str(v) for k, v in compose["services"]["memory"]["environment"].items()})
    data = work / "data"
    data.mkdir(mode=0o700)
    port = free_port()
    env = {k: v.replace("/data", str(data)) for k, v in env.items()}
    env["MEMORY_BIND"] = f"127.0.0.1:{port}"
    run_env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("MEMORY_")},
        **env,
        "PATH": f"{venv / 'bin'}:{os.environ['PATH']}",
    }
    (cmd,) = [json.loads(rest) for word, rest in instructions if word == "CMD"]
    health = [rest for word, rest in instructions if word == "HEALTHCHECK"][0]
    health_cmd = json.loads(health[health.index("CMD") + 3 :].strip())
    health_cmd = [c.replace("/srv/project-memory", str(workdir)) for c in health_cmd]
    log = work / "server.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(cmd, cwd=workdir, env=run_env, stdout=out, stderr=subprocess.STDOUT)
    try:
        wait_ready(health_cmd, run_env, proc)
        say("HEALTHCHECK passes (GET /readyz)")
        check_log(log)
        # docs/deploy.md: docker compose exec memory flask --app wsgi tokens create ...
        made = subprocess.run(
            ["flask", "--app", "wsgi", "tokens", "create", "--role", "admin", "--name", "admin"],
            cwd=workdir,
            env=run_env,
            capture_output=True,
            text=True,
            check=True,
        )
        secret = made.stdout.strip().splitlines()[-1]
        status = request(f"http://127.0.0.1:{port}/sandbox/memory/v1/tasks", secret)
        if status != 200:
            raise SystemExit(f"the first token got {status}")
        say("the first admin token, made with the CLI, works")
        stop(proc, data / "storage")
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def systemd(work: Path) -> None:
    env, exec_start, workdir = unit_settings()
    state = work / "state"
    state.mkdir(mode=0o700)  # StateDirectory=, StateDirectoryMode=0700
    env = {k: v.replace(STATE_DIR, str(state)) for k, v in env.items()}
    port = free_port()
    env["MEMORY_BIND"] = f"127.0.0.1:{port}"
    argv = [a.replace(INSTALL_DIR, str(REPO)) for a in shlex.split(exec_start)]
    cwd = workdir.replace(INSTALL_DIR, str(REPO))
    run_env = {**{k: v for k, v in os.environ.items() if not k.startswith("MEMORY_")}, **env}
    log = work / "journal.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(argv, cwd=cwd, env=run_env, stdout=out, stderr=subprocess.STDOUT)
    try:
        health = [sys.executable, str(DEPLOY / "healthcheck.py")]
        wait_ready(health, run_env, proc)
        say("ExecStart serves (GET /readyz)")
        text = check_log(log)
        lines = text.splitlines()
        at = next(i for i, line in enumerate(lines) if line.strip().startswith("first token"))
        command = lines[at + 1].strip()
        say(f"printed: {command}")
        # From an operator's shell: no MEMORY_* in the environment.
        clean = {k: v for k, v in os.environ.items() if not k.startswith("MEMORY_")}
        made = subprocess.run(
            ["bash", "-c", command], env=clean, capture_output=True, text=True, check=True
        )
        secret = made.stdout.strip().splitlines()[-1]
        status = request(f"http://127.0.0.1:{port}/sandbox/memory/v1/tasks", secret)
        if status != 200:
            raise SystemExit(f"the first token got {status}")
        say("the printed command made a working admin token")
        stop(proc, state / "storage")
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def main() -> int:
    which = sys.argv[1] if len(sys.argv) > 1 else ""
    if which not in ("container", "systemd"):
        print(__doc__)
        return 2
    with tempfile.TemporaryDirectory(prefix=f"rehearse-{which}-") as tmp:
        (container if which == "container" else systemd)(Path(tmp))
    return 0


if __name__ == "__main__":
    sys.exit(main())
