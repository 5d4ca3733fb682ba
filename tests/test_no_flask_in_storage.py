"""Plain-Python packages must not pull in Flask: the storage engine and the memory-tool logic
run (and are tested) without a web framework."""

from __future__ import annotations

import subprocess
import sys

import pytest


@pytest.mark.parametrize(
    "modules",
    [
        "app.storage, app.storage.core.tokens, app.storage.tree.backend",
        "app.services.memory_tool, app.services.mcp.tools",
    ],
)
def test_imports_no_flask(modules: str) -> None:
    code = (
        f"import sys, {modules}\n"
        "bad = sorted(m for m in sys.modules if m.split('.')[0] in ('flask', 'werkzeug'))\n"
        "print(','.join(bad))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "", f"{modules} imported: {out.stdout}"
