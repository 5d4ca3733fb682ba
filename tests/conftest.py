"""Shared fixtures: a fixed clock, a store on tmp_path, an app and tokens of every role."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from flask import Flask
from flask.testing import FlaskClient

from app import create_app
from app.storage import Scope, TaskStore
from app.storage.tokens import TokenRegistry

T0 = datetime(2026, 1, 1, tzinfo=UTC)


class FixedClock:
    """A clock tests move by hand: ``clock.advance(days=30)``."""

    def __init__(self, start: datetime = T0) -> None:
        self.now = start

    def __call__(self) -> datetime:
        return self.now

    def advance(self, **delta: float) -> datetime:
        self.now += timedelta(**delta)
        return self.now

    def set(self, moment: datetime) -> None:
        self.now = moment


@pytest.fixture
def clock() -> FixedClock:
    return FixedClock()


@pytest.fixture
def scope() -> Scope:
    return Scope("acme", "web")


@pytest.fixture
def store(tmp_path: Path, clock: FixedClock) -> TaskStore:
    return TaskStore(tmp_path / "root", clock=clock, lock_timeout=5.0)


@pytest.fixture
def app(tmp_path: Path, clock: FixedClock) -> Iterator[Flask]:
    application = create_app(
        {
            "TESTING": True,
            "STORAGE_ROOT": str(tmp_path / "root"),
            "TOKENS_FILE": str(tmp_path / "tokens.json"),
            "CLOCK": clock,
            "LOCK_TIMEOUT": 5.0,
        }
    )
    yield application


class BufferedClient(FlaskClient):
    """Consume and close every response body, as a WSGI server does (streamed files included)."""

    def open(self, *args: object, **kwargs: object):  # type: ignore[override]
        kwargs.setdefault("buffered", True)
        return super().open(*args, **kwargs)


@pytest.fixture
def client(app: Flask) -> FlaskClient:
    app.test_client_class = BufferedClient
    return app.test_client()


@dataclass
class Tokens:
    """Secrets by name; ``headers(name)`` gives the Authorization header for one."""

    registry: TokenRegistry
    secrets: dict[str, str]
    ids: dict[str, str]

    def headers(self, name: str, **extra: str) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.secrets[name]}", **extra}

    def add(self, name: str, **kwargs: object) -> str:
        token, secret = self.registry.create(**kwargs)  # type: ignore[arg-type]
        self.secrets[name], self.ids[name] = secret, token.id
        return secret


@pytest.fixture
def tokens(app: Flask) -> Tokens:
    """Tokens for tenant acme / project web of every role, plus outsiders."""
    reg: TokenRegistry = app.extensions["token_registry"]
    t = Tokens(reg, {}, {})
    t.add("reader", role="reader", tenant="acme", project="web")
    t.add("writer", role="writer", tenant="acme", project="web")
    t.add("writer2", role="writer", tenant="acme", project="web")
    t.add("project_admin", role="project_admin", tenant="acme", project="web")
    t.add("tenant_admin", role="tenant_admin", tenant="acme")
    t.add("admin", role="admin")
    t.add("other_project", role="writer", tenant="acme", project="mobile")
    t.add("other_tenant", role="writer", tenant="globex", project="web")
    return t


# -- the mount tests (tests/mount, tests/e2e/test_mount_e2e.py) ------------------------------
# Each of those modules starts its own module-scoped gunicorn as its ``server`` fixture.
@pytest.fixture(scope="module")
def token(server: Any) -> str:
    """A writer token on the requesting module's server."""
    return str(server.token("writer"))


@pytest.fixture
def remote(server: Any, token: str) -> Iterator[Any]:
    """A memory-stores client (tests.mount.helpers.Remote) on that server."""
    from tests.mount.helpers import Remote

    client = Remote(server, token)
    yield client
    client.close()
