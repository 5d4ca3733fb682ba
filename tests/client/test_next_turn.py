"""The next-turn loop the client's put_turn(task, "next") and the spool share, on fakes."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest
from project_memory_client.errors import ClientError, PreconditionFailed
from project_memory_client.next_turn import NEXT_TURN_ATTEMPTS, after_latest, put_next_turn


@dataclass
class Turn:
    turn: int


@dataclass
class Index:
    turns: list[Turn] = field(default_factory=list)
    latest_turn: int | None = None


def test_the_number_after_the_latest_turn() -> None:
    assert after_latest(None) == 0
    assert after_latest(Index()) == 0
    assert after_latest(Index([Turn(0), Turn(3)], 3)) == 4
    # A page of the index may leave out the latest turn: latest_turn still counts.
    assert after_latest(Index([Turn(0)], 7)) == 8


def test_a_lost_race_takes_the_next_number_even_before_the_index_shows_it() -> None:
    stale = Index([Turn(0)], 0)  # never shows the turns others take
    taken = {1, 2}
    tried: list[int] = []

    def put(index: Index | None, number: int) -> int:
        assert index is stale
        tried.append(number)
        if number in taken:
            raise PreconditionFailed(412, "taken")
        return number

    assert put_next_turn("t", lambda: stale, put) == 3
    assert tried == [1, 2, 3]


def test_a_body_sent_once_is_not_sent_for_another_number() -> None:
    def put(index: Index | None, number: int) -> int:
        raise PreconditionFailed(412, "taken")

    with pytest.raises(PreconditionFailed):
        put_next_turn("t", lambda: None, put, resend=False)


def test_it_gives_up_after_the_attempts_naming_the_last_number() -> None:
    calls: list[int] = []

    def put(index: Index | None, number: int) -> int:
        calls.append(number)
        raise PreconditionFailed(412, "taken")

    with pytest.raises(ClientError) as caught:
        put_next_turn("t", lambda: None, put)
    assert len(calls) == NEXT_TURN_ATTEMPTS == 64
    assert str(caught.value) == (
        f"no free turn of task t after 64 tries; last tried {NEXT_TURN_ATTEMPTS - 1}"
    )
