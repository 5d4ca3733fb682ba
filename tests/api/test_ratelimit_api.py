"""Rate limits through the Flask app: 429 in each API's shape, the RateLimit fields, what is
never limited, and a Content-Length over budget refused before the body is read."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from flask import Flask
from flask.testing import FlaskClient

from app import create_app
from app.storage.core.limits import RateOverride
from app.storage.core.users import User, user_id
from app.storage.tree.tokens import TokenRegistry
from app.web.ratelimit import Limiter
from tests.conftest import FixedClock
from tests.web.test_ratelimit import Clock

API = "/sandbox/memory/v1"
STORES = "/v1/memory_stores"


def make_app(tmp_path: Path, clock: FixedClock, **settings: Any) -> Flask:
    app = create_app(
        {
            "TESTING": True,
            "STORAGE_ROOT": str(tmp_path / "root"),
            "TOKENS_FILE": str(tmp_path / "tokens.json"),
            "CLOCK": clock,
            "LOCK_TIMEOUT": 5.0,
            **settings,
        }
    )
    return app


class Client:
    """A test client with a token per name and the limiter's clock in hand."""

    def __init__(self, app: Flask) -> None:
        self.app = app
        self.http = app.test_client()
        self.registry: TokenRegistry = app.extensions["token_registry"]
        self.limiter: Limiter = app.extensions["rate_limiter"]
        self.clock = Clock()
        self.limiter.clock = self.clock
        self.secrets: dict[str, str] = {}

    def token(self, name: str, role: str = "writer", project: str | None = "web") -> None:
        _, self.secrets[name] = self.registry.create(role=role, tenant="acme", project=project)

    def h(self, name: str, **extra: str) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.secrets[name]}", **extra}

    def get(self, path: str, name: str = "w", **extra: str) -> Any:
        return self.http.get(path, headers=self.h(name, **extra))


@pytest.fixture
def limited(tmp_path: Path, clock: FixedClock) -> Iterator[Client]:
    """Two requests at once, then one per 0.25 s; 1 KiB of bodies at once, then 1 KiB/s."""
    c = Client(
        make_app(
            tmp_path,
            clock,
            RATE_LIMIT_RPS=4,
            RATE_LIMIT_BURST=2,
            RATE_LIMIT_UPLOAD_BPS="1KiB",
        )
    )
    c.token("w")
    yield c


def spend(c: Client, path: str = f"{API}/tasks", name: str = "w") -> Any:
    """Make requests until one is refused; return the refusal."""
    for _ in range(10):
        r = c.get(path, name)
        if r.status_code == 429:
            return r
    raise AssertionError("never refused")


def test_project_memory_429_is_detail_with_retry_after_and_ratelimit_fields(
    limited: Client,
) -> None:
    first = limited.get(f"{API}/tasks")
    assert first.status_code == 200
    assert first.headers["RateLimit"] == '"project";r=1;t=1, "token";r=1;t=1'
    assert first.headers["RateLimit-Policy"] == (
        '"project";q=2;w=1, "token";q=2;w=1, '
        '"project-upload";q=1024;w=1;qu="content-bytes", '
        '"token-upload";q=1024;w=1;qu="content-bytes"'
    )
    assert limited.get(f"{API}/project.md").status_code == 200
    r = limited.get(f"{API}/tasks/nope")
    assert r.status_code == 429
    assert r.headers["Retry-After"] == "1"
    assert r.headers["RateLimit"] == '"project";r=0;t=1, "token";r=0;t=1'
    assert r.headers["RateLimit-Policy"] == first.headers["RateLimit-Policy"]
    assert r.json == {
        "detail": "rate limit exceeded for project acme/web: 4 requests/s, burst 2; retry in 1 s"
    }
    limited.clock.advance(0.25)
    assert limited.get(f"{API}/tasks").status_code == 200


def test_memory_stores_429_is_the_error_envelope(limited: Client) -> None:
    r = spend(limited, STORES)
    assert r.json["type"] == "error"
    assert r.json["error"]["type"] == "rate_limit_error"
    assert "rate limit exceeded for project acme/web" in r.json["error"]["message"]
    assert r.json["request_id"].startswith("req_")
    assert r.headers["Retry-After"] == "1"
    assert r.headers["RateLimit"].startswith('"project";r=0;t=1')
    assert "RateLimit-Policy" in r.headers


