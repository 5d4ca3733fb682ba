"""A reverse proxy in front of the nodes of one deployment (docs/scaling.md, "A topology"):
nginx or Caddy, configured as that page shows, listening on one port of 127.0.0.1 and
spreading requests over the nodes; a node that refuses connections is skipped.

Used by deploy/cluster.py (``--proxy nginx`` or ``--proxy caddy``). A missing proxy is
installed with apt-get (as root), or named in the error.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from pathlib import Path

import requests

PACKAGES = {"nginx": "nginx", "caddy": "caddy"}


def nginx_config(upstreams: list[str], port: int, directory: Path) -> str:
    """nginx.conf for a proxy on 127.0.0.1:``port`` with its files under ``directory``."""
    servers = "".join(f"        server {u} max_fails=1 fail_timeout=10s;\n" for u in upstreams)
    temp = "".join(
        f"    {kind}_temp_path {directory / ('nginx-' + kind)};\n"
        for kind in ("client_body", "proxy", "fastcgi", "uwsgi", "scgi")
    )
    return f"""# Written by deploy/proxy.py: docs/scaling.md's nginx block, on one machine.
worker_processes 1;
daemon off;
pid {directory / "nginx.pid"};
error_log {directory / "nginx-error.log"};
events {{ worker_connections 1024; }}
http {{
    log_format upstream '$remote_addr "$request" $status upstream=$upstream_addr';
    access_log {directory / "nginx-access.log"} upstream;
{temp}    upstream project_memory {{
{servers}        keepalive 16;
    }}
    server {{
        listen 127.0.0.1:{port};
        client_max_body_size 51m;          # 50 MiB artifacts, and a little JSON
        proxy_request_buffering off;       # stream uploads to the node
        proxy_buffering off;               # and downloads to the client
        location / {{
            proxy_pass http://project_memory;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
            proxy_set_header Host $http_host;
            proxy_set_header X-Forwarded-For $proxy_add_x_forwarded_for;
            proxy_set_header X-Forwarded-Proto $scheme;
            # A node that refuses the connection (stopped, killed) is skipped: the request
            # never reached it, so even a PUT goes to the next one.
            proxy_next_upstream error timeout;
        }}
    }}
}}
"""


def caddy_config(upstreams: list[str], port: int) -> str:
    """A Caddyfile for a proxy on 127.0.0.1:``port`` (plain HTTP: no certificate here)."""
    return f"""# Written by deploy/proxy.py: docs/scaling.md's Caddy line, on one machine.
{{
    admin off
    auto_https off
}}
http://127.0.0.1:{port} {{
    request_body {{
        max_size 51MiB
    }}
    reverse_proxy {" ".join(upstreams)} {{
        lb_policy round_robin
        lb_try_duration 5s
        fail_duration 10s
    }}
}}
"""


def ensure_installed(kind: str) -> str:
    """The proxy's binary; installed with apt-get when missing (as root only)."""
    found = shutil.which(kind) or shutil.which(kind, path="/usr/sbin:/usr/bin")
    if found:
        return found
    if os.geteuid() != 0:
        raise SystemExit(f"{kind} is not installed: apt-get install {PACKAGES[kind]}")
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    subprocess.run(["apt-get", "update", "-q"], check=True, env=env)
    subprocess.run(["apt-get", "install", "-y", "-q", PACKAGES[kind]], check=True, env=env)
    found = shutil.which(kind) or shutil.which(kind, path="/usr/sbin:/usr/bin")
    if not found:
        raise SystemExit(f"apt-get installed {PACKAGES[kind]}, but no {kind} binary is on PATH")
    return found


def start(kind: str, upstreams: list[str], port: int, directory: Path) -> subprocess.Popen[bytes]:
    """Start the proxy in the foreground of a process group of its own; wait until it answers
    /healthz through a node."""
    binary = ensure_installed(kind)
    directory.mkdir(parents=True, exist_ok=True)
    if kind == "nginx":
        config = directory / "nginx.conf"
        config.write_text(nginx_config(upstreams, port, directory))
        args = [binary, "-p", str(directory), "-c", str(config)]
    else:
        config = directory / "Caddyfile"
        config.write_text(caddy_config(upstreams, port))
        args = [binary, "run", "--config", str(config), "--adapter", "caddyfile"]
    log = open(directory / f"{kind}.log", "wb")  # noqa: SIM115 - lives with the process
    proc = subprocess.Popen(
        args, cwd=directory, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
    )
    log.close()
    url = f"http://127.0.0.1:{port}"
    for _ in range(100):
        if proc.poll() is not None:
            text = (directory / f"{kind}.log").read_text(errors="replace")
            raise RuntimeError(f"{kind} exited: {text[-2000:]}")
        try:
            if requests.get(f"{url}/healthz", timeout=2).status_code == 200:
                return proc
        except requests.ConnectionError:
            pass
        time.sleep(0.1)
    proc.kill()
    raise RuntimeError(f"{kind} did not answer on {url}")
