"""Start the scaled-out topology on this machine: one PostgreSQL, one SeaweedFS (S3) and N
gunicorn nodes on one database and bucket (docs/scaling.md). Ctrl+C stops everything.

    .venv/bin/python -m deploy.cluster --nodes 2

Prints each node's URL, the environment a node (or `flask --app wsgi ...`) needs, and an
admin token. Put a proxy in front to spread clients over the nodes (docs/scaling.md has an
nginx and a Caddy block); every node serves every request.
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import requests

from tools.services import Postgres, Seaweed, free_port, scratch_dir

REPO = Path(__file__).resolve().parents[1]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--nodes", type=int, default=2)
    parser.add_argument("--workers", type=int, default=2)
    args = parser.parse_args()
    # Delivered to sigwait below, so that Ctrl+C (or a TERM) still runs the clean-up.
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM})
    directory = scratch_dir("pm-cluster-")
    postgres = Postgres(directory / "pg").start()
    seaweed = Seaweed(directory / "s3").start()
    env = {
        **os.environ,
        **seaweed.env(),
        "MEMORY_DATABASE_URL": postgres.database("project_memory"),
        "MEMORY_BLOB_URL": f"s3://{seaweed.bucket}/memory",
        "MEMORY_S3_ENDPOINT_URL": seaweed.endpoint,
        "MEMORY_FIRST_TOKEN": "off",
        "MEMORY_WORKERS": str(args.workers),
    }
    nodes: list[subprocess.Popen[bytes]] = []
    bin_dir = Path(sys.executable).parent
    try:
        for i in range(args.nodes):
            port = free_port()
            node_env = {
                **env,
                "MEMORY_BIND": f"127.0.0.1:{port}",
                # Unused by this backend, but each node keeps its own control socket there.
                "MEMORY_STORAGE_ROOT": str(directory / f"node-{i}"),
                "MEMORY_TOKENS_FILE": str(directory / f"node-{i}.tokens.json"),
            }
            log = open(directory / f"node-{i}.log", "wb")  # noqa: SIM115 - lives with the node
            nodes.append(
                subprocess.Popen(
                    [str(bin_dir / "gunicorn"), "-c", "gunicorn.conf.py", "wsgi:app"],
                    cwd=REPO,
                    env=node_env,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                )
            )
            url = f"http://127.0.0.1:{port}"
            for _ in range(300):
                try:
                    if requests.get(f"{url}/readyz", timeout=1).status_code == 200:
                        break
                except requests.ConnectionError:
                    pass
                time.sleep(0.1)
            print(f"node {i}: {url}  (log {directory / f'node-{i}.log'})")
        token = subprocess.run(
            [str(bin_dir / "flask"), "--app", "wsgi", "tokens", "create", "--role", "admin"]
            + ["--tenant", "default", "--project", "default", "--name", "cluster"],
            cwd=REPO,
            env=env,
            capture_output=True,
            text=True,
            check=True,
        ).stdout.split()[-1]
        print("environment of every node:")
        for name in ("MEMORY_DATABASE_URL", "MEMORY_BLOB_URL", "MEMORY_S3_ENDPOINT_URL"):
            print(f"  {name}={env[name]}")
        print(f"admin token: {token}")
        print("Ctrl+C stops the nodes, SeaweedFS and PostgreSQL.")
        signal.sigwait({signal.SIGINT, signal.SIGTERM})
    finally:
        for proc in nodes:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
        for proc in nodes:
            proc.wait(timeout=30)
        seaweed.stop()
        postgres.stop()
        shutil.rmtree(directory, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