def test_memory_tool_429_is_the_error_envelope(limited: Client) -> None:
    created = limited.http.post(STORES, json={"name": "notes"}, headers=limited.h("w"))
    assert created.status_code == 200, created.json
    path = f"{STORES}/{created.json['id']}/memory_tool"
    body = {"command": "view", "path": "/memories"}
    statuses = [
        limited.http.post(path, json=body, headers=limited.h("w")).status_code for _ in range(3)
    ]
    assert statuses == [200, 429, 429]
    r = limited.http.post(path, json=body, headers=limited.h("w"))
    assert r.json["error"]["type"] == "rate_limit_error" and r.headers["Retry-After"] == "1"


def test_health_openapi_and_metrics_are_never_limited(tmp_path: Path, clock: FixedClock) -> None:
    c = Client(
        make_app(
            tmp_path,
            clock,
            RATE_LIMIT_RPS=0.01,
            RATE_LIMIT_BURST=1,
            RATE_LIMIT_EXEMPT_ADMIN=False,
            METRICS="token",
        )
    )
    c.token("admin", role="admin")
    assert c.get(f"{API}/tasks", "admin").status_code == 200
    assert c.get(f"{API}/tasks", "admin").status_code == 429  # admins are limited here
    for path in ("/healthz", "/readyz", f"{API}/openapi.yaml", "/metrics"):
        for _ in range(5):
            r = c.get(path, "admin")
            assert r.status_code == 200, path
            assert "RateLimit" not in r.headers


def test_admin_tokens_are_exempt_by_default(tmp_path: Path, clock: FixedClock) -> None:
    c = Client(make_app(tmp_path, clock, RATE_LIMIT_RPS=0.01, RATE_LIMIT_BURST=1))
    c.token("admin", role="admin")
    c.token("tenant_admin", role="tenant_admin", project=None)
    headers = {"X-Sandbox-Project-Id": "web"}
    assert all(c.get(f"{API}/tasks", "admin", **headers).status_code == 200 for _ in range(5))
    assert "RateLimit" not in c.get(f"{API}/tasks", "admin").headers
    assert c.get(f"{API}/tasks", "tenant_admin", **headers).status_code == 200
    assert c.get(f"{API}/tasks", "tenant_admin", **headers).status_code == 429


def test_refused_credentials_are_answered_before_the_limit_and_cost_nothing(
    limited: Client,
) -> None:
    for _ in range(10):
        assert limited.http.get(f"{API}/tasks").status_code == 401
        bad = {"Authorization": "Bearer pm_nope"}
        assert limited.http.get(f"{API}/tasks", headers=bad).status_code == 401
        assert limited.get(f"{API}/tasks", **{"X-Sandbox-Project-Id": "other"}).status_code == 403
    assert [limited.get(f"{API}/tasks").status_code for _ in range(3)] == [200, 200, 429]


def test_the_fields_come_once_a_budget_is_half_spent(tmp_path: Path, clock: FixedClock) -> None:
    c = Client(make_app(tmp_path, clock, RATE_LIMIT_RPS=1, RATE_LIMIT_BURST=4))
    c.token("w")
    fields = [c.get(f"{API}/tasks").headers.get("RateLimit") for _ in range(5)]
    assert fields == [
        None,
        '"project";r=2;t=2, "token";r=2;t=2',
        '"project";r=1;t=3, "token";r=1;t=3',
        '"project";r=0;t=4, "token";r=0;t=4',
        '"project";r=0;t=1, "token";r=0;t=1',  # the 429
    ]


def test_no_limits_no_fields(client: FlaskClient, tokens: Any) -> None:
    r = client.get(f"{API}/tasks", headers=tokens.headers("writer"))
    assert r.status_code == 200
    assert "RateLimit" not in r.headers and "RateLimit-Policy" not in r.headers


class Unreadable:
    """A request body that must not be read."""

    def __init__(self) -> None:
        self.reads = 0

    def read(self, *args: object) -> bytes:
        self.reads += 1
        raise AssertionError("the body was read")

    readline = read


