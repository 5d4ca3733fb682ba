"""The task list's orders, its cursors in both directions and its substring filters: one rule
for both engines, each of which spells it in its own SQL (tree/sqlite/listing.py,
pg/listing.py).

An order is a sort key and a direction: ``updated`` (last update, then id), ``task_id``,
``size`` (the bytes a task stores: its turns' meta and summaries and its artifacts, then id)
or ``turns`` (then id). Each has an index whose order is the page order, so a page is one
index range read from either end, whatever the project's size.

A cursor names the row a page starts after (``next_cursor``) or before (``prev_cursor``, a
page read backwards), the order it was issued for and the project: it is refused by another
order or project. Cursors of the first version (last update, newest first) still resume.

The model and agent filters match any part of the value, in any case of its ASCII letters
(both engines compare the values' ASCII-lowercased bytes): "claude" finds
``claude-sonnet-4-5`` and ``Claude-Opus``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from app.storage.core.clock import iso_us
from app.storage.core.cursor import CursorCodec
from app.storage.core.errors import InvalidName
from app.storage.core.models import TaskFilter, TaskPage, TaskSummary
from app.storage.core.names import Scope, validate_id
from app.storage.core.task_rules import listed_text, scope_tag

CURSOR_VERSION = 2
# The sort key of each order, as columns of the listing row (both engines name them alike).
SORT_KEYS: dict[str, tuple[str, ...]] = {
    "updated": ("updated_us", "task_id"),
    "task_id": ("task_id",),
    "size": ("bytes", "task_id"),
    "turns": ("turn_count", "task_id"),
}
_ASCII_LOWER = str.maketrans("ABCDEFGHIJKLMNOPQRSTUVWXYZ", "abcdefghijklmnopqrstuvwxyz")


def needle(value: str | None) -> str | None:
    """What a substring filter looks for: its ASCII letters lowercased, a NUL as the listing
    keeps it (task_rules.listed_text); None for nothing."""
    return listed_text(value).translate(_ASCII_LOWER) if value else None


@dataclass(frozen=True, slots=True)
class TaskOrder:
    """How a page of tasks is sorted: a key of SORT_KEYS, largest (newest, Z) first or not."""

    sort: str = "updated"
    descending: bool = True

    def __post_init__(self) -> None:
        if self.sort not in SORT_KEYS:
            raise InvalidName("sort", self.sort, f"must be one of {', '.join(SORT_KEYS)}")

    @property
    def columns(self) -> tuple[str, ...]:
        return SORT_KEYS[self.sort]

    def order_by(self, *, backward: bool) -> str:
        """The ORDER BY of a page read forward, or backward (from its end)."""
        down = self.descending != backward
        return ", ".join(f"t.{c} {'DESC' if down else 'ASC'}" for c in self.columns)

    def keyset(
        self,
        key: Sequence[Any],
        params: dict[str, object],
        *,
        backward: bool,
        mark: Callable[[str], str],
    ) -> str:
        """The WHERE term of the rows after ``key`` in the page's order (before it, read
        backward): a row-value comparison, which both engines answer from the index."""
        names = [f"k{i}" for i in range(len(self.columns))]
        params.update(zip(names, key, strict=True))
        down = self.descending != backward
        left = ", ".join(f"t.{c}" for c in self.columns)
        right = ", ".join(mark(n) for n in names)
        return f" AND ({left}) {'<' if down else '>'} ({right})"

    def key_of(self, row: dict[str, Any]) -> list[Any]:
        return [row[c] for c in self.columns]


def encode_cursor(codec: CursorCodec, scope: Scope, order: TaskOrder, key: Sequence[Any]) -> str:
    """The cursor of the rows after (or, passed as ``backward``, before) ``key``."""
    return codec.encode(
        {
            "v": CURSOR_VERSION,
            "s": scope_tag(scope),
            "o": order.sort,
            "d": int(order.descending),
            "k": list(key),
        }
    )


def decode_cursor(codec: CursorCodec, scope: Scope, order: TaskOrder, cursor: str) -> list[Any]:
    """The sort key a page resumes from; InvalidName for a cursor not issued for this order
    of this project's task list."""
    body = codec.decode(cursor, "cursor")
    try:
        if body["s"] != scope_tag(scope):
            raise ValueError("issued for another project")
        if body["v"] == 1:  # last update, newest first: the only order there was
            if order != TaskOrder():
                raise ValueError("issued for another order")
            key: list[Any] = [int(body["u"]), body["id"]]
        elif body["v"] == CURSOR_VERSION:
            if body["o"] != order.sort or bool(body["d"]) != order.descending:
                raise ValueError("issued for another order")
            key = list(body["k"])
        else:
            raise ValueError("unknown version")
        if len(key) != len(order.columns):
            raise ValueError("wrong key")
        for column, value in zip(order.columns, key, strict=True):
            if column == "task_id":
                validate_id("task_id", value)
            elif not isinstance(value, int) or isinstance(value, bool):
                raise ValueError("not a number")
        return key
    except (ValueError, KeyError, TypeError, InvalidName):
        raise InvalidName(
            "cursor", cursor, "is not a cursor this server issued for this list"
        ) from None


