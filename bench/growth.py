"""Growth curves and worker peak memory (issue 8, item 4).

* PUT turn median latency in projects of 10, 1,000 and 10,000 tasks;
* GET tasks?limit=50 median latency in projects of 100, 10,000 and 100,000 tasks;
* GET project.md at 10,000 tasks: time to first byte and worker peak memory, on the first GET
  after a write (it re-renders) and on a repeat GET (served from the rendered file);
* worker peak memory of a 50 MiB artifact upload and download.

All the projects live in one storage root served by one server, and the sizes are measured
interleaved (10, 1k, 10k, 10, 1k, 10k, ...), so the ratios compare like with like.
Peak memory is VmHWM of the only worker (MEMORY_WORKERS=1), reset before each request through
/proc/<pid>/clear_refs, so "+MiB" is the growth of the peak over the resident size before it.

    python -m bench.growth [--quick] [--reps 3]

--quick (used by `make bench`) writes the 100,000-task project as listing rows only (what
GET tasks reads); without it every task is a full tree written through TaskStore.put_turn.
"""

from __future__ import annotations

import argparse
import http.client
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from . import loadgen, servers, workloads as w

RESULTS = servers.REPO / "bench" / "results"
MiB = 1 << 20
PUT_LEVELS = {10: "p10", 1000: "p1k", 10_000: "p10k"}
LIST_LEVELS = {100: "p100", 10_000: "p10k", 100_000: "p100k"}


def load(root: Path, project: str, count: int, listing_only: bool = False) -> float:
    args = [sys.executable, "-m", "bench.loader", str(root), "bench", project, str(count)]
    if listing_only:
        args.append("--listing-only")
    t0 = time.perf_counter()
    subprocess.run(args, cwd=servers.REPO, check=True, stdout=subprocess.DEVNULL)
    return time.perf_counter() - t0


def latency_curve(
    server: servers.Server,
    secret: str,
    levels: dict[int, str],
    op: loadgen.Op,
    args: Any,
) -> dict[int, list[float]]:
    out: dict[int, list[float]] = {n: [] for n in levels}
    for rep in range(args.reps):
        for n, project in levels.items():
            headers = {"Authorization": f"Bearer {secret}", "X-Sandbox-Project-Id": project}
            res = loadgen.run(
                server.host, server.port, op, headers=headers, duration=args.duration, warmup=0.5
            )
            if res.errors:
                print(f"  !! {res.errors} errors: {res.first_error}", file=sys.stderr)
            out[n].append(res.median_ms)
            print(f"  rep {rep} {project:<6} p50 {res.median_ms:7.2f} ms", file=sys.stderr)
    return out


def _peak_delta(pid: int, action: Any) -> tuple[float, Any]:
    """Run ``action`` and return how far the worker's peak RSS rose above its RSS before (MiB)."""
    servers.reset_hwm(pid)
    time.sleep(0.05)
    before = servers.vm_kib(pid, "VmHWM")
    result = action()
    after = servers.vm_kib(pid, "VmHWM")
    return (after - before) / 1024, result


def _upload(server: servers.Server, headers: dict[str, str], path: str, size: int) -> None:
    conn = http.client.HTTPConnection(server.host, server.port, timeout=120)
    chunk = bytes(range(256)) * 4096  # 1 MiB

    def body() -> Any:
        sent = 0
        while sent < size:
            piece = chunk[: min(len(chunk), size - sent)]
            sent += len(piece)
            yield piece

    conn.request(
        "PUT",
        path,
        body=body(),
        headers={**headers, **w.OCTETS, "Content-Length": str(size)},
    )
    resp = conn.getresponse()
    data = resp.read()
    conn.close()
    if resp.status != 200:
        raise RuntimeError(f"upload -> {resp.status}: {data[:200]!r}")


def _download(server: servers.Server, headers: dict[str, str], path: str) -> int:
    conn = http.client.HTTPConnection(server.host, server.port, timeout=120)
    conn.request("GET", path, headers=headers)
    resp = conn.getresponse()
    size = 0
    while chunk := resp.read(1 << 16):
        size += len(chunk)
    conn.close()
    if resp.status != 200:
        raise RuntimeError(f"download -> {resp.status}")
    return size


