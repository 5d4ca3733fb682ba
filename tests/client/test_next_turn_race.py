"""put_turn(task, "next") from eight writers at once: eight turns, none overwritten."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

import pytest
from project_memory_client import Client

from tests.e2e.conftest import Server

pytestmark = pytest.mark.e2e

WRITERS = 8


def test_eight_racing_writers_get_eight_distinct_turns(pm_server: Server, writer: str) -> None:
    start = threading.Barrier(WRITERS)

    def write(i: int) -> int:
        with Client(pm_server.url, writer) as pm:
            pm.get_task("race")  # connected and warm: the puts below leave together
            start.wait(timeout=30)
            return pm.put_turn(
                "race", "next", meta={"agent_id": f"w{i}"}, summary_md=f"writer {i}"
            ).turn

    with Client(pm_server.url, writer) as pm:
        pm.put_turn("race", 0, summary_md="the first turn, before the race")
        with ThreadPoolExecutor(WRITERS) as pool:
            turns = list(pool.map(write, range(WRITERS)))
        assert sorted(turns) == list(range(1, WRITERS + 1)), turns
        # Each writer's turn holds what that writer wrote: none was overwritten.
        for i, turn in enumerate(turns):
            record = pm.get_turn("race", turn)
            assert (record.summary_md, record.meta["agent_id"]) == (f"writer {i}", f"w{i}")
        assert pm.get_turn("race", 0).summary_md == "the first turn, before the race"
        assert pm.get_task("race").turn_count == WRITERS + 1
