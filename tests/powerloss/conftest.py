"""The power-loss filesystem of these tests: LazyFS when ``LAZYFS`` names its binary, else the
simulator (simfs.py). A machine that cannot mount it fails these tests; they never skip."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.powerloss.mount import PowerLossMount, lazyfs_binary, mounted


def pytest_report_header() -> str:
    binary = os.environ.get("LAZYFS", "").strip()
    return f"power-loss filesystem: {f'LazyFS ({binary})' if binary else 'simulator (simfs.py)'}"


@pytest.fixture(scope="session")
def plfs() -> Iterator[PowerLossMount]:
    # Not under pytest's tmp_path: its retention may delete a directory that is still mounted.
    with (
        tempfile.TemporaryDirectory(prefix="powerloss_") as tmp,
        mounted(Path(tmp), lazyfs_binary()) as fs,
    ):
        yield fs


@pytest.fixture
def area(plfs: PowerLossMount, request: pytest.FixtureRequest) -> Path:
    """An empty directory of the mount for one test (it is durable: made before any cut)."""
    name = "".join(c if c.isalnum() else "-" for c in request.node.name)
    path = plfs.mountpoint / name
    path.mkdir()
    return path
