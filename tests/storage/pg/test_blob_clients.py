"""The object store's clients: every store a process opens takes its client from one boto3
session (the service model is loaded once), each keeps its own bucket prefix, and a forked
child makes a session, a lock and clients of its own."""

from __future__ import annotations

import io
import os
import signal
import time
from typing import Any

import pytest

from app.storage.pg import blobs
from app.storage.pg.blobs import BlobStore

pytestmark = pytest.mark.all_backends


def _store(settings: dict[str, Any], suffix: str) -> BlobStore:
    return BlobStore(f"{settings['BLOB_URL']}-{suffix}", endpoint_url=settings["S3_ENDPOINT_URL"])


def _round_trip(store: BlobStore, name: str, data: bytes) -> bytes | None:
    key = store.key(name)
    store.put_new(key, io.BytesIO(data), limit=1 << 20, content_type="application/octet-stream")
    return store.read_bytes(key)


def test_stores_of_one_process_share_a_session_and_keep_their_prefixes(
    pg_settings: dict[str, Any],
) -> None:
    first, second = _store(pg_settings, "a"), _store(pg_settings, "b")
    assert _round_trip(first, "x", b"first") == b"first"
    session = blobs._SESSION
    assert _round_trip(second, "x", b"second") == b"second"
    assert first.read_bytes(first.key("x")) == b"first"  # the same name, another prefix
    assert first.client() is not second.client()
    assert session is not None and blobs._SESSION is session  # the second store made none


def test_a_forked_child_makes_its_own_session_and_client(pg_settings: dict[str, Any]) -> None:
    store = _store(pg_settings, "fork")
    parent_client = store.client()
    parent_session = blobs._SESSION
    # Held at the fork, as another thread of a server may hold it: the child has its own.
    with blobs._SESSION_LOCK:
        pid = os.fork()
        if pid == 0:  # the child: exit status 0 only if everything it checks holds
            ok = False
            try:
                ok = (
                    store.client() is not parent_client
                    and blobs._SESSION not in (None, parent_session)
                    and _round_trip(store, "child", b"from the child") == b"from the child"
                )
            finally:
                os._exit(0 if ok else 1)
    deadline = time.monotonic() + 60
    while (found := os.waitpid(pid, os.WNOHANG))[0] == 0:
        if time.monotonic() > deadline:  # stuck on the parent's lock
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            pytest.fail("the child waited for a lock its parent held at the fork")
        time.sleep(0.05)
    assert os.waitstatus_to_exitcode(found[1]) == 0
    assert store.client() is parent_client
    assert store.read_bytes(store.key("child")) == b"from the child"
