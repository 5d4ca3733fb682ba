"""project.md: title, one section per live task (newest first), latest turn, summary verbatim."""

from __future__ import annotations

import io
from datetime import timedelta

from app.storage.core.clock import iso
from app.storage.core.names import Scope
from app.storage.interface import TaskBackend
from tests.conformance.conftest import assert_views_agree, expected_digest, read_digest
from tests.conftest import T0, FixedClock


def test_digest_of_an_empty_project(tasks: TaskBackend, scope: Scope) -> None:
    assert read_digest(tasks, scope) == "# Project memory: acme/web\n\nNo tasks yet.\n"


def test_digest_format(tasks: TaskBackend, scope: Scope, clock: FixedClock) -> None:
    tasks.put_turn(scope, "alpha", 0, meta={}, summary_md="alpha zero")
    clock.advance(minutes=1)
    tasks.put_turn(scope, "beta", 0, meta={}, summary_md="beta zero\n\n- item\n")
    clock.advance(minutes=1)
    tasks.put_turn(scope, "alpha", 1, meta={}, summary_md="alpha **one**")
    clock.advance(minutes=1)
    # An older turn number rewritten later: the task moves up, the section shows turn 1.
    tasks.put_turn(scope, "alpha", 0, meta={}, summary_md="alpha zero again")
    clock.advance(minutes=1)
    tasks.put_turn(scope, "gamma", 5, meta={}, summary_md="")
    expected = (
        "# Project memory: acme/web\n"
        "\n## gamma\n\nLatest turn: 5, updated " + iso(T0 + timedelta(minutes=4)) + "\n\n"
        "\n## alpha\n\nLatest turn: 1, updated " + iso(T0 + timedelta(minutes=2)) + "\n\n"
        "alpha **one**\n"
        "\n## beta\n\nLatest turn: 0, updated " + iso(T0 + timedelta(minutes=1)) + "\n\n"
        "beta zero\n\n- item\n"
    )
    assert read_digest(tasks, scope) == expected
    assert expected_digest(tasks, scope) == expected


def test_digest_follows_every_change(tasks: TaskBackend, scope: Scope, clock: FixedClock) -> None:
    tasks.put_turn(scope, "a", 0, meta={}, summary_md="a0")
    assert "a0" in read_digest(tasks, scope)
    clock.advance(seconds=1)
    tasks.put_turn(scope, "a", 0, meta={}, summary_md="a0 v2")
    assert "a0 v2" in read_digest(tasks, scope)
    clock.advance(seconds=1)
    tasks.put_turn(scope, "b", 0, meta={}, summary_md="b0")
    text = read_digest(tasks, scope)
    assert text.index("## b") < text.index("## a")
    clock.advance(seconds=1)
    tasks.put_artifact(scope, "a", 0, "f", io.BytesIO(b"1"), content_type="x")
    text = read_digest(tasks, scope)
    assert text.index("## a") < text.index("## b")
    tasks.delete_task(scope, "b")
    assert "## b" not in read_digest(tasks, scope)
    assert_views_agree(tasks, scope)


def test_digest_expires_with_the_turns_without_any_write(
    tasks: TaskBackend, scope: Scope, clock: FixedClock
) -> None:
    tasks.put_turn(scope, "a", 0, meta={}, summary_md="a zero")
    clock.advance(days=1)
    tasks.put_turn(scope, "a", 1, meta={}, summary_md="a one")
    tasks.put_turn(scope, "b", 0, meta={}, summary_md="b zero")
    assert "a one" in read_digest(tasks, scope)  # rendered and kept now
    clock.advance(days=30)  # a/1 and b/0 expired; nothing was written since
    assert read_digest(tasks, scope) == "# Project memory: acme/web\n\nNo tasks yet.\n"


def test_digest_shows_latest_live_turn_when_a_newer_number_expired(
    tasks: TaskBackend, scope: Scope, clock: FixedClock
) -> None:
    tasks.put_turn(scope, "a", 1, meta={}, summary_md="a one")
    clock.advance(days=10)
    tasks.put_turn(scope, "a", 0, meta={}, summary_md="a zero")
    assert "Latest turn: 1," in read_digest(tasks, scope)
    clock.advance(days=25)  # turn 1 expired, turn 0 alive
    text = read_digest(tasks, scope)
    assert "Latest turn: 0," in text and "a zero" in text and "a one" not in text
    assert text == expected_digest(tasks, scope)


def test_digest_follows_a_clock_that_steps_back_across_an_expiry(
    tasks: TaskBackend, scope: Scope, clock: FixedClock
) -> None:
    tasks.put_turn(scope, "a", 0, meta={}, summary_md="a zero")
    clock.set(T0 + timedelta(days=30))  # expired now
    assert "## a" not in read_digest(tasks, scope)
    clock.set(T0 + timedelta(days=30) - timedelta(microseconds=1))  # NTP stepped back
    assert tasks.get_turn(scope, "a", 0).summary_md == "a zero"
    assert "a zero" in read_digest(tasks, scope)
