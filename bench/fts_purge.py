"""What a search purge costs (app/storage/tree/sqlite/fts.py), against the purge it replaced,
on the same index in the same run.

For each index size (turns of ~80 words, as the listing holds them), interleaved reps of:

* **old**: the purge of be2183b, inlined: 'merge' with -256 pages until a step changes
  nothing (its level count grows by about two per purge, without bound);
* **new**: ``fts_purge.purge``: one negative step, positive ones to finish, and a compaction once
  the structure has more than LEVEL_BOUND levels;

each over ``--purges`` rounds of one write, one delete and its purge, on two copies of one
index, round by round in alternating order.
Reported: the median and p95 of one purge, the mean over the rounds (compactions included),
the levels at the end, and the longest single write transaction (what a writer may wait
behind). Then one compaction against FTS5's 'rebuild' (one transaction) on the same index.

``--sqlite3-dist`` (an interpreter with pysqlite3-binary installed) adds the purge a newer
SQLite would allow: FTS5's secure-delete, which removes a row's entries at once, so a purge
is only the WAL's truncation.

    python -m bench.fts_purge [--sizes 1000,10000] [--purges 200]
"""

# ruff: noqa: S608 - table names are module constants; every value is bound.
from __future__ import annotations

import argparse
import json
import random
import shutil
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from app.storage.tree.sqlite import fts, fts_purge

COLUMNS = "task_id, meta, summary"
WORDS = [f"w{n:05d}" for n in range(30_000)]


def _text(rng: random.Random, n: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(n))


def build(path: Path, turns: int) -> None:
    rng = random.Random(1)
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute(
        f"CREATE VIRTUAL TABLE {fts.TEXT} USING fts5({COLUMNS}, tokenize = '{fts.TOKENIZER}')"
    )
    conn.execute(fts.STATE_SCHEMA)
    conn.execute("BEGIN")
    for n in range(turns):
        conn.execute(
            f"INSERT INTO {fts.TEXT} (rowid, {COLUMNS}) VALUES (?, ?, ?, ?)",
            (n + 1, f"task-{n}", "model opus agent claude", _text(rng, 80)),
        )
    conn.execute("COMMIT")
    conn.execute(f"INSERT INTO {fts.TEXT} ({fts.TEXT}) VALUES ('optimize')")
    conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    conn.close()


class Timed:
    """A connection whose write transactions are timed (the longest is what a writer of
    the same index may wait behind)."""

    def __init__(self, path: Path) -> None:
        self.conn = sqlite3.connect(path, isolation_level=None)
        self.conn.execute("PRAGMA secure_delete=ON")
        self.conn.execute("PRAGMA synchronous=NORMAL")
        self.longest = 0.0
        self._began = 0.0
        self.conn.set_trace_callback(self._trace)

    def _trace(self, sql: str) -> None:
        if sql.startswith("BEGIN"):
            self._began = time.perf_counter()
        elif sql.startswith(("COMMIT", "ROLLBACK")):
            self.longest = max(self.longest, time.perf_counter() - self._began)


def old_purge(conn: sqlite3.Connection) -> None:
    """The purge as it was: negative merges until one changes (almost) nothing."""
    while True:
        conn.execute("BEGIN IMMEDIATE")
        before = conn.total_changes
        conn.execute(f"INSERT INTO {fts.TEXT} ({fts.TEXT}, rank) VALUES ('merge', -256)")
        done = conn.total_changes - before < 2
        conn.execute("COMMIT")
        if done:
            break
    fts_purge.checkpoint(conn)


def new_purge(conn: sqlite3.Connection) -> None:
    fts_purge.purge(conn, "bench", COLUMNS)


def rounds(paths: dict[str, Path], n: int) -> dict[str, dict[str, float]]:
    """``n`` rounds of a write, a delete of an older row and its purge, on each copy in turn
    (old, then new, then new, then old, ...): background load hits both alike."""
    purges = {"old": old_purge, "new": new_purge}
    timed = {name: Timed(path) for name, path in paths.items()}
    rng = random.Random(2)
    (top,) = timed["old"].conn.execute(f"SELECT max(rowid) FROM {fts.TEXT}").fetchone()
    times: dict[str, list[float]] = {name: [] for name in paths}
    for k in range(n):
        text = _text(rng, 80)
        order = list(paths) if k % 2 == 0 else list(reversed(paths))
        for name in order:
            conn = timed[name].conn
            conn.execute(
                f"INSERT INTO {fts.TEXT} (rowid, {COLUMNS}) VALUES (?, ?, ?, ?)",
                (top + k + 1, f"new-{k}", "model", text),
            )
            conn.execute(f"DELETE FROM {fts.TEXT} WHERE rowid = ?", (k + 1,))
            started = time.perf_counter()
            purges[name](conn)
            times[name].append(time.perf_counter() - started)
    out = {}
    for name, spent in times.items():
        spent.sort()
        out[name] = {
            "median_ms": statistics.median(spent) * 1e3,
            "p95_ms": spent[int(0.95 * (len(spent) - 1))] * 1e3,
            "mean_ms": statistics.fmean(spent) * 1e3,
            "levels": fts.levels(timed[name].conn),
            "longest_txn_ms": timed[name].longest * 1e3,
        }
        timed[name].conn.close()
    return out