def test_an_upload_over_budget_is_refused_before_its_body_is_read(limited: Client) -> None:
    artifact = f"{API}/tasks/t1/turns/0/artifacts/log.txt"
    turn = {"meta": {}, "summary_md": "x"}
    assert limited.http.put(
        f"{API}/tasks/t1/turns/0", json=turn, headers=limited.h("w")
    ).status_code in (200, 201)
    r = limited.http.put(artifact, data=b"a" * 900, headers=limited.h("w"))
    assert r.status_code in (200, 201), r.json
    # A request is free again; of the upload budget, 1024 - ~940 + 256 bytes.
    limited.clock.advance(0.25)
    body = Unreadable()
    r = limited.http.put(
        artifact,
        headers=limited.h("w"),
        environ_overrides={"wsgi.input": body, "CONTENT_LENGTH": "1000"},
    )
    assert r.status_code == 429 and body.reads == 0
    assert r.headers["RateLimit"].startswith('"project-upload";r=0;t=')
    assert "request bodies" in r.json["detail"]
    # The project's upload budget is spent for every token of it.
    limited.token("w2")
    body = Unreadable()
    r = limited.http.put(
        artifact,
        headers=limited.h("w2"),
        environ_overrides={"wsgi.input": body, "CONTENT_LENGTH": "1000"},
    )
    assert r.status_code == 429 and body.reads == 0
    # Reads are not uploads.
    assert limited.get(f"{API}/tasks/t1").status_code == 200


def test_an_override_through_the_file_applies_within_a_second(limited: Client) -> None:
    assert limited.get(f"{API}/tasks").status_code == 200
    limited.limiter.file.set_rate("acme", "web", RateOverride(rps=4, burst=5))
    assert [limited.get(f"{API}/tasks").status_code for _ in range(2)] == [200, 429]
    limited.clock.advance(1.0)
    statuses = [limited.get(f"{API}/tasks").status_code for _ in range(6)]
    assert statuses == [200] * 5 + [429]
    assert '"project";q=5;w=1' in limited.get(f"{API}/tasks").headers["RateLimit-Policy"]


@pytest.mark.all_backends
def test_a_bad_entry_in_the_stored_limits_never_fails_another_projects_requests(
    app: Flask, client: FlaskClient, tokens: Any
) -> None:
    """One entry no change could have written (the stored document edited by hand): its own
    project falls back to the settings, and every other request is answered as before."""
    limits = app.extensions["storage"].limits()
    with limits._held() as (_, write):  # noqa: SLF001 - the store's own primitive
        write(
            b'{"version": 1, "tenants": {}, "projects": {"acme/web": {"rate": {"rps": 1e-320}},'
            b' "globex/web": {"rate": {"rps": 1, "burst": 1}}}}'
        )
    limiter: Limiter = app.extensions["rate_limiter"]
    limiter.check_every = 0  # every request looks at the document
    for who in ("writer", "other_project", "writer", "other_project"):
        r = client.get(f"{API}/tasks", headers=tokens.headers(who))
        assert r.status_code == 200, (who, r.get_data(as_text=True))
    outsider = tokens.headers("other_tenant")
    assert [client.get(f"{API}/tasks", headers=outsider).status_code for _ in range(2)] == [
        200,
        429,
    ]
    # A later change applies, everywhere.
    limits.set_rate("acme", "mobile", RateOverride(rps=1, burst=1))
    mobile = tokens.headers("other_project")
    assert [client.get(f"{API}/tasks", headers=mobile).status_code for _ in range(2)] == [
        200,
        429,
    ]


def test_a_private_space_spends_its_projects_budget(limited: Client) -> None:
    """A user's requests in their private space count against the project's budget as
    theirs in the project do: a private space is no way round the project's limit."""
    ana = user_id("https://idp.example", "ana")
    limited.app.extensions["storage"].users.change(
        ana,
        lambda _: User(ana, "https://idp.example", "ana", "", "Ana", "2026-01-01",
                       role="writer", tenant="acme", project="web"),
    )  # fmt: skip
    for name in ("ana", "ana2"):
        _, limited.secrets[name] = limited.registry.create(
            role="writer", tenant="acme", project="web", user=ana
        )
    # Two tokens of hers, each within its own budget, spend the project's two at once.
    for name in ("ana", "ana2"):
        assert limited.get(f"{API}/tasks?visibility=private", name).status_code == 200
    refused = limited.get(f"{API}/tasks", "w")
    assert refused.status_code == 429, refused.get_data(as_text=True)
