"""fsck flags a stored record the API would not have written (a hand edit, an import by an
older version), and leaves it for a person: the same rules an import applies
(app/storage/core/record_rules.py)."""

from __future__ import annotations

import io
import json
from pathlib import Path

from app.storage.core.names import Scope
from app.storage.tree.backend import TreeStorage
from app.storage.tree.fsck import fsck
from tests.conftest import FixedClock


def edit(path: Path, **fields: object) -> None:
    record = json.loads(path.read_text())
    record.update(fields)
    path.write_text(json.dumps(record))


def test_a_turn_with_a_cr_lf_content_type_is_flagged_and_left(
    tmp_path: Path, clock: FixedClock, scope: Scope
) -> None:
    storage = TreeStorage(tmp_path / "root", clock=clock, lock_timeout=5.0)
    storage.tasks.put_turn(scope, "t", 0, meta={}, summary_md="s")
    storage.tasks.put_artifact(scope, "t", 0, "a.txt", io.BytesIO(b"x"), content_type="text/plain")
    assert fsck(storage.tasks).clean
    meta = next((tmp_path / "root").rglob("meta.json"))
    record = json.loads(meta.read_text())
    record["artifacts"][0]["content_type"] = "text/plain\r\nX-Evil: 1"
    meta.write_text(json.dumps(record))
    before = meta.read_bytes()
    report = fsck(storage.tasks, repair=True)
    assert any("content_type: not a valid media type" in p for p in report.problems), report
    assert meta.read_bytes() == before


def test_a_version_whose_digest_is_not_its_contents_is_flagged(
    tmp_path: Path, clock: FixedClock, scope: Scope
) -> None:
    storage = TreeStorage(tmp_path / "root", clock=clock, lock_timeout=5.0)
    store = storage.stores.create_store(scope, name="s")
    memory = storage.stores.create_memory(scope, store.id, path="/a.md", content="one", actor=None)
    assert storage.fsck().clean
    version = next(tmp_path.rglob(f"{memory.memory_version_id}.json"))
    edit(version, content_sha256="0" * 64)
    report = storage.fsck()
    assert any("content_sha256: is not the content's" in p for p in report.problems), report
