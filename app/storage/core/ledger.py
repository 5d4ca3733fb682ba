"""The turn ledger: what each turn a hook recorded adds up to, and how it is asked for.

Each turn contributes one :class:`LedgerTurn`, read from its record alone (:func:`entry_of`):
its agent, model, branch and session, its tokens (input, output, cache read, cache
creation), the cost its meta reports, its wall time and its exit code, at one moment, ``at``.
Both engines keep those entries beside the turns (``ledger_turns``) and, as each is written,
replaced or removed, move the sums of three rollups (:data:`ROLLUPS`) by the difference, in
the same transaction (the tree's ``_ledger.sqlite3``, PostgreSQL's tables of the same names):

* ``ledger_models``: one row per UTC day, agent and model (a few a day), which answers every
  total and grouping of those three without a branch;
* ``ledger``: one row per UTC day, agent, model and branch, which answers every grouping of
  those four;
* ``ledger_tasks``: one row per task, session, day, agent, model and branch, which answers
  the groupings by task or session.

A read sums the rows of the smallest rollup that holds its grouping and filters, in the days
it asks for, never turns: its cost follows those rows, not the project's turns.
Both are derived: fsck compares them with a recount of the records and ``--repair`` rebuilds
them.

What a turn's meta gives (docs/api.md "The ledger"): ``agent_id``, ``model``, ``branch``;
the session, ``session_id`` or else ``claude_session_id`` or ``codex_session_id``; ``tokens``,
an object of whole numbers ``input``, ``output``, ``cache_read``, ``cache_creation``;
``cost`` (or ``cost_usd``), a number of US dollars; ``started_at`` and ``ended_at``, times;
``exit_code``; ``commit``. A value of another type counts as absent. A turn is *at* its
``started_at`` when that is a time no later than a day after the turn was first written,
else at that first write (its ``created_at``): a clock a day ahead does not put a turn at the
top of the timeline for good.

**Sessions** are counted once each, in the row of the session's first turn (earliest ``at``,
then task id, then turn): sums over rows add up to the sessions of the whole, and a session
counts where it started.

**Cost**: a turn's ``cost`` when its meta has one; else its tokens priced by the project's
price table (:class:`Price`, US dollars per million tokens of each kind) for its model, at
the time of the read, so a price edit applies to every turn without a cost of its own, past
ones too. A turn with neither counts in ``unpriced_turns`` and adds nothing to ``cost_usd``.
"""

# ruff: noqa: S608 - SQL text is fixed fragments and column names; every value is bound.

from __future__ import annotations

import functools
import math
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from app.storage.core.clock import is_time, iso_us, parse_time_us
from app.storage.core.cursor import CursorCodec
from app.storage.core.errors import InvalidName
from app.storage.core.models import TurnRecord
from app.storage.core.names import Scope
from app.storage.core.task_rules import listed_text, scope_tag

DAY_US = 86_400_000_000
# Group keys a read may ask for, and the column each is kept in.
DIMENSIONS = ("day", "agent", "model", "branch", "task", "session", "owner")
COLUMNS = {
    "day": "day",
    "agent": "agent",
    "model": "model",
    "branch": "branch",
    "task": "task_id",
    "session": "session",
}
# The owner of a task (the token that created it, the listing's) is no column of a rollup: a
# grouping by owner reads the rows by task of its days and sums them by their tasks' owners
# (:func:`by_task_for_owners`, :func:`owner_page`): it costs a row per task of those days.
OWNER = "owner"
# Each rollup and the key of its rows (its index's order: by day, then model, the grouping a
# report asks for most), smallest first (rows kept per day: a few, the branches times that,
# the tasks times that).
ROLLUPS: dict[str, tuple[str, ...]] = {
    "ledger_models": ("day", "model", "agent"),
    "ledger": ("day", "agent", "model", "branch"),
    "ledger_tasks": ("task_id", "session", "day", "agent", "model", "branch"),
}


def rollup_for(columns: Iterable[str]) -> str:
    """The smallest rollup whose key holds ``columns`` (those grouped and filtered by)."""
    wanted = set(columns)
    return next(name for name, key in ROLLUPS.items() if wanted <= set(key))


# A text value (agent, model, branch, session) is kept to its first this many bytes of UTF-8:
# it is part of a rollup's key, which an index must hold.
MAX_VALUE_BYTES = 256
MAX_COMMIT_CHARS = 64
# Bounds of one turn's figures: beyond them a meta value counts as absent (tokens, cost) or
# is cut (wall time), so that no sum of a project's turns can overflow 64 bits.
MAX_TOKENS = 10**12
MAX_COST_USD = 10**6
MAX_WALL_US = 366 * DAY_US
# How far past its first write a turn's started_at may be and still place it.
AHEAD_US = DAY_US
NANO = 1_000_000_000

