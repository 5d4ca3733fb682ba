"""Power-loss cycles against the real server: every acknowledged write survives, recovery is clean.

    python -m tests.powerloss.harness [--cycles N] [--seed S] [--writers W]
                                      [--kill-in-recovery P] [--keep]

``LAZYFS=/path/to/lazyfs`` runs it on LazyFS; without it, on the simulator (simfs.py).
``--group-commit`` runs the server under group commit, on the simulator with ext4's ordering
and its flush as a command to the simulator (simfs.py ``--ext4``, groupcommit/sitecustomize.py).

The storage root lives on a power-loss filesystem (mount.py). One cycle:

1. writers (threads, each with keys of its own) put turns (new and replaced), artifacts (new
   and replaced) and memories of a memory store (created, updated, deleted) through a real
   gunicorn (``-c gunicorn.conf.py``, 2 workers), recording every attempt and its answer;
2. at a random moment the whole server, master and workers, is SIGKILLed;
3. the power is cut: everything nobody fsynced is dropped (``lazyfs::clear-cache``);
4. the server starts again on the same root, and its start-up recovery runs (a third of
   these starts are SIGKILLed again within 1.5 s, and started once more); the checks wait
   for ``/readyz``;
5. ``flask --app wsgi fsck`` must report the tree clean;
6. every key written in the cycle must hold what its last acknowledged write put there, or
   what a later unanswered write put there (it may have reached its commit point before the
   kill); never an older state, never anything else. Artifacts and memory contents are
   compared byte for byte, turn ETags and memory heads with the acknowledged ones, and every
   acknowledged memory version is read back by its id.

Every 10 cycles a new storage root (with a new server and memory store) takes over, and
every key written on the old one is checked once more: the full check after a cut reads the
whole tree, and a root that kept growing would make a cycle ever longer. The counts go to
stdout; the exit status is 0 only when nothing acknowledged was lost and every fsck after a
recovery was clean.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import requests

from app.storage.core.models import DEFAULT_GRACE
from tests.e2e.conftest import REPO, VENV_BIN
from tests.powerloss.mount import PowerLossMount, lazyfs_binary, mounted
from tests.robust.helpers import BASE, Live, auth

TASKS_PER_WRITER = 2
MEMORY_PATHS_PER_WRITER = 3
# Up to 150 kB: more than one FUSE write (128 KiB), and a full check that reads every
# artifact back stays a few seconds long after 50 cycles.
ARTIFACT_SIZES = (1, 3000, 40_000, 150_000)
WRITE_SECONDS = (0.3, 2.5)  # the kill comes at a random moment in this window
# A third of the restarts after a cut are killed again while they recover (in this window),
# without a cut: the next start must still repair what the power loss left.
KILL_IN_RECOVERY = 1 / 3
RECOVERY_KILL_SECONDS = (0.0, 1.5)
# The full check after a cut reads the whole tree back: a new storage root every 10 cycles
# keeps a cycle a few seconds long.
CYCLES_PER_ROOT = 10
ABSENT = ("absent",)
REQUEST_TIMEOUT = 30


# -- the model: what each key may hold --------------------------------------------------------------
@dataclass
class Attempt:
    state: tuple[Any, ...]
    acked: bool
    cycle: int
    counted: bool = True  # False: a change another write made (an artifact moves its turn's ETag)


@dataclass
class KeyLog:
    """Writes to one key, in order. A key is written by one writer, one write at a time."""

    attempts: list[Attempt] = field(default_factory=list)

    def last_acked(self) -> int | None:
        return max((i for i, a in enumerate(self.attempts) if a.acked), default=None)

    def allowed(self) -> list[tuple[Any, ...]]:
        """The states a reader may see: the last acknowledged one or any later one."""
        last = self.last_acked()
        if last is None:
            return [ABSENT, *(a.state for a in self.attempts)]
        return [a.state for a in self.attempts[last:]]


def matches(seen: tuple[Any, ...], want: tuple[Any, ...]) -> bool:
    """``want`` may leave a field it did not learn (an unanswered write's ETag) as None."""
    return len(seen) == len(want) and all(
        w is None or s == w for s, w in zip(seen, want, strict=True)
    )


@dataclass
class Stats:
    acked: int = 0
    unanswered: int = 0
    refused: int = 0  # a definite "no" (409, 412, 404 on a turn a dead write never made)
    checked: int = 0
    superseded: int = 0
    lost: dict[tuple[Any, ...], str] = field(default_factory=dict)  # key -> what was found
    unexpected: dict[tuple[Any, ...], str] = field(default_factory=dict)
    bad_status: list[str] = field(default_factory=list)


class Model:
    """Every attempt of every writer on one storage root, and what the checks found."""

    def __init__(self, stats: Stats) -> None:
        self.lock = threading.Lock()
        self.keys: dict[tuple[Any, ...], KeyLog] = {}
        self.touched: set[tuple[Any, ...]] = set()
        self.cycle = 0
        self.stats = stats

    def record(
        self, key: tuple[Any, ...], state: tuple[Any, ...], acked: bool, *, count: bool = True
    ) -> None:
        """One write to ``key``; ``count=False``: a change another write made to it."""
        with self.lock:
            attempt = Attempt(state, acked, self.cycle, count)
            self.keys.setdefault(key, KeyLog()).attempts.append(attempt)
            self.touched.add(key)
            if count and acked:
                self.stats.acked += 1
            elif count:
                self.stats.unanswered += 1

    def refused(self) -> None:
        with self.lock:
            self.stats.refused += 1

    def bad(self, text: str) -> None:
        with self.lock:
            self.stats.bad_status.append(text)


# -- the writers ------------------------------------------------------------------------------------
class Unanswered(Exception):
    """The request got no answer (the server was killed under it)."""


@dataclass
class Target:
    """Where the writers send requests: the server of the current cycle."""

    url: str = ""
    store: str = ""  # the memory store's id
    secret: str = ""


class Writer:
    """One client with keys of its own: two tasks and three memory paths."""

    def __init__(self, index: int, model: Model, target: Target, seed: int) -> None:
        self.index = index
        self.model = model
        self.target = target
        self.rng = random.Random(seed)
        self.tasks = [f"w{index}-t{j}" for j in range(TASKS_PER_WRITER)]
        self.turns: dict[str, set[int]] = {t: set() for t in self.tasks}  # acknowledged turns
        self.next_turn = dict.fromkeys(self.tasks, 0)
        self.artifacts: dict[tuple[str, int], set[str]] = {}
        self.paths = [f"/w{index}/m{k}.md" for k in range(MEMORY_PATHS_PER_WRITER)]
        # path -> memory id (live), None (no memory there), or missing (unknown: resync first)
        self.memories: dict[str, str | None] = dict.fromkeys(self.paths)
        self.n = 0
        self.session = requests.Session()

    # -- requests --------------------------------------------------------------------------------
    def call(self, method: str, path: str, **kwargs: Any) -> requests.Response:
        try:
            return self.session.request(
                method,
                f"{self.target.url}{path}",
                headers={**auth(self.target.secret), **kwargs.pop("headers", {})},
                timeout=REQUEST_TIMEOUT,
                **kwargs,
            )
        except requests.RequestException as exc:
            raise Unanswered(str(exc)) from None

    def answered(
        self, key: tuple[Any, ...], state: tuple[Any, ...], resp: requests.Response
    ) -> bool:
        if resp.status_code == 200:
            self.model.record(key, state, True)
            return True
        if resp.status_code in (404, 409, 412):
            self.model.refused()
        else:
            # Nothing but 200 is expected while the server runs; 503 (busy) is still recorded
            # as a write that may have happened, like any answer that is not a success.
            self.model.bad(
                f"{resp.status_code} {resp.request.method} {resp.url}: {resp.text[:200]}"
            )
        self.model.record(key, state, False)
        return False

    # -- operations ------------------------------------------------------------------------------
    def step(self) -> None:
        self.n += 1
        task = self.rng.choice(self.tasks)
        op = self.rng.random()
        try:
            if not self.turns[task] or op < 0.30:
                self.put_turn(task, self.next_turn[task], new=True)
            elif op < 0.40:
                self.put_turn(task, self.rng.choice(sorted(self.turns[task])), new=False)
            elif op < 0.62:
                self.put_artifact(task, self.rng.choice(sorted(self.turns[task])), op < 0.55)
            else:
                self.memory_op()
        except Unanswered:
            time.sleep(0.01)

    def put_turn(self, task: str, turn: int, *, new: bool) -> None:
        if new:
            self.next_turn[task] = turn + 1
        meta = {"writer": self.index, "n": self.n, "cycle": self.model.cycle, "new": new}
        summary = f"# w{self.index} n{self.n} ✓ é\n" + "s" * self.rng.randint(0, 4000)
        key = ("turn", task, turn)
        state = (json.dumps(meta, sort_keys=True), summary, None)
        try:
            resp = self.call(
                "PUT",
                f"{BASE}/tasks/{task}/turns/{turn}",
                json={"meta": meta, "summary_md": summary},
            )
        except Unanswered:
            self.model.record(key, state, False)
            self.turns[task].discard(turn)  # unknown until checked: write no artifact to it
            raise
        if self.answered(key, (*state[:2], resp.headers.get("ETag")), resp):
            self.turns[task].add(turn)
            # The record kept the artifacts the turn had.

    def put_artifact(self, task: str, turn: int, new: bool) -> None:
        names = self.artifacts.setdefault((task, turn), set())
        name = f"a{self.n}.bin" if new or not names else self.rng.choice(sorted(names))
        body = self.rng.randbytes(self.rng.choice(ARTIFACT_SIZES))
        kind = f"application/x-w{self.index}-n{self.n}"
        sha = hashlib.sha256(body).hexdigest()
        key = ("artifact", task, turn, name)
        state = (sha, kind, len(body))
        turn_key = ("turn", task, turn)
        last = self.model.keys[turn_key]
        meta, summary = last.attempts[last.last_acked() or 0].state[:2]
        try:
            resp = self.call(
                "PUT",
                f"{BASE}/tasks/{task}/turns/{turn}/artifacts/{name}",
                data=body,
                headers={"Content-Type": kind},
            )
        except Unanswered:
            self.model.record(key, state, False)
            # It may have committed, and an artifact write moves its turn's ETag.
            self.model.record(turn_key, (meta, summary, None), False, count=False)
            names.discard(name)
            raise
        if not self.answered(key, state, resp):
            return
        names.add(name)
        # The turn's new ETag: nobody else writes this task, so a read now sees this write.
        etag = None
        with contextlib.suppress(Unanswered):
            got = self.call("GET", f"{BASE}/tasks/{task}/turns/{turn}")
            if got.status_code == 200:
                etag = got.headers.get("ETag")
        self.model.record(turn_key, (meta, summary, etag), True, count=False)

    def memory_op(self) -> None:
        known = [p for p in self.paths if p in self.memories]
        if not known:
            return
        path = self.rng.choice(known)
        memory_id = self.memories.pop(path)  # unknown until this write is answered
        base = f"/v1/memory_stores/{self.target.store}/memories"
        key = ("memory", path)
        if memory_id is not None and self.rng.random() < 0.25:
            try:
                resp = self.call("DELETE", f"{base}/{memory_id}")
            except Unanswered:
                self.model.record(key, ABSENT, False)
                raise
            if self.answered(key, ABSENT, resp):
                self.memories[path] = None
            return
        content = f"memory {path} of w{self.index}, write {self.n} — ✓\n"
        content += "m" * self.rng.randint(0, 3000)
        sha = hashlib.sha256(content.encode()).hexdigest()
        try:
            if memory_id is None:
                resp = self.call("POST", base, json={"path": path, "content": content})
            else:
                resp = self.call("POST", f"{base}/{memory_id}", json={"content": content})
        except Unanswered:
            self.model.record(key, ("live", sha, None), False)
            raise
        body = resp.json() if resp.status_code == 200 else {}
        if self.answered(key, ("live", sha, body.get("memory_version_id")), resp):
            self.memories[path] = body["id"]
            version = body["memory_version_id"]
            self.model.record(("version", version), (body["id"], path, sha, content), True)

    def resync(self, live: dict[str, tuple[str, str, str]]) -> None:
        """Take the server's word for this writer's memories (after a check found it allowed)."""
        self.memories = {p: (live[p][0] if p in live else None) for p in self.paths}

    def run(self, stop: threading.Event) -> None:
        while not stop.is_set():
            self.step()


# -- the checks -------------------------------------------------------------------------------------
class Checker:
    """Reads every key back through the restarted server."""

    def __init__(self, model: Model, target: Target) -> None:
        self.model = model
        self.target = target
        self.session = requests.Session()

    def get(self, path: str, **params: str) -> requests.Response:
        for _ in range(50):
            resp = self.session.get(
                f"{self.target.url}{path}",
                params=params,
                headers=auth(self.target.secret),
                timeout=REQUEST_TIMEOUT,
            )
            if resp.status_code != 503:
                return resp
            time.sleep(0.1)
        return resp

    def live_memories(self) -> dict[str, tuple[str, str, str]] | tuple[Any, ...]:
        """path -> (memory id, content sha256, head version id), from the listing; an error
        state when the listing fails."""
        out: dict[str, tuple[str, str, str]] = {}
        page: str | None = None
        while True:
            params = {"limit": "100", **({"page": page} if page else {})}
            resp = self.get(f"/v1/memory_stores/{self.target.store}/memories", **params)
            if resp.status_code != 200:
                return _error("listing", resp)
            body = resp.json()
            for item in body["data"]:
                if item.get("type") == "memory":
                    out[item["path"]] = (
                        item["id"],
                        item["content_sha256"],
                        item["memory_version_id"],
                    )
            page = body.get("next_page")
            if not page:
                return out

    def observe(
        self, key: tuple[Any, ...], memories: dict[str, tuple[str, str, str]] | tuple[Any, ...]
    ) -> tuple[Any, ...]:
        """What a reader gets for ``key`` now: a state comparable with the model's, ABSENT,
        or an error state (which matches nothing)."""
        kind = key[0]
        if kind == "turn":
            resp = self.get(f"{BASE}/tasks/{key[1]}/turns/{key[2]}")
            if resp.status_code != 200:
                return ABSENT if resp.status_code == 404 else _error("turn", resp)
            body = resp.json()
            return (
                json.dumps(body["meta"], sort_keys=True),
                body["summary_md"],
                resp.headers["ETag"],
            )
        if kind == "artifact":
            resp = self.get(f"{BASE}/tasks/{key[1]}/turns/{key[2]}/artifacts/{key[3]}")
            if resp.status_code != 200:
                return ABSENT if resp.status_code == 404 else _error("artifact", resp)
            sha = hashlib.sha256(resp.content).hexdigest()
            if resp.headers.get("ETag") != f'"{sha}"':
                return ("etag-mismatch", resp.headers.get("ETag"), sha)
            return (sha, resp.headers.get("Content-Type"), len(resp.content))
        if kind == "memory":
            if not isinstance(memories, dict):
                return memories  # the listing failed
            found = memories.get(key[1])
            if found is None:
                return ABSENT
            memory_id, sha, head = found
            resp = self.get(f"/v1/memory_stores/{self.target.store}/memories/{memory_id}")
            if resp.status_code != 200:
                return _error("memory", resp)
            body = resp.json()
            if hashlib.sha256(body["content"].encode()).hexdigest() != sha:
                return ("content-mismatch", memory_id, sha)
            return ("live", sha, head)
        resp = self.get(f"/v1/memory_stores/{self.target.store}/memory_versions/{key[1]}")
        if resp.status_code != 200:
            return ABSENT if resp.status_code == 404 else _error("version", resp)
        body = resp.json()
        return (body["memory_id"], body["path"], body["content_sha256"], body["content"])

    def check(self, keys: set[tuple[Any, ...]], cycle: int | None) -> tuple[int, list[str]]:
        """Check ``keys``; count the acknowledged writes of ``cycle`` (None: of any cycle) checked.

        Returns (checked, problems). An acknowledged write is checked through its key: the
        last acknowledged write of each key; earlier ones the writer itself replaced are
        counted as superseded.
        """
        memories = self.live_memories()
        checked, problems = 0, []
        stats = self.model.stats
        for key in sorted(keys, key=repr):
            log = self.model.keys[key]
            seen = self.observe(key, memories)
            allowed = log.allowed()
            last = log.last_acked()
            acked_here = [
                a
                for a in log.attempts
                if a.acked and a.counted and (cycle is None or a.cycle == cycle)
            ]
            if acked_here:
                checked += 1
                stats.superseded += len(acked_here) - 1 if cycle is not None else 0
            if any(matches(seen, want) for want in allowed):
                continue
            where = "LOST" if last is not None else "UNEXPECTED"
            problem = (
                f"{where} {key}: holds {_short(seen)}; the last acknowledged write "
                f"(cycle {log.attempts[last].cycle if last is not None else '-'}) put "
                f"{_short(log.attempts[last].state) if last is not None else 'nothing'}; "
                f"{len(log.attempts)} attempt(s)"
            )
            problems.append(problem)
            (stats.lost if last is not None else stats.unexpected)[key] = problem
        return checked, problems


def _error(what: str, resp: requests.Response) -> tuple[Any, ...]:
    return ("error", what, resp.status_code, resp.text[:120])


def _short(state: tuple[Any, ...]) -> str:
    return "(" + ", ".join(str(s)[:24] for s in state) + ")"


# -- the server -------------------------------------------------------------------------------------
def kill_server(server: Live) -> None:
    """SIGKILL master and workers at once, and wait until none of them is left."""
    assert server.proc is not None
    pgid = server.proc.pid
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pgid, signal.SIGKILL)
    server.proc.wait(timeout=30)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.01)
    raise RuntimeError("a worker of the killed server is still alive")


