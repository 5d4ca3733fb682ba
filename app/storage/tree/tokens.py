"""The tree's token registry: one JSON file of token hashes, mode 0600, outside the storage
root (MEMORY_TOKENS_FILE).

Every worker re-reads the file when its inode, size or mtime changes, so a revocation or an
expiry takes effect on all gunicorn workers at once.
"""

from __future__ import annotations

import os
import threading
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

from app.storage.core.clock import Clock, iso, system_clock
from app.storage.core.encoding import dumps
from app.storage.core.errors import NotFound
from app.storage.core.tokens import Token, TokenRegistryBase
from app.storage.tree.fs.atomic import make_config_dirs, write_atomic
from app.storage.tree.fs.locks import locked
from app.storage.tree.records import read_json


class TokenRegistry(TokenRegistryBase):
    """Create, list, revoke and authenticate tokens kept in ``path``."""

    def __init__(self, path: Path, *, clock: Clock = system_clock, lock_timeout: float = 10.0):
        self.path = Path(os.path.abspath(path))
        self.clock = clock
        self.lock_timeout = lock_timeout
        self._mutex = threading.Lock()
        self._stamp: tuple[int, int, int] | None = None
        self._by_hash: dict[str, Token] = {}
        self._by_id: dict[str, Token] = {}

    # -- reading ---------------------------------------------------------------------------
    def _load(self) -> list[Token]:
        obj = read_json(self.path)
        if obj is None:
            return []
        return [Token(**t) for t in obj.get("tokens", [])]

    def _refresh(self) -> dict[str, Token]:
        try:
            st = os.stat(self.path)
            stamp = (st.st_ino, st.st_size, st.st_mtime_ns)
        except FileNotFoundError:
            stamp = (0, 0, 0)
        with self._mutex:
            if stamp != self._stamp:
                tokens = self._load()
                self._by_hash = {t.sha256: t for t in tokens}
                self._by_id = {t.id: t for t in tokens}
                self._stamp = stamp
            return self._by_hash

    def _find(self, sha256: str) -> Token | None:
        return self._refresh().get(sha256)

    def get(self, token_id: str) -> Token | None:
        """The token with this id, usable or not; None when there is none.

        For callers that keep a token's id rather than its secret (the console's session):
        they check ``usable`` on every request, so a revocation or expiry counts at once.
        """
        self._refresh()
        with self._mutex:
            return self._by_id.get(token_id)

    def all(self) -> list[Token]:
        return self._load()

    def is_empty(self) -> bool:
        return not self._load()

    # -- writing ---------------------------------------------------------------------------
    def _save(self, tokens: list[Token]) -> None:
        make_config_dirs(self.path.parent)
        write_atomic(self.path, dumps({"version": 1, "tokens": [asdict(t) for t in tokens]}))
        os.chmod(self.path, 0o600)

    def _lock(self) -> Any:
        return locked(self.path.with_name(self.path.name + ".lock"), self.lock_timeout)

    def _add(self, token: Token) -> None:
        with self._lock():
            self._save([*self._load(), token])

    def end_console_sessions(self, token_id: str) -> None:
        with self._lock():
            tokens = self._load()
            for i, token in enumerate(tokens):
                if token.id == token_id:
                    tokens[i] = replace(token, console_signed_out_at=iso(self.clock()))
                    self._save(tokens)
                    return
        raise NotFound(f"no token with id {token_id}")

    def revoke(self, token_id: str) -> Token:
        with self._lock():
            tokens = self._load()
            for i, token in enumerate(tokens):
                if token.id == token_id:
                    if token.revoked_at is None:
                        tokens[i] = replace(token, revoked_at=iso(self.clock()))
                        self._save(tokens)
                    return tokens[i]
        raise NotFound(f"no token with id {token_id}")
