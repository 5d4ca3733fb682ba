"""A circuit breaker: stop calling a service that keeps failing, and try it again later.

Closed, every call goes through. After ``failures`` consecutive failures it opens: calls are
refused at once (no waiting on a dead server, no retry storm) until ``cool_down`` seconds
have passed. Then it is half-open: one call goes through as a probe, the others are still
refused; the probe's success closes the breaker, its failure opens it for another cool-down.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Literal

State = Literal["closed", "open", "half-open"]


class CircuitBreaker:
    """Count consecutive failures; refuse calls for a cool-down once there are too many."""

    def __init__(
        self,
        *,
        failures: int = 5,
        cool_down: float = 30.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if failures < 1 or cool_down <= 0:
            raise ValueError("a breaker needs failures >= 1 and a positive cool-down")
        self.threshold = failures
        self.cool_down = cool_down
        self._clock = clock
        self._lock = threading.Lock()
        self._failures = 0
        self._opened_at: float | None = None
        self._probing = False

    @property
    def state(self) -> State:
        with self._lock:
            return self._state()

    def _state(self) -> State:
        if self._opened_at is None:
            return "closed"
        if self._clock() - self._opened_at >= self.cool_down:
            return "half-open"
        return "open"

    def allow(self) -> bool:
        """May a call go through now? In half-open, True for one caller (the probe) only."""
        with self._lock:
            state = self._state()
            if state == "closed":
                return True
            if state == "half-open" and not self._probing:
                self._probing = True
                return True
            return False

    def retry_after(self) -> float:
        """Seconds until the breaker half-opens (0 when it is not open)."""
        with self._lock:
            if self._opened_at is None:
                return 0.0
            return max(0.0, self.cool_down - (self._clock() - self._opened_at))

    def success(self) -> None:
        """A call went through: the count starts again and an open breaker closes."""
        with self._lock:
            self._failures = 0
            self._opened_at = None
            self._probing = False

    def failure(self) -> None:
        """A call failed: one more in a row; a failed probe opens the breaker again."""
        with self._lock:
            self._failures += 1
            if self._probing or self._failures >= self.threshold:
                self._opened_at = self._clock()
            self._probing = False