def memory(server: servers.Server, secret: str, args: Any) -> dict[str, Any]:
    (pid,) = server.worker_pids()
    auth = {"Authorization": f"Bearer {secret}"}
    h10k = {**auth, "X-Sandbox-Project-Id": "p10k"}
    h10 = {**auth, "X-Sandbox-Project-Id": "p10"}
    s10k = loadgen.Session(server.host, server.port, h10k)
    s10 = loadgen.Session(server.host, server.port, h10)
    # Warm the worker: imports, SQLite connections, first-request caches.
    for s in (s10k, s10):
        s.request("GET", f"{w.API}/tasks?limit=50")
        s.request("GET", f"{w.API}/project.md")
    out: dict[str, list[float]] = {
        k: []
        for k in (
            "digest10k_first_ttfb_ms",
            "digest10k_first_total_ms",
            "digest10k_first_peak_mib",
            "digest10k_repeat_ttfb_ms",
            "digest10k_repeat_total_ms",
            "digest10k_repeat_peak_mib",
            "digest10_first_ttfb_ms",
            "digest10_repeat_ttfb_ms",
            "upload50_peak_mib",
            "download50_peak_mib",
        )
    }
    for rep in range(args.reps):
        for label, s in (("10k", s10k), ("10", s10)):
            s.request("PUT", f"{w.API}/tasks/t000000/turns/1", w.turn_body(0, rep), w.JSON)
            peak, (ttfb, total, size) = _peak_delta(
                pid, lambda s=s: s.ttfb("GET", f"{w.API}/project.md")
            )
            out[f"digest{label}_first_ttfb_ms"].append(ttfb * 1000)
            if label == "10k":
                out["digest10k_first_total_ms"].append(total * 1000)
                out["digest10k_first_peak_mib"].append(peak)
                out.setdefault("digest10k_bytes", []).append(size)
            peak, (ttfb, total, size) = _peak_delta(
                pid, lambda s=s: s.ttfb("GET", f"{w.API}/project.md")
            )
            out[f"digest{label}_repeat_ttfb_ms"].append(ttfb * 1000)
            if label == "10k":
                out["digest10k_repeat_total_ms"].append(total * 1000)
                out["digest10k_repeat_peak_mib"].append(peak)
        base = f"{w.API}/tasks/t000001/turns/{rep + 2}"
        s10.request("PUT", base, w.turn_body(1, rep), w.JSON)
        peak, _ = _peak_delta(
            pid, lambda b=base: _upload(server, h10, f"{b}/artifacts/big.bin", 50 * MiB)
        )
        out["upload50_peak_mib"].append(peak)
        peak, size = _peak_delta(
            pid, lambda b=base: _download(server, h10, f"{b}/artifacts/big.bin")
        )
        assert size == 50 * MiB, size
        out["download50_peak_mib"].append(peak)
        print(
            f"  rep {rep} digest@10k first ttfb {out['digest10k_first_ttfb_ms'][-1]:.0f} ms"
            f" +{out['digest10k_first_peak_mib'][-1]:.1f} MiB; upload +{out['upload50_peak_mib'][-1]:.1f}"
            f" MiB; download +{out['download50_peak_mib'][-1]:.1f} MiB",
            file=sys.stderr,
        )
    s10k.close()
    s10.close()
    result: dict[str, Any] = {k: statistics.median(v) for k, v in out.items()}
    result["samples"] = out
    result["worker_rss_mib"] = servers.vm_kib(pid, "VmRSS") / 1024
    return result


