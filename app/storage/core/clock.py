"""Time: an injectable clock and the one timestamp format the engine writes."""

from __future__ import annotations

import re
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from functools import lru_cache

Clock = Callable[[], datetime]
EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_MICRO = timedelta(microseconds=1)


def system_clock() -> datetime:
    return datetime.now(UTC)


def to_us(moment: datetime) -> int:
    """Exact integer microseconds since the epoch (no float rounding)."""
    return (moment - EPOCH) // _MICRO


def from_us(us: int) -> datetime:
    return EPOCH + timedelta(microseconds=us)


def iso(moment: datetime) -> str:
    """UTC, microseconds, 'Z' suffix: sorts as text in time order."""
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


# A list page formats two stamps per task, and the same stamps recur page after page:
# cached, strftime leaves list_tasks' profile.
@lru_cache(maxsize=8192)
def iso_us(us: int) -> str:
    return iso(from_us(us))


def parse_iso(text: str) -> datetime:
    moment = datetime.fromisoformat(text)
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return moment


def parse_iso_us(text: str) -> int:
    return to_us(parse_iso(text))


# -- the times a request names ---------------------------------------------------------------
# RFC 3339's date-time, its time optional (a date alone is its midnight) and its offset
# optional (UTC when it names none), the seconds and their fraction (up to nanoseconds, kept to
# the microsecond) optional: one regular language, spelled so that every string it matches is a
# real time. Month lengths and leap years are in the pattern, so the OpenAPI document states
# the whole rule and a parse never fails after a match.
_YEAR = r"(?!0000)[0-9]{4}"
_LEAP_YEAR = r"(?!0000)(?:[0-9]{2}(?:0[48]|[2468][048]|[13579][26])|(?:[02468][048]|[13579][26])00)"
_MONTH_DAY = (
    r"(?:(?:0[13578]|1[02])-(?:0[1-9]|[12][0-9]|3[01])"
    r"|(?:0[469]|11)-(?:0[1-9]|[12][0-9]|30)"
    r"|02-(?:0[1-9]|1[0-9]|2[0-8]))"
)
_DATE = rf"(?:{_YEAR}-{_MONTH_DAY}|{_LEAP_YEAR}-02-29)"
_HOUR_MINUTE = r"(?:[01][0-9]|2[0-3]):[0-5][0-9]"
MAX_FRACTION_DIGITS = 9
# Seconds since the epoch, in digits, to the microsecond (the other way to name a time where
# a request may: project.md's ``since``).
EPOCH_SECONDS_PATTERN = r"[0-9]{1,12}(?:\.[0-9]{1,6})?"


def time_pattern(*, query: bool = False) -> str:
    """The rule of a time a request names, as a regular expression (unanchored). In a query
    string (``query``) the offset's sign may also be a space: what an unencoded ``+``
    arrives as."""
    sign = "[+ -]" if query else "[+-]"
    return (
        rf"{_DATE}(?:[Tt ]{_HOUR_MINUTE}(?::[0-5][0-9](?:\.[0-9]{{1,{MAX_FRACTION_DIGITS}}})?)?"
        rf"(?:[Zz]|{sign}{_HOUR_MINUTE})?)?"
    )


# By ``query``: the rule in a query string, and in a body.
_TIME_RES = {q: re.compile(time_pattern(query=q), re.ASCII) for q in (True, False)}


def is_time(text: object, *, query: bool = False) -> bool:
    """Whether ``text`` follows :func:`time_pattern`."""
    return isinstance(text, str) and _TIME_RES[query].fullmatch(text) is not None


def parse_time_us(text: str, *, query: bool = False) -> int:
    """Microseconds since the epoch of a time that follows :func:`time_pattern` (ValueError
    otherwise). Read by position, since the pattern fixes every field's place, and counted in
    integers: near year 1 or 9999 an offset takes the instant beyond what a datetime holds,
    and such an instant is still one to compare with."""
    if not is_time(text, query=query):
        raise ValueError(f"not a time: {text[:64]!r}")
    us = to_us(datetime(int(text[0:4]), int(text[5:7]), int(text[8:10]), tzinfo=UTC))
    rest = text[10:]
    if not rest:
        return us
    us += (int(rest[1:3]) * 3600 + int(rest[4:6]) * 60) * 1_000_000
    rest = rest[6:]
    if rest[:1] == ":":
        us += int(rest[1:3]) * 1_000_000
        rest = rest[3:]
        if rest[:1] == ".":
            end = 1
            while end < len(rest) and rest[end] in "0123456789":
                end += 1
            us += int(rest[1:end][:6].ljust(6, "0"))  # kept to the microsecond
            rest = rest[end:]
    if rest and rest not in ("Z", "z"):
        offset = (int(rest[1:3]) * 3600 + int(rest[4:6]) * 60) * 1_000_000
        us += offset if rest[0] == "-" else -offset
    return us
