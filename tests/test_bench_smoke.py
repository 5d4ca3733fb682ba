"""bench/ keeps running: every module imports (in `make test`), and every script runs to its
end at a tiny size (in `make slow`), so a rename in app/ breaks CI instead of the next
benchmark run. No figure is checked: a smoke run proves the script works, not how fast.
"""

from __future__ import annotations

import importlib
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
BENCH = REPO / "bench"

# Every script, at a size that runs in seconds. The base of the A/B scripts is this checkout.
SMOKE: dict[str, list[str]] = {
    "ab": ["--base", ".", "--workloads", "read", "search", "--reps", "1", "--search-turns", "12"],
    "agent_hooks": ["--runs", "1", "--hogs", "0"],
    "console": ["--n", "2", "--reps", "1", "--tasks", "20"],
    "cpu": ["read", "--duration", "0.5", "--reps", "1"],
    "digest": ["--sizes", "20", "--reps", "1"],
    "digest_head": ["--sizes", "20", "--reps", "1", "--backends", "tree,pg"],
    "fts_purge": ["--sizes", "20", "--purges", "2"],
    "growth": ["--quick", "--reps", "1"],
    "ledger": ["--tasks", "200", "--reps", "3", "--backends", "tree,pg"],
    "loader": ["{tmp}/root", "acme", "web", "20"],
    "micro": ["--n", "5"],
    "neighbour": ["--rate", "5", "--reps", "1", "--duration", "0.5", "--workloads", "record"],
    "oauth_call": ["--calls", "3", "--reps", "1"],
    "parts": ["--records", "5", "--rounds", "1"],
    "pg": ["--reps", "1", "--duration", "0.3", "--only", "read"],
    "pg_digest": ["--sizes", "20", "--reps", "1"],
    "pg_search": ["--turns", "50", "--stores", "1", "--memories", "2", "--reps", "1"],
    "prompt_hook": ["--runs", "1", "--turns", "60"],
    "ratelimit": ["--reps", "1", "--duration", "0.5", "--micro-n", "5", "--no-http"],
    "recall": [
        "--docs",
        "200",
        "--queries",
        "20",
        "--sizes",
        "1000",
        "--reps",
        "5",
        "--embedders",
        "wordllama",
        "--no-rss",
    ],  # fmt: skip
    "recall_set": [],
    "record_ab": ["--base", ".", "--reps", "1", "--records", "5"],
    "recovery": ["--tasks", "20", "--reps", "1"],
    "relay": ["--runs", "1", "--base", "HEAD"],
    "run": ["--reps", "1", "--duration", "0.5", "--warmup", "0.1", "--only", "read"],
    "scale": ["--checkout", ".", "--sizes", "20", "--out", "{tmp}/scale.json", "--reps", "1"],
    "secrets_scan": ["--mib", "0.05", "--reps", "1", "--turns", "5", "--worst-kib", "8"],
    "secrets_sweep": ["--tasks", "40", "--secrets", "4"],
    "search": ["--turns", "50", "--stores", "1", "--memories", "2", "--reps", "1", "--writes", "2"],
    "search_concurrency": [
        "--threads",
        "4",
        "--workers",
        "1",
        "--clients",
        "2",
        "--turns",
        "20",
        "--seconds",
        "0.5",
    ],  # fmt: skip
    "search_worst": [
        "--backends",
        "tree",
        "--sizes",
        "20000",
        "--reps",
        "1",
        "--load",
        "2",
        "--load-seconds",
        "0.5",
    ],  # fmt: skip
    "slow_bodies": ["--backends", "tree", "--clients", "2"],
    "starts": ["--tasks", "20", "--reps", "1"],
    "statement_cache": ["--rounds", "1", "--iterations", "5", "--settings", "8"],
    "storage_ab": ["--base", ".", "--reps", "1", "--n", "60"],
    "stores_scale": ["--stores", "3", "--ops", "3", "--reps", "1"],
    "suite_timeline": ["{tmp}"],
    "vector_rank": ["--sizes", "200", "--reps", "2"],
    "vector_rank_pg": ["--sizes", "200", "--reps", "2"],
}
# Modules that are not scripts (the others' parts), and what a script needs that CI lacks.
NOT_RUN = {
    "__init__": "the package",
    "floor": "the floor server `run` starts",
    "hello": "the hello-world server `run` starts",
    "loadgen": "the load generator the scripts share",
    "measure": "the measurement helpers the scripts share",
    "report": "the report `run` prints",
    "scale_report": "the report `scale` writes",
    "servers": "starts the servers the scripts measure",
    "workloads": "the workloads the scripts share",
    "profile": "needs py-spy in bench/.venv-prof (it says how to make it); run by hand",
}


def bench_modules() -> list[str]:
    return sorted(p.stem for p in BENCH.glob("*.py"))


def test_every_bench_module_is_smoked_or_says_why_not() -> None:
    assert set(bench_modules()) == set(SMOKE) | set(NOT_RUN)
    assert not set(SMOKE) & set(NOT_RUN)


@pytest.mark.parametrize("name", bench_modules())
def test_every_bench_module_imports(name: str) -> None:
    """A name a script imports from app/ that no longer exists fails here, in `make test`."""
    importlib.import_module("bench" if name == "__init__" else f"bench.{name}")


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(SMOKE))
def test_every_bench_script_runs_at_a_tiny_size(name: str, tmp_path: Path) -> None:
    args = [a.replace("{tmp}", str(tmp_path)) for a in SMOKE[name]]
    if name == "suite_timeline":  # a report over what its plugin wrote: one test's lines
        (tmp_path / "gw0.jsonl").write_text(
            '{"ev": "start", "id": "t", "t": 1.0}\n{"ev": "end", "id": "t", "t": 2.5}\n'
        )
    done = subprocess.run(
        [sys.executable, "-m", f"bench.{name}", *args],
        cwd=REPO,
        env={**os.environ, "TMPDIR": str(tmp_path)},
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert done.returncode == 0, (done.stdout[-2000:], done.stderr[-4000:])