RECOVERY_FAILED = re.compile(r".*(?:recovery failed|full check failed|Traceback).*")


def recovery_line(server: Live) -> str:
    """What the server said about its start-up recovery, and its full check if it ran one."""
    text = server.log()
    why = re.findall(r"previous run did not shut down cleanly.*", text)
    full = re.findall(r"full check after .*", text)
    return "; ".join(why[-1:] + full[-1:])[:300] or "the log says nothing of a recovery"


def restart_killed(server: Live, delay: float) -> bool:
    """Start the server and SIGKILL it ``delay`` seconds later; whether that was before it
    was ready (during its recovery)."""
    timer = threading.Timer(delay, kill_server, args=(server,))
    timer.start()
    try:
        server.start()
        wait_ready(server)
    except RuntimeError:
        timer.join()
        return True
    timer.join()
    if server.proc is not None and server.proc.poll() is None:
        kill_server(server)  # the timer fired before the new server was spawned
    return False


def wait_ready(server: Live, timeout: float = 600.0) -> None:
    """Wait for /readyz: a recovery may go on after the server listens (it answers 503)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if server.proc is None or server.proc.poll() is not None:
            raise RuntimeError(f"the server exited before it was ready:\n{server.log()[-2000:]}")
        with contextlib.suppress(requests.RequestException):
            if requests.get(f"{server.url}/readyz", timeout=5).status_code == 200:
                return
        time.sleep(0.05)
    raise RuntimeError(f"the server was not ready {timeout:.0f}s after its start:\n{server.log()}")


def fsck_cli(server: Live, since: float) -> tuple[bool, str]:
    """``flask --app wsgi fsck``, as of the moment the recovery that started at ``since``
    (time.monotonic()) began: with the grace period stretched by the time since then.

    Temp files younger than the grace period are writes in flight to fsck, left in place by
    the recovery's repair; a dead writer's temp file that crossed the grace period between the
    repair and this check would otherwise be reported, depending only on when the check ran.
    """
    grace = DEFAULT_GRACE.total_seconds() + (time.monotonic() - since)
    done = subprocess.run(
        [str(VENV_BIN / "flask"), "--app", "wsgi", "fsck", "--grace-minutes", f"{grace / 60:.4f}"],
        cwd=REPO,
        env=server.env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    return done.returncode == 0 and "fsck: clean" in done.stdout, (
        done.stdout + done.stderr
    ).strip()


# -- the run ----------------------------------------------------------------------------------------
@dataclass
class RunResult:
    kind: str
    cycles: int = 0
    fsck_clean: int = 0
    fsck_failures: list[str] = field(default_factory=list)
    # A recovery that raised (and left its work to the full check) is a bug even when the
    # check then ends clean.
    recovery_failures: list[str] = field(default_factory=list)
    recovery_seconds: list[float] = field(default_factory=list)
    recovery_kills: int = 0
    stats: Stats = field(default_factory=Stats)
    checked: int = 0

    @property
    def ok(self) -> bool:
        return (
            not self.stats.lost
            and not self.stats.unexpected
            and not self.stats.bad_status
            and self.fsck_clean == self.cycles
            and not self.recovery_failures
            and self.checked > 0
        )

    def summary(self) -> str:
        s = self.stats
        times = sorted(self.recovery_seconds) or [0.0]
        return (
            f"powerloss ({self.kind}): cycles {self.cycles}, acknowledged writes {s.acked}, "
            f"checked {self.checked} (superseded by the writer's own later write: {s.superseded}), "
            f"lost {len(s.lost)}, unexpected {len(s.unexpected)}, "
            f"fsck clean after {self.fsck_clean}/{self.cycles} recoveries "
            f"({self.recovery_kills} of them after a kill during the recovery), "
            f"recoveries that failed {len(self.recovery_failures)}; "
            f"unanswered writes {s.unanswered}, refused {s.refused}, other statuses "
            f"{len(s.bad_status)}; restart with recovery {times[len(times) // 2]:.1f}s median, "
            f"{times[-1]:.1f}s max (start to /readyz)"
        )


def run(
    fs: PowerLossMount,
    workdir: Path,
    cycles: int,
    seed: int,
    writers: int,
    log: Callable[[str], None],
    kill_in_recovery: float = KILL_IN_RECOVERY,
    per_root: int = CYCLES_PER_ROOT,
    group_commit: bool = False,
) -> RunResult:
    """``cycles`` cycles, on a new storage root every ``per_root`` of them."""
    rng = random.Random(seed)
    result = RunResult(fs.kind)
    first = 1
    while first <= cycles:
        last = min(cycles, first + per_root - 1)
        number = (first - 1) // per_root + 1
        log(f"storage root {number}: cycles {first} to {last}")
        RootRun(fs, workdir / f"root-{number}", rng, log, result, group_commit).run(
            range(first, last + 1), cycles, seed * 1000 + number * 100, writers, kill_in_recovery
        )
        first = last + 1
    return result


def group_commit_env(fs: PowerLossMount) -> dict[str, str]:
    """The server's environment for group commit on the simulator (groupcommit/)."""
    here = Path(__file__).parent / "groupcommit"
    path = os.environ.get("PYTHONPATH")
    boot = boot_id_file(fs)
    if not boot.exists():
        reboot(fs)
    return {
        "PYTHONPATH": f"{here}{os.pathsep}{path}" if path else str(here),
        "MEMORY_TEST_SIMFS_FIFO": str(fs.fifo),
        "MEMORY_TEST_BOOT_ID_FILE": str(boot),
        "MEMORY_GROUP_COMMIT": "true",
    }