# The figures of a rollup row, in the order a turn's contribution gives them; a row also
# keeps ``sessions`` (the sessions whose first turn it holds).
ADDED = (
    "turns",
    "input_tokens",
    "output_tokens",
    "cache_read_tokens",
    "cache_creation_tokens",
    "cost_nusd",
    "costed_turns",
    "open_input_tokens",
    "open_output_tokens",
    "open_cache_read_tokens",
    "open_cache_creation_tokens",
    "wall_us",
    "nonzero_exits",
)
FIGURES = (*ADDED, "sessions")
# The columns of ``ledger_turns`` after (task_id, turn), in LedgerTurn.values() order.
TURN_COLUMNS = (
    "at_us",
    "day",
    "agent",
    "model",
    "branch",
    "session",
    "git_commit",
    "input_tokens",
    "output_tokens",
    "cache_read_tokens",
    "cache_creation_tokens",
    "cost_nusd",
    "wall_us",
    "exit_code",
)
# A turn's contribution to its rollup rows, as SQL over its ``ledger_turns`` row (fsck's
# recount, both engines); :meth:`LedgerTurn.contribution` is the same in Python.
CONTRIBUTION_SQL = (
    "1",
    "input_tokens",
    "output_tokens",
    "cache_read_tokens",
    "cache_creation_tokens",
    "coalesce(cost_nusd, 0)",
    "CASE WHEN cost_nusd IS NULL THEN 0 ELSE 1 END",
    "CASE WHEN cost_nusd IS NULL THEN input_tokens ELSE 0 END",
    "CASE WHEN cost_nusd IS NULL THEN output_tokens ELSE 0 END",
    "CASE WHEN cost_nusd IS NULL THEN cache_read_tokens ELSE 0 END",
    "CASE WHEN cost_nusd IS NULL THEN cache_creation_tokens ELSE 0 END",
    "wall_us",
    "CASE WHEN coalesce(exit_code, 0) <> 0 THEN 1 ELSE 0 END",
)
TOKEN_KINDS = ("input", "output", "cache_read", "cache_creation")
SESSION_KEYS = ("session_id", "claude_session_id", "codex_session_id")
_INT64 = (1 << 63) - 1


@dataclass(frozen=True, slots=True)
class LedgerTurn:
    """What one turn adds to the ledger (see the module); text values are "" when absent."""

    task_id: str
    turn: int
    at_us: int
    agent: str = ""
    model: str = ""
    branch: str = ""
    session: str = ""
    git_commit: str = ""
    input_tokens: int = 0
    output_tokens: int = 0
    cache_read_tokens: int = 0
    cache_creation_tokens: int = 0
    cost_nusd: int | None = None  # the cost its meta reports, in billionths of a dollar
    wall_us: int = 0
    exit_code: int | None = None

    @property
    def day(self) -> int:
        """Its UTC day, in days since the epoch."""
        return self.at_us // DAY_US

    def values(self) -> tuple[Any, ...]:
        """Its ``ledger_turns`` columns after (task_id, turn), in TURN_COLUMNS order."""
        return (
            self.at_us,
            self.day,
            self.agent,
            self.model,
            self.branch,
            self.session,
            self.git_commit,
            self.input_tokens,
            self.output_tokens,
            self.cache_read_tokens,
            self.cache_creation_tokens,
            self.cost_nusd,
            self.wall_us,
            self.exit_code,
        )

    @property
    def tokens(self) -> tuple[int, int, int, int]:
        return (
            self.input_tokens,
            self.output_tokens,
            self.cache_read_tokens,
            self.cache_creation_tokens,
        )

    def contribution(self) -> tuple[int, ...]:
        """Its figures in a rollup row, in ADDED order."""
        costed = self.cost_nusd is not None
        open_tokens = (0, 0, 0, 0) if costed else self.tokens
        return (
            1,
            *self.tokens,
            self.cost_nusd or 0,
            int(costed),
            *open_tokens,
            self.wall_us,
            int(self.exit_code not in (None, 0)),
        )


def row_of(task_id: str, turn: int, values: Sequence[Any]) -> LedgerTurn:
    """A LedgerTurn from its ``ledger_turns`` columns after (task_id, turn)."""
    (at_us, _day, agent, model, branch, session, commit, i, o, r, c, cost, wall, code) = values
    return LedgerTurn(
        task_id,
        int(turn),
        int(at_us),
        agent,
        model,
        branch,
        session,
        commit,
        int(i),
        int(o),
        int(r),
        int(c),
        None if cost is None else int(cost),
        int(wall),
        None if code is None else int(code),
    )


# -- a turn's entry, from its record ----------------------------------------------------------
def text_value(value: object, limit: int = MAX_VALUE_BYTES) -> str:
    """A meta text as a ledger key keeps it: NUL as U+FFFD (task_rules.listed_text), cut to
    ``limit`` bytes of UTF-8 at a character boundary; "" for anything but a string."""
    if not isinstance(value, str):
        return ""
    text = listed_text(value)
    data = text.encode("utf-8", "surrogatepass")
    if len(data) <= limit:
        return text
    return data[:limit].decode("utf-8", "ignore")


def _count(value: object) -> int:
    """A token count: a whole number in 0..MAX_TOKENS, else 0."""
    if isinstance(value, bool) or not isinstance(value, int):
        return 0
    return value if 0 <= value <= MAX_TOKENS else 0


def _cost_nusd(meta: Mapping[str, Any]) -> int | None:
    for key in ("cost", "cost_usd"):
        value = meta.get(key)
        if isinstance(value, bool) or not isinstance(value, int | float):
            continue
        if math.isfinite(value) and 0 <= value <= MAX_COST_USD:
            return round(value * NANO)
    return None


