"""Render the latest results (bench/results/{bench,peer,pg}-latest.json) as the README's tables.

python -m bench.report
"""

from __future__ import annotations

import json
from pathlib import Path

from . import growth
from .pg import markdown as pg_markdown
from .run import target_rows

RESULTS = Path(__file__).resolve().parent / "results"


def main() -> None:
    rows = []
    sources = []
    for kind in ("bench", "peer"):
        path = RESULTS / f"{kind}-latest.json"
        if not path.exists():
            continue
        report = json.loads(path.read_text())
        sources.append(f"{kind}-{report['started']}.json")
        for row, (name, value, target, met, detail) in zip(
            [r for r in report["rows"] if r.get("target") is not None],
            target_rows(report["rows"]),
            strict=True,
        ):
            reps = ", ".join(f"{x:.2f}" for x in row["throughput_ratios"])
            rows.append((name, value, target, met, f"{detail}; per rep: {reps}"))
        if report.get("growth"):
            rows += growth.target_rows(report["growth"])
    print(f"Measured in `{'`, `'.join(sources)}`:\n")
    print("| target | measured | target | met | detail |")
    print("|---|---:|---:|:-:|---|")
    for name, value, target, met, detail in rows:
        print(f"| {name} | {value:.2f} | {target} | {'yes' if met else '**no**'} | {detail} |")
    bench = RESULTS / "bench-latest.json"
    if bench.exists():
        print("\nAll workloads (ours vs hello-world, medians over the repetitions):\n")
        print(
            "| workload | ours op/s | ours p50 ms | ours p99 ms | hello op/s | hello p50 ms | ratio |"
        )
        print("|---|---:|---:|---:|---:|---:|---:|")
        for r in json.loads(bench.read_text())["rows"]:
            print(
                f"| {r['workload']} | {r['ours_ops_s']:.0f} | {r['ours_median_ms']:.2f} |"
                f" {r['ours_p99_ms']:.1f} | {r['base_ops_s']:.0f} | {r['base_median_ms']:.2f} |"
                f" {r['throughput_ratio']:.3f} |"
            )

    pg = RESULTS / "pg-latest.json"
    if pg.exists():
        report = json.loads(pg.read_text())
        print(f"\nPostgreSQL + S3 against the tree (`pg-{report['started']}.json`):\n")
        print(pg_markdown(report))


if __name__ == "__main__":
    main()