def boot_id_file(fs: PowerLossMount) -> Path:
    return fs.workdir / "boot_id"


def reboot(fs: PowerLossMount) -> None:
    """A new boot id for the servers under group commit (groupcommit/sitecustomize.py)."""
    boot_id_file(fs).write_text(f"{random.SystemRandom().getrandbits(128):032x}\n")


class RootRun:
    """Cycles on one storage root of the mount, its own server and memory store."""

    def __init__(
        self,
        fs: PowerLossMount,
        workdir: Path,
        rng: random.Random,
        log: Callable[[str], None],
        result: RunResult,
        group_commit: bool = False,
    ) -> None:
        workdir.mkdir(parents=True)
        self.group_commit = group_commit
        self.fs = fs
        self.rng = rng
        self.log = log
        self.result = result
        self.model = Model(result.stats)
        self.server = Live(
            tmp_path=workdir,
            root=fs.mountpoint / workdir.name,
            workers=2,
            threads=4,
            env_extra=group_commit_env(fs) if group_commit else {},
        )
        self.target = Target()
        self.checker = Checker(self.model, self.target)

    def run(
        self, numbers: range, total: int, seed: int, writers: int, kill_in_recovery: float
    ) -> None:
        server, target, model = self.server, self.target, self.model
        server.start()
        try:
            target.url, target.secret = server.url, server.token("writer")
            resp = requests.post(
                f"{server.url}/v1/memory_stores",
                json={"name": "powerloss"},
                headers=auth(target.secret),
                timeout=REQUEST_TIMEOUT,
            )
            resp.raise_for_status()
            target.store = resp.json()["id"]
            clients = [Writer(i, model, target, seed + i) for i in range(writers)]
            for cycle in numbers:
                self.cycle(cycle, total, clients, kill_in_recovery)
            _, problems = self.checker.check(set(model.keys), None)
            self.log(f"final check of all {len(model.keys)} keys: problems {len(problems)}")
            for line in problems[:20]:
                self.log(f"  {line}")
        finally:
            server.stop()

    def cycle(self, cycle: int, total: int, clients: list[Writer], kill_in_recovery: float) -> None:
        server, target, model, result, rng = (
            self.server,
            self.target,
            self.model,
            self.result,
            self.rng,
        )
        model.cycle = cycle
        model.touched = set()
        stop = threading.Event()
        threads = [threading.Thread(target=w.run, args=(stop,), daemon=True) for w in clients]
        acked_before = model.stats.acked
        for t in threads:
            t.start()
        delay = rng.uniform(*WRITE_SECONDS)
        time.sleep(delay)
        stop.set()  # before the kill: no write starts after it
        kill_server(server)
        for t in threads:
            t.join(timeout=REQUEST_TIMEOUT + 10)
        self.fs.cut_power()
        if self.group_commit:
            reboot(self.fs)  # as a real cut does; the canary cannot tell here
        again = ""
        if rng.random() < kill_in_recovery:
            after = rng.uniform(*RECOVERY_KILL_SECONDS)
            during = restart_killed(server, after)
            result.recovery_kills += during
            again = f", after a kill {after:.2f}s into the {'recovery' if during else 'run'}"
        started = time.monotonic()
        server.start()
        wait_ready(server)
        result.recovery_seconds.append(time.monotonic() - started)
        target.url = server.url
        clean, report = fsck_cli(server, started)
        result.cycles += 1
        if clean:
            result.fsck_clean += 1
        else:
            result.fsck_failures.append(f"cycle {cycle}: {report}")
        failed = RECOVERY_FAILED.findall(server.log())
        if failed:
            result.recovery_failures.append(f"cycle {cycle}: {failed[0][:1000]}")
        checked, problems = self.checker.check(model.touched, cycle)
        result.checked += checked
        live = self.checker.live_memories()
        for w in clients:
            if isinstance(live, dict):
                w.resync({p: v for p, v in live.items() if p.startswith(f"/w{w.index}/")})
            else:
                w.memories = {}  # unknown: no memory writes until a listing works
        self.log(
            f"cycle {cycle}/{total}: killed at {delay:.2f}s, "
            f"{model.stats.acked - acked_before} acknowledged, checked {checked}, "
            f"problems {len(problems)}, fsck {'clean' if clean else 'NOT CLEAN'}, "
            f"restart {result.recovery_seconds[-1]:.1f}s{again} ({recovery_line(server)})"
        )
        for line in problems[:20]:
            self.log(f"  {line}")
        if not clean:
            self.log("  " + report.replace("\n", "\n  ")[:4000])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cycles", type=int, default=50)
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument("--writers", type=int, default=8)
    parser.add_argument(
        "--kill-in-recovery",
        type=float,
        default=KILL_IN_RECOVERY,
        help="the share of restarts killed again while they recover",
    )
    parser.add_argument("--cycles-per-root", type=int, default=CYCLES_PER_ROOT)
    parser.add_argument("--keep", action="store_true", help="keep the work directory")
    parser.add_argument(
        "--group-commit",
        action="store_true",
        help="the server under group commit, on the simulator with ext4's ordering",
    )
    args = parser.parse_args(argv)
    seed = args.seed if args.seed is not None else random.SystemRandom().randrange(1 << 30)
    lazyfs = None if args.group_commit else lazyfs_binary()
    workdir = Path(tempfile.mkdtemp(prefix="powerloss_"))

    def log(line: str) -> None:
        print(line, flush=True)

    log(
        f"powerloss: {args.cycles} cycles, {args.writers} writers, seed {seed}, on "
        f"{'LazyFS ' + str(lazyfs) if lazyfs else 'the simulator'}"
        f"{' under group commit' if args.group_commit else ''}, work directory {workdir}"
    )
    started = time.monotonic()
    try:
        with mounted(workdir, lazyfs, ext4=args.group_commit) as fs:
            result = run(
                fs,
                workdir,
                args.cycles,
                seed,
                args.writers,
                log,
                args.kill_in_recovery,
                args.cycles_per_root,
                args.group_commit,
            )
    finally:
        if not args.keep:
            shutil.rmtree(workdir, ignore_errors=True)
    for line in result.fsck_failures[:5]:
        log(f"fsck after recovery: {line[:2000]}")
    for line in result.recovery_failures[:5]:
        log(f"recovery failed: {line}")
    for line in result.stats.bad_status[:10]:
        log(f"unexpected status: {line}")
    log(f"{result.summary()}; {time.monotonic() - started:.0f}s in all")
    return 0 if result.ok else 1


if __name__ == "__main__":
    sys.exit(main())
