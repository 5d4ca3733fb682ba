"""What every worker of one root must agree on, kept in files of the root: secret keys, the
service's state and the sweeper's leader lease (pg/control.py keeps the same in the database).

A key lives beside the data it protects (a root copied elsewhere keeps working) and is made
once: of the processes racing to create it, one wins and everyone uses the winner's bytes.
"""

from __future__ import annotations

import os
import secrets
from pathlib import Path
from typing import TYPE_CHECKING, Any

from app.storage.core.encoding import dumps
from app.storage.core.names import CURSOR_KEY, TMP_PREFIX
from app.storage.tree.fs.atomic import make_config_dirs, remove_quietly, write_atomic
from app.storage.tree.fs.layout import Layout
from app.storage.tree.fs.locks import try_locked
from app.storage.tree.fs.noatime import read_all
from app.storage.tree.fs.sync import fsync_dir
from app.storage.tree.records import read_json

if TYPE_CHECKING:
    import filelock

_KEY_BYTES = 32


def root_key(layout: Layout, name: str) -> bytes:
    """The secret kept in ``<root>/<name>`` (mode 0600), created on first use."""
    if not name.startswith(".") or "/" in name or name in (".", ".."):
        raise ValueError(f"{name!r} is not a key file name")
    root = layout.root
    make_config_dirs(root)
    path = layout.own_file(root / name)  # a link there is removed: a new key is made
    found = _read(layout, path)
    if found is not None:
        return found
    # Written whole and synced under a temp name, readable by the owner only from the
    # start, then linked into place: link() refuses an existing name, so exactly one
    # creator wins and nobody reads a partial key.
    tmp = root / f"{TMP_PREFIX}{secrets.token_hex(8)}"
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        with os.fdopen(fd, "wb") as fh:
            fh.write(secrets.token_bytes(_KEY_BYTES))
            fh.flush()
            os.fsync(fh.fileno())
        try:
            os.link(tmp, path)
        except FileExistsError:
            pass
        else:
            fsync_dir(root)
    finally:
        remove_quietly(tmp)
    found = _read(layout, path)
    if found is None:
        raise FileNotFoundError(path)
    return found


def _read(layout: Layout, path: Path) -> bytes | None:
    # Opened without following a link: a linked key file would sign with bytes from
    # outside the root (UnsafePath).
    fd = layout.open_read(os.fspath(path))
    return None if fd is None else read_all(fd)


def load_key(layout: Layout) -> bytes:
    """The root's cursor key, shared by every worker through its file (made on first use)."""
    return root_key(layout, CURSOR_KEY)


class Lease:
    """Leadership held by a non-blocking flock on ``<root>/.locks/<name>.leader``, by one
    thread (filelock's locks are per thread): the kernel drops it when its process dies."""

    def __init__(self, lock: filelock.BaseFileLock) -> None:
        self._lock = lock

    @staticmethod
    def acquire(layout: Layout, name: str) -> Lease | None:
        lock = try_locked(layout.check_inside(layout.locks_dir() / f"{name}.leader"))
        return None if lock is None else Lease(lock)

    def held(self) -> bool:
        return True

    def release(self) -> None:
        self._lock.release()


def _state_path(layout: Layout, name: str) -> Path:
    return layout.root / f".{name}.json"


def load_state(layout: Layout, name: str) -> dict[str, Any] | None:
    """``<root>/.<name>.json`` (the sweeper's last runs); None when absent or unreadable."""
    try:
        state = read_json(_state_path(layout, name))
    except Exception:  # noqa: BLE001 - a torn state file only costs an early run
        return None
    return state if isinstance(state, dict) else None


def save_state(layout: Layout, name: str, state: dict[str, Any]) -> None:
    write_atomic(_state_path(layout, name), dumps(state))
