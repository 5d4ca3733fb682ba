"""Fixtures of the storage tests that run on PostgreSQL only (the tree's own counterparts
live beside them, in the files these tests name)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from app.storage.backends import open_backend


@pytest.fixture
def pg_settings(backend_kind: str, backend_settings: dict[str, Any]) -> dict[str, Any]:
    """``backend_settings`` of the PostgreSQL backend; the tree's run of the test is skipped."""
    if backend_kind == "tree":
        pytest.skip("PostgreSQL and its object store only")
    return backend_settings


@pytest.fixture
def pg_storage(pg_settings: dict[str, Any]) -> Iterator[Any]:
    """A PostgreSQL backend of the test's own, closed after it."""
    found = open_backend(pg_settings)
    yield found
    found.close()
