"""The few server rules the client applies itself, restated so it imports nothing of the server.

tests/client/test_rules.py checks each against the server's own on many generated inputs,
so the two cannot drift apart.
"""

from __future__ import annotations

import re
from typing import Any

# The prefix of the server's temp files; it also refuses memory path segments that start
# with it. The mount skips local files named so, and writes its own temp files with it.
TMP_PREFIX = ".~tmp-"

_ULID = r"[0-9A-HJKMNP-TV-Z]{26}"
_STORE_ID_RE = re.compile(rf"memstore_{_ULID}")
_SLUG_RUN = re.compile(r"[^a-z0-9]+")


def is_store_id(value: Any) -> bool:
    return isinstance(value, str) and _STORE_ID_RE.fullmatch(value) is not None


def slugify(name: str) -> str:
    """The mount slug: lowercased, runs of anything but ASCII letters/digits → one hyphen."""
    return _SLUG_RUN.sub("-", name.lower()).strip("-")
