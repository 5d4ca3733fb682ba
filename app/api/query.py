"""Readers of the query string, for both APIs.

A value that does not follow its rule is a ``validation_error`` at ``["query", name]``;
app/web/errors.py answers it in the shape of the API the request addressed (the seed's 422
for project memory, a 400 in the envelope for memory stores). What differs between the two
APIs besides that shape is a :class:`Dialect`: the words of a refusal, and whether a time
may be given in seconds since the epoch.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

from flask import request

from app.api.common import strict_int
from app.storage.core.clock import EPOCH_SECONDS_PATTERN, parse_time_us
from app.storage.core.errors import InvalidName
from app.storage.core.ledger import parse_when
from app.storage.core.names import validate_id
from app.web.errors import RequestValidationError, validation_error

_EPOCH = re.compile(EPOCH_SECONDS_PATTERN, re.ASCII)
T = TypeVar("T")


@dataclass(frozen=True)
class Dialect:
    """How an API reads a query value, and words its refusal."""

    integer: str  # a value that is not an integer
    between: str  # an integer out of range, formatted with ``low`` and ``high``
    time: str  # a time that cannot be read
    epoch_seconds: bool  # a time may also be seconds since the epoch


# Project memory: the seed's words (pydantic's), and times as its ``since`` takes them.
SEED = Dialect(
    integer="Input should be a valid integer",
    between="Input should be between {low} and {high}",
    time="Input should be an RFC 3339 time (UTC when it names no offset) or seconds since"
    " the epoch",
    epoch_seconds=True,
)
# Memory stores: the reference API's words, and RFC 3339 times only.
STORES = Dialect(
    integer="must be an integer",
    between="must be between {low} and {high}",
    time="must be an RFC 3339 timestamp",
    epoch_seconds=False,
)


def _refused(name: str, message: str) -> RequestValidationError:
    """Query parameter ``name`` refused with ``message``."""
    return validation_error(["query", name], message, "value_error")


def query_int(name: str, default: int, low: int, high: int, dialect: Dialect = SEED) -> int:
    """Query parameter ``name`` as an integer in ``low..high``; ``default`` when absent."""
    raw = request.args.get(name)
    if raw is None:
        return default
    value = strict_int(raw, signed=low < 0)
    if value is None:
        raise validation_error(["query", name], dialect.integer, "int_parsing", raw[:200])
    if not low <= value <= high:
        raise validation_error(
            ["query", name],
            dialect.between.format(low=low, high=high),
            "value_error",
            raw,  # as sent: a 20-digit value is beyond what the JSON encoder takes as an int
            ge=low,
            le=high,
        )
    return value


def query_time_us(name: str, dialect: Dialect = SEED) -> int | None:
    """Query parameter ``name`` as microseconds since the epoch; None when absent."""
    raw = request.args.get(name)
    if raw is None:
        return None
    if dialect.epoch_seconds and _EPOCH.fullmatch(raw):
        whole, _, fraction = raw.partition(".")
        return int(whole) * 1_000_000 + int(fraction.ljust(6, "0"))
    try:
        return parse_time_us(raw, query=True)
    except ValueError:
        raise validation_error(["query", name], dialect.time, "value_error", raw[:200]) from None


def query_when(name: str, now_us: int) -> int | None:
    """Query parameter ``name`` as a moment of core/ledger.py ``parse_when`` (an RFC 3339
    time, ``7d``, ``yesterday``...); None when absent."""
    raw = request.args.get(name)
    if raw is None:
        return None
    try:
        return parse_when(raw, now_us)
    except ValueError:
        raise validation_error(
            ["query", name],
            "Input should be an RFC 3339 time (UTC when it names no offset), a count of"
            " minutes, hours, days or weeks before now (30m, 12h, 7d, 2w), today or yesterday",
            "value_error",
            raw[:200],
        ) from None


def query_checked(name: str, check: Callable[[str], T]) -> T | None:
    """Query parameter ``name`` as ``check`` reads it (InvalidName: a 422 at the parameter);
    None when absent."""
    raw = request.args.get(name)
    if raw is None:
        return None
    try:
        return check(raw)
    except InvalidName as exc:
        raise validation_error(["query", name], exc.message, "value_error", raw[:200]) from None


def query_task_id(name: str = "task_id") -> str:
    """Query parameter ``name``, required, by the task-id rule."""
    raw = request.args.get(name)
    if raw is None:
        raise validation_error(["query", name], "Field required", "missing")
    try:
        return validate_id("task_id", raw)
    except InvalidName as exc:
        raise validation_error(
            ["query", name], exc.message, "string_pattern_mismatch", raw[:200]
        ) from None


def query_choice(name: str, default: str, choices: tuple[str, ...], message: str) -> str:
    """Query parameter ``name``, one of ``choices`` as spelt there; ``default`` when absent."""
    value = request.args.get(name, default)
    if value not in choices:
        raise _refused(name, message)
    return value


def query_bool(name: str) -> bool:
    """Query parameter ``name`` as true/false or 1/0 (any case); false when absent."""
    raw = request.args.get(name)
    if raw is None:
        return False
    if raw.lower() in ("true", "1"):
        return True
    if raw.lower() in ("false", "0"):
        return False
    raise _refused(name, "must be true or false")


def query_full(default: str) -> bool:
    """A memory-stores ``view``: true for ``full``."""
    return query_choice("view", default, ("basic", "full"), "must be 'basic' or 'full'") == "full"


def store_page_limit(full: bool) -> int:
    """A memory-stores page's ``limit``, 1-100; with ``view=full`` at most 20.

    A larger one is clamped, not refused, as the reference API does: full views carry
    content, so their pages stay small.
    """
    limit = query_int("limit", 20, 1, 100, STORES)
    return min(limit, 20) if full else limit
