"""``usage``: what the project and its tenant store, the quotas, the traffic."""

from __future__ import annotations

import argparse

from ..models import UsageCounts
from . import Context, Output, add_common_options, configure, table

COUNTS = tuple(UsageCounts.__dataclass_fields__)


def register(parser: argparse.ArgumentParser) -> None:
    add_common_options(parser)
    parser.add_argument(
        "--hours", type=int, metavar="N", help="hours of traffic, the current one included (24)"
    )
    configure(parser, show_usage)


def _limit(value: int | None) -> str:
    return "no limit" if value is None else str(value)


def show_usage(ctx: Context) -> Output:
    report = ctx.client().usage(hours=ctx.args.hours)
    project, tenant = report.usage.to_dict(), report.tenant_usage.to_dict()
    rows = [(name, project[name], tenant[name]) for name in COUNTS]
    rows.append(("quota: bytes", _limit(report.quota.bytes), _limit(report.tenant_quota.bytes)))
    rows.append(("quota: tasks", _limit(report.quota.tasks), _limit(report.tenant_quota.tasks)))
    parts = [
        table(
            ["", f"project {report.tenant}/{report.project}", f"tenant {report.tenant}"],
            rows,
        )
    ]
    if report.disk is not None:
        parts.append(
            f"disk: {report.disk.free_bytes} bytes free; writes stop below"
            f" {report.disk.floor_bytes} bytes free"
        )
    if report.traffic:
        parts.append(
            table(
                ["hour", "project", "token", "requests", "bytes in", "bytes out"],
                [
                    (t.hour, t.project, t.token_id, t.requests, t.bytes_in, t.bytes_out)
                    for t in report.traffic
                ],
            )
        )
    return Output(report.to_dict(), "\n\n".join(parts))
