"""A stateful property test: random operations and clock moves against an in-memory model.

After every step, every read (turn, task index, listing with total, digest, artifact bytes)
must agree with the model, including expiry: turns past retain_until are absent everywhere.
"""

from __future__ import annotations

import hashlib
import io
import shutil
import tempfile
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path

from hypothesis import settings, strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from app.storage.core.clock import iso_us, to_us
from app.storage.core.digest import nest_headings
from app.storage.core.errors import NotFound
from app.storage.core.names import Scope
from app.storage.tree.tasks import TaskStore
from tests.conftest import FixedClock
from tests.storage._helpers import read_digest, temp_files, upkeep_done

SCOPE = Scope("acme", "model")
RETENTION = timedelta(hours=1)
RETENTION_US = RETENTION // timedelta(microseconds=1)
TASKS = st.sampled_from(["a", "b", "c", "index.json"])
TURNS = st.integers(min_value=0, max_value=3)
NAMES = st.sampled_from(["x.bin", "y.txt"])


@dataclass
class ModelTurn:
    meta: dict[str, int]
    summary: str
    created_us: int
    updated_us: int
    artifacts: dict[str, tuple[bytes, str, int]] = field(default_factory=dict)

    @property
    def retain_us(self) -> int:
        return self.updated_us + RETENTION_US


class StoreMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.tmp = tempfile.mkdtemp()
        self.clock = FixedClock()
        self.store = TaskStore(
            Path(self.tmp) / "root", clock=self.clock, retention=RETENTION, lock_timeout=5.0
        )
        self.model: dict[str, dict[int, ModelTurn]] = {}
        # The clock at each task's last write: its digest section was chosen then.
        self.written: dict[str, int] = {}

    def teardown(self) -> None:
        shutil.rmtree(self.tmp, ignore_errors=True)

    # -- helpers -------------------------------------------------------------------------------
    @property
    def now(self) -> int:
        return to_us(self.clock.now)

    def alive(self, task_id: str, at: int | None = None) -> dict[int, ModelTurn]:
        at = self.now if at is None else at
        return {n: t for n, t in self.model.get(task_id, {}).items() if t.retain_us > at}

    def next_version(self, task_id: str) -> int:
        last = max((t.updated_us for t in self.model.get(task_id, {}).values()), default=0)
        return max(self.now, last + 1)

    # -- operations ----------------------------------------------------------------------------
    @rule(task_id=TASKS, turn=TURNS, value=st.integers(0, 99), summary=st.text(max_size=30))
    def put_turn(self, task_id: str, turn: int, value: int, summary: str) -> None:
        rec = self.store.put_turn(SCOPE, task_id, turn, meta={"v": value}, summary_md=summary)
        prev = self.alive(task_id).get(turn)
        version = self.next_version(task_id)
        new = ModelTurn(
            meta={"v": value},
            summary=summary,
            created_us=prev.created_us if prev else version,
            updated_us=version,
            artifacts=dict(prev.artifacts) if prev else {},
        )
        self.model.setdefault(task_id, {})[turn] = new
        self.written[task_id] = self.now
        assert rec.updated_us == version
        assert rec.created_at == iso_us(new.created_us)

    @rule(task_id=TASKS, turn=TURNS, name=NAMES, size=st.integers(0, 3000))
    def put_artifact(self, task_id: str, turn: int, name: str, size: int) -> None:
        data = hashlib.sha256(f"{task_id}{turn}{name}{size}{self.now}".encode()).digest() * (
            size // 32 + 1
        )
        data = data[:size]
        target = self.alive(task_id).get(turn)
        try:
            info = self.store.put_artifact(
                SCOPE, task_id, turn, name, io.BytesIO(data), content_type=f"x/{size}"
            )
        except NotFound:
            assert target is None
            return
        assert target is not None, "an artifact was stored on a turn that is not alive"
        version = self.next_version(task_id)
        target.updated_us = version
        target.artifacts[name] = (data, f"x/{size}", version)
        self.written[task_id] = self.now
        assert info.size == size and info.updated_at == iso_us(version)

    @rule(task_id=TASKS)
    def delete_task(self, task_id: str) -> None:
        try:
            self.store.delete_task(SCOPE, task_id)
        except NotFound:
            assert not self.alive(task_id)
            return
        assert self.alive(task_id)
        self.model.pop(task_id, None)

    @rule(step=st.sampled_from([0, 1, 1_000_000, 30 * 60 * 10**6, RETENTION_US, 2 * RETENTION_US]))
    def advance(self, step: int) -> None:
        self.clock.advance(microseconds=step)

    @rule(back=st.sampled_from([1, 1_000_000]))
    def clock_steps_back(self, back: int) -> None:
        self.clock.advance(microseconds=-back)

    # -- what every reader must see -----------------------------------------------------------
    @invariant()
    def turns_and_artifacts_match(self) -> None:
        for task_id, turns in self.model.items():
            for n, t in turns.items():
                if t.retain_us <= self.now:
                    try:
                        self.store.get_turn(SCOPE, task_id, n)
                    except NotFound:
                        continue
                    raise AssertionError(f"expired turn {task_id}/{n} is readable")
                rec = self.store.get_turn(SCOPE, task_id, n)
                assert (rec.meta, rec.summary_md) == (t.meta, t.summary)
                assert rec.created_at == iso_us(t.created_us)
                assert rec.updated_at == iso_us(t.updated_us)
                assert rec.retain_until == iso_us(t.retain_us)
                assert {a.name for a in rec.artifacts} == set(t.artifacts)
                for name, (data, ctype, _) in t.artifacts.items():
                    art = self.store.open_artifact(SCOPE, task_id, n, name)
                    with art.file:
                        assert art.file.read() == data
                    assert art.info.content_type == ctype

    @invariant()
    def task_indexes_match(self) -> None:
        for task_id in ("a", "b", "c", "index.json"):
            alive = self.alive(task_id)
            try:
                index = self.store.get_task(SCOPE, task_id)
            except NotFound:
                assert not alive, f"task {task_id} with live turns is not found"
                continue
            assert [e.turn for e in index.turns] == sorted(alive)
            assert index.updated_at == iso_us(max(t.updated_us for t in alive.values()))

    @invariant()
    def listing_and_digest_match(self) -> None:
        listed = []
        for task_id in self.model:
            alive = self.alive(task_id)
            if alive:
                version = max(t.updated_us for t in self.model[task_id].values())
                listed.append((version, task_id, alive))
        listed.sort(key=lambda x: (x[0], x[1]), reverse=True)
        page = self.store.list_tasks(SCOPE, limit=1000)
        assert [t.task_id for t in page.tasks] == [x[1] for x in listed]
        assert page.total == len(listed)
        for summary, (_, _, alive) in zip(page.tasks, listed, strict=True):
            assert summary.turn_count == len(alive) and summary.latest_turn == max(alive)
        text = f"# Project memory: {SCOPE.tenant}/{SCOPE.project}\n"
        if not listed:
            text += "\nNo tasks yet.\n"
        for _, task_id, _ in listed:
            # A write chose the section at its own clock; a clock that later steps back does
            # not bring a turn that write saw expired into the digest (the listing, counted
            # at each read, does show it again).
            alive = self.alive(task_id, max(self.now, self.written.get(task_id, 0)))
            if not alive:
                continue
            n = max(alive)
            # Heading nesting has its own cases (test_digest.py); here the model checks which
            # turn each section shows and in what order.
            summary_md = nest_headings(alive[n].summary)
            if summary_md and not summary_md.endswith("\n"):
                summary_md += "\n"
            text += (
                f"\n## {task_id}\n\nLatest turn: {n}, updated {iso_us(alive[n].updated_us)}"
                f"\n\n{summary_md}"
            )
        assert read_digest(self.store, SCOPE) == text
        # A delete's purge rewrites the digest after the answer, through a temp file.
        upkeep_done(self.store)
        assert temp_files(self.store.layout.root) == []


StoreMachine.TestCase.settings = settings(max_examples=20, stateful_step_count=20, deadline=None)
test_store_against_a_model = StoreMachine.TestCase


def test_a_clock_stepping_back_over_an_expiry_after_a_write() -> None:
    """Turn 1 expires, turn 0 is written at that instant, then the clock steps back 1 µs."""
    machine = StoreMachine()
    try:
        machine.put_turn(task_id="b", turn=1, value=0, summary="")
        machine.advance(step=RETENTION_US)
        machine.put_turn(task_id="b", turn=0, value=0, summary="")
        machine.clock_steps_back(back=1)
        machine.listing_and_digest_match()
        machine.task_indexes_match()
        machine.turns_and_artifacts_match()
    finally:
        machine.teardown()
