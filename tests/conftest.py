"""Shared fixtures: a fixed clock, a store on tmp_path, an app and tokens of every role.

Backends: ``MEMORY_TEST_BACKENDS`` (``tree``, ``pg`` or ``tree,pg``; default ``tree``) names
the storage backends the conformance suite (tests/conformance/) and the API suites marked
``all_backends`` run against. ``pg`` starts a real PostgreSQL and a real SeaweedFS once per
run (tools/services.py); each test gets a schema and a key prefix of its own. A test that
reads the tree's files is marked ``tree_only`` and skipped on the others; one whose cases
check a rule all backends share is marked ``shared_rule`` (pytest_collection_modifyitems).
"""

from __future__ import annotations

import itertools
import os
import shutil
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from flask import Flask
from flask.testing import FlaskClient

from app import create_app
from app.storage.core.names import Scope
from app.storage.tree.tasks import TaskStore
from app.storage.tree.tokens import TokenRegistry

T0 = datetime(2026, 1, 1, tzinfo=UTC)
# The servers, CLIs and hooks the tests start search by keyword unless a test asks for an
# embedder (MEMORY_EMBEDDER=bundled in its env_extra or app_overrides): the model, loaded by
# each of the hundreds of short-lived servers, would cost make test minutes of CPU that only
# the tests of vectors need.
os.environ.setdefault("MEMORY_EMBEDDER", "off")

BACKENDS = ("tree", "pg")
_schemas = itertools.count()


def selected_backends() -> list[str]:
    """The backends ``MEMORY_TEST_BACKENDS`` names, in its order."""
    names = [n.strip() for n in os.environ.get("MEMORY_TEST_BACKENDS", "tree").split(",")]
    names = [n for n in names if n]
    unknown = sorted(set(names) - set(BACKENDS))
    if unknown or not names:
        raise pytest.UsageError(f"MEMORY_TEST_BACKENDS: unknown backend(s) {unknown}")
    return names


def backends_first_then_slow() -> list[Any]:
    """Params of a real-server scenario that runs on each selected backend: the first one in
    `make test`, the others in `make slow` (each behaviour keeps one case in `make test`;
    CI runs both)."""
    first, *others = selected_backends()
    return [first, *(pytest.param(kind, marks=pytest.mark.slow) for kind in others)]


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """Run ``all_backends`` tests (and every user of ``backend``) once per selected backend."""
    if "backend_kind" not in metafunc.fixturenames:
        return
    marked = metafunc.definition.get_closest_marker("all_backends") is not None
    if marked or "backend" in metafunc.fixturenames:
        metafunc.parametrize("backend_kind", selected_backends(), indirect=True)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """A test marked ``shared_rule`` checks, case by case, a rule every backend takes from the
    same code (a schema, app/storage/core/store_rules.py): each of its cases runs on the first
    backend MEMORY_TEST_BACKENDS names, and its first case on each other one, which shows
    that backend applies the rule (and writes nothing when it refuses)."""
    first = selected_backends()[0]
    kept: list[pytest.Item] = []
    dropped: list[pytest.Item] = []
    seen: set[tuple[str, str]] = set()
    for item in items:
        callspec = getattr(item, "callspec", None)
        kind = callspec.params.get("backend_kind") if callspec else None
        if item.get_closest_marker("shared_rule") is None or kind in (None, first):
            kept.append(item)
            continue
        key = (f"{item.nodeid.split('[')[0]}", str(kind))
        (dropped if key in seen else kept).append(item)
        seen.add(key)
    if dropped:
        config.hook.pytest_deselected(items=dropped)
        items[:] = kept
    items[:] = slow_modules_first(items)


# Tests that start a real gunicorn (e2e) or pip-install the checkout (install) take seconds to
# a minute each.
SLOW_MARKERS = ("e2e", "install")


def slow_modules_first(items: list[pytest.Item]) -> list[pytest.Item]:
    """The modules that hold a slow test first, each kept whole and in order.

    pytest-xdist hands tests out in this order: in chunks under make slow's loadgroup, as a
    contiguous share per worker under make test's worksteal, where an idle worker takes the
    end of another's share. Either way a minute-long test near the end of the order keeps
    one worker busy while the others have nothing left to do. A module moves whole, so its
    module-scoped server still starts once where the module stays on one worker."""
    slow = {_module(item) for item in items if any(map(item.get_closest_marker, SLOW_MARKERS))}
    return sorted(items, key=lambda item: _module(item) not in slow)


