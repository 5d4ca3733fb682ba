"""The limits document of the tree: ``<root>/.limits.json``, changed under its lock
(core/limits.py says what the document holds and checks it)."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from app.storage.core.errors import Corrupt
from app.storage.core.limits import (
    LimitEdits,
    LimitsFileError,
    check_document,
    empty_document,
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
        """The whole file, its shape checked (core/limits.py checks each entry as it is read
        or changed); an empty document when there is none."""
        # A planted symlink would make the server read limits from outside the root.
        self.layout.check_inside(self.path)
        try:
            doc = read_json(self.path)
        except Corrupt as exc:
            raise LimitsFileError(str(exc)) from None
        if doc is None:
            return empty_document()
        check_document(doc)
        return doc  # type: ignore[no-any-return]

    # -- writing ---------------------------------------------------------------------------
    @contextmanager
    def _held(self) -> Iterator[tuple[dict[str, Any], Callable[[bytes], None]]]:
        """The document under the file's lock, and the atomic write of its new bytes."""
        make_dirs(self.lock_path.parent, self.layout.root)
        with locked(self.lock_path, self.lock_timeout):
            yield self.document(), lambda data: write_atomic(self.path, data)
