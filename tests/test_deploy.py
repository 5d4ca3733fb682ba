"""The deployment recipes (deploy/): what `make test` can check quickly. deploy/check.sh
runs the slow rest (hadolint, dclint, and the recipes' own steps in fresh venvs)."""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest
import yaml

from app.config import PREFIX, SETTINGS
from app.ops.startup import EXIT_BAD_SETTING
from tests.e2e.conftest import REPO, start_server

DEPLOY = REPO / "deploy"


def _rehearse() -> ModuleType:
    spec = importlib.util.spec_from_file_location("rehearse", DEPLOY / "rehearse.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _known(names: list[str]) -> None:
    settings = {f"{PREFIX}_{name}" for name in SETTINGS}
    unknown = [n for n in names if n.startswith(f"{PREFIX}_") and n not in settings]
    assert unknown == [], f"not settings the server reads: {unknown}"


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="systemd-analyze missing")
def test_the_unit_passes_systemd_analyze_verify(tmp_path: Path) -> None:
    unit = tmp_path / "project-memory.service"
    text = (DEPLOY / "project-memory.service").read_text()
    unit.write_text(text.replace("/opt/project-memory", str(REPO)))  # ExecStart must exist
    run = subprocess.run(
        ["systemd-analyze", "verify", str(unit)], capture_output=True, text=True, timeout=60
    )
    assert run.returncode == 0 and run.stdout + run.stderr == "", run.stdout + run.stderr


def test_the_unit_keeps_data_in_its_state_directory_and_no_token_in_the_journal() -> None:
    env, exec_start, workdir = _rehearse().unit_settings()
    _known(list(env))
    text = (DEPLOY / "project-memory.service").read_text()
    assert "StateDirectory=project-memory\n" in text
    assert env["MEMORY_STORAGE_ROOT"].startswith("/var/lib/project-memory/")
    assert env["MEMORY_TOKENS_FILE"].startswith("/var/lib/project-memory/")
    assert not env["MEMORY_TOKENS_FILE"].startswith(env["MEMORY_STORAGE_ROOT"] + "/")
    assert env["MEMORY_FIRST_TOKEN"] == "off"
    assert f"RestartPreventExitStatus={EXIT_BAD_SETTING}\n" in text
    assert "-c /opt/project-memory/gunicorn.conf.py wsgi:app" in exec_start
    assert workdir == "/opt/project-memory"


def test_the_image_keeps_data_on_its_volume_and_no_token_in_docker_logs() -> None:
    rehearse = _rehearse()
    instructions = rehearse.dockerfile_instructions()
    env = rehearse.dockerfile_env(instructions)
    compose = yaml.safe_load((DEPLOY / "compose.yaml").read_text())["services"]["memory"]
    _known([*env, *compose["environment"]])
    (volume,) = [rest.strip('[]" ') for word, rest in instructions if word == "VOLUME"]
    assert env["MEMORY_STORAGE_ROOT"].startswith(volume + "/")
    assert env["MEMORY_TOKENS_FILE"].startswith(volume + "/")
    assert not env["MEMORY_TOKENS_FILE"].startswith(env["MEMORY_STORAGE_ROOT"] + "/")
    assert env["MEMORY_FIRST_TOKEN"] == "off"
    assert compose["environment"]["MEMORY_FIRST_TOKEN"] == "off"
    assert [v.split(":")[1] for v in compose["volumes"]] == [volume]
    # What the health checks run is in the image.
    copied = [rest.split()[-1] for word, rest in instructions if word == "COPY"]
    health = [rest for word, rest in instructions if word == "HEALTHCHECK"][0]
    assert "/srv/project-memory/deploy/healthcheck.py" in health
    assert compose["healthcheck"]["test"][-1] == "/srv/project-memory/deploy/healthcheck.py"
    assert "./deploy/healthcheck.py" in copied
    assert ("WORKDIR", "/srv/project-memory") in instructions


def test_the_health_check_tells_a_ready_server_from_a_stopped_one(tmp_path: Path) -> None:
    srv = start_server(tmp_path, workers=1)
    # As in the image: MEMORY_BIND names every interface, the check asks the loopback one.
    every = srv.env["MEMORY_BIND"].replace("127.0.0.1", "0.0.0.0")  # noqa: S104
    env = {**os.environ, "MEMORY_BIND": every}
    check = [sys.executable, str(DEPLOY / "healthcheck.py")]
    try:
        ready = subprocess.run(check, env=env, capture_output=True, text=True, timeout=30)
    finally:
        srv.stop()
    assert ready.returncode == 0, ready.stdout
    assert ready.stdout.strip().endswith("/readyz: 200")
    down = subprocess.run(check, env=env, capture_output=True, text=True, timeout=30)
    assert down.returncode == 1, down.stdout
