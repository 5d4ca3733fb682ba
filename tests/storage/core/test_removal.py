"""Deleting one turn or one artifact, through the storage interface, on every backend: the
removed text is in no answer at once, and in no stored place once the upkeep the call started
has run (on the tree, no file under the root, the listing's WAL included; on PostgreSQL, no
live row of any table)."""

from __future__ import annotations

import io
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from app.storage.backends import open_backend
from app.storage.core.background import Later
from app.storage.core.names import Scope
from app.storage.interface import StorageBackend
from tests.storage._helpers import upkeep_done

pytestmark = pytest.mark.all_backends
SCOPE = Scope("acme", "web")
LEAK_TURN, LEAK_FILE = "LEAKED-TURN-5d1e", "LEAKED-FILE-9a3c"


@pytest.fixture
def storage(backend_settings: dict[str, Any]) -> Iterator[StorageBackend]:
    found = open_backend(backend_settings)
    yield found
    found.close()


def holders(backend_kind: str, settings: dict[str, Any], word: str) -> list[str]:
    """Where ``word`` is stored: the files under the root that hold it (as written, or
    lower-cased as FTS5 keeps its terms), or the PostgreSQL tables with a live row that does
    (in a text column, or in a bytea one, which a row's text shows in hex)."""
    if backend_kind == "tree":
        root = Path(settings["STORAGE_ROOT"])
        spelled = (word.encode(), word.lower().encode())
        return sorted(
            str(p.relative_to(root))
            for p in root.rglob("*")
            if p.is_file() and any(w in p.read_bytes() for w in spelled)
        )
    with psycopg.connect(settings["DATABASE_URL"], autocommit=True) as conn:
        tables = [
            r[0]
            for r in conn.execute(
                "SELECT table_name FROM information_schema.tables"
                " WHERE table_schema = current_schema() AND table_type = 'BASE TABLE'"
            )
        ]
        return [
            t
            for t in tables
            if conn.execute(
                f'SELECT 1 FROM "{t}" AS r WHERE r::text ILIKE %s OR r::text LIKE %s LIMIT 1',  # noqa: S608
                (f"%{word}%", f"%{word.encode().hex()}%"),
            ).fetchone()
        ]


def quiet(storage: StorageBackend) -> None:
    """Wait for the upkeep a call started after its return (the tree's purge)."""
    upkeep_done(storage.tasks)


def test_a_turn_deleted_after_an_artifact_of_another_turn_leaves_nothing_behind(
    storage: StorageBackend, backend_kind: str, backend_settings: dict[str, Any]
) -> None:
    tasks = storage.tasks
    tasks.put_turn(SCOPE, "leaky", 0, meta={}, summary_md="keep this")
    tasks.put_turn(SCOPE, "leaky", 1, meta={}, summary_md=f"pasted {LEAK_TURN} by mistake")
    tasks.put_artifact(
        SCOPE,
        "leaky",
        0,
        "env.txt",
        io.BytesIO(f"TOKEN={LEAK_FILE}\n".encode()),
        content_type="text/plain",
    )
    assert holders(backend_kind, backend_settings, LEAK_TURN)  # the check below can fail
    tasks.delete_artifact(SCOPE, "leaky", 0, "env.txt")
    tasks.delete_turn(SCOPE, "leaky", 1)
    assert storage.search(SCOPE, LEAK_TURN).hits == ()
    quiet(storage)
    assert holders(backend_kind, backend_settings, LEAK_TURN) == []
    assert holders(backend_kind, backend_settings, LEAK_FILE) == []
    assert storage.search(SCOPE, LEAK_TURN).hits == ()
    body, _ = tasks.open_digest(SCOPE)
    with body:
        digest = body.read()
    assert b"keep this" in digest and LEAK_TURN.encode() not in digest
    assert [t.turn for t in tasks.get_task(SCOPE, "leaky").turns] == [0]


def test_a_job_asked_for_while_it_runs_runs_again_after_it() -> None:
    later = Later()
    started, release = threading.Event(), threading.Event()
    runs: list[str] = []

    def first() -> None:
        started.set()
        release.wait(10)
        runs.append("first")

    done_first = later.run("k", first, "a test job")
    assert started.wait(10)
    # Asked for twice while the first runs: one more run, after it, of the latest job.
    later.run("k", lambda: runs.append("second"), "a test job")
    done_again = later.run("k", lambda: runs.append("third"), "a test job")
    assert not done_again.is_set()
    release.set()
    assert done_first.wait(10) and done_again.wait(10)
    assert runs == ["first", "third"]
    deadline = time.monotonic() + 10
    while later.busy():
        assert time.monotonic() < deadline
        time.sleep(0.01)


def test_a_settling_job_folds_every_request_made_before_it_starts() -> None:
    later = Later(settle=0.3)
    runs: list[int] = []
    seen_at: list[float] = []
    asked = time.monotonic()
    events = []
    for n in range(5):
        events.append(
            later.run(
                "k", lambda n=n: (runs.append(n), seen_at.append(time.monotonic())), "a test job"
            )
        )
    # Every request before the start shares the one run, which runs the latest job.
    assert all(e is events[0] for e in events)
    assert not events[0].is_set()
    assert events[0].wait(10)
    assert runs == [4] and seen_at[0] - asked >= 0.3
    # A request made while a run is under way still gets a run after it, settled too.
    started, release = threading.Event(), threading.Event()

    def slow() -> None:
        started.set()
        release.wait(10)
        runs.append(10)

    later.run("k", slow, "a test job")
    assert started.wait(10)
    again = later.run("k", lambda: runs.append(11), "a test job")
    release.set()
    assert again.wait(10)
    assert runs == [4, 10, 11]
