"""What every node of a deployment shares through the backend: tokens, limit overrides,
secret keys, the sweeper's lease and state, the list of projects; and the task sweep."""

from __future__ import annotations

import io
from datetime import timedelta

import pytest

from app.storage.core.errors import NotFound
from app.storage.core.limits import InvalidLimit, LimitsFileError, RateOverride
from app.storage.core.names import Scope
from app.storage.interface import StorageBackend
from tests.conformance.conftest import Factory, assert_views_agree
from tests.conftest import FixedClock


def test_tokens_created_revoked_and_expired(backend: StorageBackend, clock: FixedClock) -> None:
    registry = backend.token_registry()
    assert registry.is_empty()
    token, secret = registry.create(role="writer", tenant="acme", project="web", name="ci")
    assert secret not in repr(registry.all())
    assert registry.authenticate(secret) == token
    assert registry.authenticate(secret + "x") is None
    assert registry.get(token.id) == token
    other = backend.token_registry()
    revoked = other.revoke(token.id)
    assert revoked.revoked_at is not None
    assert registry.authenticate(secret) is None  # seen by every registry object at once
    short, short_secret = registry.create(
        role="reader", tenant="acme", expires_in=timedelta(hours=1)
    )
    assert registry.authenticate(short_secret) == short
    clock.advance(hours=2)
    assert registry.authenticate(short_secret) is None
    with pytest.raises(NotFound):
        registry.revoke("tok_missing")
    with pytest.raises(ValueError, match="tenant"):
        registry.create(role="writer")
    assert [t.id for t in registry.all()] == sorted([token.id, short.id])


def test_limit_overrides(backend: StorageBackend, make_backend: Factory) -> None:
    limits = backend.limits()
    stamp = limits.stamp()
    assert limits.rates().projects == {}
    limits.set_rate("acme", "web", RateOverride(rps=5, burst=10))
    limits.set_rate("acme", None, RateOverride(upload_bps=1000))
    assert limits.stamp() != stamp
    seen = make_backend().limits().rates()  # another node's view
    assert seen.projects[("acme", "web")] == RateOverride(rps=5, burst=10)
    assert seen.tenants["acme"] == RateOverride(upload_bps=1000)
    assert limits.clear_rate("acme", "web") and not limits.clear_rate("acme", "web")
    with pytest.raises(LimitsFileError):
        limits.set_rate("acme", "../x", RateOverride(rps=1))


def test_limits_out_of_range_are_refused_and_a_bad_stored_entry_limits_nothing(
    backend: StorageBackend, make_backend: Factory
) -> None:
    limits = backend.limits()
    for change in (RateOverride(rps=1e-320), RateOverride(rps=1e-300), RateOverride(rps=1e7)):
        with pytest.raises(InvalidLimit):
            limits.set_rate("acme", "web", change)
    assert limits.rates().projects == {}
    # The stored document edited by hand (the tree's file, the database's row): one entry
    # no change could have written, beside a good one.
    with limits._held() as (_, write):  # noqa: SLF001 - the store's own primitive
        write(
            b'{"version": 1, "tenants": {}, "projects": {"acme/bad": {"rate": {"rps": 1e-320},'
            b' "quota": {"tasks": 2}}, "acme/good": {"rate": {"rps": 2, "burst": 4}}}}'
        )
    seen = make_backend().limits()  # another node's view
    rates = seen.rates()
    assert rates.projects == {("acme", "good"): RateOverride(rps=2, burst=4)}
    assert len(rates.skipped) == 1 and "projects.acme/bad" in rates.skipped[0]
    assert seen.quotas().projects[("acme", "bad")].tasks == 2  # its other section still holds
    # Other entries still change; the bad section is replaced by a change to it.
    seen.set_rate("acme", "web", RateOverride(rps=1))
    seen.set_rate("acme", "bad", RateOverride(rps=3))
    rates = limits.rates()
    assert rates.skipped == ()
    assert rates.projects[("acme", "bad")] == RateOverride(rps=3)
    assert rates.projects[("acme", "web")] == RateOverride(rps=1)


def test_keys_are_made_once_and_shared(backend: StorageBackend, make_backend: Factory) -> None:
    key = backend.key(".console-key")
    assert len(key) >= 32 and backend.key(".console-key") == key
    assert make_backend().key(".console-key") == key
    assert backend.key(".cursor-key") != key


def test_one_leader_at_a_time_and_shared_state(
    backend: StorageBackend, make_backend: Factory
) -> None:
    first = backend.lead("conformance")
    assert first is not None and first.held()
    other = make_backend()
    assert other.lead("conformance") is None  # another node's standby
    first.release()
    second = other.lead("conformance")
    assert second is not None
    second.release()
    assert backend.load_state("conformance") is None
    backend.save_state("conformance", {"runs": 3, "recent": [{"pid": 1}]})
    assert other.load_state("conformance") == {"runs": 3, "recent": [{"pid": 1}]}


def test_projects_and_readiness(backend: StorageBackend) -> None:
    assert backend.projects() == []
    backend.tasks.put_turn(Scope("acme", "web"), "t", 0, meta={}, summary_md="")
    backend.stores.create_store(Scope("globex", "api"), name="s")
    assert backend.projects() == [Scope("acme", "web"), Scope("globex", "api")]
    assert backend.projects(["globex"]) == [Scope("globex", "api")]
    ok, detail = backend.ready()
    assert ok, detail


def test_the_sweep_removes_expired_turns_and_reports_them(
    backend: StorageBackend, scope: Scope, clock: FixedClock
) -> None:
    tasks = backend.tasks
    tasks.put_turn(scope, "old", 0, meta={}, summary_md="old summary")
    tasks.put_artifact(scope, "old", 0, "blob", io.BytesIO(b"x" * 5000), content_type="x/y")
    clock.advance(days=10)
    tasks.put_turn(scope, "mixed", 0, meta={}, summary_md="mixed zero")
    clock.advance(days=25)
    tasks.put_turn(scope, "mixed", 1, meta={}, summary_md="mixed one")
    dry = backend.sweep(now=clock(), dry_run=True).to_dict()
    assert (dry["turns"], dry["tasks"]) == (1, 1)
    assert tasks.list_tasks(scope).total == 1  # old expired already: invisible either way
    report = backend.sweep(now=clock()).to_dict()
    assert (report["turns"], report["tasks"]) == (1, 1) and report["bytes"] >= 5000
    assert report["errors"] == []
    clock.advance(days=11)  # mixed/0 expires, mixed/1 lives
    report = backend.sweep(now=clock()).to_dict()
    assert (report["turns"], report["tasks"]) == (1, 0)
    assert [t.turn for t in tasks.get_task(scope, "mixed").turns] == [1]
    assert backend.sweep(now=clock()).to_dict()["turns"] == 0
    assert backend.fsck().clean
    assert_views_agree(tasks, scope)
