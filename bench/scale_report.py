"""Tables of bench.scale results: one run's rows by size, and two runs side by side.

The row names are the issue's acceptance table, word for word; a row with several figures
("peak RSS / wall") keeps them in that order, and its ratios are taken figure by figure.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

PORT_ROW = "crash restart until the port accepts"
READY_ROW = "until /readyz is 200"
DIGEST_ROW = "GET project.md after one write: time to first byte / worker CPU"
REPEAT_ROW = "repeat GET (no write)"
PUT_ROW = "PUT one turn: wall / worker CPU"
EXPORT_ROW = "export peak RSS / wall"
IMPORT_ROW = "import wall"
FSCK_ROW = "fsck peak RSS / wall"
DISK_ROW = "disk allocated per turn / inodes per turn"
DISK_TASKS_ROW = "disk allocated per turn / inodes per turn (task directories only)"
ROWS = [PORT_ROW, READY_ROW, DIGEST_ROW, REPEAT_ROW, PUT_ROW, EXPORT_ROW, IMPORT_ROW]
ROWS += [FSCK_ROW, DISK_ROW, DISK_TASKS_ROW]


def label(count: int | str) -> str:
    n = int(count)
    return f"{n // 1000}k" if n % 1000 == 0 else str(n)


def num(v: float) -> str:
    return f"{v:.0f}" if abs(v) >= 100 else f"{v:.1f}" if abs(v) >= 10 else f"{v:.2f}"


def cell(r: dict[str, Any] | None) -> str:
    if not r or "na" in r:
        return "n/a"
    return " / ".join(f"{num(v)} {u}" for v, u in zip(r["values"], r["units"], strict=True))


def ratio(a: dict[str, Any] | None, b: dict[str, Any] | None) -> str:
    """a / b, metric by metric ("n/a" when either is missing or b is zero)."""
    if not a or not b or "na" in a or "na" in b:
        return "n/a"
    parts = [f"{x / y:.2f}" if y else "n/a" for x, y in zip(a["values"], b["values"], strict=True)]
    return " / ".join(parts)


def size_ratios(report: dict[str, Any], name: str, sizes: list[str]) -> list[str]:
    """One row at each of sizes[1:] over the same row at sizes[0] (10k/1k, 50k/1k)."""
    rows = [report["sizes"][n]["rows"].get(name) for n in sizes]
    return [ratio(r, rows[0]) for r in rows[1:]]


def header(report: dict[str, Any]) -> str:
    m = report["machine"]
    busy = max(m["load_avg_start"][0], m["load_avg_end"][0]) > 1.5
    dirty = f" + {len(report['dirty'])} uncommitted changes" if report["dirty"] else ""
    return (
        f"{report['checkout']} @ {report['commit'][:10]}{dirty};"
        f" {m['fs_type']} ({m['storage']}); load {m['load_avg_start'][0]:.2f} ->"
        f" {m['load_avg_end'][0]:.2f}{' (shared/busy machine)' if busy else ''};"
        f" {report['settings']['reps']} reps, medians"
    )


def print_report(report: dict[str, Any]) -> None:
    sizes = sorted(report["sizes"], key=int)
    head = ["row", *map(label, sizes), *[f"{label(n)}/{label(sizes[0])}" for n in sizes[1:]]]
    print(header(report))
    print("| " + " | ".join(head) + " |")
    print("|" + "---|" * len(head))
    for name in ROWS:
        cells = [cell(report["sizes"][n]["rows"].get(name)) for n in sizes]
        print("| " + " | ".join([name, *cells, *size_ratios(report, name, sizes)]) + " |")
    for n in sizes:
        for name, r in report["sizes"][n]["rows"].items():
            if "na" in r:
                print(f"n/a at {label(n)}: {name}: {r['na']}")
            elif r.get("detail"):
                print(f"{label(n)}: {name}: {r['detail']}")
    for note in report["notes"]:
        print(f"note: {note}")


def compare(before_path: Path, after_path: Path) -> None:
    before, after = (json.loads(p.read_text()) for p in (before_path, after_path))
    print(f"before: {header(before)}")
    print(f"after: {header(after)}")
    if before["machine"]["fs_type"] != after["machine"]["fs_type"]:
        print("**the two runs measured different filesystems: disk rows do not compare**")
    print("\n| row | size | before | after | after/before |\n|---|---|---:|---:|---:|")
    sizes = sorted(set(before["sizes"]) & set(after["sizes"]), key=int)
    for name in ROWS:
        for n in sizes:
            b, a = before["sizes"][n]["rows"].get(name), after["sizes"][n]["rows"].get(name)
            print(f"| {name} | {label(n)} | {cell(b)} | {cell(a)} | {ratio(a, b)} |")
    for side, report in (("before", before), ("after", after)):
        for n in sizes:
            for name, r in report["sizes"][n]["rows"].items():
                if "na" in r:
                    print(f"{side}, n/a at {label(n)}: {name}: {r['na']}")
    if len(sizes) < 2:
        return
    print("\nRatios between sizes (each against the smallest):\n")
    cols = [f"{label(n)}/{label(sizes[0])}" for n in sizes[1:]]
    print("| row | " + " | ".join(f"{c} before | {c} after" for c in cols) + " |")
    print("|---|" + "---:|" * 2 * len(cols))
    for name in ROWS:
        pairs = zip(size_ratios(before, name, sizes), size_ratios(after, name, sizes), strict=True)
        print(f"| {name} | " + " | ".join(f"{b} | {a}" for b, a in pairs) + " |")
