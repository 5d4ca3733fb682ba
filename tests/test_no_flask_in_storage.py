"""The storage engine is plain Python: importing it must not pull in Flask."""

from __future__ import annotations

import subprocess
import sys


def test_storage_imports_no_flask() -> None:
    code = (
        "import sys, app.storage, app.storage.tokens, app.storage.readiness\n"
        "bad = sorted(m for m in sys.modules if m.split('.')[0] in ('flask', 'werkzeug'))\n"
        "print(','.join(bad))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "", f"app.storage imported: {out.stdout}"
