"""The lock excludes across processes and across the threads of each, at once.

Real processes (spawned interpreters) with several threads each take one lock path over and
over; while holding it, each creates an ``O_EXCL`` marker file and does a read-modify-write of
a counter file with a pause in between, so two holders at once would show as a marker that
already exists or as a lost update. A control run with no lock shows the check catches both.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

REPO = Path(__file__).resolve().parents[4]

HAMMER = textwrap.dedent(
    """
    import contextlib, json, os, sys, threading, time
    from pathlib import Path
    from app.storage.tree.fs.locks import locked

    lock, counter, marker = Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3]
    threads, rounds, use_lock = int(sys.argv[4]), int(sys.argv[5]), sys.argv[6] == "lock"
    overlaps = []

    def hold():
        return locked(lock, 60.0) if use_lock else contextlib.nullcontext()

    def run():
        for _ in range(rounds):
            with hold():
                try:
                    fd = os.open(marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
                    os.close(fd)
                except FileExistsError:
                    overlaps.append(1)
                value = int(counter.read_text() or "0")
                time.sleep(0.0005)  # the window another holder would fall into
                counter.write_text(str(value + 1))
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(marker)

    workers = [threading.Thread(target=run) for _ in range(threads)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    print(json.dumps({"overlaps": len(overlaps)}))
    """
)


def hammer(tmp_path: Path, *, processes: int, threads: int, rounds: int, lock: bool) -> tuple:
    counter = tmp_path / "counter"
    counter.write_text("0")
    args = [str(tmp_path / "locks" / "one.lock"), str(counter), str(tmp_path / "holder")]
    args += [str(threads), str(rounds), "lock" if lock else "none"]
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", HAMMER, *args],
            cwd=REPO,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )  # fmt: skip
        for _ in range(processes)
    ]
    overlaps = 0
    for proc in procs:
        out, err = proc.communicate(timeout=120)
        assert proc.returncode == 0, err
        overlaps += json.loads(out.strip().splitlines()[-1])["overlaps"]
    return int(counter.read_text()), overlaps


def test_processes_and_their_threads_hold_the_lock_one_at_a_time(tmp_path: Path) -> None:
    total, overlaps = hammer(tmp_path, processes=3, threads=3, rounds=40, lock=True)
    assert overlaps == 0
    assert total == 3 * 3 * 40


def test_without_the_lock_the_check_sees_overlaps_and_lost_updates(tmp_path: Path) -> None:
    total, overlaps = hammer(tmp_path, processes=3, threads=3, rounds=40, lock=False)
    # Lost updates, or a counter two unguarded writes garbled into another number (one
    # process's "9" written over another's "961"): either way not the count of increments.
    assert overlaps > 0 and total != 3 * 3 * 40


def test_a_lock_held_when_a_process_forks_is_not_the_childs(tmp_path: Path) -> None:
    """A child forked while its parent holds the lock (a gunicorn worker forked from a
    master, say) must wait for it like any other process, not share the parent's hold."""
    from app.storage.core.errors import LockTimeout
    from app.storage.tree.fs.locks import locked

    path = tmp_path / "locks" / "one.lock"
    with locked(path, 5.0):
        pid = os.fork()
        if pid == 0:  # the child: exit status 0 only if the lock timed out
            code = 1
            with contextlib.suppress(BaseException):
                try:
                    with locked(path, 0.3):
                        code = 2
                except LockTimeout:
                    code = 0
            os._exit(code)
        _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    with locked(path, 5.0):  # and the parent's release left it free
        pass


def test_a_holder_killed_mid_hold_frees_the_lock(tmp_path: Path) -> None:
    from app.storage.tree.fs.locks import locked

    path = tmp_path / "locks" / "one.lock"
    holder = subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(
            f"""
            import sys, time
            from pathlib import Path
            from app.storage.tree.fs.locks import locked
            with locked(Path({str(path)!r}), 5.0):
                print("held", flush=True)
                time.sleep(120)
            """
        )],
        cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)}, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        holder.kill()
        holder.wait(timeout=30)
        with locked(path, 5.0):
            pass
    finally:
        if holder.poll() is None:
            holder.kill()
            holder.wait()
        assert holder.stdout is not None
        holder.stdout.close()
