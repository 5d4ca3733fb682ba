"""CPU cost per request, in process (Flask test client): the A/B check behind each app/ fix.

On a machine shared with other jobs, wall-clock throughput moves by ±30% between runs, but
the CPU time a request costs its own thread barely moves. This measures that, for the
read / list / digest paths (writes are fsync-bound: see bench.profile instead).

    python -m bench.micro [--n 2000]
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

from flask.testing import FlaskClient

from app import create_app

from . import workloads as w


def app_client(tmp: Path) -> tuple[FlaskClient, dict[str, str]]:
    """The service in process over a new root under ``tmp``, and a writer's auth header."""
    app = create_app(
        {
            "STORAGE_ROOT": str(tmp / "storage"),
            "TOKENS_FILE": str(tmp / "tokens.json"),
            "LOG_LEVEL": "WARNING",
        }
    )
    _, secret = app.extensions["token_registry"].create(
        role="writer", tenant="bench", project="bench"
    )
    return app.test_client(), {"Authorization": f"Bearer {secret}"}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--n", type=int, default=2000)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="pm-micro-") as tmp:
        client, auth = app_client(Path(tmp))
        for i in range(w.READ_TASKS):
            r = client.put(
                f"{w.API}/tasks/pre-{i}/turns/0",
                data=w.turn_body(i, 0),
                headers={**auth, **w.JSON},
            )
            assert r.status_code == 200, r.data
        paths = {
            "read a turn": [f"{w.API}/tasks/pre-{i % w.READ_TASKS}/turns/0" for i in range(64)],
            "list": [f"{w.API}/tasks?limit=50"],
            "digest": [f"{w.API}/project.md"],
        }
        out = {}
        for name, urls in paths.items():
            samples = []
            for _rep in range(5):
                t0 = time.process_time()
                for i in range(args.n):
                    r = client.get(urls[i % len(urls)], headers=auth)
                    r.close()
                samples.append((time.process_time() - t0) / args.n * 1e6)
            out[name] = statistics.median(samples)
            print(f"{name:<12} {out[name]:8.1f} us CPU per request (median of 5 x {args.n})")
        print(json.dumps(out))


if __name__ == "__main__":
    main()