@dataclass(frozen=True, slots=True)
class PageWindow:
    """The rows of a page in its order and whether a page follows and one comes before."""

    rows: list[Sequence[Any]]
    more_after: bool
    more_before: bool


def window(
    rows: list[Sequence[Any]], limit: int, *, backward: bool, from_cursor: bool
) -> PageWindow:
    """The page in ``rows`` (``limit`` + 1 read, in the order they were read). Read forward
    from a cursor, a page comes before it; read backward, a page comes after it."""
    more = len(rows) > limit
    rows = rows[:limit]
    if backward:
        return PageWindow(rows[::-1], more_after=True, more_before=more)
    return PageWindow(rows, more_after=more, more_before=from_cursor)


#: The columns of a page row, in the order both engines select them (PAGE_COLUMNS).
ROW_FIELDS = (
    "task_id",
    "updated_us",
    "retain_until_us",
    "turn_count",
    "latest_turn",
    "owner",
    "model",
    "agent_id",
    "exit_code",
    "bytes",
)


def task_page(
    rows: Sequence[Sequence[Any]],
    *,
    limit: int,
    order: TaskOrder,
    backward: bool,
    from_cursor: bool,
    codec: CursorCodec,
    scope: Scope,
    total: int,
    matched: int | None,
) -> TaskPage:
    """The page of ``rows`` (``limit`` + 1 of them read in the page's order, or backward),
    with the cursors of the pages after and before it."""
    found = window(list(rows), limit, backward=backward, from_cursor=from_cursor)
    tasks = tuple(map(summary, found.rows))
    first, last = (found.rows[0], found.rows[-1]) if found.rows else (None, None)
    next_cursor = prev_cursor = None
    if last is not None and found.more_after:
        next_cursor = encode_cursor(codec, scope, order, _typed(order.key_of(_named(last))))
    if first is not None and found.more_before:
        prev_cursor = encode_cursor(codec, scope, order, _typed(order.key_of(_named(first))))
    return TaskPage(
        tasks,
        total,
        next_cursor,
        prev_cursor=prev_cursor,
        matched=total if matched is None else matched,
    )


def summary(row: Sequence[Any]) -> TaskSummary:
    """A task as a page shows it, from its row of ROW_FIELDS (unpacked by position, not made
    a dict: a page makes up to a hundred of these)."""
    task_id, updated, retain, turns, latest, owner, model, agent_id, exit_code, size = row
    return TaskSummary(
        task_id=task_id,
        latest_turn=None if latest is None else int(latest),
        turn_count=int(turns),
        updated_at=iso_us(int(updated)),
        retain_until=iso_us(int(retain)),
        owner=owner,
        model=model,
        agent_id=agent_id,
        exit_code=None if exit_code is None else int(exit_code),
        bytes=int(size),
    )


def _named(row: Sequence[Any]) -> dict[str, Any]:
    return dict(zip(ROW_FIELDS, row, strict=True))


def _typed(key: list[Any]) -> list[Any]:
    return [v if isinstance(v, str) else int(v) for v in key]


# A substring is turned into the values that hold it when a column holds few distinct values
# (models, agents): then the filter is an index lookup (``IN``) and a count of the matches
# reads index entries only. A column with more distinct values than DISTINCT_SCAN, or a
# substring that more than MAX_VALUES of them hold, is tested on each row instead.
DISTINCT_SCAN = 1000
MAX_VALUES = 64


def values_holding(distinct: Sequence[str], found: str, *, complete: bool) -> list[str] | None:
    """The values of ``distinct`` (every value of a column when ``complete``) that hold the
    needle ``found``; None when they cannot stand for the substring (too many, or a column
    with more values than were read)."""
    if not complete:
        return None
    holding = [v for v in distinct if found in v.translate(_ASCII_LOWER)]
    return holding if len(holding) <= MAX_VALUES else None


def substring_values(
    only: TaskFilter, distinct: Callable[[str, int], list[str]]
) -> dict[str, list[str]]:
    """The stored values each substring filter of ``only`` stands for, for each column that
    holds few enough distinct values to list; ``distinct(column, limit)`` reads up to
    ``limit`` of a column's distinct values."""
    found: dict[str, list[str]] = {}
    for column, value in (("model", only.model), ("agent_id", only.agent_id)):
        wanted = needle(value)
        if wanted is None:
            continue
        values = distinct(column, DISTINCT_SCAN + 1)
        holding = values_holding(
            values[:DISTINCT_SCAN], wanted, complete=len(values) <= DISTINCT_SCAN
        )
        if holding is not None:
            found[column] = holding
    return found
