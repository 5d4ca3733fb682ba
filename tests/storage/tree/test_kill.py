"""SIGKILL a writer process at random moments; the next writer repairs what it left.

Temp files a killed writer leaves behind are the sweeper's to collect (they are never read);
everything else must hold after the next write to each task: every acknowledged write is
there (or a newer one), artifact bytes match their records, and every derived file equals a
rebuild from the records.
"""

from __future__ import annotations

import hashlib
import multiprocessing
import os
import random
import signal
import time
from pathlib import Path

from app.storage.core.errors import NotFound
from app.storage.core.names import Scope
from app.storage.tree.tasks import TaskStore
from tests.storage import _workers
from tests.storage._helpers import assert_consistent, temp_files

SCOPE = Scope("acme", "web")
KILLS = 5


def test_sigkill_mid_write_then_the_next_writer_repairs(tmp_path: Path) -> None:
    root = tmp_path / "root"
    TaskStore(root)
    ctx = multiprocessing.get_context("spawn")
    rng = random.Random(1234)
    acked_turns: dict[tuple[str, int], int] = {}
    acked_artifacts: set[tuple[str, int, str]] = set()
    dirty_after_kill = 0
    for kill in range(KILLS):
        parent, child = ctx.Pipe(duplex=False)
        proc = ctx.Process(target=_workers.write_until_killed, args=(str(root), kill + 1, child))
        proc.start()
        child.close()
        assert parent.poll(60), "the writer never acknowledged a write"
        time.sleep(rng.uniform(0.0, 0.3))
        os.kill(proc.pid, signal.SIGKILL)
        proc.join(timeout=30)
        assert proc.exitcode == -signal.SIGKILL
        while True:
            try:
                msg = parent.recv()
            except EOFError:
                break
            if msg[0] == "turn":
                acked_turns[(msg[1], msg[2])] = msg[3]
                # A new turn value keeps the turn's artifacts; nothing else to track.
            else:
                acked_artifacts.add((msg[1], msg[2], msg[3]))
        parent.close()

        # Temp files of the killed write are the sweeper's: remove them as it would.
        for path in temp_files(root):
            if path.name.startswith(".~tmp-prev-"):
                continue  # a kept artifact copy: the next writer's repair decides its fate
            path.unlink()
        store = TaskStore(root, lock_timeout=30.0)
        dirty_after_kill += bool(store.txns.journal.pending())
        for task_id in ("k0", "k1", "k2"):
            # The next writer of each task (here: a turn nobody else writes).
            store.put_turn(SCOPE, task_id, 9000 + kill, meta={}, summary_md="after the kill")
        for (task_id, turn), i in acked_turns.items():
            rec = store.get_turn(SCOPE, task_id, turn)
            assert rec.meta["i"] >= i, "an acknowledged turn write was lost"
        for task_id, turn, name in acked_artifacts:
            rec = store.get_turn(SCOPE, task_id, turn)
            # Present (perhaps replaced by a later write of the same name since).
            info = next(a for a in rec.artifacts if a.name == name)
            art = store.open_artifact(SCOPE, task_id, turn, name)
            with art.file:
                data = art.file.read()
            assert hashlib.sha256(data).hexdigest() == info.sha256 and len(data) == info.size
        for task_id in ("k0", "k1", "k2"):
            try:
                index = store.get_task(SCOPE, task_id)
            except NotFound:
                continue
            for entry in index.turns:
                rec = store.get_turn(SCOPE, task_id, entry.turn)
                for info in rec.artifacts:
                    art = store.open_artifact(SCOPE, task_id, entry.turn, info.name)
                    with art.file:
                        assert hashlib.sha256(art.file.read()).hexdigest() == info.sha256
        assert_consistent(store, SCOPE)
        assert store.txns.journal.pending() == []
    assert acked_turns, "no write was acknowledged before the kills"
    print(f"kills that left a write in flight: {dirty_after_kill} of {KILLS}")
