"""The lists of the memory-stores API, whichever engine serves them: limits, signed page
cursors, and what a cursor pins.

A page cursor carries the fingerprint of the list it was issued for (kind, scope, filters),
so a cursor of one list is refused by another, and the key the next page resumes after. Both
engines (the tree in this package, PostgreSQL in pg/stores.py) check and build cursors here,
so a cursor is the same bytes whichever engine issued it.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from app.storage.core import store_rules as rules
from app.storage.core.cursor import CursorCodec, cut_page
from app.storage.core.errors import InvalidName
from app.storage.core.names import VERSION_ID_RE
from app.storage.core.store_models import MemoryPrefix, Page, VersionFilter
from app.storage.core.store_records import OPERATIONS, MemoryLookup, MemoryRow, StoreRecord

PAGE_PREFIX = "page_"
MAX_LIMIT = 100
# A page of full views carries every content (100 KiB each at most): fewer of them.
FULL_VIEW_LIMIT = 20


def fingerprint(*parts: object) -> str:
    """What a cursor was issued for (kind, scope, filters): another list refuses it."""
    return hashlib.sha256(json.dumps(parts, default=str).encode()).hexdigest()[:16]


def check_limit(limit: int) -> int:
    if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= MAX_LIMIT:
        raise InvalidName("limit", limit, f"must be an integer between 1 and {MAX_LIMIT}")
    return limit


def view_limit(limit: int, full: bool) -> int:
    """The page size of a list of memories or versions (smaller for full views)."""
    return min(check_limit(limit), FULL_VIEW_LIMIT) if full else check_limit(limit)


def decode_page(cursors: CursorCodec, page: str, fp: str) -> dict[str, Any]:
    """The body of ``page``, refused unless it was issued for the list ``fp`` names."""
    body = cursors.decode(page, "page", PAGE_PREFIX)
    if body.get("q") != fp:
        raise InvalidName("page", page, "is not a page cursor this server issued for this list")
    return body


def encode_page(cursors: CursorCodec, body: dict[str, Any]) -> str:
    return cursors.encode(body, PAGE_PREFIX)


def stores_after(cursors: CursorCodec, page: str | None, fp: str) -> tuple[int, str] | None:
    """The (created_us, id) key a page of stores resumes after; None for the first page."""
    if page is None:
        return None
    key = decode_page(cursors, page, fp).get("k")
    if not (isinstance(key, list) and len(key) == 2 and isinstance(key[0], int)):
        raise InvalidName("page", page, "is not a valid page cursor")
    return key[0], str(key[1])


def stores_next(cursors: CursorCodec, fp: str, last: tuple[int, str]) -> str:
    """The cursor of the page of stores after the one that ends with the key ``last``."""
    return encode_page(cursors, {"q": fp, "k": [last[0], last[1]]})


def stores_page(cursors: CursorCodec, fp: str, records: Sequence[StoreRecord], limit: int) -> Page:
    """The page of stores read (newest first, ``limit + 1`` at most or all of them)."""
    kept, next_page = cut_page(
        records, limit, lambda last: stores_next(cursors, fp, (last.created_us, last.id))
    )
    return Page(tuple(r.view() for r in kept), next_page)


@dataclass(frozen=True, slots=True)
class VersionQuery:
    """A checked request for a page of versions: newest first, before ``before``."""

    limit: int
    fp: str
    before: str | None


def versions_query(
    cursors: CursorCodec,
    store_id: str,
    filters: VersionFilter,
    limit: int,
    page: str | None,
    full: bool,
) -> VersionQuery:
    """Check a request for a page of versions."""
    if filters.operation is not None and filters.operation not in OPERATIONS:
        raise InvalidName("operation", filters.operation, f"must be one of {OPERATIONS}")
    limit = view_limit(limit, full)
    # The filter's '?' form whichever backend serves it: a cursor is the same bytes on each.
    fp = fingerprint("versions", store_id, *filter_clause(filters, "?"))
    before = None
    if page is not None:
        before = decode_page(cursors, page, fp).get("k")
        if not isinstance(before, str) or not VERSION_ID_RE.fullmatch(before):
            raise InvalidName("page", page, "is not a valid page cursor")
    return VersionQuery(limit, fp, before)


def versions_next(cursors: CursorCodec, query: VersionQuery, last_id: str) -> str:
    """The cursor of the page of versions after the one that ends with ``last_id``."""
    return encode_page(cursors, {"q": query.fp, "k": last_id})


@dataclass(frozen=True, slots=True)
class MemoryQuery:
    """A checked request for a page of memories in path order (``body``: its cursor's)."""

    store_id: str
    prefix: str
    depth: int
    limit: int
    fp: str
    body: dict[str, Any] | None


def memories_query(
    cursors: CursorCodec,
    store_id: str,
    path_prefix: object,
    depth: int,
    limit: int,
    page: str | None,
    full: bool,
) -> MemoryQuery:
    """Check a request for a page of memories."""
    prefix = rules.validate_path_prefix(path_prefix)
    if depth not in (0, 1) or isinstance(depth, bool):
        raise InvalidName("depth", depth, "must be 0 or 1")
    limit = view_limit(limit, full)
    fp = fingerprint("memories", store_id, prefix, depth)
    body = decode_page(cursors, page, fp) if page is not None else None
    if body is not None and not (isinstance(body.get("k"), str) and isinstance(body.get("a"), str)):
        raise InvalidName("page", page, "is not a valid page cursor")
    return MemoryQuery(store_id, prefix, depth, limit, fp, body)


def memory_items(
    reader: MemoryLookup, query: MemoryQuery
) -> tuple[str, list[MemoryRow | MemoryPrefix]]:
    """Up to ``limit + 1`` items of a page (the extra one says there is a next page), and the
    last version id the list is pinned to.

    The first page pins the store's last version id; later pages skip memories whose
    current path was set after it (created or renamed since), so a memory renamed past the
    cursor while a client pages is never returned twice.
    """
    prefix, limit = query.prefix, query.limit
    high = prefix[:-1] + "0"  # '0' follows '/': every path below the prefix sorts before
    if query.body is None:
        as_of, low = reader.state()[0], prefix
    else:
        as_of, key = str(query.body["a"]), str(query.body["k"])
        low = key[:-1] + "0" if key.endswith("/") else key + "\x00"
    items: list[MemoryRow | MemoryPrefix] = []
    if query.depth == 0:
        items.extend(reader.memories_page(low, high, as_of, limit + 1))
        return as_of, items
    while len(items) <= limit:
        rows = reader.memories_page(low, high, as_of, 1)
        if not rows:
            break
        row = rows[0]
        rest = row.path[len(prefix) :]
        if "/" in rest:
            child = prefix + rest.split("/", 1)[0] + "/"
            items.append(MemoryPrefix(child))
            low = child[:-1] + "0"
        else:
            items.append(row)
            low = row.path + "\x00"
    return as_of, items


def memories_page(
    cursors: CursorCodec,
    query: MemoryQuery,
    as_of: str,
    items: list[MemoryRow | MemoryPrefix],
    content: Callable[[MemoryRow], str | None],
) -> Page:
    """The page of ``items`` (from :func:`memory_items`), each memory with ``content(row)``."""
    next_page = None
    if len(items) > query.limit:
        items = items[: query.limit]
        next_page = encode_page(cursors, {"q": query.fp, "a": as_of, "k": items[-1].path})
    data = tuple(
        item if isinstance(item, MemoryPrefix) else item.view(query.store_id, content(item))
        for item in items
    )
    return Page(data, next_page)


def filter_clause(
    filters: VersionFilter, mark: Literal["?", "%s"]
) -> tuple[list[str], list[object]]:
    """The WHERE terms and arguments of a version filter, each value bound at ``mark``, the
    driver's placeholder (``?`` for sqlite3, ``%s`` for psycopg). Written once for both
    backends, so a filter selects the same versions on each; its ``?`` form is also the
    filter's part of a cursor's fingerprint, so a cursor is the same bytes on either."""
    where: list[str] = ["1 = 1"]
    args: list[object] = []
    if filters.memory_id is not None:
        where.append(f"memory_id = {mark}")
        args.append(filters.memory_id)
    if filters.operation is not None:
        where.append(f"operation = {mark}")
        args.append(filters.operation)
    for kind, value in (
        ("api_actor", filters.api_key_id),
        ("session_actor", filters.session_id),
        ("service_account_actor", filters.service_account_id),
    ):
        if value is not None:
            where.append(f"actor_type = {mark} AND actor_id = {mark}")
            args.extend([kind, value])
    if filters.created_gte_us is not None:
        where.append(f"created_us >= {mark}")
        args.append(filters.created_gte_us)
    if filters.created_lte_us is not None:
        where.append(f"created_us <= {mark}")
        args.append(filters.created_lte_us)
    return where, args
