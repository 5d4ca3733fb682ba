"""The sync client and the memory-tool logic are plain Python: no Flask in their imports."""

from __future__ import annotations

import subprocess
import sys


def test_mount_and_memory_tool_import_no_flask() -> None:
    code = (
        "import sys, app.mount.cli, app.mount.sync, app.mount.http, app.memory_tool\n"
        "bad = sorted(m for m in sys.modules if m.split('.')[0] in ('flask', 'werkzeug'))\n"
        "print(','.join(bad))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "", f"imported: {out.stdout}"
