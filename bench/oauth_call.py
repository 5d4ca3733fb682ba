"""What an OAuth access token costs at /mcp against a ``pm_`` token, side by side.

    python -m bench.oauth_call [--calls 300] [--reps 5]

One server (as `make bench` starts it); a writer token; an OAuth grant made by that token
through the real flow (registration, console sign-in, consent, code + PKCE exchange). Each
rep sends ``--calls`` ``tools/call`` (``read_digest``, a read that touches storage) one after
another with each credential, the two interleaved in alternating order, and reads the
workers' CPU from /proc around each batch. Prints wall time and server CPU per call and their
ratios (OAuth / pm_): the ratio is the figure, not the milliseconds.
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import re
import secrets
import statistics
import tempfile
import time
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

import requests

from . import servers

CALL = {
    "jsonrpc": "2.0",
    "id": 1,
    "method": "tools/call",
    "params": {"name": "read_digest", "arguments": {}},
}
REDIRECT = "http://127.0.0.1:9/cb"


def oauth_token(base: str, secret: str) -> str:
    """An access token for /mcp, by the flow a client runs (the consent approved here)."""
    http = requests.Session()
    client_id = http.post(
        f"{base}/oauth/register",
        json={"redirect_uris": [REDIRECT], "token_endpoint_auth_method": "none"},
        timeout=10,
    ).json()["client_id"]
    page = http.get(f"{base}/console/signin", timeout=10).text
    csrf = re.search(r'name="csrf" value="([^"]+)"', page)
    assert csrf
    http.post(f"{base}/console/signin", data={"token": secret, "csrf": csrf.group(1)}, timeout=10)
    verifier = secrets.token_urlsafe(48)
    challenge = (
        base64.urlsafe_b64encode(hashlib.sha256(verifier.encode()).digest()).rstrip(b"=").decode()
    )
    params = {
        "response_type": "code",
        "client_id": client_id,
        "redirect_uri": REDIRECT,
        "code_challenge": challenge,
        "code_challenge_method": "S256",
        "resource": f"{base}/mcp",
    }
    page = http.get(f"{base}/console/oauth/authorize", params=params, timeout=10)
    csrf = re.search(r'name="csrf" value="([^"]+)"', page.text)
    assert csrf, page.text[:300]
    answer = http.post(
        page.url,
        data={"csrf": csrf.group(1), "role": "writer", "decision": "approve"},
        allow_redirects=False,
        timeout=10,
    )
    code = parse_qs(urlsplit(answer.headers["Location"]).query)["code"][0]
    token = http.post(
        f"{base}/oauth/token",
        data={
            "grant_type": "authorization_code",
            "code": code,
            "redirect_uri": REDIRECT,
            "client_id": client_id,
            "code_verifier": verifier,
        },
        timeout=10,
    ).json()
    return str(token["access_token"])


def batch(server: servers.Server, token: str, calls: int) -> tuple[float, float]:
    """(wall seconds, server CPU seconds) of ``calls`` tools/call in a row."""
    http = requests.Session()
    http.headers.update({"Authorization": f"Bearer {token}", "Accept": "application/json"})
    url = f"{server.url}/mcp"
    assert http.post(url, json=CALL, timeout=10).json()["result"]["isError"] is False
    cpu, started = server.cpu_seconds(), time.perf_counter()
    for _ in range(calls):
        r = http.post(url, json=CALL, timeout=10)
        assert r.status_code == 200
    return time.perf_counter() - started, server.cpu_seconds() - cpu


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--calls", type=int, default=300)
    parser.add_argument("--reps", type=int, default=5)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="pm-oauth-") as tmp:
        server = servers.start_ours(Path(tmp) / "ours")
        try:
            secret = server.token("writer")
            access = oauth_token(server.url, secret)
            runs: dict[str, list[tuple[float, float]]] = {"pm_": [], "oauth": []}
            for rep in range(args.reps):
                order = [("pm_", secret), ("oauth", access)]
                for name, token in order if rep % 2 == 0 else order[::-1]:
                    runs[name].append(batch(server, token, args.calls))
        finally:
            server.stop()
    per = {
        name: (
            statistics.median(w for w, _ in found) / args.calls * 1000,
            statistics.median(c for _, c in found) / args.calls * 1000,
        )
        for name, found in runs.items()
    }
    for name, (wall, cpu) in per.items():
        print(f"{name:6} wall {wall:.3f} ms/call   server CPU {cpu:.3f} ms/call")

    def ratio(a: float, b: float) -> str:
        return f"{a / b:.2f}x" if b > 0 else "n/a (too few calls to measure)"

    print(
        f"oauth / pm_: wall {ratio(per['oauth'][0], per['pm_'][0])},"
        f" server CPU {ratio(per['oauth'][1], per['pm_'][1])}"
        f" ({args.reps} interleaved reps of {args.calls} calls, medians)"
    )


if __name__ == "__main__":
    main()