def target_rows(r: dict[str, Any]) -> list[tuple[str, float, str, bool, str]]:
    """(name, measured, target text, met, detail) for each growth and memory target."""
    # int keys when fresh, str keys when read back from JSON
    put = {int(k): v for k, v in r["put_p50_ms"].items()}
    lst = {int(k): v for k, v in r["list_p50_ms"].items()}
    mem = r["mem"]
    quick = " (100k: listing rows only, --quick)" if r["quick"] else ""
    rows = [
        (
            "PUT turn p50 @10k / @10 tasks",
            r["put_ratio"],
            1.5,
            f"p50 {put[10]:.1f} / {put[1000]:.1f} / {put[10000]:.1f} ms at 10 / 1k / 10k tasks",
        ),
        (
            "list p50 @100k / @100 tasks",
            r["list_ratio"],
            2.0,
            f"p50 {lst[100]:.2f} / {lst[10000]:.2f} / {lst[100000]:.2f} ms at 100 / 10k / 100k"
            + quick,
        ),
        ("upload 50 MiB: worker peak +MiB", mem["upload50_peak_mib"], 16, "VmHWM growth"),
        ("download 50 MiB: worker peak +MiB", mem["download50_peak_mib"], 16, "VmHWM growth"),
        (
            "project.md @10k, 1st GET after a write +MiB",
            mem["digest10k_first_peak_mib"],
            32,
            f"re-render: TTFB {mem['digest10k_first_ttfb_ms']:.0f} ms (10 tasks:"
            f" {mem['digest10_first_ttfb_ms']:.1f} ms), body {mem['digest10k_bytes'] / MiB:.1f} MiB"
            f" in {mem['digest10k_first_total_ms']:.0f} ms",
        ),
        (
            "project.md @10k, repeat GET +MiB",
            mem["digest10k_repeat_peak_mib"],
            32,
            f"cached: TTFB {mem['digest10k_repeat_ttfb_ms']:.1f} ms (10 tasks:"
            f" {mem['digest10_repeat_ttfb_ms']:.1f} ms), body in"
            f" {mem['digest10k_repeat_total_ms']:.0f} ms",
        ),
    ]
    return [(n, v, f"<= {t:g}", v <= t, d) for n, v, t, d in rows]


def print_table(rows: list[tuple[str, float, str, bool, str]]) -> None:
    print(f"{'target':<46}{'measured':>10}{'target':>10}  met  detail")
    print("-" * 120)
    for name, value, target, met, detail in rows:
        print(f"{name:<46}{value:>10.2f}{target:>10}  {'yes' if met else 'NO ':<4} {detail}")


def run_growth(args: Any) -> dict[str, Any]:
    """Load the projects, measure the curves and the memory; return the report."""
    started = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    with tempfile.TemporaryDirectory(prefix="pm-growth-") as tmp:
        work = Path(tmp)
        root = work / "storage"
        load_s = {}
        for n, project in {10: "p10", 100: "p100", 1000: "p1k", 10_000: "p10k"}.items():
            load_s[project] = load(root, project, n)
        load_s["p100k"] = load(root, "p100k", 100_000, listing_only=args.quick)
        print(
            f"  loaded (s): {json.dumps({k: round(v, 1) for k, v in load_s.items()})}",
            file=sys.stderr,
        )
        server = servers.start_ours(work)
        try:
            secret = server.token(project=None)
            put = latency_curve(server, secret, PUT_LEVELS, w.ours_put_turn("t{client:06d}"), args)
            lst = latency_curve(server, secret, LIST_LEVELS, w.ours_list(), args)
        finally:
            server.stop()
        server = servers.start_ours(work, MEMORY_WORKERS="1")
        try:
            mem = memory(server, secret, args)
        finally:
            server.stop()
    return {
        "kind": "growth",
        "started": started,
        "quick": args.quick,
        "load_seconds": load_s,
        "put_p50_ms": {n: statistics.median(v) for n, v in put.items()},
        "list_p50_ms": {n: statistics.median(v) for n, v in lst.items()},
        "put_samples_ms": put,
        "list_samples_ms": lst,
        "put_ratio": statistics.median(a / b for a, b in zip(put[10_000], put[10], strict=True)),
        "list_ratio": statistics.median(a / b for a, b in zip(lst[100_000], lst[100], strict=True)),
        "mem": mem,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--duration", type=float, default=2.0)
    args = parser.parse_args()
    RESULTS.mkdir(parents=True, exist_ok=True)
    report = run_growth(args)
    report["settings"] = vars(args)
    out = RESULTS / f"growth-{report['started']}.json"
    out.write_text(json.dumps(report, indent=1))
    (RESULTS / "growth-latest.json").write_text(json.dumps(report, indent=1))
    print()
    print(GROWTH_NOTE.format(reps=args.reps, duration=args.duration))
    print_table(target_rows(report))
    print(f"JSON: {out.relative_to(servers.REPO)}")


GROWTH_NOTE = (
    "growth: 8 clients, {reps} interleaved reps of {duration:g} s; ratios are medians of per-rep"
    " ratios; memory on a 1-worker server (VmHWM reset before each request)"
)


if __name__ == "__main__":
    main()