def _time_us(value: object) -> int | None:
    if not isinstance(value, str) or not is_time(value):
        return None
    return parse_time_us(value)


def entry_of(record: TurnRecord) -> LedgerTurn:
    """What ``record`` adds to the ledger (the module says how each figure is read)."""
    return entry_from(record.task_id, record.turn, record.meta, record.created_at)


def entry_from(task_id: str, turn: int, meta: Mapping[str, Any], created_at: str) -> LedgerTurn:
    """:func:`entry_of` a turn's meta and first write (all a turn's entry depends on)."""
    tokens = meta.get("tokens")
    counts = [_count(tokens.get(k)) for k in TOKEN_KINDS] if isinstance(tokens, dict) else [0] * 4
    session = ""
    for key in SESSION_KEYS:
        session = text_value(meta.get(key))
        if session:
            break
    # A record edited by hand into a created_at that is no time counts at the epoch.
    first_us = _time_us(created_at) or 0
    started = _time_us(meta.get("started_at"))
    ended = _time_us(meta.get("ended_at"))
    wall = 0
    if started is not None and ended is not None and ended >= started:
        wall = min(ended - started, MAX_WALL_US)
    at_us = started if started is not None and started <= first_us + AHEAD_US else first_us
    code = meta.get("exit_code")
    exit_code = (
        max(-_INT64, min(_INT64, code))
        if isinstance(code, int) and not isinstance(code, bool)
        else None
    )
    return LedgerTurn(
        task_id=task_id,
        turn=turn,
        at_us=at_us,
        agent=text_value(meta.get("agent_id")),
        model=text_value(meta.get("model")),
        branch=text_value(meta.get("branch")),
        session=session,
        git_commit=text_value(meta.get("commit"), MAX_COMMIT_CHARS),
        input_tokens=counts[0],
        output_tokens=counts[1],
        cache_read_tokens=counts[2],
        cache_creation_tokens=counts[3],
        cost_nusd=_cost_nusd(meta),
        wall_us=wall,
        exit_code=exit_code,
    )


# -- the price table --------------------------------------------------------------------------
PRICES = "prices"  # its section in an entry of the limits document (core/limits.py)
MAX_PRICED_MODELS = 256
# A model name in a price table: no longer than the ledger keeps one (MAX_VALUE_BYTES of
# UTF-8 hold any 64 characters).
MAX_MODEL_CHARS = 64
# An agent, model or branch filter: one longer than the ledger keeps matches nothing.
MAX_FILTER_CHARS = 256
CONTROL_RE = re.compile(r"[\x00-\x1f\x7f]")
CONTROL_FREE_PATTERN = r"^[^\x00-\x1f\x7f]*$"
MAX_PRICE = 1_000_000.0  # US dollars per million tokens
PRICE_UNIT = "USD per million tokens"


@dataclass(frozen=True, slots=True)
class Price:
    """What a million tokens of each kind cost with one model, in US dollars."""

    input: float = 0.0
    output: float = 0.0
    cache_read: float = 0.0
    cache_creation: float = 0.0

    def to_json(self) -> dict[str, float]:
        return {k: getattr(self, k) for k in TOKEN_KINDS}

    def of(self, tokens: Sequence[int]) -> float:
        """The cost in US dollars of ``tokens`` (input, output, cache read, cache creation)."""
        return sum(n * p for n, p in zip(tokens, self.prices, strict=True)) / 1_000_000

    @property
    def prices(self) -> tuple[float, float, float, float]:
        return (self.input, self.output, self.cache_read, self.cache_creation)


PriceTable = Mapping[str, Price]


class PriceTableError(ValueError):
    """A price table breaks the rules of :func:`prices_from_json` (the message says which)."""


def _name_fault(value: object, most: int) -> str | None:
    """Why ``value`` is not a model name or filter value (1 to ``most`` characters, none a
    control character), or None."""
    if not isinstance(value, str) or not 1 <= len(value) <= most:
        return f"has 1 to {most} characters"
    if CONTROL_RE.search(value):
        return "holds a control character"
    return None


def prices_from_json(obj: object, where: str = "prices") -> dict[str, Price]:
    """Check a price table: an object of at most MAX_PRICED_MODELS model names (1 to
    MAX_MODEL_CHARS characters, none a control character), each an object of the token
    kinds it prices (``input``, ``output``, ``cache_read``, ``cache_creation``; an absent one
    costs nothing), each a number of dollars per million tokens in 0..MAX_PRICE."""
    if not isinstance(obj, dict):
        raise PriceTableError(f"{where}: must be an object of model names")
    if len(obj) > MAX_PRICED_MODELS:
        raise PriceTableError(f"{where}: at most {MAX_PRICED_MODELS} models")
    table: dict[str, Price] = {}
    for model, kinds in obj.items():
        fault = _name_fault(model, MAX_MODEL_CHARS)
        if fault:
            raise PriceTableError(f"{where}: a model name {fault}")
        if not isinstance(kinds, dict):
            raise PriceTableError(f"{where}.{model}: must be an object of token kinds")
        unknown = sorted(set(kinds) - set(TOKEN_KINDS))
        if unknown:
            raise PriceTableError(
                f"{where}.{model}: unknown token kind(s) {', '.join(map(str, unknown))}"
                f" (one of {', '.join(TOKEN_KINDS)})"
            )
        values: dict[str, float] = {}
        for kind, value in kinds.items():
            if (
                isinstance(value, bool)
                or not isinstance(value, int | float)
                or not math.isfinite(value)
                or not 0 <= value <= MAX_PRICE
            ):
                raise PriceTableError(
                    f"{where}.{model}.{kind}: must be a number of {PRICE_UNIT} in 0..{MAX_PRICE:g}"
                )
            values[kind] = float(value)
        table[model] = Price(**values)
    return table


