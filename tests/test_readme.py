"""The README documents every setting and the two set-up commands."""

from __future__ import annotations

from pathlib import Path

from app.config import SETTINGS

README = (Path(__file__).resolve().parents[1] / "README.md").read_text()


def test_every_setting_is_in_the_readme_table() -> None:
    for name, (default, _, _) in SETTINGS.items():
        assert f"| `MEMORY_{name}` | `{default}` |" in README, name


def test_readme_gives_the_two_commands() -> None:
    assert "make run" in README and "make test" in README
