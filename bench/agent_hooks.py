"""What a coding agent waits for at each hook: ``project-memory agent hook <event>``, whole
processes, in fresh non-editable installs of the client.

    python -m bench.agent_hooks [--runs 30] [--hogs 2] [--base REF] [--share-memory]

Builds a venv with ``pip install ./client`` of this checkout (and with ``--base REF`` one of
that commit's client, from ``git archive``), starts the service (as `make run` does) on
127.0.0.1, a git repository and a Claude Code transcript, and measures, interleaved run by
run between the two installs:

* ``start``: ``agent hook session-start`` against a port that refuses at once: the hook's
  start-up, all it does before its first request (wall and CPU, the git call included);
* ``session-start`` and ``stop`` with the server ``up``; ``slow`` (a relay that holds each
  answer 1 s); ``hung`` (a socket that accepts and never answers); ``down`` (refused).

``--hogs N`` runs N ``yes > /dev/null`` beside the hooks for the whole run (the load the
acceptance tests put on the agents). ``--share-memory`` adds the side ``shared``: this
checkout's client in a repository installed with ``agent install claude-code
--share-memory`` (a store of 20 memories, all in sync), its share's server set to each
state's URL, so that every hook also syncs Claude Code's memory folder. Prints p50/p95 in ms, the ratio of each p50 to the
base's, the load average, and writes bench/results/agent-hooks-<time>.json.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import resource
import select
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from bench.servers import REPO, start_ours

SLOW_SECONDS = 1.0


def transcript(path: Path, session: str, turns: int) -> None:
    usage = {"input_tokens": 100, "output_tokens": 10, "cache_read_input_tokens": 900}
    with open(path, "w", encoding="utf-8") as fh:
        for i in range(turns):
            add_turn(path, session, i, usage=usage, fh=fh)


def add_turn(
    path: Path, session: str, i: int, usage: dict[str, int] | None = None, fh: Any = None
) -> None:
    """One more prompt and answer, so that every ``stop`` has a turn to record."""
    lines: list[dict[str, Any]] = [
        {"type": "user", "message": {"role": "user", "content": f"bench prompt {i} " + "x" * 400}},
        {
            "type": "assistant",
            "message": {
                "id": f"b{i}",
                "model": "claude-bench",
                "content": [{"type": "text", "text": f"bench answer {i} " + "answer " * 80}],
                "usage": usage or {"input_tokens": 100, "output_tokens": 10},
            },
        },
    ]
    text = "".join(
        json.dumps({**line, "uuid": f"b{i}-{n}", "timestamp": "2026-12-01T11:00:00.000Z",
                    "sessionId": session}) + "\n"
        for n, line in enumerate(lines)
    )  # fmt: skip
    if fh is not None:
        fh.write(text)
    else:
        with open(path, "a", encoding="utf-8") as out:
            out.write(text)


def client_venv(work: Path, name: str, ref: str | None, *, compile: bool = True) -> Path:
    """A fresh venv with the client of ``ref`` (None: this checkout) installed, not editable;
    ``compile=False``: without the bytecode pip writes by default (``--no-compile``)."""
    source = work / f"client-{name}"
    source.mkdir()
    if ref is None:
        archive = subprocess.run(
            ["git", "archive", "--format=tar", "HEAD", "client"], cwd=REPO, capture_output=True
        )
        # Uncommitted changes too: copy the work tree's client over the archive.
        subprocess.run(["tar", "x", "-C", str(source)], input=archive.stdout, check=True)
        subprocess.run(["cp", "-r", f"{REPO}/client/.", str(source / "client")], check=True)
    else:
        archive = subprocess.run(
            ["git", "archive", "--format=tar", ref, "client"],
            cwd=REPO,
            capture_output=True,
            check=True,
        )
        subprocess.run(["tar", "x", "-C", str(source)], input=archive.stdout, check=True)
    # What an earlier build left in the work tree (git-ignored): setuptools would put a stale
    # build/lib's modules into the wheel.
    for left in [*(source / "client" / "src").glob("*.egg-info"), source / "client" / "build"]:
        subprocess.run(["rm", "-rf", str(left)], check=True)
    venv = work / f"venv-{name}"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    subprocess.run(
        [str(venv / "bin" / "pip"), "install", "-q", "--disable-pip-version-check",
         *([] if compile else ["--no-compile"]), str(source / "client")],
        check=True,
        capture_output=True,
    )  # fmt: skip
    return venv / "bin" / "project-memory"


def run_once(
    args: list[str], stdin: str, env: dict[str, str], cwd: Path, out: list[str] | None = None
) -> tuple[float, float]:
    """Wall and CPU milliseconds of one whole process (its children included); its stdout
    appended to ``out``, when given."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    done = subprocess.run(args, input=stdin, capture_output=True, text=True, env=env, cwd=cwd,
                          timeout=60, check=True)  # fmt: skip
    wall = (time.perf_counter() - started) * 1000
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime) * 1000
    if out is not None:
        out.append(done.stdout)
    return wall, cpu


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))]