def prices_to_json(table: PriceTable) -> dict[str, dict[str, float]]:
    return {model: price.to_json() for model, price in sorted(table.items())}


@dataclass(frozen=True, slots=True)
class PriceSettings:
    """Every project's price table in the limits document; ``skipped``: why each entry that
    breaks the rules was left out."""

    projects: Mapping[tuple[str, str], Mapping[str, Price]] = field(default_factory=dict)
    skipped: tuple[str, ...] = ()

    def of(self, scope: Scope) -> Mapping[str, Price]:
        return self.projects.get((scope.tenant, scope.project), {})


NO_PRICES = PriceSettings()


# -- reads ------------------------------------------------------------------------------------
# A month by model, or by agent and model, is one page.
LEDGER_LIMIT = 200
MAX_LEDGER_LIMIT = 1000
TIMELINE_LIMIT = 50
MAX_TIMELINE_LIMIT = 500
# Relative times: a count of minutes, hours, days or weeks before now.
RELATIVE_RE = re.compile(r"([1-9][0-9]{0,5})([mhdw])", re.ASCII)
RELATIVE_PATTERN = r"[1-9][0-9]{0,5}[mhdw]|today|yesterday"
_UNIT_US = {"m": 60_000_000, "h": 3_600_000_000, "d": DAY_US, "w": 7 * DAY_US}


