"""A recorded turn in process, two checkouts side by side: CPU per record through the app.

    python -m bench.record_ab --base /path/to/other/checkout [--reps 5] [--records 600]
                              [--this-env NAME=VALUE ...] [--base-env NAME=VALUE ...]

``bench.ab`` measures a record over HTTP (gunicorn, 8 clients); this one takes HTTP, the
worker and the load generator away and keeps everything the app does: the Flask test client
sends ``PUT turn`` and ``PUT`` a 16 KiB artifact (as `make bench` does, 10 turns per task,
new tasks as it goes) to ``create_app()`` over a fresh storage root under $TMPDIR, and
``time.process_time`` gives the CPU of the process per record (the fsyncs' waits are not
CPU). Each repetition runs one fresh process per checkout, interleaved (this, base, base,
this, ...), with that checkout first on ``sys.path``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from . import workloads as w
from .storage_ab import print_pairs

WORKER = r"""
import json, os, sys, tempfile, time
from pathlib import Path
from app import create_app

records = int(sys.argv[1])
body = sys.argv[2].encode()
artifact = bytes.fromhex(sys.argv[3])
tmp = Path(tempfile.mkdtemp(dir=sys.argv[4]))
form = bytes.fromhex(sys.argv[5]) if len(sys.argv) > 5 else None
app = create_app({
    "STORAGE_ROOT": str(tmp / "storage"),
    "TOKENS_FILE": str(tmp / "tokens.json"),
    "LOG_LEVEL": "WARNING",
})
_, secret = app.extensions["token_registry"].create(role="writer", tenant="bench", project="bench")
client = app.test_client()
auth = {"Authorization": f"Bearer {secret}"}
api = "/sandbox/memory/v1"
json_type = {**auth, "Content-Type": "application/json"}
octets = {**auth, "Content-Type": "application/octet-stream"}

form_type = {**auth, "Content-Type": f"multipart/form-data; boundary={sys.argv[6] if form else ''}"}

def record(i):
    base = f"{api}/tasks/rec-t{i // 10}/turns/{i % 10}"
    if form is not None:  # one request: the turn and its artifact as one form
        r = client.put(base, data=form, headers=form_type)
        assert r.status_code in (200, 201), r.data
        return
    r = client.put(base, data=body, headers=json_type)
    assert r.status_code in (200, 201), r.data
    r = client.put(f"{base}/artifacts/out.bin", data=artifact, headers=octets)
    assert r.status_code in (200, 201), r.data

for i in range(100):
    record(i)
start = time.process_time()
for i in range(100, 100 + records):
    record(i)
print(json.dumps({"record": (time.process_time() - start) / records * 1e3}))
"""


def run_once(
    checkout: Path, records: int, tmp: Path, one: bool = False, extra: list[str] | None = None
) -> dict[str, float]:
    body = w.turn_body(0, 0).decode()
    args = [sys.executable, "-c", WORKER, str(records), body, w.ARTIFACT.hex(), str(tmp)]
    if one:
        args += [w.turn_form(0, 0, {"out.bin": w.ARTIFACT}).hex(), w.BOUNDARY]
    settings = dict(item.split("=", 1) for item in extra or [])
    env = {**os.environ, "PYTHONPATH": str(checkout), **settings}
    done = subprocess.run(
        args, cwd=checkout, env=env, capture_output=True, text=True, check=True, timeout=900
    )
    result: dict[str, float] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base", type=Path, required=True, help="the other checkout")
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--records", type=int, default=600)
    parser.add_argument(
        "--one", action="store_true",
        help="this side records each turn in one request (the turn and its artifact as one"
        " multipart PUT); the base, in the seed's two",
    )  # fmt: skip
    parser.add_argument(
        "--base-one", action="store_true", help="the base records in one request too"
    )
    parser.add_argument("--this-env", nargs="*", default=[], help="NAME=VALUE for this side")
    parser.add_argument("--base-env", nargs="*", default=[], help="NAME=VALUE for the base")
    args = parser.parse_args()
    this = Path(__file__).resolve().parent.parent
    base = args.base.resolve()
    rows: dict[str, list[tuple[float, float]]] = {}
    load = [os.getloadavg()[0]]
    with tempfile.TemporaryDirectory(prefix="pm-record-ab-") as tmp:
        for rep in range(args.reps):
            # Alternate which side goes first, so neither always follows the other.
            if rep % 2 == 0:
                ours = run_once(this, args.records, Path(tmp), args.one, args.this_env)
                theirs = run_once(base, args.records, Path(tmp), args.base_one, args.base_env)
            else:
                theirs = run_once(base, args.records, Path(tmp), args.base_one, args.base_env)
                ours = run_once(this, args.records, Path(tmp), args.one, args.this_env)
            for name in ours:
                rows.setdefault(name, []).append((ours[name], theirs[name]))
            load.append(os.getloadavg()[0])
            print(
                f"  rep {rep} "
                + "  ".join(f"{k} {ours[k]:.2f} / {theirs[k]:.2f} ms" for k in ours)
                + f"  load {load[-1]:.1f}",
                flush=True,
            )
    print(f"record_ab: this = {this}, base = {base}; CPU ms per record in process,")
    print(f"median of {args.reps} interleaved reps; load average {min(load):.1f}-{max(load):.1f}")
    print_pairs(rows, "ms", 2)


if __name__ == "__main__":
    main()
