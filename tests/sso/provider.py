"""A real OpenID Connect provider for the tests: node's ``oidc-provider`` (a certified
implementation), pinned in tests/sso/npm/package-lock.json, installed once with ``npm ci``
into ``.cache/oidc-provider/`` (``MEMORY_TEST_OIDC_CACHE`` elsewhere) and reused while the
lock file is unchanged. No node or npm, or a failed install, fails the test (never a skip:
``.ci/run`` installs node, and runs this module to install the provider first).

:class:`OidcProvider` runs tests/sso/provider.mjs on a free port of 127.0.0.1 with one
client; :meth:`OidcProvider.set_account` writes the accounts file it reads at each sign-in.
:func:`sign_in_over_http` walks a sign-in without a browser: the console's start, the
provider's login form, its redirect back, as a browser would.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urljoin, urlsplit

import pytest
import requests
from filelock import FileLock

from tests.agents.harness import free_port, npm_ci

REPO = Path(__file__).resolve().parents[2]
PINS = Path(__file__).resolve().parent / "npm"
SCRIPT = Path(__file__).resolve().parent / "provider.mjs"
CLIENT_ID = "project-memory-console"
CLIENT_SECRET = "a-client-secret-long-enough-for-hs256-0123456789"  # noqa: S105 - a test's


def cache() -> Path:
    return Path(os.environ.get("MEMORY_TEST_OIDC_CACHE") or REPO / ".cache" / "oidc-provider")


def installed() -> Path:
    """The directory oidc-provider is installed in (on first use)."""
    root = cache()
    npm_ci(PINS, root, "oidc-provider (.ci/run installs node and npm)", pytest.fail)
    # An ES module finds its imports beside itself (NODE_PATH is CommonJS only).
    with FileLock(str(root / ".install.lock"), timeout=600):
        if (
            not (root / SCRIPT.name).exists()
            or (root / SCRIPT.name).read_bytes() != SCRIPT.read_bytes()
        ):
            shutil.copyfile(SCRIPT, root / SCRIPT.name)
    return root


class OidcProvider:
    """oidc-provider on 127.0.0.1, with one confidential client for ``redirect_uris``."""

    def __init__(
        self,
        directory: Path,
        redirect_uris: list[str],
        *,
        id_token_ttl: int = 3600,
        port: int | None = None,
    ) -> None:
        self.directory = directory
        self.port = port or free_port()
        self.issuer = f"http://127.0.0.1:{self.port}"
        self.accounts_file = directory / "accounts.json"
        self.accounts: dict[str, dict[str, Any]] = {}
        self.set_account("ana", email="ana@example.com", name="Ana", groups=["eng"])
        config = {
            "port": self.port,
            "accounts": str(self.accounts_file),
            "idTokenTtl": id_token_ttl,
            "clients": [
                {
                    "client_id": CLIENT_ID,
                    "client_secret": CLIENT_SECRET,
                    "redirect_uris": redirect_uris,
                    "grant_types": ["authorization_code"],
                    "response_types": ["code"],
                    "token_endpoint_auth_method": "client_secret_basic",
                }
            ],
        }
        (directory / "provider.json").write_text(json.dumps(config))
        (directory / "secret").write_text(CLIENT_SECRET)
        root = installed()
        self.log = (directory / "provider.log").open("w")
        self.process = subprocess.Popen(  # noqa: S603 - our script, our node
            [str(shutil.which("node")), str(root / SCRIPT.name), str(directory / "provider.json")],
            cwd=root,
            stdout=subprocess.PIPE,
            stderr=self.log,
            text=True,
        )
        assert self.process.stdout is not None
        line = self.process.stdout.readline()
        if not line.startswith("ready"):
            self.stop()
            raise RuntimeError(
                f"oidc-provider did not start: {line}{(directory / 'provider.log').read_text()}"
            )
        self.secret_file = directory / "secret"

    def set_account(self, login: str, **claims: Any) -> None:
        self.accounts[login] = {"email_verified": True, **claims}
        tmp = self.accounts_file.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.accounts))
        os.replace(tmp, self.accounts_file)

    def settings(self, **extra: Any) -> dict[str, Any]:
        """The app's settings for this provider."""
        return {
            "OIDC_ISSUER": self.issuer,
            "OIDC_CLIENT_ID": CLIENT_ID,
            "OIDC_CLIENT_SECRET_FILE": str(self.secret_file),
            "OIDC_SCOPES": "openid email profile groups",
            **extra,
        }

    def stop(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(timeout=10)
        if self.process.stdout is not None:
            self.process.stdout.close()
        self.log.close()


def provider_login(session: requests.Session, url: str, login: str) -> str:
    """Follow ``url`` (an authorization request) through the provider's login form as
    ``login``; return the URL it sends the browser back to (our callback, with the answer)."""
    location = url
    for _ in range(10):
        answer = session.get(location, allow_redirects=False, timeout=10)
        if answer.status_code in (302, 303):
            location = urljoin(location, answer.headers["Location"])
            if not location.startswith(url.split("/auth")[0]):
                return location  # left the provider: the redirect back to us
            continue
        if answer.status_code == 200 and 'name="login"' in answer.text:
            posted = session.post(
                location, data={"login": login}, allow_redirects=False, timeout=10
            )
            assert posted.status_code in (302, 303), posted.text[:500]
            location = urljoin(location, posted.headers["Location"])
            continue
        raise AssertionError(f"{answer.status_code} at {location}: {answer.text[:500]}")
    raise AssertionError("too many redirects at the provider")


def query_of(url: str) -> dict[str, str]:
    return {k: v[0] for k, v in parse_qs(urlsplit(url).query).items()}


def wait_closed(port: int, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            requests.get(f"http://127.0.0.1:{port}/", timeout=0.5)
        except requests.RequestException:
            return
        time.sleep(0.05)


if __name__ == "__main__":  # .ci/run: install oidc-provider before the tests need it
    print(f"oidc-provider: {installed()}")
