"""Readiness: the storage root takes a durable write and the lock tree takes a lock."""

from __future__ import annotations

import secrets

from app.storage.tree.fs.atomic import remove_quietly, write_atomic
from app.storage.tree.fs.locks import locked
from app.storage.tree.tasks import TaskStore


def check_ready(store: TaskStore) -> tuple[bool, str]:
    root = store.layout.root
    probe = root / f".~tmp-ready-{secrets.token_hex(4)}"
    try:
        with locked(store.layout.locks_dir() / "ready.lock", timeout=2.0):
            write_atomic(probe, b"ok")
    except Exception as exc:  # noqa: BLE001 - any failure means "not ready"
        return False, f"storage not writable: {type(exc).__name__}"
    finally:
        remove_quietly(probe)
    return True, "storage writable, locks usable"
