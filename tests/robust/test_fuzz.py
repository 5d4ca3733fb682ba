"""Fuzzing from the OpenAPI document with schemathesis: no 5xx, nothing that contradicts it.

In process (WSGI) in ``make test``, with a few examples per operation; against a real
gunicorn, with more, in ``make soak``. Checks: not_a_server_error,
status_code_conformance, response_schema_conformance, negative_data_rejection,
ignored_auth, missing_required_header and use_after_free (inert: the document has no links,
so use-after-free is also checked by hand below).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from schemathesis.checks import (
    ignored_auth,
    missing_required_header,
    negative_data_rejection,
    not_a_server_error,
    response_schema_conformance,
    status_code_conformance,
    use_after_free,
)

from app import create_app
from tests.conftest import BufferedClient
from tests.robust.helpers import BASE, start

CHECKS = [
    not_a_server_error,
    status_code_conformance,
    response_schema_conformance,
    negative_data_rejection,
    use_after_free,
    ignored_auth,
    missing_required_header,
]


def _fuzz(loaded, secret: str, max_examples: int) -> list[str]:  # noqa: ANN001
    """Run every operation of ``loaded`` with hypothesis; return the failures, by operation."""
    failures = []
    operations = 0
    for result in loaded.get_all_operations():
        operation = result.ok()
        operations += 1

        @settings(
            max_examples=max_examples,
            deadline=None,
            suppress_health_check=list(HealthCheck),
            database=None,
        )
        @given(operation.as_strategy())
        def run(case) -> None:  # noqa: ANN001
            case.call_and_validate(headers={"Authorization": f"Bearer {secret}"}, checks=CHECKS)

        try:
            run()
        except (Exception, BaseExceptionGroup) as exc:  # noqa: BLE001 - collect them all
            failures.append(f"{operation.label}: {str(exc)[:2000]}")
    assert operations >= 8
    return failures


def _seed(client, secret: str) -> None:  # noqa: ANN001
    h = {"Authorization": f"Bearer {secret}"}
    client.put(f"{BASE}/tasks/t/turns/0", json={"summary_md": "seed"}, headers=h)
    client.put(f"{BASE}/tasks/t/turns/0/artifacts/a.bin", data=b"seed", headers=h)


# schemathesis' WSGI transport does not close streamed (file) responses.
@pytest.mark.filterwarnings("ignore::ResourceWarning")
@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
def test_in_process(tmp_path: Path) -> None:
    app = create_app(
        {
            "TESTING": True,
            "STORAGE_ROOT": str(tmp_path / "root"),
            "TOKENS_FILE": str(tmp_path / "tokens.json"),
        }
    )
    _, secret = app.extensions["token_registry"].create(
        role="project_admin", tenant="acme", project="web"
    )
    _seed(app.test_client(), secret)
    loaded = schemathesis.openapi.from_wsgi(f"{BASE}/openapi.yaml", app)
    failures = _fuzz(loaded, secret, max_examples=6)
    assert failures == [], "\n\n".join(failures)


@pytest.mark.soak
@pytest.mark.e2e
def test_against_real_gunicorn(tmp_path: Path) -> None:
    server = start(tmp_path, workers=2, threads=4)
    try:
        secret = server.token("project_admin")
        import requests

        with requests.Session() as s:
            h = {"Authorization": f"Bearer {secret}"}
            s.put(f"{server.url}{BASE}/tasks/t/turns/0", json={"summary_md": "seed"}, headers=h)
        loaded = schemathesis.openapi.from_url(f"{server.url}{BASE}/openapi.yaml")
        failures = _fuzz(loaded, secret, max_examples=60)
        assert failures == [], "\n\n".join(failures)
    finally:
        server.stop()


def test_use_after_free_by_hand(tmp_path: Path) -> None:
    """The document has no OpenAPI links, so schemathesis' use_after_free has nothing to follow:
    check by hand that nothing deleted is served again."""
    app = create_app(
        {
            "TESTING": True,
            "STORAGE_ROOT": str(tmp_path / "root"),
            "TOKENS_FILE": str(tmp_path / "tokens.json"),
        }
    )
    _, secret = app.extensions["token_registry"].create(
        role="project_admin", tenant="acme", project="web"
    )
    h = {"Authorization": f"Bearer {secret}"}
    app.test_client_class = BufferedClient  # closes streamed (file) responses
    with app.test_client() as c:
        _seed(c, secret)
        assert c.delete(f"{BASE}/tasks/t", headers=h).status_code == 204
        for url in (
            f"{BASE}/tasks/t",
            f"{BASE}/tasks/t/turns/0",
            f"{BASE}/tasks/t/turns/0/artifacts/a.bin",
        ):
            assert c.get(url, headers=h).status_code == 404, url
        assert c.delete(f"{BASE}/tasks/t", headers=h).status_code == 404
        assert c.get(f"{BASE}/tasks", headers=h).get_json()["tasks"] == []
        assert b"## t\n" not in c.get(f"{BASE}/project.md", headers=h).data
        store = c.post("/v1/memory_stores", json={"name": "s"}, headers=h).get_json()["id"]
        base = f"/v1/memory_stores/{store}"
        mem = c.post(
            f"{base}/memories", json={"path": "/a.md", "content": "x"}, headers=h
        ).get_json()["id"]
        assert c.delete(f"{base}/memories/{mem}", headers=h).status_code == 200
        assert c.get(f"{base}/memories/{mem}", headers=h).status_code == 404
        assert c.post(f"{base}/memories/{mem}", json={"content": "y"}, headers=h).status_code == 404
        assert c.delete(base, headers=h).status_code == 200
        assert c.get(base, headers=h).status_code == 404
        assert c.get(f"{base}/memories", headers=h).status_code == 404
