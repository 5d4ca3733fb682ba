"""What the rate limits cost the read path: limits off against limits on, side by side.

    python -m bench.ratelimit [--reps 3] [--duration 2] [--micro-n 2000] [--no-http]

"On" sets every budget (requests and uploads, per token and per project) far above what the
load reaches, and an override for the bench project, so every request runs the whole check
(the overrides lookup, the shared table's lock, the arithmetic) and none is refused (nor half
spent, so no response carries the RateLimit fields). Two figures:

* **in process** (as ``bench.micro``): CPU per request through the Flask test client, off and
  on, alternated; the difference is the check's cost per request;
* **over HTTP** (as ``make bench``): two servers as ``make run`` starts them, one off and one
  on, the same 8 clients; repetitions interleave off, on, off, on ... with the server not
  measured paused; the ratio is the median over repetitions of on ÷ off throughput.
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

from flask.testing import FlaskClient

from app import create_app

from . import loadgen, servers, workloads as w
from .run import RESULTS, machine, measure

ON = {
    "MEMORY_RATE_LIMIT_RPS": "1000000",
    "MEMORY_RATE_LIMIT_UPLOAD_BPS": "1GiB",
}
OVERRIDE = ["--rps", "2000000", "--burst", "2000000", "--upload-bps", "2GiB"]
WORKLOADS = {"read a turn": w.ours_read, "list": w.ours_list}


def in_process(tmp: Path, limited: bool) -> tuple[FlaskClient, dict[str, str]]:
    settings = {k.removeprefix("MEMORY_"): v for k, v in ON.items()} if limited else {}
    app = create_app(
        {
            "STORAGE_ROOT": str(tmp / "storage"),
            "TOKENS_FILE": str(tmp / "tokens.json"),
            "LOG_LEVEL": "WARNING",
            **settings,
        }
    )
    _, secret = app.extensions["token_registry"].create(
        role="writer", tenant="bench", project="bench"
    )
    auth = {"Authorization": f"Bearer {secret}"}
    client = app.test_client()
    for i in range(w.READ_TASKS):
        r = client.put(
            f"{w.API}/tasks/pre-{i}/turns/0", data=w.turn_body(i, 0), headers={**auth, **w.JSON}
        )
        assert r.status_code == 200, r.data
    return client, auth


def micro(n: int) -> dict[str, dict[str, float]]:
    """CPU µs per request in process, limits off and on, alternated 5 times."""
    paths = {
        "read a turn": [f"{w.API}/tasks/pre-{i}/turns/0" for i in range(w.READ_TASKS)],
        "list": [f"{w.API}/tasks?limit=50"],
    }
    out: dict[str, dict[str, float]] = {}
    with tempfile.TemporaryDirectory(prefix="pm-rl-micro-") as tmp:
        clients = {
            "off": in_process(Path(tmp) / "off", False),
            "on": in_process(Path(tmp) / "on", True),
        }
        limiter = clients["on"][0].application.extensions["rate_limiter"]
        assert not limiter.limits("bench", "bench").off, "limits are not on"
        for name, urls in paths.items():
            samples: dict[str, list[float]] = {"off": [], "on": []}
            for _rep in range(5):
                for side, (client, auth) in clients.items():
                    t0 = time.process_time()
                    for i in range(n):
                        r = client.get(urls[i % len(urls)], headers=auth)
                        assert r.status_code == 200
                        r.close()
                    samples[side].append((time.process_time() - t0) / n * 1e6)
            off, on = statistics.median(samples["off"]), statistics.median(samples["on"])
            out[name] = {"off_us": off, "on_us": on, "extra_us": on - off}
            print(
                f"  in process {name:<12} off {off:7.1f} µs  on {on:7.1f} µs  "
                f"(+{on - off:.1f} µs per request)",
                file=sys.stderr,
            )
    return out


def over_http(args: Any, work: Path) -> dict[str, Any]:
    off = servers.start_ours(work / "off")
    on = servers.start_ours(work / "on", **ON)
    try:
        auth = {}
        for side, label in ((off, "off"), (on, "on")):
            auth[label] = {"Authorization": f"Bearer {side.token()}"}
            s = loadgen.Session(side.host, side.port, auth[label])
            w.ours_preload(s)
            s.close()
        for project, limits in (("bench", OVERRIDE), ("probe", ["--rps", "1", "--burst", "2"])):
            subprocess.run(
                [str(servers.VENV_BIN / "flask"), "--app", "wsgi", "ratelimit", "set"]
                + ["--tenant", "bench", "--project", project, *limits],
                cwd=servers.REPO,
                env=on.env,
                check=True,
                capture_output=True,
            )
        time.sleep(1.2)  # every worker sees the overrides
        # The server limits: a request in a project with a budget of 2 gets the fields.
        probe_auth = {"Authorization": f"Bearer {on.token(project='probe')}"}
        probe = http.client.HTTPConnection(on.host, on.port, timeout=10)
        probe.request("GET", f"{w.API}/tasks?limit=1", headers=probe_auth)
        answer = probe.getresponse()
        answer.read()
        probe.close()
        assert answer.getheader("RateLimit"), "limits are not on"
        data: dict[str, dict[str, list[dict[str, Any]]]] = {
            name: {"off": [], "on": []} for name in WORKLOADS
        }
        for rep in range(args.reps):
            for name, op in WORKLOADS.items():
                o = measure(off, op(), auth["off"], args, paused=on)
                n = measure(on, op(), auth["on"], args, paused=off)
                data[name]["off"].append(o)
                data[name]["on"].append(n)
                print(
                    f"  rep {rep} {name:<12} off {o['throughput']:7.0f} op/s  "
                    f"on {n['throughput']:7.0f} op/s  ratio {n['throughput'] / o['throughput']:.3f}",
                    file=sys.stderr,
                )
        rows = {}
        for name, sides in data.items():
            ratios = [
                n["throughput"] / o["throughput"]
                for o, n in zip(sides["off"], sides["on"], strict=True)
            ]
            rows[name] = {
                "off_ops_s": statistics.median(o["throughput"] for o in sides["off"]),
                "on_ops_s": statistics.median(n["throughput"] for n in sides["on"]),
                "off_p50_ms": statistics.median(o["p50_ms"] for o in sides["off"]),
                "on_p50_ms": statistics.median(n["p50_ms"] for n in sides["on"]),
                "ratio": statistics.median(ratios),
                "ratios": ratios,
                "errors": sum(
                    o["errors"] + n["errors"]
                    for o, n in zip(sides["off"], sides["on"], strict=True)
                ),
            }
        return rows
    finally:
        off.stop()
        on.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--duration", type=float, default=2.0)
    parser.add_argument("--warmup", type=float, default=0.5)
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--micro-n", type=int, default=2000)
    parser.add_argument("--no-http", action="store_true", help="only the in-process figure")
    args = parser.parse_args()
    started = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    report: dict[str, Any] = {
        "kind": "ratelimit",
        "started": started,
        "machine": machine(),
        "settings": vars(args),
    }
    report["micro"] = micro(args.micro_n)
    if not args.no_http:
        with tempfile.TemporaryDirectory(prefix="pm-bench-rl-") as tmp:
            report["http"] = over_http(args, Path(tmp))
    RESULTS.mkdir(parents=True, exist_ok=True)
    out = RESULTS / f"ratelimit-{started}.json"
    out.write_text(json.dumps(report, indent=1))
    (RESULTS / "ratelimit-latest.json").write_text(json.dumps(report, indent=1))
    print()
    print("rate limits off vs on (every budget set, none reached)")
    print(f"{'workload':<14}{'CPU µs off':>12}{'CPU µs on':>11}{'+µs':>7}", end="")
    if "http" in report:
        print(f"{'op/s off':>10}{'op/s on':>9}{'on ÷ off':>10}  per rep", end="")
    print()
    for name in WORKLOADS:
        m = report["micro"][name]
        line = f"{name:<14}{m['off_us']:>12.1f}{m['on_us']:>11.1f}{m['extra_us']:>7.1f}"
        if "http" in report:
            h = report["http"][name]
            per_rep = ", ".join(f"{r:.3f}" for r in h["ratios"])
            line += f"{h['off_ops_s']:>10.0f}{h['on_ops_s']:>9.0f}{h['ratio']:>10.3f}  {per_rep}"
        print(line)
    print(f"JSON: {out.relative_to(servers.REPO)}")


if __name__ == "__main__":
    main()
