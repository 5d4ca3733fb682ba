"""429 and 503 are retried after Retry-After, a bounded number of times, on a real server:
the server's own rate limiter gives the 429, a task lock held by the test the 503."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from project_memory_client import ApiError, Client

from app.storage.core.names import Scope
from app.storage.tree.fs.locks import locked
from app.storage.tree.fs.txn import Key
from app.storage.tree.tasks import TaskStore
from tests.e2e.conftest import Server, serving

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def strict(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """One request a second per token and per project, and a lock given up after 0.3 s."""
    env = {
        "MEMORY_RATE_LIMIT_RPS": "1",
        "MEMORY_RATE_LIMIT_BURST": "1",
        "MEMORY_LOCK_TIMEOUT": "0.3",
    }
    yield from serving(tmp_path_factory, "strict", workers=2, env_extra=env)


def test_a_429_is_waited_out_and_retried(strict: Server) -> None:
    token = strict.token("writer", project="limited")
    with Client(strict.url, token, max_retries=0) as impatient:
        impatient.put_turn("limited", 0, summary_md="first")
        with pytest.raises(ApiError) as refused:
            impatient.get_turn("limited", 0)
    assert refused.value.status == 429 and refused.value.retry_after == 1
    with Client(strict.url, token) as pm:
        started = time.monotonic()
        assert pm.get_turn("limited", 0).summary_md == "first"  # after one Retry-After
        assert time.monotonic() - started >= 0.9


def test_a_wait_longer_than_the_bound_is_not_waited_for(strict: Server) -> None:
    token = strict.token("writer", project="bounded")
    with Client(strict.url, token, max_retry_wait=0.5) as pm:
        started = time.monotonic()
        pm.put_turn("bounded", 0)
        with pytest.raises(ApiError) as refused:
            pm.get_turn("bounded", 0)
    assert refused.value.status == 429
    assert time.monotonic() - started < 0.5


def test_a_503_of_a_busy_lock_is_retried_until_the_lock_is_free(strict: Server) -> None:
    token = strict.token("admin", tenant="acme", project="web")  # admins: no rate limit
    store = TaskStore(Path(strict.root), lock_timeout=10.0)
    lock = store.txns.lock_path(Key(Scope("acme", "web"), "held"))
    with Client(strict.url, token) as pm:
        pm.put_turn("held", 0, summary_md="before")
        impatient = Client(strict.url, token, max_retries=0)
        with impatient, locked(lock, timeout=5), pytest.raises(ApiError) as busy:
            impatient.put_turn("held", 0, summary_md="refused")
        assert busy.value.status == 503 and busy.value.retry_after == 1
        release = threading.Event()

        def hold() -> None:
            with locked(lock, timeout=5):
                release.set()
                time.sleep(0.8)  # past the server's 0.3 s: the first try answers 503

        holder = threading.Thread(target=hold)
        holder.start()
        release.wait(5)
        started = time.monotonic()
        record = pm.put_turn("held", 0, summary_md="after")
        holder.join()
        assert time.monotonic() - started >= 1.0  # one Retry-After at least
        assert record.summary_md == "after"
        assert pm.get_turn("held", 0).summary_md == "after"