def compaction(path: Path) -> dict[str, float]:
    """One compaction against FTS5's 'rebuild' of the same index."""
    copy = path.with_name("rebuild.sqlite3")
    shutil.copy(path, copy)
    timed = Timed(path)
    started = time.perf_counter()
    fts_purge.compact(timed.conn, "bench", COLUMNS)
    compact_s = time.perf_counter() - started
    compact_longest = timed.longest
    timed.conn.close()
    timed = Timed(copy)
    started = time.perf_counter()
    timed.conn.execute("BEGIN IMMEDIATE")
    timed.conn.execute(f"INSERT INTO {fts.TEXT} ({fts.TEXT}) VALUES ('rebuild')")
    timed.conn.execute("COMMIT")
    rebuild_s = time.perf_counter() - started
    timed.conn.close()
    return {
        "compact_s": compact_s,
        "compact_longest_txn_ms": compact_longest * 1e3,
        "rebuild_s": rebuild_s,
        "rebuild_txn_ms": timed.longest * 1e3,
        "mb": path.stat().st_size / 1e6,
    }


_SECURE = """
import json, sqlite3, statistics, sys, time, random, shutil
import pysqlite3.dbapi2 as lite
path, n = sys.argv[1], int(sys.argv[2])
conn = lite.connect(path, isolation_level=None)
conn.execute("PRAGMA secure_delete=ON")
conn.execute("INSERT INTO search_text (search_text, rank) VALUES ('secure-delete', 1)")
conn.execute("INSERT INTO search_text (search_text) VALUES ('optimize')")
rng = random.Random(2)
(top,) = conn.execute("SELECT max(rowid) FROM search_text").fetchone()
times = []
for k in range(n):
    text = " ".join(f"w{rng.randrange(30000):05d}" for _ in range(80))
    conn.execute("INSERT INTO search_text (rowid, task_id, meta, summary) VALUES (?, ?, ?, ?)",
                 (top + k + 1, f"new-{k}", "model", text))
    conn.execute("DELETE FROM search_text WHERE rowid = ?", (k + 1,))
    started = time.perf_counter()
    conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    times.append(time.perf_counter() - started)
times.sort()
print(json.dumps({"median_ms": statistics.median(times) * 1e3,
                  "p95_ms": times[int(0.95 * (len(times) - 1))] * 1e3,
                  "mean_ms": statistics.fmean(times) * 1e3, "sqlite": lite.sqlite_version}))
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="1000,10000")
    parser.add_argument("--purges", type=int, default=200)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--sqlite3-dist", help="a Python with pysqlite3-binary installed")
    args = parser.parse_args()
    out: dict[str, object] = {"sqlite": sqlite3.sqlite_version, "sizes": {}}
    for size in (int(s) for s in args.sizes.split(",")):
        with tempfile.TemporaryDirectory(prefix="bench-fts-") as scratch:
            base = Path(scratch) / "base.sqlite3"
            build(base, size)
            runs: dict[str, list[dict[str, float]]] = {"old": [], "new": [], "secure": []}
            for _ in range(args.reps):
                paths = {name: Path(scratch) / f"{name}.sqlite3" for name in ("old", "new")}
                for path in paths.values():
                    shutil.copy(base, path)
                for name, found in rounds(paths, args.purges).items():
                    runs[name].append(found)
                if args.sqlite3_dist:
                    work = Path(scratch) / "secure.sqlite3"
                    shutil.copy(base, work)
                    done = subprocess.run(
                        [args.sqlite3_dist, "-c", _SECURE, str(work), str(args.purges)],
                        capture_output=True,
                        text=True,
                        check=True,
                    )
                    runs["secure"].append(json.loads(done.stdout))
            work = Path(scratch) / "compact.sqlite3"
            shutil.copy(base, work)
            compact = compaction(work)
        row = {
            name: {k: statistics.median(rep[k] for rep in r) for k in r[0] if k != "sqlite"}
            for name, r in runs.items()
            if r
        }
        out["sizes"][size] = {"purge": row, "compaction": compact}  # type: ignore[index]
        print(
            f"\n{size} turns ({compact['mb']:.1f} MB index), {args.purges} purges, median of {args.reps}"
        )
        print(
            f"{'':8} {'median ms':>10} {'p95 ms':>8} {'mean ms':>8} {'levels':>7} {'longest txn ms':>15}"
        )
        for name, r in row.items():
            print(
                f"{name:8} {r['median_ms']:10.2f} {r['p95_ms']:8.2f} {r['mean_ms']:8.2f}"
                f" {r.get('levels', 0):7.0f} {r.get('longest_txn_ms', 0):15.1f}"
            )
        print(
            f"new/old mean: {row['new']['mean_ms'] / row['old']['mean_ms']:.2f}; compaction"
            f" {compact['compact_s']:.2f} s (longest txn {compact['compact_longest_txn_ms']:.0f} ms)"
            f" vs rebuild {compact['rebuild_s']:.2f} s in one transaction"
        )
    results = Path(__file__).parent / "results"
    results.mkdir(exist_ok=True)
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    (results / f"fts_purge-{stamp}.json").write_text(json.dumps(out, indent=2))


if __name__ == "__main__":
    sys.exit(main())
