"""Configuration comes from MEMORY_* variables and is validated at start-up."""

from __future__ import annotations

from pathlib import Path

import pytest

from app import create_app
from app.config import ConfigError


def test_environment_sets_config(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MEMORY_STORAGE_ROOT", str(tmp_path / "r"))
    monkeypatch.setenv("MEMORY_TOKENS_FILE", str(tmp_path / "t.json"))
    monkeypatch.setenv("MEMORY_RETENTION_DAYS", "0.5")
    app = create_app()
    assert app.config["STORAGE_ROOT"] == str(tmp_path / "r")
    assert app.config["RETENTION_DAYS"] == 0.5
    assert app.extensions["storage"].tasks.retention.total_seconds() == 43200


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("RETENTION_DAYS", "0"),
        ("RETENTION_DAYS", "soon"),
        ("RETENTION_DAYS", "36501"),
        ("LOCK_TIMEOUT", "-1"),
        ("MAX_ARTIFACT_BYTES", "0"),
        ("METRICS", "on"),
        ("HEADER_TIMEOUT", "0"),
        ("BODY_TIMEOUT", "nan"),
        ("BODY_MIN_RATE", "-1"),
    ],
)
def test_bad_values_fail_fast_with_a_clear_message(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, name: str, value: str
) -> None:
    monkeypatch.setenv("MEMORY_STORAGE_ROOT", str(tmp_path / "r"))
    monkeypatch.setenv("MEMORY_TOKENS_FILE", str(tmp_path / "t.json"))
    monkeypatch.setenv(f"MEMORY_{name}", value)
    with pytest.raises(ConfigError, match=f"MEMORY_{name}"):
        create_app()


def test_tokens_file_must_live_outside_the_root(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="outside"):
        create_app({"STORAGE_ROOT": str(tmp_path), "TOKENS_FILE": str(tmp_path / "tokens.json")})