class SlowRelay:
    """127.0.0.1:<port> → ``target``, each answer held ``delay`` seconds."""

    def __init__(self, target: tuple[str, int], delay: float) -> None:
        self.target, self.delay = target, delay
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(64)
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.sock.accept()
            except OSError:
                return
            threading.Thread(target=self._relay, args=(client,), daemon=True).start()

    def _relay(self, client: socket.socket) -> None:
        with client, socket.create_connection(self.target) as upstream:
            waiting = False
            while True:
                ready, _, _ = select.select([client, upstream], [], [], 30)
                if not ready:
                    return
                for sock in ready:
                    data = sock.recv(65536)
                    if not data:
                        return
                    if sock is client:
                        waiting = True
                        upstream.sendall(data)
                    else:
                        if waiting:
                            time.sleep(self.delay)  # the answer's first bytes are held
                            waiting = False
                        client.sendall(data)

    def close(self) -> None:
        self.sock.close()


@contextlib.contextmanager
def server_states(url: str, slow_seconds: float) -> Iterator[dict[str, str]]:
    """The addresses a hook is timed against: ``up`` (the server), ``slow`` (a relay that
    answers after ``slow_seconds``), ``hung`` (the kernel accepts, nobody answers) and
    ``down`` (a port bound but not listening)."""
    host, port = url.removeprefix("http://").split(":")
    slow = SlowRelay((host, int(port)), slow_seconds)
    hung = socket.socket()
    try:
        hung.bind(("127.0.0.1", 0))
        hung.listen(1024)
        with socket.socket() as closed:
            closed.bind(("127.0.0.1", 0))
            yield {
                "up": url,
                "slow": slow.url,
                "hung": f"http://127.0.0.1:{hung.getsockname()[1]}",
                "down": f"http://127.0.0.1:{closed.getsockname()[1]}",
            }
    finally:
        slow.close()
        hung.close()


