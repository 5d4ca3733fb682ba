"""A task's next turn: the one loop that takes the next free number and writes it.

Both writers of a turn without a number use it: :meth:`Client.put_turn` with ``"next"`` and
the spool (agents/spool.py), over the full client or the hooks' own. It imports nothing but
the errors, so that a hook pays nothing for it at start-up.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, TypeVar

from .errors import ClientError, PreconditionFailed

if TYPE_CHECKING:
    from collections.abc import Sequence
    from typing import Protocol

    class NumberedTurn(Protocol):
        @property
        def turn(self) -> int: ...

    class TaskTurns(Protocol):
        """What the loop reads of a task's index: its turns' numbers and the latest."""

        @property
        def turns(self) -> Sequence[NumberedTurn]: ...
        @property
        def latest_turn(self) -> int | None: ...


# A writer that loses the race for a number tries the next one; this many losses in a row
# means something else is wrong (or 9999 turns are taken).
NEXT_TURN_ATTEMPTS = 64

IndexT = TypeVar("IndexT", bound="TaskTurns")
Result = TypeVar("Result")


def after_latest(index: TaskTurns | None) -> int:
    """The number after the task's latest turn; 0 for a task with none, or no task."""
    if index is None:
        return 0
    numbers = [t.turn for t in index.turns]
    if index.latest_turn is not None:
        numbers.append(index.latest_turn)
    return max(numbers) + 1 if numbers else 0


def put_next_turn(
    task_id: str,
    read_index: Callable[[], IndexT | None],
    put: Callable[[IndexT | None, int], Result],
    *,
    resend: bool = True,
) -> Result:
    """``put(index, number)`` for the task's next free turn number; what it returns.

    Each try reads the task's index (``read_index``: None when there is no such task yet)
    and takes the number after its latest turn. ``put`` writes that number with
    ``If-None-Match: *``, so that it never overwrites another writer's turn; when another
    took the number (PreconditionFailed) the next try takes the number after, even if the
    index does not show yet what took it. ``put`` sees the index it was given the number
    from (the spool looks there for a turn it sent before). ``resend=False``: a body that
    cannot be sent twice; a lost race raises PreconditionFailed. ClientError after
    NEXT_TURN_ATTEMPTS lost races.
    """
    number = -1
    for _ in range(NEXT_TURN_ATTEMPTS):
        index = read_index()
        number = max(number + 1, after_latest(index))
        try:
            return put(index, number)
        except PreconditionFailed:
            if not resend:
                raise
    raise ClientError(
        f"no free turn of task {task_id} after {NEXT_TURN_ATTEMPTS} tries; last tried {number}"
    )
