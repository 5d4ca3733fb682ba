"""Single sign-on in Chromium against a real gunicorn and a real oidc-provider: a person signs
in at the provider's form, lands in the console with the role the rules map their group to,
mints a token under "Your tokens", and uses it with the project-memory CLI."""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.e2e.conftest import Server, serving
from tests.e2e.test_console_browser import CHROMIUM, _browser_or_fail
from tests.sso.provider import CLIENT_ID, CLIENT_SECRET, OidcProvider, free_port

CLI = Path(os.environ.get("VIRTUAL_ENV", ".venv")) / "bin" / "project-memory"
RULES = [{"claim": "groups", "equals": "eng", "role": "writer", "tenant": "acme", "project": "*"}]


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Server, OidcProvider]]:
    _browser_or_fail()
    where = tmp_path_factory.mktemp("sso-browser")
    port = free_port()
    secret = where / "client-secret"
    secret.write_text(CLIENT_SECRET)
    env = {
        "MEMORY_OIDC_ISSUER": f"http://127.0.0.1:{port}",
        "MEMORY_OIDC_CLIENT_ID": CLIENT_ID,
        "MEMORY_OIDC_CLIENT_SECRET_FILE": str(secret),
        "MEMORY_OIDC_SCOPES": "openid email profile groups",
        "MEMORY_OIDC_NAME": "Test IdP",
        "MEMORY_ROLE_RULES": json.dumps(RULES),
    }
    servers = serving(tmp_path_factory, "sso-server", workers=1, threads=4, env_extra=env)
    server = next(servers)
    idp = OidcProvider(where, [f"{server.url}/console/oidc/callback"], port=port)
    try:
        yield server, idp
    finally:
        idp.stop()
        next(servers, None)


def test_sign_in_in_chromium_gets_the_mapped_role_and_a_minted_token_works_with_the_cli(
    site: tuple[Server, OidcProvider],
) -> None:
    server, idp = site
    with _browser_or_fail()() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM)
        page = browser.new_page()
        page.goto(f"{server.url}/console/signin")
        page.click("#sso")
        page.fill("#login", "ana")
        page.click("#go")
        page.wait_for_url(f"{server.url}/console/**")
        page.goto(f"{server.url}/console/p/acme/web/tasks")
        assert "Ana via console" in page.content() and "writer" in page.content()
        page.click("text=Your tokens")
        page.fill("#name", "laptop")
        page.select_option("#role", "writer")
        page.fill("#expires_in_days", "7")
        page.click("text=Mint a token")
        secret = page.input_value("label.secret input")
        assert secret.startswith("pm_")
        browser.close()
    env = {
        **os.environ,
        "PROJECT_MEMORY_URL": server.url,
        "PROJECT_MEMORY_TOKEN": secret,
        "PROJECT_MEMORY_PROJECT": "web",
    }
    done = subprocess.run(
        [str(CLI), "--json", "whoami"], capture_output=True, text=True, env=env, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["data"]["role"] == "writer"
    done = subprocess.run(
        [str(CLI), "tasks"], capture_output=True, text=True, env=env, timeout=60, check=False
    )
    assert done.returncode == 0, done.stderr
