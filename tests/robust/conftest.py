"""Fixtures of the robustness tests (see helpers.py)."""

from tests.robust.helpers import live_factory

__all__ = ["live_factory"]
