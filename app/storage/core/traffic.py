"""Requests and bytes per hour, per project and per token, as every backend keeps them: the
tree in ``<root>/.traffic.sqlite3`` (tree/usage.py ``TreeTraffic``), PostgreSQL in its
``traffic`` table (pg/usage.py).

Nothing here runs per request: each worker adds up its requests in memory and adds its sums
to their hours every few seconds (app/web/traffic.py), one transaction per flush. The hours
are kept as long as the turns are (``MEMORY_RETENTION_DAYS``), then pruned.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class TrafficRow:
    """One hour (since the epoch, UTC) of one token in one project."""

    hour: int
    tenant: str
    project: str
    token_id: str
    requests: int
    bytes_in: int
    bytes_out: int
