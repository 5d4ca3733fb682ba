"""Usage you can look at: a project's counters against its quotas, its requests and bytes per
hour over the retention period (SVG drawn here, app/console/charts.py), its largest tasks."""

from __future__ import annotations

from flask import current_app, render_template
from flask.typing import ResponseReturnValue

from app.console import charts, render
from app.console.base import bp, scope, storage
from app.services.usage_report import project_usage
from app.storage.core.limits import format_bytes

LABEL_EVERY_HOURS = 24 * 5


def _count(value: int) -> str:
    return f"{value:,}"


def _bytes(value: int) -> str:
    return render.size(value)


@bp.get("/p/<tenant>/<project>/usage")
def usage(tenant: str, project: str) -> ResponseReturnValue:
    """What this project stores against its quotas, and its traffic by the hour."""
    hours = max(1, int(current_app.config["RETENTION_DAYS"] * 24))
    report = project_usage(storage(), scope(), hours=hours, top=10)
    slots = [h.label for h in report.hours]
    every = LABEL_EVERY_HOURS if hours > LABEL_EVERY_HOURS * 2 else max(1, hours // 6)
    requests_chart = charts.bars(
        slots,
        [charts.Series("requests", "bar", [h.requests for h in report.hours], _count_label)],
        title=f"Requests per hour, last {hours // 24} days",
        axis=_count,
        every=every,
    )
    bytes_chart = charts.bars(
        slots,
        [
            charts.Series("bytes-in", "bar-in", [h.bytes_in for h in report.hours], _in_label),
            charts.Series("bytes-out", "bar-out", [h.bytes_out for h in report.hours], _out_label),
        ],
        title=f"Bytes received and sent per hour, last {hours // 24} days",
        axis=_bytes,
        every=every,
    )
    return render_template(
        "console/usage.html",
        report=report,
        requests_chart=requests_chart,
        bytes_chart=bytes_chart,
        format_bytes=format_bytes,
        count=_count,
    )


def _count_label(value: int) -> str:
    return f"{value:,} request{'' if value == 1 else 's'}"


def _in_label(value: int) -> str:
    return f"{render.size(value)} received"


def _out_label(value: int) -> str:
    return f"{render.size(value)} sent"
