"""Start the scaled-out topology on this machine: one PostgreSQL, one SeaweedFS (S3), N
gunicorn nodes on one database and bucket, and nginx (or Caddy) in front of them
(docs/scaling.md). Ctrl+C stops everything.

    .venv/bin/python -m deploy.cluster --nodes 2 [--proxy nginx|caddy|none]

Prints the proxy's URL (clients use that one: every node serves every request, and a node
that is down is skipped), each node's URL, the environment a node (or `flask --app wsgi
...`) needs, and an admin token. A missing proxy is installed with apt-get (deploy/proxy.py).
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

from deploy import proxy
from tools.services import Postgres, Seaweed, free_port, scratch_dir

REPO = Path(__file__).resolve().parents[1]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--nodes", type=int, default=2)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--proxy", choices=("nginx", "caddy", "none"), default="nginx")
    args = parser.parse_args()
    directory = scratch_dir("pm-cluster-")
    postgres = Postgres(directory / "pg").start()
    try:
        seaweed = Seaweed(directory / "s3").start()
    except BaseException:
        # Nothing else runs yet: what started is stopped before the error is told.
        postgres.stop()
        shutil.rmtree(directory, ignore_errors=True)
        raise
    env = {
        **os.environ,
        **seaweed.env(),
        "MEMORY_DATABASE_URL": postgres.database("project_memory"),
        "MEMORY_BLOB_URL": f"s3://{seaweed.bucket}/memory",
        "MEMORY_S3_ENDPOINT_URL": seaweed.endpoint,
        "MEMORY_FIRST_TOKEN": "off",
        "MEMORY_WORKERS": str(args.workers),
    }
    if args.proxy != "none":
        env["MEMORY_TRUSTED_PROXIES"] = "1"  # the client's address is the proxy's X-Forwarded-For
    nodes: list[subprocess.Popen[bytes]] = []
    upstreams: list[str] = []
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
            upstreams.append(f"127.0.0.1:{port}")
            print(f"node {i}: {url}  (log {directory / f'node-{i}.log'}, pid {nodes[-1].pid})")
        if args.proxy != "none":
            port = free_port()
            nodes.append(proxy.start(args.proxy, upstreams, port, directory / args.proxy))
            print(f"{args.proxy}: http://127.0.0.1:{port}  (in front of every node; use this one)")
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
        print("Ctrl+C stops the proxy, the nodes, SeaweedFS and PostgreSQL.")
        # Blocked only now, and delivered to sigwait, so that Ctrl+C (or a TERM) still runs
        # the clean-up: a child started with them blocked would inherit the mask and never
        # see the SIGTERM that stops it.
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM})
        signal.sigwait({signal.SIGINT, signal.SIGTERM})
    finally:
        for proc in nodes:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
        for proc in nodes:
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        seaweed.stop()
        postgres.stop()
        shutil.rmtree(directory, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
