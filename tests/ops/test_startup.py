"""Start-up checks (app/ops/startup.py): MEMORY_BIND forms, the control socket path, exit status 2."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from app.config import ConfigError
from app.ops.startup import (
    MAX_SOCKET_PATH,
    checked_app,
    checked_config,
    control_socket_path,
    parse_bind,
)


@pytest.mark.parametrize(
    ("text", "url"),
    [
        ("127.0.0.1:8000", "http://127.0.0.1:8000"),
        ("localhost:9000", "http://localhost:9000"),
        ("0.0.0.0:80", "http://0.0.0.0:80"),
        ("[::1]:8000", "http://[::1]:8000"),
        ("unix:/run/project-memory.sock", "http+unix:///run/project-memory.sock"),
    ],
)
def test_binds_gunicorn_takes(text: str, url: str) -> None:
    assert parse_bind(text).url == url


@pytest.mark.parametrize(
    "text",
    [
        "localhost",  # gunicorn would pick port 8000 silently
        "8000",  # gunicorn would take it for a host name
        ":8000",
        "127.0.0.1:0",
        "127.0.0.1:65536",
        "127.0.0.1:http",
        "unix:relative.sock",
        "http://127.0.0.1:8000",
        "two words:80",
        "",
    ],
)
def test_binds_refused(text: str) -> None:
    with pytest.raises(ConfigError, match="MEMORY_BIND"):
        parse_bind(text)


def test_the_control_socket_is_off_when_its_path_is_too_long_for_a_socket(tmp_path: Path) -> None:
    assert control_socket_path(str(tmp_path)) == str(tmp_path / ".gunicorn.ctl")
    fits = "/" + "r" * (MAX_SOCKET_PATH - len("/.gunicorn.ctl") - 1)
    assert control_socket_path(fits) == fits + "/.gunicorn.ctl"
    assert control_socket_path(fits + "r") is None


def test_a_bad_setting_exits_2_with_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    overrides = {
        "STORAGE_ROOT": str(tmp_path / "root"),
        "TOKENS_FILE": str(tmp_path / "tokens.json"),
    }
    assert checked_config(overrides)["WORKERS"] == 2
    with pytest.raises(SystemExit) as stopped:
        checked_config({**overrides, "THREADS": 0})
    assert stopped.value.code == 2
    assert capsys.readouterr().err == "project-memory: MEMORY_THREADS must be >= 1 (got 0)\n"


def test_a_database_that_cannot_be_reached_exits_2_naming_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    overrides = {
        "STORAGE_ROOT": str(tmp_path / "root"),
        "TOKENS_FILE": str(tmp_path / "tokens.json"),
        "DATABASE_URL": "postgresql://nobody@127.0.0.1:1/none",
        "BLOB_URL": "s3://bucket/prefix",
        "LOCK_TIMEOUT": 1.0,
    }
    with pytest.raises(SystemExit) as stopped:
        checked_app(overrides)
    assert stopped.value.code == 2
    last = capsys.readouterr().err.splitlines()[-1]
    assert last.startswith("project-memory: cannot start: ") and "unavailable" in last


@pytest.mark.all_backends
def test_the_start_banner_names_the_registry_the_backend_uses(
    backend_kind: str, backend_settings: dict[str, Any]
) -> None:
    from app import create_app
    from app.ops.bootstrap import where_things_are

    app = create_app({**backend_settings, "FIRST_TOKEN": "off"})
    lines = "\n".join(where_things_are(app, "http://127.0.0.1:9"))
    if backend_kind == "tree":
        assert f"token registry  {backend_settings['TOKENS_FILE']} (no tokens yet)" in lines
        return
    assert "token registry  the database (MEMORY_DATABASE_URL) (no tokens yet)" in lines
    assert "MEMORY_TOKENS_FILE" not in lines and "MEMORY_STORAGE_ROOT=" not in lines
    assert "MEMORY_DATABASE_URL, MEMORY_BLOB_URL, MEMORY_S3_ENDPOINT_URL" in lines
    assert backend_settings["DATABASE_URL"] not in lines
