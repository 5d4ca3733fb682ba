"""Time: an injectable clock and the one timestamp format the engine writes."""

from __future__ import annotations

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
