"""Signed list cursors, for every list of both engines.

A cursor is ``base64url(body + tag)``: ``body`` is compact JSON (what the list needs to
resume, and what it was issued for), ``tag`` the first 16 bytes of its HMAC-SHA256 under a
per-root secret (``<root>/.cursor-key``). A client can pass a cursor back but cannot forge
or edit one, so a keyset position is never taken from unchecked input, and a cursor issued
for one project or list is refused by another.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import json
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from app.storage.core.errors import InvalidName

T = TypeVar("T")

TAG_BYTES = 16
MAX_CURSOR_CHARS = 8192


class CursorCodec:
    """Encode and check cursors signed with one key."""

    def __init__(self, key: bytes) -> None:
        self._key = key

    def _tag(self, body: bytes) -> bytes:
        return hmac.new(self._key, body, hashlib.sha256).digest()[:TAG_BYTES]

    def encode(self, body: dict[str, Any], prefix: str = "") -> str:
        data = json.dumps(body, ensure_ascii=False, separators=(",", ":")).encode("utf-8")
        return prefix + base64.urlsafe_b64encode(data + self._tag(data)).decode().rstrip("=")

    def decode(self, cursor: object, field: str, prefix: str = "") -> dict[str, Any]:
        """The body of a cursor this codec issued with ``prefix``; InvalidName otherwise."""
        bad = InvalidName(field, cursor, "is not a cursor this server issued for this list")
        if not isinstance(cursor, str) or len(cursor) > MAX_CURSOR_CHARS:
            raise bad
        if not cursor.startswith(prefix) or not cursor.isascii():
            raise bad
        text = cursor[len(prefix) :]
        try:
            raw = base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))
        except (ValueError, binascii.Error):
            raise bad from None
        data, tag = raw[:-TAG_BYTES], raw[-TAG_BYTES:]
        if len(raw) <= TAG_BYTES or not hmac.compare_digest(tag, self._tag(data)):
            raise bad
        try:
            body = json.loads(data)
        except ValueError:
            raise bad from None
        if not isinstance(body, dict):
            raise bad
        return body


def cut_page(
    rows: Sequence[T], limit: int, cursor_after: Callable[[T], str]
) -> tuple[Sequence[T], str | None]:
    """A page of a keyset list: the first ``limit`` of ``rows`` (read ``limit + 1`` at most,
    or all of them), and the cursor after the last of those when there were more."""
    if len(rows) > limit:
        kept = rows[:limit]
        return kept, cursor_after(kept[-1])
    return rows, None
