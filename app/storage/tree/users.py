"""Users on the tree: one JSON file each, a person can ``cat`` it, and it holds no secret:

    <root>/.users/usr_<32 hex>.json

The file name is derived from the issuer and subject (core/users.py ``user_id``), so a sign-in
finds its user without a scan. A record is rewritten whole (write, fsync, rename) under
``<root>/.locks/.users.lock``; nothing is followed through a link, and a file that is not a
user record is Corrupt, never trusted.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path

from app.storage.core.encoding import dumps
from app.storage.core.errors import StorageError
from app.storage.core.names import LOCKS_DIR, USERS_DIR
from app.storage.core.users import User, is_user_id
from app.storage.tree.fs.atomic import make_dirs, write_atomic
from app.storage.tree.fs.layout import Layout
from app.storage.tree.fs.locks import locked
from app.storage.tree.records import read_json_bytes

log = logging.getLogger(__name__)


class UserFiles:
    """The :class:`~app.storage.core.users.UserStore` of one root."""

    def __init__(self, layout: Layout, *, lock_timeout: float = 10.0) -> None:
        self.layout = layout
        self.dir = layout.root / USERS_DIR
        self.lock_path = layout.root / LOCKS_DIR / f"{USERS_DIR}.lock"
        self.lock_timeout = lock_timeout

    def _path(self, user_id: str) -> Path | None:
        return self.dir / f"{user_id}.json" if is_user_id(user_id) else None

    def get(self, user_id: str) -> User | None:
        path = self._path(user_id)
        if path is None:
            return None
        data = self.layout.read_bytes(path)
        if data is None:
            return None
        return User.from_json(read_json_bytes(data, path), str(path))

    def change(self, user_id: str, change: Callable[[User | None], User]) -> User:
        path = self._path(user_id)
        if path is None:
            raise ValueError(f"{user_id[:60]!r} is not a user id")
        with locked(self.lock_path, self.lock_timeout):
            found = self.get(user_id)
            changed = change(found)
            if changed.id != user_id:
                raise ValueError("a change may not rename a user")
            if changed != found:
                make_dirs(self.dir, self.layout.root)
                write_atomic(self.layout.own_file(path), dumps(changed.to_json()))
            return changed

    def all(self) -> list[User]:
        """Every user whose record can be read (a link or a damaged file is logged, left out)."""
        try:
            entries = self.layout.tree.entries(self.dir)
        except StorageError as exc:
            log.warning("users unreadable: %s", exc)
            return []
        out = []
        for entry in entries:
            if entry.is_file and entry.name.endswith(".json"):
                try:
                    found = self.get(entry.name[: -len(".json")])
                except StorageError as exc:
                    log.warning("user %s unreadable: %s", entry.name, exc)
                    continue
                if found is not None:
                    out.append(found)
        return sorted(out, key=lambda u: (u.display.lower(), u.id))
