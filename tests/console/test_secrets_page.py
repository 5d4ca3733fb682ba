"""The console's secrets page: a project_admin sets the policy, scans what is stored and
purges it, each behind the console's POST guard; no page ever shows a secret's value."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from flask.testing import FlaskClient

from tests.conftest import Tokens
from tests.secrets_corpus import corpus

from .conftest import Browser, text

pytestmark = pytest.mark.all_backends

WEB = "/console/p/acme/web"
PM = "/sandbox/memory/v1"


def test_a_project_admin_sets_the_policy_scans_and_purges(
    client: FlaskClient, tokens: Tokens, console: Callable[[str], Browser]
) -> None:
    secret = next(p for p in corpus(seed=9, per_kind=1) if p.kind == "openai-key")
    admin = tokens.headers("project_admin")
    h = tokens.headers("writer")
    assert (
        client.put(f"{PM}/secrets/policy", json={"policy": "allow"}, headers=admin).status_code
        == 200
    )
    r = client.put(f"{PM}/tasks/t/turns/0", json={"summary_md": f"key {secret.text}"}, headers=h)
    assert r.status_code == 200 and secret.value in r.get_json()["summary_md"]

    # Writers see no link and get a 403; a project_admin gets the page.
    writer = console("writer")
    assert "/secrets" not in text(writer.get(f"{WEB}/tasks"))
    assert writer.get(f"{WEB}/secrets").status_code == 403
    assert writer.post(f"{WEB}/secrets/scan").status_code == 403
    browser = console("project_admin")
    page = text(browser.get(f"{WEB}/secrets"))
    assert 'class="policy">allow<' in page
    # A POST without the console's guard is refused before it does anything.
    assert client.post(f"{WEB}/secrets/purge", headers=admin).status_code == 303  # sign in
    unguarded = browser.client.post(f"{WEB}/secrets/purge", data={})
    assert unguarded.status_code in (400, 403)
    assert secret.value in client.get(f"{PM}/tasks/t/turns/0", headers=h).get_data(as_text=True)

    scanned = browser.post(f"{WEB}/secrets/scan")
    assert scanned.status_code == 200
    page = text(scanned)
    assert "task t turn 0 summary_md" in page and "openai-key" in page
    assert secret.value not in page
    purged = browser.post(f"{WEB}/secrets/purge")
    assert purged.status_code == 200 and secret.value not in text(purged)
    summary = client.get(f"{PM}/tasks/t/turns/0", headers=h).get_json()["summary_md"]
    assert summary == "key [secret:openai-key]" or (
        secret.value not in summary and "[secret:openai-key]" in summary
    )

    assert browser.post(f"{WEB}/secrets/policy", {"policy": "reject"}).status_code == 303
    assert client.get(f"{PM}/secrets/policy", headers=h).get_json()["policy"] == "reject"
    assert browser.post(f"{WEB}/secrets/policy", {"policy": "nope"}).status_code == 422
