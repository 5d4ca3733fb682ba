"""An import into a root whose filesystem does not make ``syncfs`` a durability barrier (a FUSE
filesystem: the power-loss filesystem itself) keeps everything it imported through a cut."""

from __future__ import annotations

import io
import os
from pathlib import Path

import pytest

from app.storage.core.names import Scope
from app.storage.tree.backend import TreeStorage
from tests.e2e.conftest import flask_cli
from tests.powerloss.mount import PowerLossMount
from tests.storage._helpers import record_files

pytestmark = pytest.mark.powerloss


def test_an_import_keeps_what_it_imported_through_a_power_cut(
    plfs: PowerLossMount, area: Path, tmp_path: Path
) -> None:
    source = TreeStorage(tmp_path / "source")
    scope = Scope("acme", "web")
    for i in range(12):
        for turn in range(2):
            source.tasks.put_turn(
                scope, f"t{i:02d}", turn, meta={"i": i}, summary_md=f"task {i} turn {turn}\n"
            )
    source.tasks.put_artifact(
        scope,
        "t03",
        1,
        "out.bin",
        io.BytesIO(os.urandom(50_000)),
        content_type="application/octet-stream",
    )
    backup = tmp_path / "web.tar.gz"
    source.export(backup)

    # The CLI, as an operator runs it: its process is gone before the cut, as a real power
    # cut takes it (one still holding the listing's mmapped -shm would get SIGBUS after it).
    env = {
        **os.environ,
        "MEMORY_STORAGE_ROOT": str(area / "root"),
        "MEMORY_TOKENS_FILE": str(tmp_path / "tokens.json"),
    }
    imported = flask_cli(env, "import", str(backup))
    assert "12 task(s)" in imported, imported
    plfs.cut_power()

    restored = record_files(area / "root")
    assert len(restored) == 12 * 3 + 1
    assert restored == record_files(tmp_path / "source")
    flask_cli(env, "fsck", "--repair")
    assert "fsck: clean" in flask_cli(env, "fsck")
