"""Hooks through which the process measures its storage without the storage knowing who
listens: each is called with what happened (app/web/metrics.py adds its counters here)."""

from __future__ import annotations

from collections.abc import Callable

# Called with (seconds waited, acquired) after each blocking lock acquisition (the tree's
# locks, tree/fs/locks.py).
lock_wait_observers: list[Callable[[float, bool], None]] = []


def lock_waited(seconds: float, acquired: bool) -> None:
    """Tell every observer that a lock was waited for ``seconds`` (and taken or not)."""
    for observe in lock_wait_observers:
        observe(seconds, acquired)
