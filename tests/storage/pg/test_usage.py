"""PostgreSQL's usage counters against a recount of its rows: fsck finds counters changed by
hand and --repair sets them from the rows (tests/storage/tree/test_usage.py does it for the tree)."""

from __future__ import annotations

import io
from typing import Any

import psycopg
import pytest

from app.storage.backends import open_backend
from app.storage.core.names import Scope

pytestmark = pytest.mark.all_backends
WEB = Scope("acme", "web")


def test_fsck_repairs_counters_changed_by_hand(
    backend_kind: str, backend_config: dict[str, Any], backend_settings: dict[str, Any]
) -> None:
    if backend_kind == "tree":
        pytest.skip("the tree's counters: tests/storage/tree/test_usage.py")
    storage = open_backend(backend_settings)
    try:
        storage.tasks.put_turn(WEB, "t", 0, meta={}, summary_md="s" * 100)
        storage.tasks.put_artifact(WEB, "t", 0, "a", io.BytesIO(b"a" * 500), content_type="x/y")
        store = storage.stores.create_store(WEB, name="s")
        storage.stores.create_memory(WEB, store.id, path="/m.md", content="m" * 40, actor=None)
        want = storage.usage(WEB)
        with psycopg.connect(backend_config["DATABASE_URL"], autocommit=True) as conn:
            conn.execute(
                "UPDATE projects SET artifact_bytes = 7, versions = 99, turn_bytes = 0"
                " WHERE tenant = 'acme' AND project = 'web'"
            )
        assert storage.usage(WEB) != want
        report = storage.fsck()
        assert any("usage counters" in p for p in report.problems), report.problems
        storage.fsck(repair=True)
        assert storage.fsck().clean
        assert storage.usage(WEB) == want
    finally:
        storage.close()
