"""Rate limits per token and per project, one budget for the whole server.

Four parts, one job each:

- ``table``: the GCRA buckets, in one fixed-size table of memory every worker shares;
- ``limits``: the limits each project is held to, from the settings and the overrides file;
- ``limiter``: what a request is charged, whether its budgets admit it, and the RateLimit
  fields of the answer;
- ``hooks``: the Flask side, the request hooks that charge and refuse with 429.

The names callers use are here.
"""

from __future__ import annotations

from app.web.ratelimit.hooks import (
    check_request,
    check_token_request,
    init_after_request,
    init_app,
    limit_blueprints,
)
from app.web.ratelimit.limiter import Limiter, Outcome
from app.web.ratelimit.limits import Limits, Rate, limits_of, resolve
from app.web.ratelimit.table import PROBES, BucketTable, share_across_workers

__all__ = [
    "PROBES",
    "BucketTable",
    "Limiter",
    "Limits",
    "Outcome",
    "Rate",
    "check_request",
    "check_token_request",
    "init_after_request",
    "init_app",
    "limit_blueprints",
    "limits_of",
    "resolve",
    "share_across_workers",
]
