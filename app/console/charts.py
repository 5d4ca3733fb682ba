"""Charts drawn by the server as inline SVG: no script, no library, nothing fetched.

A chart is one ``<svg>`` element of ``<rect>`` bars whose colours come from console.css
(classes, never ``style`` attributes, which the CSP refuses). Each bar carries its value in
a ``data-`` attribute and a ``<title>`` (the tooltip a browser shows on hover, and what a
screen reader reads), so a person, a test and a script read the same numbers. Every piece of
text passes through markupsafe's escaping, although all of it is ours (numbers and dates).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from markupsafe import Markup, escape

_SVG = 'xmlns="http://www.w3.org/2000/svg"'


@dataclass(frozen=True, slots=True)
class Series:
    """One kind of bar in a chart: its values (one per slot), its CSS class and data name."""

    name: str  # the data attribute: data-<name>="value"
    css: str
    values: Sequence[int]
    label: Callable[[int], str] = str  # the value as the tooltip says it


def _num(value: float) -> str:
    return f"{value:.2f}".rstrip("0").rstrip(".")


def bars(
    slots: Sequence[str],
    series: Sequence[Series],
    *,
    title: str,
    width: int = 720,
    height: int = 140,
    axis: Callable[[int], str] = str,
    every: int = 0,
) -> Markup:
    """A bar chart of one bar per slot, the series stacked; ``slots`` name the slots (an
    hour, a day), ``every`` > 0 labels every ``every``-th slot under the axis. Empty slots
    draw nothing, so a chart of 720 hours costs what its busy hours cost."""
    count = max(1, len(slots))
    top = max([sum(s.values[i] for s in series) for i in range(len(slots))] or [0])
    scale = (height - 4) / top if top else 0.0
    step = width / count
    gap = min(1.0, step / 4)
    parts = [
        f'<svg {_SVG} class="chart" viewBox="0 0 {width} {height + 18}" role="img"'
        f' aria-label="{escape(title)}" preserveAspectRatio="none">',
        f"<title>{escape(title)}</title>",
        f'<line class="axis" x1="0" y1="{height}" x2="{width}" y2="{height}"/>',
        f'<text class="tick" x="0" y="10">{escape(axis(top))}</text>',
    ]
    for i, slot in enumerate(slots):
        base = float(height)
        for s in series:
            value = s.values[i]
            if value <= 0:
                continue
            tall = max(1.0, value * scale)
            base -= tall
            parts.append(
                f'<rect class="{escape(s.css)}" x="{_num(i * step)}" y="{_num(base)}"'
                f' width="{_num(max(2.0, step - gap))}" height="{_num(tall)}"'
                f' data-{escape(s.name)}="{value}"><title>{escape(slot)}:'
                f" {escape(s.label(value))}</title></rect>"
            )
        if every and i % every == 0:
            parts.append(
                f'<text class="tick" x="{_num(i * step)}" y="{height + 14}">{escape(slot)}</text>'
            )
    parts.append("</svg>")
    return Markup("".join(parts))  # noqa: S704 - every value in it passed escape()


def sparkline(
    slots: Sequence[str],
    values: Sequence[int],
    *,
    name: str,
    title: str,
    label: Callable[[int], str] = str,
    width: int = 112,
    height: int = 24,
) -> Markup:
    """A small bar chart for a table cell: one bar per slot, an empty slot a flat tick."""
    count = max(1, len(values))
    top = max(values or [0])
    step = width / count
    parts = [
        f'<svg {_SVG} class="spark" viewBox="0 0 {width} {height}" width="{width}"'
        f' height="{height}" role="img" aria-label="{escape(title)}">',
        f"<title>{escape(title)}</title>",
    ]
    for i, (slot, value) in enumerate(zip(slots, values, strict=True)):
        tall = max(1.0, value / top * (height - 2)) if top and value > 0 else 1.0
        parts.append(
            f'<rect class="{"bar" if value > 0 else "none"}" x="{_num(i * step + 0.5)}"'
            f' y="{_num(height - tall)}" width="{_num(max(0.5, step - 1))}"'
            f' height="{_num(tall)}" data-{escape(name)}="{value}">'
            f"<title>{escape(slot)}: {escape(label(value))}</title></rect>"
        )
    parts.append("</svg>")
    return Markup("".join(parts))  # noqa: S704 - every value in it passed escape()