def _module(item: pytest.Item) -> str:
    return item.nodeid.split("::", 1)[0]


@dataclass
class Services:
    """One PostgreSQL and one SeaweedFS for the whole run, and the database tests use."""

    postgres: Any
    seaweed: Any
    database_url: str
    # One connection makes every test's schema: a new one per test cost more than the schema.
    admin: Any = None

    def settings(self) -> dict[str, Any]:
        """Config overrides for a backend of its own: a fresh schema and key prefix."""
        import psycopg

        name = f"t{next(_schemas)}_{os.getpid()}"
        if self.admin is None or self.admin.closed:
            self.admin = psycopg.connect(self.database_url, autocommit=True)
        try:
            self.admin.execute(f"CREATE SCHEMA {name}")
        except psycopg.OperationalError:  # a test ended the connection: once more on a new one
            self.admin.close()
            self.admin = psycopg.connect(self.database_url, autocommit=True)
            self.admin.execute(f"CREATE SCHEMA {name}")
        return {
            "DATABASE_URL": f"{self.database_url}?options=-csearch_path%3D{name}",
            "BLOB_URL": f"s3://{self.seaweed.bucket}/{name}",
            "S3_ENDPOINT_URL": self.seaweed.endpoint,
        }


def _services_dir() -> Path:
    """Where the run's PostgreSQL and SeaweedFS keep their files: on tmpfs when there is one.

    A run leaves a schema per test in the cluster, tens of thousands of files, and deleting
    them from the disk kept each worker busy for many seconds after its last test; nothing
    in it outlives the run, and PostgreSQL runs without fsync anyway."""
    from tools.services import scratch_dir

    shm = Path("/dev/shm")
    if not (shm.is_dir() and os.access(shm, os.W_OK)):
        return scratch_dir("pm-test-")
    path = Path(tempfile.mkdtemp(prefix="pm-test-", dir=shm))
    path.chmod(0o755)  # PostgreSQL runs as the postgres user
    return path


@pytest.fixture(scope="session")
def services() -> Iterator[Services]:
    """A real PostgreSQL 15 and a real SeaweedFS, started once per run (never mocked)."""
    from tools.services import Postgres, Seaweed

    directory = _services_dir()
    postgres = seaweed = None
    try:
        postgres = Postgres(directory / "pg").start()
        seaweed = Seaweed(directory / "s3").start()
        os.environ.update(seaweed.env())  # boto3 (and gunicorn children) read AWS_* from here
        found = Services(postgres, seaweed, postgres.database("project_memory_test"))
        yield found
        if found.admin is not None:
            found.admin.close()
    finally:
        if seaweed is not None:
            seaweed.stop()
        if postgres is not None:
            postgres.stop()
        shutil.rmtree(directory, ignore_errors=True)


@pytest.fixture
def backend_kind(request: pytest.FixtureRequest) -> str:
    kind = getattr(request, "param", "tree")
    if kind != "tree" and request.node.get_closest_marker("tree_only"):
        marker = request.node.get_closest_marker("tree_only")
        pytest.skip(f"tree only: {marker.args[0] if marker.args else 'reads the tree'}")
    return str(kind)


@pytest.fixture
def backend_config(backend_kind: str, request: pytest.FixtureRequest) -> dict[str, Any]:
    """Config overrides that select ``backend_kind`` (none for the tree)."""
    if backend_kind == "tree":
        return {}
    found: Services = request.getfixturevalue("services")
    return found.settings()


@pytest.fixture
def backend_settings(
    backend_config: dict[str, Any], tmp_path: Path, clock: FixedClock
) -> dict[str, Any]:
    """Settings for ``open_backend`` of the selected kind: a root (or schema) of the test's
    own, the fixed clock, 1 MiB artifacts."""
    return {
        "STORAGE_ROOT": str(tmp_path / "root"),
        "TOKENS_FILE": str(tmp_path / "tokens.json"),
        "RETENTION_DAYS": 30.0,
        "LOCK_TIMEOUT": 5.0,
        "MAX_ARTIFACT_BYTES": 1 << 20,
        "CLOCK": clock,
        "THREADS": 4,
        # Keyword search unless a test passes an embedder: no model loaded, no drain.
        "EMBEDDER": "off",
        **backend_config,
    }


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
def app_overrides() -> dict[str, Any]:
    """Settings a test module adds to its ``app`` (override this fixture)."""
    return {}


