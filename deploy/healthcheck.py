#!/usr/bin/env python3
"""Health check for containers: GET /readyz on the address MEMORY_BIND names; exit 0 if ready.

/readyz answers 200 once the storage root takes a durable write and the lock tree a lock.
Standard library only, so it runs in any image that runs the server. TCP binds only.
"""

from __future__ import annotations

import os
import sys
import urllib.error
import urllib.request


def readyz_url(bind: str) -> str:
    host, _, port = bind.rpartition(":")
    host = host.strip("[]")
    if host in ("", "0.0.0.0"):  # noqa: S104 - every interface includes the loopback one
        host = "127.0.0.1"
    elif host == "::":
        host = "::1"
    if ":" in host:
        host = f"[{host}]"
    return f"http://{host}:{port}/readyz"


def main() -> int:
    bind = os.environ.get("MEMORY_BIND", "127.0.0.1:8000")
    if bind.startswith("unix:"):
        print(f"healthcheck: MEMORY_BIND={bind} is a unix socket; this check speaks TCP")
        return 1
    url = readyz_url(bind)
    try:
        with urllib.request.urlopen(url, timeout=4) as response:  # noqa: S310 - http only
            status = response.status
    except urllib.error.HTTPError as exc:
        status = exc.code
    except OSError as exc:
        print(f"healthcheck: {url}: {exc}")
        return 1
    print(f"healthcheck: {url}: {status}")
    return 0 if status == 200 else 1


if __name__ == "__main__":
    sys.exit(main())
