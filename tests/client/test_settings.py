"""Settings: flags, then the environment, then a private config file; the token never shows."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
from project_memory_client import Client, Settings, SettingsError, load_settings
from project_memory_client.settings import default_config_path, normalise_url

from tests.client.conftest import CLI


def _config(path: Path, text: str, mode: int = 0o600) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    os.chmod(path, mode)
    return path


def test_flags_then_environment_then_config_file(tmp_path: Path) -> None:
    path = _config(
        tmp_path / "project-memory" / "config.toml",
        'url = "http://config:1"\ntoken = "pm_config"\ntenant = "t-config"\nproject = "p-config"\n'
        "timeout = 7\n",
    )
    env = {"XDG_CONFIG_HOME": str(tmp_path)}
    assert default_config_path(env) == path
    s = load_settings(env=env)
    assert (s.url, s.token, s.tenant, s.project, s.timeout) == (
        "http://config:1",
        "pm_config",
        "t-config",
        "p-config",
        7.0,
    )
    assert s.sources["url"] == f"config {path}"
    env.update(PROJECT_MEMORY_URL="http://env:2/", PROJECT_MEMORY_TOKEN="pm_env")
    s = load_settings(env=env)
    assert (s.url, s.token, s.tenant) == ("http://env:2", "pm_env", "t-config")
    s = load_settings(env=env, url="http://flag:3", tenant="t-flag")
    assert (s.url, s.token, s.tenant) == ("http://flag:3", "pm_env", "t-flag")
    assert s.sources == {
        "url": "flag",
        "token": "env PROJECT_MEMORY_TOKEN",
        "tenant": "flag",
        "project": f"config {path}",
        "timeout": f"config {path}",
    }


def test_the_mounts_server_variable_is_an_alias_after_the_url_variable(tmp_path: Path) -> None:
    env = {"XDG_CONFIG_HOME": str(tmp_path), "PROJECT_MEMORY_SERVER": "http://old:1"}
    assert load_settings(env=env).url == "http://old:1"
    env["PROJECT_MEMORY_URL"] = "http://new:2"
    assert load_settings(env=env).url == "http://new:2"


@pytest.mark.parametrize("mode", [0o644, 0o640, 0o604, 0o660])
def test_a_config_file_others_may_read_is_refused(tmp_path: Path, mode: int) -> None:
    path = _config(tmp_path / "c.toml", 'token = "pm_secret"\n', mode)
    with pytest.raises(SettingsError, match=f"mode {mode:04o}.*chmod 600") as refused:
        load_settings(env={}, config_path=path)
    assert "pm_secret" not in str(refused.value)
    # Refused even when flags give everything: such a file is reported, not skipped.
    with pytest.raises(SettingsError):
        load_settings(env={}, config_path=path, url="http://x:1", token="pm_flag")
    os.chmod(path, 0o400)
    assert load_settings(env={}, config_path=path).token == "pm_secret"


def test_a_linked_or_broken_config_file_is_refused_with_a_clear_message(tmp_path: Path) -> None:
    real = _config(tmp_path / "real.toml", 'token = "pm_secret"\n')
    link = tmp_path / "link.toml"
    link.symlink_to(real)
    with pytest.raises(SettingsError, match="is a symbolic link"):
        load_settings(env={}, config_path=link)
    for text, message in [
        ("token = ", "not valid TOML"),
        ('colour = "blue"\n', "unknown setting"),
        ("token = 12\n", "token must be a string"),
        ('timeout = "soon"\n', "timeout must be a number"),
    ]:
        with pytest.raises(SettingsError, match=message):
            load_settings(env={}, config_path=_config(tmp_path / "bad.toml", text))
    assert load_settings(env={}, config_path=tmp_path / "absent.toml") == Settings()


def test_missing_settings_say_what_to_set(tmp_path: Path) -> None:
    with pytest.raises(SettingsError, match="PROJECT_MEMORY_URL.*PROJECT_MEMORY_TOKEN"):
        load_settings(env={}, config_path=tmp_path / "none.toml").require()
    with pytest.raises(SettingsError, match="must start with http"):
        load_settings(env={"PROJECT_MEMORY_URL": "127.0.0.1:8000"}, config_path=tmp_path / "n")
    with pytest.raises(SettingsError, match="more than 0"):
        load_settings(env={"PROJECT_MEMORY_TIMEOUT": "0"}, config_path=tmp_path / "n")


def test_the_api_path_may_be_given_with_the_url() -> None:
    assert normalise_url("http://h:8000/sandbox/memory/v1/") == "http://h:8000"
    assert normalise_url(" https://memory.example/ ") == "https://memory.example"


def test_the_token_never_shows_in_a_repr() -> None:
    s = Settings(url="http://h:1", token="pm_hidden")
    assert "pm_hidden" not in repr(s)
    with Client(settings=s) as client:
        assert "pm_hidden" not in repr(client)


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("token", "pm_sécret"),
        ("token", "pm_secret\n"),
        ("token", "pm_se cret"),
        ("tenant", "acmé"),
        ("project", "web\x1b[2J"),
    ],
)
def test_a_value_no_header_can_carry_is_a_settings_error(
    tmp_path: Path, key: str, value: str
) -> None:
    """The token, tenant and project go in headers, which carry printable ASCII only: any other
    character is a SettingsError naming where the value came from (never the token), for the
    Python client and for the CLI, whose --json prints its envelope, not a traceback."""
    env = {"PROJECT_MEMORY_URL": "http://127.0.0.1:9", "PROJECT_MEMORY_TOKEN": "pm_fine"}
    env[f"PROJECT_MEMORY_{key.upper()}"] = value
    with pytest.raises(SettingsError) as refused:
        Client(settings=load_settings(env=env, config_path=tmp_path / "none.toml"))
    message = str(refused.value)
    assert f"(from env PROJECT_MEMORY_{key.upper()}) holds a character other than" in message
    if key == "token":
        assert "cret" not in message
    cli_env = {k: v for k, v in os.environ.items() if not k.startswith("PROJECT_MEMORY_")}
    cli_env.update(env, XDG_CONFIG_HOME=str(tmp_path))
    for json_mode in (True, False):
        ran = subprocess.run(
            [CLI, "whoami", *(["--json"] if json_mode else [])],
            env=cli_env,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert ran.returncode == 2, ran.stderr
        if json_mode:
            assert ran.stderr == ""
            error = json.loads(ran.stdout)["error"]
            assert error["kind"] == "settings" and error["message"] == message
        else:
            assert ran.stdout == "" and ran.stderr.count("\n") == 1
            assert "Traceback" not in ran.stderr and "holds a character" in ran.stderr
        if key == "token":
            assert "cret" not in ran.stdout + ran.stderr


def test_visibility_private_puts_every_request_in_the_users_private_space(tmp_path: Path) -> None:
    path = _config(tmp_path / "project-memory" / "config.toml", 'visibility = "private"\n')
    env = {"XDG_CONFIG_HOME": str(tmp_path), "PROJECT_MEMORY_TOKEN": "pm_x"}
    s = load_settings(env=env)
    assert s.visibility == "private" and s.sources["visibility"] == f"config {path}"
    assert s.headers()["X-Sandbox-Visibility"] == "private"
    # "project" (the team's) is the default, and sends nothing.
    s = load_settings(env={**env, "PROJECT_MEMORY_VISIBILITY": "project"})
    assert s.visibility is None and "X-Sandbox-Visibility" not in s.headers()
    assert s.with_overrides(visibility="private").headers()["X-Sandbox-Visibility"] == "private"
    with pytest.raises(SettingsError, match="visibility must be one of project, private"):
        load_settings(env={**env, "PROJECT_MEMORY_VISIBILITY": "secret"})