@pytest.fixture
def app(
    tmp_path: Path,
    clock: FixedClock,
    backend_config: dict[str, Any],
    app_overrides: dict[str, Any],
) -> Iterator[Flask]:
    application = create_app(
        {
            "TESTING": True,
            "STORAGE_ROOT": str(tmp_path / "root"),
            "TOKENS_FILE": str(tmp_path / "tokens.json"),
            "CLOCK": clock,
            "LOCK_TIMEOUT": 5.0,
            "THREADS": 4,
            # Keyword search unless a module asks for an embedder (its app_overrides): the
            # suites that do not test vectors load no model and start no embedding thread.
            "EMBEDDER": "off",
            **app_overrides,
            **backend_config,
        }
    )
    yield application
    application.extensions["traffic"].close()
    application.extensions["storage"].close()


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


TOKENS: dict[str, dict[str, str]] = {
    "reader": {"role": "reader", "tenant": "acme", "project": "web"},
    "writer": {"role": "writer", "tenant": "acme", "project": "web"},
    "writer2": {"role": "writer", "tenant": "acme", "project": "web"},
    "project_admin": {"role": "project_admin", "tenant": "acme", "project": "web"},
    "tenant_admin": {"role": "tenant_admin", "tenant": "acme"},
    "admin": {"role": "admin"},
    "other_project": {"role": "writer", "tenant": "acme", "project": "mobile"},
    "other_tenant": {"role": "writer", "tenant": "globex", "project": "web"},
}


@pytest.fixture(scope="session")
def tokens_file_at_t0(tmp_path_factory: pytest.TempPathFactory) -> Tokens:
    """The tokens of ``tokens``, made once per process by the tree's registry at T0.

    Each of them is a locked, fsynced rewrite of the file: eight per test, which cost as
    much as building the app. A test whose registry is a tree file not yet written, on a
    clock at T0, gets a copy of this one: the same bytes its registry would have written,
    but for the random ids and secrets."""
    registry = TokenRegistry(tmp_path_factory.mktemp("tokens") / "tokens.json", clock=FixedClock())
    made = Tokens(registry, {}, {})
    for name, kwargs in TOKENS.items():
        made.add(name, **kwargs)
    return made


@pytest.fixture
def tokens(app: Flask, request: pytest.FixtureRequest) -> Tokens:
    """Tokens for tenant acme / project web of every role, plus outsiders."""
    reg: TokenRegistry = app.extensions["token_registry"]
    if isinstance(reg, TokenRegistry) and reg.clock() == T0 and not reg.path.exists():
        made: Tokens = request.getfixturevalue("tokens_file_at_t0")
        shutil.copy2(made.registry.path, reg.path)
        return Tokens(reg, dict(made.secrets), dict(made.ids))
    t = Tokens(reg, {}, {})
    for name, kwargs in TOKENS.items():
        t.add(name, **kwargs)
    return t


# -- the mount tests (tests/mount, tests/e2e/test_mount_e2e.py) ------------------------------
# Each of those modules starts its own module-scoped gunicorn as its ``server`` fixture.
@pytest.fixture(scope="module")
def token(server: Any) -> str:
    """A writer token on the requesting module's server."""
    return str(server.token("writer"))


@pytest.fixture
def remote(server: Any, token: str) -> Iterator[Any]:
    """A memory-stores client (tests.client.mount.helpers.Remote) on that server."""
    from tests.client.mount.helpers import Remote

    client = Remote(server, token)
    yield client
    client.close()


def nested_summary(markdown: str) -> str:
    """A summary as project.md shows it: its ATX headings two levels deeper (at most six),
    code blocks untouched. Written apart from app/storage/core/digest.py, from the rule alone."""
    out = []
    fence = ""
    for line in markdown.splitlines(keepends=True):
        body = line.lstrip(" ")
        indent = len(line) - len(body)
        mark = body.rstrip()
        if fence:
            if indent <= 3 and len(mark) >= len(fence) and set(mark) == {fence[0]}:
                fence = ""
        elif indent <= 3 and body[:3] in ("```", "~~~"):
            fence = body[: len(body) - len(body.lstrip(body[0]))]
        elif indent <= 3 and body.startswith("#"):
            level = len(body) - len(body.lstrip("#"))
            rest = body[level:]
            if level <= 6 and (not rest or rest[0] in " \t\r\n"):
                line = " " * indent + "#" * min(6, level + 2) + rest
        out.append(line)
    return "".join(out)
