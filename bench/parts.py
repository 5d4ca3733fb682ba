"""What each safety part of a recorded turn costs in CPU, measured by leaving it out.

    python -m bench.parts [--records 500] [--rounds 5]

Records turns in process (Flask test client, one thread: PUT turn + PUT a 16 KiB artifact,
as `make bench` does) with the engine as shipped, and with one part at a time replaced by
nothing or by a bare equivalent, **in this process only**: the filelock task lock by a bare
flock, the fsyncs, the index.json rewrite, the listing row, the containment walks, the dirty
flag, the search text, the ledger, the secret scan, the embedder (and so the embedding its
drains do, which the run waits for). Each variant runs in a fresh process and storage root under $TMPDIR, the variants
interleaved round after round; it prints the median user and system CPU per record. This
is how bench/HISTORY.md ("What a recorded turn's parts cost") prices the parts a record
cannot do without: none of the variants is a configuration of the service.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

VARIANTS = ["as shipped", "bare flock", "no fsync", "no index.json", "no listing row"]
VARIANTS += ["no containment walk", "no dirty flag", "no search text", "no ledger"]
VARIANTS += ["no secret scan", "no embedder"]


def _patch(variant: str) -> None:
    from app.storage.tree import tasks
    from app.storage.tree.fs import layout
    from app.storage.tree.sqlite import listing

    if variant == "bare flock":

        @contextlib.contextmanager
        def bare(path: Path, timeout: float) -> Iterator[None]:
            path.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX)
                yield
            finally:
                os.close(fd)

        tasks.locked = bare  # type: ignore[assignment]
    elif variant == "no fsync":
        os.fsync = lambda fd: None
    elif variant == "no index.json":
        write_json = tasks.write_json

        def skip_index(path: Path, obj: Any, *, durable: bool = True) -> None:
            if path.name != "index.json":
                write_json(path, obj, durable=durable)

        tasks.write_json = skip_index  # type: ignore[assignment]
    elif variant == "no listing row":
        from app.storage.tree.sqlite import fts

        listing.Listing.put_turn = lambda self, *args, **kwargs: fts.Upkeep()  # type: ignore[method-assign]
    elif variant == "no containment walk":
        layout.Layout.check_inside = lambda self, path, below=None: path  # type: ignore[method-assign]
    elif variant == "no dirty flag":
        from app.storage.tree.fs import txn

        txn.Journal.set = txn.Journal.clear = lambda self, *args: None  # type: ignore[method-assign]
        txn.Journal.get = lambda self, stripe: None  # type: ignore[method-assign]
    elif variant == "no search text":
        from app.storage.tree.sqlite import turn_search

        turn_search.put = lambda conn, turn, text: None  # type: ignore[assignment]
    elif variant == "no ledger":
        from app.storage.tree.sqlite import ledger

        ledger.Ledger.put_turn = lambda self, *args: None  # type: ignore[method-assign]
    elif variant == "no secret scan":
        from app.services import secrets

        secrets.Screen.active = property(lambda self: False)  # type: ignore[method-assign,assignment]
    elif variant == "no embedder":
        os.environ["MEMORY_EMBEDDER"] = "off"


def quiet(client: Any) -> None:
    """Wait until the background embedding of what was written has run."""
    embedding = getattr(client.application.extensions["storage"], "embedding", None)
    while embedding is not None and not embedding.idle():
        time.sleep(0.01)


def _child(variant: str, records: int) -> None:
    """Record ``records`` turns after a warm-up; print user and system ms per record."""
    _patch(variant)
    from . import workloads as w
    from .micro import app_client

    tmp = Path(tempfile.mkdtemp(prefix="pm-parts-"))
    try:
        client, auth = app_client(tmp)

        def record(i: int) -> None:
            base = f"{w.API}/tasks/parts-t{i // 10}/turns/{i % 10}"
            r = client.put(base, data=w.turn_body(0, i), headers={**auth, **w.JSON})
            assert r.status_code == 200, r.data
            r = client.put(
                f"{base}/artifacts/out.bin", data=w.ARTIFACT, headers={**auth, **w.OCTETS}
            )
            assert r.status_code == 200, r.data

        for i in range(100):
            record(i)
        before = os.times()
        quiet(client)
        for i in range(100, 100 + records):
            record(i)
        quiet(client)  # the embedding the records queued is theirs
        after = os.times()
        user = (after.user - before.user) / records * 1e3
        system = (after.system - before.system) / records * 1e3
        print(f"{user:.4f} {system:.4f}")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--records", type=int, default=500)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        _child(args.child, args.records)
        return
    results: dict[str, list[tuple[float, float]]] = {v: [] for v in VARIANTS}
    for _ in range(args.rounds):
        for variant in VARIANTS:
            out = subprocess.run(
                [sys.executable, "-m", "bench.parts", "--child", variant]
                + ["--records", str(args.records)],
                capture_output=True, text=True, check=True,
            ).stdout.split()  # fmt: skip
            results[variant].append((float(out[0]), float(out[1])))
    base = statistics.median(u + s for u, s in results["as shipped"])
    print(f"CPU per recorded turn, in process, median of {args.rounds} interleaved rounds")
    print(f"{'variant':<22}{'user ms':>9}{'sys ms':>9}{'total':>9}{'vs shipped':>12}")
    for variant, rows in results.items():
        user = statistics.median(r[0] for r in rows)
        system = statistics.median(r[1] for r in rows)
        total = statistics.median(r[0] + r[1] for r in rows)
        print(f"{variant:<22}{user:9.2f}{system:9.2f}{total:9.2f}{total / base - 1:+11.0%}")


if __name__ == "__main__":
    main()
