"""The service with its locks switched off: the control run of the concurrency test.

Never used by the service itself. ``gunicorn tests.robust.nolock_app:app`` serves exactly what
``wsgi:app`` serves, except that every ``locked(...)`` block of the storage engine runs
without taking its lock, so the concurrency test can show that it notices lost updates.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator
from pathlib import Path

from app import create_app
from app.storage.tree.fs import locks


@contextlib.contextmanager
def _no_lock(path: Path, timeout: float) -> Iterator[None]:
    # Everything the real one does (the dirty marker lives beside the lock) but exclude.
    path.parent.mkdir(parents=True, exist_ok=True)
    yield


app = create_app()

# After create_app, so every storage module the app imported is patched; they look the
# name up at call time.
_real = locks.locked
for _name, _module in list(sys.modules.items()):
    if _name.startswith("app.storage") and getattr(_module, "locked", None) is _real:
        _module.locked = _no_lock  # type: ignore[attr-defined]
