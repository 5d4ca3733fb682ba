"""Two turns, or two tasks, side by side: what each hook recorded (agent, model, branch,
commit, tokens, cost, wall time, exit code) and a diff of their summaries.

A side is a task and, optionally, one of its turns (``a``/``a_turn``, ``b``/``b_turn`` in the
query string, so a comparison is an address to share). A task alone stands for its latest
turn's summary and the figures of its last :data:`TASK_TURNS` turns, summed as the ledger
sums them (core/ledger.py ``entry_of``): the page costs a bounded read whatever the task holds.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from flask import render_template, request
from flask.typing import ResponseReturnValue
from werkzeug.exceptions import BadRequest

from app.console import render
from app.console.base import bp, scope, tasks
from app.storage.core import ledger as lg
from app.storage.core.errors import Corrupt, InvalidName, StorageError
from app.storage.core.models import TurnRecord
from app.storage.core.names import validate_id

TASK_TURNS = 100  # summed for a task's figures, its latest first
DIFF_CHARS = 64 * 1024  # of each summary; difflib's time grows faster than the text


@dataclass
class Side:
    """One side of a comparison, as the page shows it."""

    task_id: str
    turn: int | None  # None: the task as a whole
    latest: TurnRecord
    turns: int = 0  # counted in the figures below
    of: int = 0  # the task's turns
    models: list[str] = field(default_factory=list)
    agents: list[str] = field(default_factory=list)
    branches: list[str] = field(default_factory=list)
    commit: str = ""
    session: str = ""
    input_tokens: int = 0
    output_tokens: int = 0
    cache_read_tokens: int = 0
    cost_usd: float | None = None
    wall_seconds: float = 0.0
    failures: int = 0
    exit_code: int | None = None

    def add(self, entry: lg.LedgerTurn) -> None:
        self.turns += 1
        for seen, value in ((self.models, entry.model), (self.agents, entry.agent),
                            (self.branches, entry.branch)):  # fmt: skip
            if value and value not in seen:
                seen.append(value)
        self.input_tokens += entry.input_tokens
        self.output_tokens += entry.output_tokens
        self.cache_read_tokens += entry.cache_read_tokens
        if entry.cost_nusd is not None:
            self.cost_usd = (self.cost_usd or 0.0) + entry.cost_nusd / lg.NANO
        self.wall_seconds += entry.wall_us / 1_000_000
        self.failures += 1 if entry.exit_code else 0


def _side(name: str) -> tuple[str, int | None] | None:
    """The side the query string names (None when it names none); 400 for a bad one."""
    task_id = request.args.get(name, "").strip()
    raw_turn = request.args.get(f"{name}_turn", "").strip()
    if not task_id:
        return None
    try:
        validate_id("task_id", task_id)
    except InvalidName as exc:
        raise BadRequest(f"{name}: {exc.message}") from None
    if raw_turn and not (raw_turn.isascii() and raw_turn.isdigit() and len(raw_turn) < 10):
        raise BadRequest(f"{name}_turn: a turn number")
    return task_id, int(raw_turn) if raw_turn else None


def _read(task_id: str, turn: int | None) -> Side:
    store = tasks()
    if turn is not None:
        record = store.get_turn(scope(), task_id, turn)
        one = Side(task_id, turn, record, of=1)
        entry = lg.entry_of(record)
        one.add(entry)
        one.commit, one.session, one.exit_code = entry.git_commit, entry.session, entry.exit_code
        return one
    index = store.get_task(scope(), task_id)
    numbers = [e.turn for e in reversed(index.turns)][:TASK_TURNS]
    side: Side | None = None
    for number in numbers:
        try:
            record = store.get_turn(scope(), task_id, number)
        except (Corrupt, StorageError):
            continue  # damaged, expired or deleted since the index was read
        if side is None:
            side = Side(task_id, None, record, of=len(index.turns))
            first = lg.entry_of(record)
            side.commit, side.session, side.exit_code = (
                first.git_commit,
                first.session,
                first.exit_code,
            )
        side.add(lg.entry_of(record))
    if side is None:
        raise BadRequest(f"task {task_id} has no turn left to compare")
    return side


def _name(side: Side) -> str:
    turn = side.turn if side.turn is not None else side.latest.turn
    return f"{side.task_id}/turn-{turn}"


@bp.get("/p/<tenant>/<project>/compare")
def compare(tenant: str, project: str) -> ResponseReturnValue:
    """Two turns or two tasks side by side, and a diff of their summaries."""
    a, b = _side("a"), _side("b")
    sides = [_read(*a), _read(*b)] if a and b else []
    lines, cut = [], False
    if sides:
        old, new = (s.latest.summary_md for s in sides)
        cut = len(old) > DIFF_CHARS or len(new) > DIFF_CHARS
        lines = list(
            render.diff_lines(old[:DIFF_CHARS], new[:DIFF_CHARS], *(_name(s) for s in sides))
        )
    return render_template(
        "console/compare.html",
        sides=sides,
        lines=lines,
        cut=cut,
        asked={k: request.args.get(k, "") for k in ("a", "a_turn", "b", "b_turn")},
        task_turns=TASK_TURNS,
    )
