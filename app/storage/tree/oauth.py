"""OAuth grants and registered clients on the tree: one JSON file each under the root, a
person can ``cat`` them, and they hold secrets only as hashes (core/oauth.py):

    <root>/.oauth/grants/grt_<ULID>.json
    <root>/.oauth/clients/dcr_<ULID>.json

A grant is rewritten whole (write, fsync, rename) under ``<root>/.locks/.oauth.lock``; nothing
is followed through a link, and a file that is not a record is Corrupt, never trusted.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from datetime import datetime
from pathlib import Path

from ulid import ULID

from app.storage.core.clock import parse_iso
from app.storage.core.encoding import dumps
from app.storage.core.errors import NotFound, StorageError
from app.storage.core.names import LOCKS_DIR, OAUTH_DIR
from app.storage.core.oauth import (
    CLIENT_PREFIX,
    Client,
    Grant,
    Replayed,
    is_client_id,
    is_grant_id,
)
from app.storage.tree.fs.atomic import make_dirs, write_atomic
from app.storage.tree.fs.layout import Layout
from app.storage.tree.fs.locks import locked
from app.storage.tree.records import read_json_bytes

log = logging.getLogger(__name__)

GRANTS = "grants"
CLIENTS = "clients"


class OAuthFiles:
    """The :class:`~app.storage.core.oauth.GrantStore` of one root."""

    def __init__(self, layout: Layout, *, lock_timeout: float = 10.0) -> None:
        self.layout = layout
        self.dir = layout.root / OAUTH_DIR
        self.lock_path = layout.root / LOCKS_DIR / f"{OAUTH_DIR}.lock"
        self.lock_timeout = lock_timeout

    # -- grants ----------------------------------------------------------------------------
    def _grant_path(self, grant_id: str) -> Path:
        if not is_grant_id(grant_id):
            raise NotFound(f"no grant {grant_id[:60]}")
        return self.dir / GRANTS / f"{grant_id}.json"

    def _write(self, kind: str, name: str, data: bytes) -> None:
        make_dirs(self.dir / kind, self.layout.root)
        write_atomic(self.layout.own_file(self.dir / kind / f"{name}.json"), data)

    def add_grant(self, grant: Grant) -> None:
        with locked(self.lock_path, self.lock_timeout):
            self._write(GRANTS, grant.id, dumps(grant.to_json()))

    def grant(self, grant_id: str) -> Grant | None:
        try:
            path = self._grant_path(grant_id)
        except NotFound:
            return None
        data = self.layout.read_bytes(path)
        if data is None:
            return None
        return Grant.from_json(read_json_bytes(data, path), str(path))

    def change_grant(self, grant_id: str, change: Callable[[Grant], Grant]) -> Grant:
        with locked(self.lock_path, self.lock_timeout):
            found = self.grant(grant_id)
            if found is None:
                raise NotFound(f"no grant {grant_id[:60]}")
            try:
                changed = change(found)
            except Replayed as exc:
                self._write(GRANTS, grant_id, dumps(exc.grant.to_json()))
                raise
            if changed != found:
                self._write(GRANTS, grant_id, dumps(changed.to_json()))
            return changed

    def grants(self) -> list[Grant]:
        """Every grant whose record can be read: one that is a link, or damaged, is left out
        (and logged), as it is refused when its token is presented."""
        out = []
        try:
            entries = self.layout.tree.entries(self.dir / GRANTS)
        except StorageError as exc:
            log.warning("OAuth grants unreadable: %s", exc)
            return []
        for entry in entries:
            if entry.is_file and entry.name.endswith(".json"):
                try:
                    found = self.grant(entry.name[: -len(".json")])
                except StorageError as exc:
                    log.warning("OAuth grant %s unreadable: %s", entry.name, exc)
                    continue
                if found is not None:
                    out.append(found)
        return out

    # -- clients ---------------------------------------------------------------------------
    def add_client(self, client: Client) -> None:
        with locked(self.lock_path, self.lock_timeout):
            self._write(CLIENTS, client.client_id, dumps(client.to_json()))

    def client(self, client_id: str) -> Client | None:
        if not is_client_id(client_id):
            return None
        path = self.dir / CLIENTS / f"{client_id}.json"
        data = self.layout.read_bytes(path)
        if data is None:
            return None
        return Client.from_json(read_json_bytes(data, path), str(path))

    def clients_registered_since(self, address: str, since: datetime) -> int:
        # A client id is a ULID: its time says whether the file is worth reading.
        floor = since.timestamp()
        count = 0
        for entry in self.layout.tree.entries(self.dir / CLIENTS):
            name = entry.name[: -len(".json")]
            if not (entry.is_file and entry.name.endswith(".json") and is_client_id(name)):
                continue
            if ULID.from_str(name[len(CLIENT_PREFIX) :]).timestamp < floor:
                continue
            found = self.client(name)
            if (
                found is not None
                and found.registered_from == address
                and parse_iso(found.created_at) >= since
            ):
                count += 1
        return count
