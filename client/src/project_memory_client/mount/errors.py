"""The two errors of the sync client's store calls, apart from any HTTP library: the sync
engine (sync.py) imports them without httpx, so that the agents' hooks can drive it over
their own HTTP (agents/shared_memory.py) and http.py over httpx."""

from __future__ import annotations


class TransportError(Exception):
    """The server could not be reached or answered 5xx / out of time: retry next sync."""


class ApiError(Exception):
    """The server answered with an error envelope (4xx)."""

    def __init__(self, status: int, error_type: str, message: str) -> None:
        super().__init__(f"{status} {error_type}: {message}")
        self.status = status
        self.error_type = error_type
        self.message = message
