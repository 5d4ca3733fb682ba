"""The tree's head of project.md (Digests.open_head, digestdb.head): the base's sections as far
as the head goes, merged with those written, moved, deleted or expired since, in the order
of the whole digest (the API's equality checks on both backends: tests/api/test_project_md_head.py)."""

from __future__ import annotations

import contextlib
import io
import random
import re

import pytest

from app.storage.core.errors import NotFound
from app.storage.core.names import Scope
from app.storage.tree.retention import sweep
from app.storage.tree.sqlite import digestdb
from app.storage.tree.tasks import TaskStore
from tests.conftest import FixedClock

SECTION = re.compile(rb"\n## (t[0-9]+)\n\nLatest turn: ")


def read(opened: tuple[io.BufferedIOBase | object, int | None]) -> bytes:
    file, size = opened
    try:
        data: bytes = file.read()  # type: ignore[attr-defined]
    finally:
        file.close()  # type: ignore[attr-defined]
    assert size is None or size == len(data)
    return data


def first(body: bytes, n: int) -> bytes:
    found = [m.start() for m in SECTION.finditer(body)]
    return body if n >= len(found) else body[: found[n]]


@pytest.fixture
def spliced(monkeypatch: pytest.MonkeyPatch) -> None:
    """Serve every project as a big one: reads splice changes into the base."""
    monkeypatch.setattr(digestdb, "INLINE_BYTES", 0)
    monkeypatch.setattr(digestdb, "COMPACT_AFTER", 1000)


@pytest.mark.usefixtures("spliced")
@pytest.mark.parametrize("seed", range(4))
def test_heads_equal_the_start_of_the_digest_through_any_history(
    store: TaskStore, scope: Scope, clock: FixedClock, seed: int
) -> None:
    rng = random.Random(seed)
    ids = [f"t{i}" for i in range(14)]
    spliced_checks = 0
    for step in range(140):
        op = rng.random()
        task = rng.choice(ids)
        clock.advance(seconds=rng.choice([0, 1, 60]))  # 0: ties, ordered by task id
        if op < 0.55:
            store.put_turn(scope, task, rng.randrange(3), meta={}, summary_md=f"{task} {step}")
        elif op < 0.62:
            with contextlib.suppress(NotFound):
                store.put_artifact(
                    scope, task, 0, "a.txt", io.BytesIO(b"x"), content_type="text/plain"
                )
        elif op < 0.7:
            with contextlib.suppress(NotFound):
                store.delete_task(scope, task)
        elif op < 0.74:
            clock.advance(days=rng.choice([10, 29]))  # turns expire, not yet swept
        elif op < 0.77:
            sweep(store, now=clock())
        elif op < 0.85:
            store.compact_digest(scope)
        if rng.random() < 0.4 and store.listing(scope).exists():
            with store.listing(scope).read() as conn:
                spliced_checks += digestdb.count_changed(conn, digestdb.base_of(conn)) > 0
            body = read(store.open_digest(scope))
            for n in (1, 2, 5, 40):
                assert read(store.open_digest_head(scope, limit=n)) == first(body, n), (step, n)
            listed = store.list_tasks(scope, limit=100).tasks
            if listed:
                k = rng.randrange(len(listed))
                since = store.listing(scope).task_updated_us(listed[k].task_id)
                assert since is not None
                head = read(store.open_digest_head(scope, since_us=since))
                shown = [m.group(1).decode() for m in SECTION.finditer(head)]
                updated = {
                    t.task_id: store.listing(scope).task_updated_us(t.task_id) for t in listed
                }
                assert all((updated[t] or 0) >= since for t in shown), step
                assert head == first(body, len(shown)), step
    assert spliced_checks > 5  # the merge of base and changes ran, not only fresh bases
