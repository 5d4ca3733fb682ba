"""The few server rules the sync client needs, restated here so the client imports no server.

``app.storage`` pulls in filelock, python-ulid and orjson, which an agent's container
installing only the client (``pip install 'project-memory[mount]'``) does not have.
tests/mount/test_names.py checks that each rule here agrees with the server's own.
"""

from __future__ import annotations

import re
from typing import Any

# The server writes through temp files with this prefix and refuses memory paths with a
# segment that starts with it; the client skips such local files for the same reason.
TMP_PREFIX = ".~tmp-"

_STORE_ID = re.compile(r"memstore_[0-9A-HJKMNP-TV-Z]{26}")
_SLUG_RUN = re.compile(r"[^a-z0-9]+")


def is_store_id(value: Any) -> bool:
    return isinstance(value, str) and _STORE_ID.fullmatch(value) is not None


def slugify(name: str) -> str:
    """The mount slug: lowercased, runs of anything but ASCII letters/digits → one hyphen."""
    return _SLUG_RUN.sub("-", name.lower()).strip("-")