def parse_when(text: str, now_us: int) -> int:
    """A ``since`` / ``until`` in microseconds since the epoch: an RFC 3339 time (a date
    alone is its midnight; no offset is UTC), ``Nm``, ``Nh``, ``Nd`` or ``Nw`` (that many
    minutes, hours, days or weeks before ``now_us``), ``today`` or ``yesterday`` (the
    midnight, UTC, that starts them). ValueError otherwise.

    A moment before the epoch reads as the epoch: no turn is placed before it (a turn with
    no time counts at it), so the answer is the same, and the day it reports stays a day a
    date can name (999999w before now is before the year 1)."""
    if text == "today":
        return now_us // DAY_US * DAY_US
    if text == "yesterday":
        return (now_us // DAY_US - 1) * DAY_US
    match = RELATIVE_RE.fullmatch(text)
    if match:
        return max(0, now_us - int(match.group(1)) * _UNIT_US[match.group(2)])
    return max(0, parse_time_us(text, query=True))


def check_filter(field_name: str, value: str | None) -> str | None:
    """An ``agent``/``model``/``branch`` filter: matched exactly against the value the ledger
    keeps; InvalidName for one of more than MAX_FILTER_CHARS characters or holding a control
    character ("" selects the turns that name none)."""
    if value is None or value == "":
        return value
    fault = _name_fault(value, MAX_FILTER_CHARS)
    if fault:
        raise InvalidName(field_name, value, f"{fault.replace('has', 'must have', 1)}")
    return value


GROUP_BY_PATTERN = f"^(?:(?:{'|'.join(DIMENSIONS)})(?:,(?:{'|'.join(DIMENSIONS)}))*)?$"


def group_by_of(text: str | None) -> tuple[str, ...]:
    """``group_by``: dimensions separated by commas, in the order the rows are sorted by (one
    named twice counts once); "" for the totals alone. InvalidName otherwise."""
    if text is None or text == "":
        return ()
    names = text.split(",")
    for name in names:
        if name not in DIMENSIONS:
            raise InvalidName("group_by", text, f"each must be one of {', '.join(DIMENSIONS)}")
    return tuple(dict.fromkeys(names))


@dataclass(frozen=True, slots=True)
class Filters:
    """What both reads select by: the moments [since_us, until_us) and exact values."""

    since_us: int | None = None
    until_us: int | None = None
    agent: str | None = None
    model: str | None = None
    branch: str | None = None

    def selecting(self) -> list[Any]:
        """What a cursor is issued for besides its grouping: the values selected. Not the
        moments: a relative since (7d) moves with the clock between two pages, and the key a
        page resumes after holds wherever the range now starts."""
        return [self.agent, self.model, self.branch]

    @property
    def days(self) -> tuple[int | None, int | None]:
        """The UTC days a ledger read covers: every day the range [since, until) meets."""
        first = None if self.since_us is None else self.since_us // DAY_US
        last = None if self.until_us is None else (self.until_us - 1) // DAY_US
        return first, last


@dataclass(frozen=True, slots=True)
class LedgerQuery:
    group_by: tuple[str, ...] = ("day",)
    filters: Filters = Filters()
    limit: int = LEDGER_LIMIT
    cursor: str | None = None

    @property
    def filtered(self) -> list[str]:
        """The columns its filters compare (the day always)."""
        f = self.filters
        return ["day", *(n for n in ("agent", "model", "branch") if getattr(f, n) is not None)]


@dataclass(frozen=True, slots=True)
class TimelineQuery:
    filters: Filters = Filters()
    limit: int = TIMELINE_LIMIT
    cursor: str | None = None


@dataclass(frozen=True, slots=True)
class Figures:
    """What a row (or the whole) adds up to, each figure in the unit its name says."""

    turns: int = 0
    sessions: int = 0
    input_tokens: int = 0
    output_tokens: int = 0
    cache_read_tokens: int = 0
    cache_creation_tokens: int = 0
    cost_usd: float = 0.0
    reported_cost_usd: float = 0.0
    unpriced_turns: int = 0
    wall_seconds: float = 0.0
    nonzero_exits: int = 0

    def to_json(self) -> dict[str, Any]:
        return {
            "turns": self.turns,
            "sessions": self.sessions,
            "input_tokens": self.input_tokens,
            "output_tokens": self.output_tokens,
            "cache_read_tokens": self.cache_read_tokens,
            "cache_creation_tokens": self.cache_creation_tokens,
            "cost_usd": self.cost_usd,
            "reported_cost_usd": self.reported_cost_usd,
            "unpriced_turns": self.unpriced_turns,
            "wall_seconds": self.wall_seconds,
            "nonzero_exits": self.nonzero_exits,
        }


@dataclass(frozen=True, slots=True)
class LedgerPage:
    group_by: tuple[str, ...]
    since_day: int | None
    until_day: int | None  # the last day counted (inclusive)
    totals: Figures
    # Each row as answered: its key (each dimension of group_by: "day" an ISO date, any other
    # a text or None), then its figures (Figures.to_json's names).
    rows: list[dict[str, Any]]
    next_cursor: str | None


@dataclass(frozen=True, slots=True)
class TimelineEntry:
    turn: LedgerTurn
    cost_usd: float | None  # reported, else priced; None when neither

    def to_json(self) -> dict[str, Any]:
        t = self.turn
        return {
            "task_id": t.task_id,
            "turn": t.turn,
            "at": iso_us(t.at_us),
            "agent": t.agent or None,
            "model": t.model or None,
            "branch": t.branch or None,
            "session": t.session or None,
            "commit": t.git_commit or None,
            "input_tokens": t.input_tokens,
            "output_tokens": t.output_tokens,
            "cache_read_tokens": t.cache_read_tokens,
            "cache_creation_tokens": t.cache_creation_tokens,
            "cost_usd": self.cost_usd,
            "wall_seconds": t.wall_us / 1_000_000,
            "exit_code": t.exit_code,
        }


@dataclass(frozen=True, slots=True)
class TimelinePage:
    entries: list[TimelineEntry]
    next_cursor: str | None


@functools.lru_cache(maxsize=4096)
def day_iso(day: int) -> str:
    return iso_us(day * DAY_US)[:10]


def turn_cost(entry: LedgerTurn, prices: PriceTable) -> float | None:
    """A turn's cost in US dollars: reported, else priced; None when it is neither."""
    if entry.cost_nusd is not None:
        return entry.cost_nusd / NANO
    price = prices.get(entry.model)
    return None if price is None else price.of(entry.tokens)


# -- the SQL both engines read with ---------------------------------------------------------
# Each engine names its parameters its own way (``mark``) and its rows of one project its own
# way (``scope_where``: "" on the tree, whose ledger file is the project's; the project's key
# columns on PostgreSQL).
Mark = Callable[[str], str]


@dataclass(frozen=True, slots=True)
class Sql:
    text: str
    params: dict[str, Any]


def _prices_cte(prices: PriceTable, params: dict[str, Any], mark: Mark) -> str:
    rows = ["SELECT CAST(NULL AS TEXT), CAST(0 AS DOUBLE PRECISION), CAST(0 AS DOUBLE PRECISION),"
            " CAST(0 AS DOUBLE PRECISION), CAST(0 AS DOUBLE PRECISION) WHERE 1 = 0"]  # fmt: skip
    for i, (model, price) in enumerate(sorted(prices.items())):
        params[f"pm{i}"] = model
        cells = [f"CAST({mark(f'pm{i}')} AS TEXT)"]
        for j, value in enumerate(price.prices):
            params[f"p{i}_{j}"] = value
            cells.append(f"CAST({mark(f'p{i}_{j}')} AS DOUBLE PRECISION)")
        rows.append("SELECT " + ", ".join(cells))
    return "prices (pm, pi, po, pr, pc) AS (" + " UNION ALL ".join(rows) + ")"


# Whole numbers as BIGINT: PostgreSQL's sum of a bigint is a numeric, which Python reads as a
# Decimal; SQLite's is an integer already.
_COUNTS = ", ".join(
    f"CAST(sum(c.{n}) AS BIGINT)"
    for n in (
        "turns",
        "sessions",
        "input_tokens",
        "output_tokens",
        "cache_read_tokens",
        "cache_creation_tokens",
        "cost_nusd",
    )
)
_PRICED = (
    ", sum(c.open_input_tokens * coalesce(p.pi, 0) + c.open_output_tokens * coalesce(p.po, 0)"
    " + c.open_cache_read_tokens * coalesce(p.pr, 0)"
    " + c.open_cache_creation_tokens * coalesce(p.pc, 0)),"
    " CAST(sum(CASE WHEN p.pm IS NULL THEN c.turns - c.costed_turns ELSE 0 END) AS BIGINT),"
)
# Without a price table nothing is priced: no join, every turn without a cost unpriced.
_UNPRICED = ", 0, CAST(sum(c.turns - c.costed_turns) AS BIGINT),"
_REST = " CAST(sum(c.wall_us) AS BIGINT), CAST(sum(c.nonzero_exits) AS BIGINT)"
SUM_COUNT = 11


def figures_of(values: Sequence[Any]) -> Figures:
    """Figures from the sums of one row of ``ledger_sql`` (None where nothing was summed)."""
    (turns, sessions, i, o, r, c, cost_nusd, priced, unpriced, wall, nonzero) = (
        0 if v is None else v for v in values
    )
    reported = int(cost_nusd) / NANO
    return Figures(
        turns=int(turns),
        sessions=int(sessions),
        input_tokens=int(i),
        output_tokens=int(o),
        cache_read_tokens=int(r),
        cache_creation_tokens=int(c),
        cost_usd=round(reported + float(priced) / 1_000_000, 9),
        reported_cost_usd=round(reported, 9),
        unpriced_turns=int(unpriced),
        wall_seconds=int(wall) / 1_000_000,
        nonzero_exits=int(nonzero),
    )


def row_json(group_by: Sequence[str], values: Sequence[Any]) -> dict[str, Any]:
    """One row as answered, from its columns (``ledger_sql``'s: the key, then the sums): a
    page holds hundreds, so it is built in one pass, without a Figures between."""
    out: dict[str, Any] = {}
    for name, value in zip(group_by, values, strict=False):
        out[name] = day_iso(value) if name == "day" else (value or None)
    (turns, sessions, i, o, r, c, cost_nusd, priced, unpriced, wall, nonzero) = values[
        len(group_by) :
    ]
    reported = cost_nusd / NANO
    out.update(
        turns=turns,
        sessions=sessions,
        input_tokens=i,
        output_tokens=o,
        cache_read_tokens=r,
        cache_creation_tokens=c,
        cost_usd=round(reported + priced / 1_000_000, 9),
        reported_cost_usd=round(reported, 9),
        unpriced_turns=unpriced,
        wall_seconds=wall / 1_000_000,
        nonzero_exits=nonzero,
    )
    return out


def _where(filters: Filters, params: dict[str, Any], mark: Mark, scope_where: str) -> list[str]:
    terms = [scope_where] if scope_where else []
    first, last = filters.days
    if first is not None:
        params["first_day"] = first
        terms.append(f"c.day >= {mark('first_day')}")
    if last is not None:
        params["last_day"] = last
        terms.append(f"c.day <= {mark('last_day')}")
    for name in ("agent", "model", "branch"):
        value = getattr(filters, name)
        if value is not None:
            params[name] = value
            terms.append(f"c.{name} = {mark(name)}")
    return terms


def _after(
    columns: Sequence[str], descending: Sequence[bool], key: Sequence[Any], params: dict[str, Any],
    mark: Mark,
) -> str:  # fmt: skip
    """The rows after ``key`` in the order of ``columns`` (each ascending or not)."""
    alternatives = []
    for i, column in enumerate(columns):
        params[f"k{i}"] = key[i]
        same = [f"c.{columns[j]} = {mark(f'k{j}')}" for j in range(i)]
        same.append(f"c.{column} {'<' if descending[i] else '>'} {mark(f'k{i}')}")
        alternatives.append("(" + " AND ".join(same) + ")")
    return "(" + " OR ".join(alternatives) + ")"


def ledger_sql(
    query: LedgerQuery,
    prices: PriceTable,
    after: Sequence[Any] | None,
    *,
    mark: Mark,
    scope_where: str = "",
    scope_params: Mapping[str, Any] | None = None,
) -> tuple[Sql, Sql]:
    """(the totals, the page of rows) of ``query``: sums of the smallest rollup that holds
    its filters for the totals, and of the smallest that holds its grouping too for the rows,
    newest day first and each other key in byte order, after the key ``after``."""
    params: dict[str, Any] = dict(scope_params or {})
    cte, join, sums = "", "", _COUNTS + _UNPRICED + _REST
    if prices:
        cte = "WITH " + _prices_cte(prices, params, mark) + " "
        join = " LEFT JOIN prices p ON p.pm = c.model"
        sums = _COUNTS + _PRICED + _REST
    terms = _where(query.filters, params, mark, scope_where)
    where = (" WHERE " + " AND ".join(terms)) if terms else ""
    table = rollup_for(query.filtered)
    totals = Sql(f"{cte}SELECT {sums} FROM {table} c{join}{where}", dict(params))
    columns = [f"c.{COLUMNS[d]}" for d in query.group_by]
    if not columns:
        return totals, Sql("", {})
    names = [COLUMNS[d] for d in query.group_by]
    table = rollup_for([*names, *query.filtered])
    descending = [d == "day" for d in query.group_by]
    rows_terms = list(terms)
    if after is not None:
        rows_terms.append(_after(names, descending, after, params, mark))
    rows_where = (" WHERE " + " AND ".join(rows_terms)) if rows_terms else ""
    order = ", ".join(
        f"{c}{' DESC' if down else ''}" for c, down in zip(columns, descending, strict=True)
    )
    params["limit"] = query.limit + 1
    rows = Sql(
        f"{cte}SELECT {', '.join(columns)}, {sums} FROM {table} c{join}{rows_where}"
        f" GROUP BY {', '.join(columns)} ORDER BY {order} LIMIT {mark('limit')}",
        params,
    )
    return totals, rows


def timeline_sql(
    query: TimelineQuery,
    after: Sequence[Any] | None,
    *,
    mark: Mark,
    scope_where: str = "",
    scope_params: Mapping[str, Any] | None = None,
) -> Sql:
    """The page of turns of ``query``, newest first (``at``, then task id, then turn, each
    descending), after the key ``after``."""
    params: dict[str, Any] = dict(scope_params or {})
    terms = [scope_where] if scope_where else []
    f = query.filters
    if f.since_us is not None:
        params["since"] = f.since_us
        terms.append(f"c.at_us >= {mark('since')}")
    if f.until_us is not None:
        params["until"] = f.until_us
        terms.append(f"c.at_us < {mark('until')}")
    for name in ("agent", "model", "branch"):
        value = getattr(f, name)
        if value is not None:
            params[name] = value
            terms.append(f"c.{name} = {mark(name)}")
    if after is not None:
        params.update(a0=after[0], a1=after[1], a2=after[2])
        terms.append(f"(c.at_us, c.task_id, c.turn) < ({mark('a0')}, {mark('a1')}, {mark('a2')})")
    where = (" WHERE " + " AND ".join(terms)) if terms else ""
    params["limit"] = query.limit + 1
    columns = ", ".join(f"c.{n}" for n in ("task_id", "turn", *TURN_COLUMNS))
    return Sql(
        f"SELECT {columns} FROM ledger_turns c{where}"
        f" ORDER BY c.at_us DESC, c.task_id DESC, c.turn DESC LIMIT {mark('limit')}",
        params,
    )


def _scoped(scope_columns: Sequence[str]) -> str:
    return "".join(f"c.{k}, " for k in scope_columns)


def recount_sql(table: str, scope_columns: Sequence[str] = (), scope_where: str = "") -> str:
    """The rows rollup ``table`` (of ROLLUPS) should hold, recounted from ``ledger_turns``
    (fsck): ``scope_columns``, the key, then FIGURES, in key order. ``scope_columns``: the
    engine's project columns (none on the tree). One pass: each entry is marked as its
    session's home by a window over the entries, never a join (which a planner without
    statistics may run as a nested loop over every pair)."""
    keys = ROLLUPS[table]
    lead = _scoped(scope_columns)
    key = ", ".join(f"c.{k}" for k in keys)
    sums = ", ".join(f"sum({expr})" for expr in CONTRIBUTION_SQL)
    return (
        f"SELECT {lead}{key}, {sums}, sum(c.home) FROM ({_marked(scope_columns, scope_where)})"
        f" c GROUP BY {lead}{key} ORDER BY {lead}{key}"
    )


def _marked(scope_columns: Sequence[str], scope_where: str) -> str:
    """Every entry, with ``home`` 1 for its session's first turn (earliest ``at``, then task
    id, then turn) and 0 for any other (or a turn of no session), and ``n`` its rank."""
    lead = _scoped(scope_columns)
    where = f" WHERE {scope_where}" if scope_where else ""
    rank = f"row_number() OVER (PARTITION BY {lead}c.session ORDER BY c.at_us, c.task_id, c.turn)"
    return (
        f"SELECT c.*, CASE WHEN c.session <> '' AND {rank} = 1 THEN 1 ELSE 0 END AS home"
        f" FROM ledger_turns c{where}"
    )


def homes_sql(scope_columns: Sequence[str] = (), scope_where: str = "") -> str:
    """Each session's first turn (its home: earliest ``at``, then task id, then turn), as
    rows of ``scope_columns``, session, at_us, task_id, turn, day, agent, model, branch."""
    lead = _scoped(scope_columns)
    return (
        f"SELECT {lead}c.session, c.at_us, c.task_id, c.turn, c.day, c.agent, c.model, c.branch"
        f" FROM ({_marked(scope_columns, scope_where)}) c WHERE c.home = 1"
    )


# -- cursors ----------------------------------------------------------------------------------
CURSOR_VERSION = 1


def encode_cursor(
    codec: CursorCodec, scope: Scope, kind: str, issued_for: list[Any], key: Sequence[Any]
) -> str:
    return codec.encode(
        {"v": CURSOR_VERSION, "l": kind, "s": scope_tag(scope), "q": issued_for, "k": list(key)}
    )


def decode_cursor(
    codec: CursorCodec, scope: Scope, kind: str, issued_for: list[Any], cursor: str | None
) -> list[Any] | None:
    """The key a cursor of ``kind`` resumes after; InvalidName for one issued for another
    project, list or question (grouping, filters)."""
    if cursor is None:
        return None
    body = codec.decode(cursor, "cursor")
    key = body.get("k")
    if (
        body.get("v") != CURSOR_VERSION
        or body.get("l") != kind
        or body.get("s") != scope_tag(scope)
        or body.get("q") != issued_for
        or not isinstance(key, list)
    ):
        raise InvalidName("cursor", cursor, "is not a cursor this server issued for this list")
    return key


def ledger_issued_for(query: LedgerQuery) -> list[Any]:
    return [list(query.group_by), query.filters.selecting()]


def needs_totals(query: LedgerQuery, rows: Sequence[Sequence[Any]]) -> bool:
    """Whether the totals must be read apart: unless the rows read are every row of the
    answer (its first and only page), whose sums they are, every figure being a sum."""
    return not query.group_by or query.cursor is not None or len(rows) > query.limit


def ledger_page(
    query: LedgerQuery,
    totals: Sequence[Any] | None,
    rows: Sequence[Sequence[Any]],
    next_cursor: Callable[[Sequence[Any]], str],
) -> LedgerPage:
    """The answer to ``query`` from the rows its SQL read (``ledger_sql``); ``totals`` None:
    the sums of ``rows`` (:func:`needs_totals`)."""
    width = len(query.group_by)
    if totals is None:
        sums: list[Any] = [0] * SUM_COUNT
        for row in rows:
            for i, value in enumerate(row[width:]):
                sums[i] += value or 0
        totals = sums
    found = [row_json(query.group_by, r) for r in rows[: query.limit]]
    cursor = None
    if len(rows) > query.limit:
        cursor = next_cursor(rows[query.limit - 1][:width])
    first, last = query.filters.days
    return LedgerPage(query.group_by, first, last, figures_of(totals), found, cursor)


def by_owner(query: LedgerQuery) -> bool:
    """Whether ``query`` groups by the tasks' owners (read by :func:`owner_page`)."""
    return OWNER in query.group_by


def by_task_for_owners(query: LedgerQuery) -> LedgerQuery:
    """The question an owner grouping is answered from: every row of its days by task (the
    owner's place) and its other dimensions, whole (no cursor, no limit)."""
    names = ["task" if name == OWNER else name for name in query.group_by]
    return LedgerQuery(tuple(dict.fromkeys(names)), query.filters, 2**62, None)


def owner_page(
    query: LedgerQuery,
    task_rows: Sequence[Sequence[Any]],
    owners: Mapping[str, str | None],
    after: Sequence[Any] | None,
    next_cursor: Callable[[Sequence[Any]], str],
) -> LedgerPage:
    """The answer to ``query`` (which groups by owner) from ``task_rows``, the rows of
    :func:`by_task_for_owners`'s question, and ``owners``, each task's owner: summed by
    owner in the order and the pages the SQL of any other grouping gives ("" for a task of
    no known owner, first, as SQL orders an empty text)."""
    inner = by_task_for_owners(query).group_by
    task_at = inner.index("task")
    width = len(inner)
    sums: dict[tuple[Any, ...], list[Any]] = {}
    for row in task_rows:
        key = tuple(
            (owners.get(row[task_at]) or "") if name == OWNER else row[inner.index(name)]
            for name in query.group_by
        )
        found = sums.get(key)
        if found is None:
            sums[key] = [value or 0 for value in row[width:]]
        else:
            for i, value in enumerate(row[width:]):
                found[i] += value or 0
    descending = [name == "day" for name in query.group_by]

    def order(key: tuple[Any, ...]) -> tuple[Any, ...]:
        return tuple(-v if down else _text_key(v) for v, down in zip(key, descending, strict=True))

    keys = sorted(sums, key=order)
    totals: list[Any] = [0] * SUM_COUNT
    for figures in sums.values():
        for i, value in enumerate(figures):
            totals[i] += value or 0
    if after is not None:
        resume = order(tuple(after))
        keys = [k for k in keys if order(k) > resume]
    rows = [(*key, *sums[key]) for key in keys[: query.limit + 1]]
    found = [row_json(query.group_by, r) for r in rows[: query.limit]]
    cursor = (
        next_cursor(rows[query.limit - 1][: len(query.group_by)])
        if len(rows) > query.limit
        else None
    )
    first, last = query.filters.days
    return LedgerPage(query.group_by, first, last, figures_of(totals), found, cursor)


def _text_key(value: Any) -> tuple[int, Any]:
    """A key value in SQL's byte order of its text (None, then any text)."""
    if value is None:
        return (0, b"")
    return (1, value.encode("utf-8", "surrogatepass") if isinstance(value, str) else value)


def timeline_page(
    query: TimelineQuery,
    rows: Sequence[Sequence[Any]],
    prices: PriceTable,
    next_cursor: Callable[[Sequence[Any]], str],
) -> TimelinePage:
    entries = [row_of(r[0], r[1], r[2:]) for r in rows]
    cursor = None
    if len(entries) > query.limit:
        entries = entries[: query.limit]
        last = entries[-1]
        cursor = next_cursor([last.at_us, last.task_id, last.turn])
    return TimelinePage([TimelineEntry(e, turn_cost(e, prices)) for e in entries], cursor)
