"""The CLI with a backend that cannot be reached: one line on stderr and a non-zero exit
status, never a traceback (the server's start: tests/ops/test_startup.py)."""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import pytest

from app import create_app
from app.storage.core.names import Scope

pytestmark = pytest.mark.all_backends


def test_an_object_store_that_cannot_be_reached_is_one_line(
    backend_kind: str, backend_settings: dict[str, Any], tmp_path: Path
) -> None:
    if backend_kind == "tree":
        pytest.skip("the object store of the PostgreSQL backend")
    writer = create_app(backend_settings)
    tasks = writer.extensions["storage"].tasks
    tasks.put_turn(Scope("acme", "web"), "t", 0, meta={}, summary_md="x")
    tasks.put_artifact(Scope("acme", "web"), "t", 0, "a", io.BytesIO(b"x"), content_type="a/b")
    app = create_app({**backend_settings, "S3_ENDPOINT_URL": "http://127.0.0.1:1"})
    runner = app.test_cli_runner()
    # --force: the turn was written at the test clock's time, far behind the sweep's clock,
    # which the sweep's clock guard would take for a clock stepped forward.
    for args in (["fsck"], ["export", str(tmp_path / "x.tar.gz")], ["sweep", "--force"]):
        result = runner.invoke(args=args)
        assert result.exit_code != 0, (args, result.output)
        assert isinstance(result.exception, SystemExit), (args, repr(result.exception))
        assert "object store unavailable" in result.output, args
        assert "Traceback" not in result.output