@contextlib.contextmanager
def hogs(n: int) -> Iterator[None]:
    procs = [
        subprocess.Popen(["yes"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        for _ in range(n)
    ]
    try:
        yield
    finally:
        for proc in procs:
            proc.kill()
            proc.wait()


def share_memory(cli: Path, work: Path, repo: Path, url: str, token: str) -> None:
    """The side ``shared``: the repository's auto-memory shared through a store of 20
    memories, synced once by install."""
    env = {**os.environ, "PROJECT_MEMORY_URL": url, "PROJECT_MEMORY_TOKEN": token,
           "HOME": str(work), "PROJECT_MEMORY_STATE_DIR": str(work / "state-shared")}  # fmt: skip
    subprocess.run([str(cli), "agent", "install", "claude-code", "--share-memory", "bench"],
                   cwd=repo, env=env, check=True, capture_output=True)  # fmt: skip
    folder = Path(json.loads((repo / ".claude" / "settings.local.json").read_text())
                  ["autoMemoryDirectory"])  # fmt: skip
    lines = []
    for i in range(19):
        (folder / f"memory-{i:02d}.md").write_text(f"---\nname: m{i}\n---\n\n" + "fact " * 60)
        lines.append(f"- [Memory {i}](memory-{i:02d}.md) — a fact\n")
    (folder / "MEMORY.md").write_text("".join(lines))
    subprocess.run([str(cli), "agent", "hook", "stop"], input=json.dumps({"cwd": str(repo)}),
                   cwd=repo, env=env, check=True, capture_output=True, text=True)  # fmt: skip


def share_at(state: Path, url: str) -> None:
    """Point the share's record at ``url``: its hooks then sync against that server."""
    for record in (state / "claude-memory" / "repos").glob("*.json"):
        data = json.loads(record.read_text())
        record.write_text(json.dumps({**data, "url": url}))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=30, help="runs of each figure, each side")
    parser.add_argument("--hogs", type=int, default=0, help="yes > /dev/null processes beside")
    parser.add_argument("--base", default=None, help="a commit whose client is measured too")
    parser.add_argument("--transcript-turns", type=int, default=200)
    parser.add_argument("--share-memory", action="store_true", help="add the side 'shared'")
    args = parser.parse_args()
    # A SIGTERM ends the run through its finally blocks: the hogs and the server stop too.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(1))
    work = Path(tempfile.mkdtemp(prefix="bench-hooks-"))
    sides = {"this": client_venv(work, "this", None)}
    if args.base:
        sides["base"] = client_venv(work, "base", args.base)
    if args.share_memory:
        sides["shared"] = sides["this"]
    server = start_ours(work / "server")
    figures: dict[str, dict[str, list[float]]] = {side: {} for side in sides}
    loads: list[float] = []
    try:
        sys.path.insert(0, str(REPO))
        from app.storage.tree.tokens import TokenRegistry

        token = TokenRegistry(work / "server" / "tokens.json").create(
            role="writer", tenant="bench", project="bench"
        )[1]
        repo = work / "repo"
        repo.mkdir()
        git_env = {**os.environ, "GIT_AUTHOR_NAME": "b", "GIT_AUTHOR_EMAIL": "b@b",
                   "GIT_COMMITTER_NAME": "b", "GIT_COMMITTER_EMAIL": "b@b"}  # fmt: skip
        subprocess.run(["git", "init", "-q", "-b", "bench-task"], cwd=repo, check=True, env=git_env)
        subprocess.run(["git", "commit", "-q", "--allow-empty", "-m", "x"], cwd=repo,
                       check=True, env=git_env)  # fmt: skip
        for i in range(30):  # a digest with sections to read
            subprocess.run(
                [str(sides["this"]), "turn", "put", f"task-{i:02d}", "next", "--summary",
                 f"Earlier work {i}. " + "word " * 80],
                env={**os.environ, "PROJECT_MEMORY_URL": server.url,
                     "PROJECT_MEMORY_TOKEN": token, "HOME": str(work)},
                check=True, capture_output=True,
            )  # fmt: skip
        if args.share_memory:
            share_memory(sides["shared"], work, repo, server.url, token)
        with server_states(server.url, SLOW_SECONDS) as urls:
            base = {k: v for k, v in os.environ.items() if not k.startswith("PROJECT_MEMORY_")}
            # Each side its own session and transcript: the turns one records are its own.
            paths = {side: work / f"t-{side}.jsonl" for side in sides}
            stdins = {}
            for side, path in paths.items():
                session = f"bench-{side}"
                transcript(path, session, args.transcript_turns)
                stdins[side] = {
                    "stop": json.dumps({"session_id": session, "transcript_path": str(path),
                                        "cwd": str(repo)}),
                    "session-start": json.dumps({"session_id": session, "cwd": str(repo),
                                                 "source": "startup"}),
                }  # fmt: skip
            plan: list[tuple[str, str, str]] = [("start", "session-start", "down")]
            for state in ("up", "slow", "down"):
                plan += [(f"session-start, {state}", "session-start", state),
                         (f"stop, {state}", "stop", state)]  # fmt: skip
            plan += [
                ("session-start, hung", "session-start", "hung"),
                ("stop, hung", "stop", "hung"),
            ]
            turn = 0
            with hogs(args.hogs):
                for name, event, state in plan:
                    if args.share_memory:
                        share_at(work / "state-shared", urls[state])
                    runs = args.runs if state != "hung" else max(3, args.runs // 6)
                    for _ in range(runs):
                        for side, cli in sides.items():
                            env = {**base, "HOME": str(work), "PROJECT_MEMORY_URL": urls[state],
                                   "PROJECT_MEMORY_TOKEN": token,
                                   "PROJECT_MEMORY_STATE_DIR": str(work / f"state-{side}")}  # fmt: skip
                            if event == "stop":
                                add_turn(paths[side], f"bench-{side}", 10_000 + turn)
                                turn += 1
                            stdin = stdins[side][event]
                            wall, cpu = run_once([str(cli), "agent", "hook", event], stdin, env,
                                                 repo)  # fmt: skip
                            figures[side].setdefault(name, []).append(wall)
                            figures[side].setdefault(f"{name} (cpu)", []).append(cpu)
                            loads.append(os.getloadavg()[0])
    finally:
        server.stop()
        shutil.rmtree(work, ignore_errors=True)
    rows = []
    header = f"{'hook':<24} {'p50 ms':>8} {'p95 ms':>8}"
    if "base" in sides:
        header += f" {'base p50':>9} {'base p95':>9} {'p50 / base':>10}"
    if "shared" in sides:
        header += f" {'shared p50':>10} {'shared p95':>10}"
    print(header)
    for name, values in figures["this"].items():
        row: dict[str, Any] = {"name": name, "runs": len(values),
                               "p50_ms": round(statistics.median(values), 1),
                               "p95_ms": round(pct(values, 0.95), 1)}  # fmt: skip
        line = f"{name:<24} {row['p50_ms']:>8.0f} {row['p95_ms']:>8.0f}"
        if "base" in sides:
            other = figures["base"][name]
            row["base_p50_ms"] = round(statistics.median(other), 1)
            row["base_p95_ms"] = round(pct(other, 0.95), 1)
            row["p50_over_base"] = round(row["p50_ms"] / row["base_p50_ms"], 2)
            line += (
                f" {row['base_p50_ms']:>9.0f} {row['base_p95_ms']:>9.0f}"
                f" {row['p50_over_base']:>10.2f}"
            )
        if "shared" in sides:
            shared = figures["shared"][name]
            row["shared_p50_ms"] = round(statistics.median(shared), 1)
            row["shared_p95_ms"] = round(pct(shared, 0.95), 1)
            line += f" {row['shared_p50_ms']:>10.0f} {row['shared_p95_ms']:>10.0f}"
        rows.append(row)
        print(line)
    load = {"min": round(min(loads), 1), "median": round(statistics.median(loads), 1),
            "max": round(max(loads), 1)}  # fmt: skip
    print(f"(load average {load}; {args.hogs} hog(s); slow = answers held {SLOW_SECONDS:g} s)")
    out = (
        REPO
        / "bench"
        / "results"
        / (f"agent-hooks-{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime())}.json")
    )
    out.parent.mkdir(exist_ok=True)
    out.write_text(json.dumps({"rows": rows, "load_average": load, "hogs": args.hogs,
                               "runs": args.runs, "base": args.base,
                               "share_memory": args.share_memory}, indent=2))  # fmt: skip


if __name__ == "__main__":
    main()
