"""The limits document of the tree: ``<root>/.limits.json``, changed under its lock
(core/limits.py says what the document holds and checks it)."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from app.storage.core.encoding import dumps
from app.storage.core.errors import Corrupt
from app.storage.core.limits import (
    VERSION,
    LimitEdits,
    LimitsFileError,
    Quotas,
    RateOverrides,
    check_document,
    quotas_of,
)
from app.storage.core.names import LIMITS_FILE, LOCKS_DIR
from app.storage.tree.fs.atomic import make_dirs, write_atomic
from app.storage.tree.fs.layout import Layout
from app.storage.tree.fs.locks import locked
from app.storage.tree.records import read_json


class LimitsFile(LimitEdits):
    """Read and change ``<root>/.limits.json``."""

    def __init__(self, root: Path, *, lock_timeout: float = 10.0) -> None:
        self.layout = Layout(root)
        self.path = self.layout.root / LIMITS_FILE
        self.lock_path = self.layout.root / LOCKS_DIR / f"{LIMITS_FILE}.lock"
        self.lock_timeout = lock_timeout
        # Called after each change made through this object: this process applies it at
        # once (others look at the file's stamp within a second).
        self.listeners: list[Callable[[], None]] = []

    # -- reading ---------------------------------------------------------------------------
    def stamp(self) -> tuple[int, int, int]:
        """(inode, size, mtime): changes whenever the file is replaced, by a link too (never
        followed); zeros when absent."""
        try:
            st = os.lstat(self.path)
        except FileNotFoundError:
            return (0, 0, 0)
        return (st.st_ino, st.st_size, st.st_mtime_ns)

    def document(self) -> dict[str, Any]:
        """The whole file, checked; an empty document when there is none."""
        # A planted symlink would make the server read limits from outside the root.
        self.layout.check_inside(self.path)
        try:
            doc = read_json(self.path)
        except Corrupt as exc:
            raise LimitsFileError(str(exc)) from None
        if doc is None:
            return {"version": VERSION, "projects": {}, "tenants": {}}
        check_document(doc)
        return doc  # type: ignore[no-any-return]

    def rates(self) -> RateOverrides:
        """Every rate override in the file (none when there is no file)."""
        return check_document(self.document())

    def quotas(self) -> Quotas:
        """Every quota in the file (none when there is no file)."""
        return quotas_of(self.document())

    # -- writing ---------------------------------------------------------------------------
    @contextmanager
    def _changing(self) -> Iterator[dict[str, Any]]:
        """Yield the current document under the lock; write it back if the block changed it."""
        make_dirs(self.lock_path.parent, self.layout.root)
        with locked(self.lock_path, self.lock_timeout):
            doc = self.document()
            before = dumps(doc)
            yield doc
            check_document(doc)
            after = dumps(doc)
            if after != before:
                write_atomic(self.path, after)
        for listener in self.listeners:
            listener()
