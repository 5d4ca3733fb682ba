"""What a coding agent waits for at each hook: ``project-memory agent hook <event>`` wall time.

    python -m bench.agent_hooks [--runs 30]

Starts the service (as `make run` does) on 127.0.0.1, a git repository and a Claude Code
transcript of the given size, and runs, interleaved run by run:

* ``baseline``: ``project-memory --version``, the CLI's bare start (Python, argparse);
* ``stop``: a finished turn recorded (transcript read, git, the task index, the PUT);
* ``session-start``: the context (the spool, the task index, 3 turns, project.md's head);

with the server up; then ``stop`` with the server down (connection refused) and hung (a
socket that accepts and never answers), where the hook gives up. Prints p50/p95 in ms and
each up-figure's ratio to the baseline's, and writes bench/results/agent-hooks-<time>.json.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.servers import REPO, VENV_BIN, start_ours

CLI = str(VENV_BIN / "project-memory")


def transcript(path: Path, session: str, turns: int) -> None:
    usage = {"input_tokens": 100, "output_tokens": 10, "cache_read_input_tokens": 900}
    with open(path, "w", encoding="utf-8") as fh:
        for i in range(turns):
            stamp = f"2026-12-01T10:{i // 60 % 60:02d}:{i % 60:02d}.000Z"
            lines: list[dict[str, Any]] = [
                {
                    "type": "user",
                    "message": {"role": "user", "content": f"prompt {i} " + "x" * 400},
                },
                {
                    "type": "assistant",
                    "message": {
                        "id": f"m{i}",
                        "model": "claude-bench",
                        "content": [{"type": "text", "text": "answer " * 80}],
                        "usage": usage,
                    },
                },
            ]
            for n, line in enumerate(lines):
                fh.write(
                    json.dumps(
                        {**line, "uuid": f"u{i}-{n}", "timestamp": stamp, "sessionId": session}
                    )
                    + "\n"
                )


def add_turn(path: Path, session: str, i: int) -> None:
    """One more prompt and answer, so that every ``stop`` has a turn to record."""
    usage = {"input_tokens": 100, "output_tokens": 10}
    with open(path, "a", encoding="utf-8") as fh:
        for n, line in enumerate(
            [
                {"type": "user", "message": {"role": "user", "content": f"bench prompt {i}"}},
                {
                    "type": "assistant",
                    "message": {
                        "id": f"b{i}",
                        "model": "claude-bench",
                        "content": [{"type": "text", "text": f"bench answer {i}"}],
                        "usage": usage,
                    },
                },
            ]
        ):
            fh.write(
                json.dumps(
                    {
                        **line,
                        "uuid": f"b{i}-{n}",
                        "timestamp": "2026-12-01T11:00:00.000Z",
                        "sessionId": session,
                    }
                )
                + "\n"
            )


def timed(args: list[str], stdin: str, env: dict[str, str], cwd: Path) -> float:
    started = time.perf_counter()
    subprocess.run(
        args, input=stdin, capture_output=True, text=True, env=env, cwd=cwd, timeout=30, check=True
    )
    return (time.perf_counter() - started) * 1000


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=30)
    parser.add_argument(
        "--transcript-turns",
        type=int,
        default=200,
        help="turns already in the session's transcript",
    )
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="bench-hooks-"))
    server = start_ours(work / "server")
    try:
        sys.path.insert(0, str(REPO))
        from app.storage.tree.tokens import TokenRegistry

        token = TokenRegistry(work / "server" / "tokens.json").create(
            role="writer", tenant="bench", project="bench"
        )[1]
        repo = work / "repo"
        repo.mkdir()
        git = {
            **os.environ,
            "GIT_AUTHOR_NAME": "b",
            "GIT_AUTHOR_EMAIL": "b@b",
            "GIT_COMMITTER_NAME": "b",
            "GIT_COMMITTER_EMAIL": "b@b",
        }
        subprocess.run(["git", "init", "-q", "-b", "bench-task"], cwd=repo, check=True, env=git)
        subprocess.run(
            ["git", "commit", "-q", "--allow-empty", "-m", "x"], cwd=repo, check=True, env=git
        )
        session = "bench-session"
        path = work / "t.jsonl"
        transcript(path, session, args.transcript_turns)
        base = {k: v for k, v in os.environ.items() if not k.startswith("PROJECT_MEMORY_")}
        env = {
            **base,
            "HOME": str(work),
            "PROJECT_MEMORY_URL": server.url,
            "PROJECT_MEMORY_TOKEN": token,
            "PROJECT_MEMORY_STATE_DIR": str(work / "state"),
        }
        stop_in = json.dumps(
            {"session_id": session, "transcript_path": str(path), "cwd": str(repo)}
        )
        start_in = json.dumps({"session_id": session, "cwd": str(repo), "source": "startup"})
        hook = [CLI, "agent", "hook"]
        up: dict[str, list[float]] = {"baseline": [], "stop": [], "session-start": []}
        timed([*hook, "stop"], stop_in, env, repo)  # warm: the first turn, the page cache
        for i in range(args.runs):
            up["baseline"].append(timed([CLI, "--version"], "", env, repo))
            add_turn(path, session, i)
            up["stop"].append(timed([*hook, "stop"], stop_in, env, repo))
            up["session-start"].append(timed([*hook, "session-start"], start_in, env, repo))
        down: dict[str, list[float]] = {"stop, server down": [], "stop, server hung": []}
        with socket.socket() as closed:
            closed.bind(("127.0.0.1", 0))
            dead = f"http://127.0.0.1:{closed.getsockname()[1]}"  # bound, not listening: refused
            hung = socket.socket()
            hung.bind(("127.0.0.1", 0))
            hung.listen(64)  # accepts (the kernel does), never answers
            slow = f"http://127.0.0.1:{hung.getsockname()[1]}"
            for i in range(min(args.runs, 5)):
                add_turn(path, session, 1000 + i)
                down["stop, server down"].append(
                    timed([*hook, "stop"], stop_in, {**env, "PROJECT_MEMORY_URL": dead}, repo)
                )
                add_turn(path, session, 2000 + i)
                down["stop, server hung"].append(
                    timed([*hook, "stop"], stop_in, {**env, "PROJECT_MEMORY_URL": slow}, repo)
                )
            hung.close()
    finally:
        server.stop()
    rows = []
    base_p50 = statistics.median(up["baseline"])
    print(f"{'hook':<20} {'p50 ms':>8} {'p95 ms':>8} {'p50 / baseline':>15}")
    for name, values in {**up, **down}.items():
        p50, p95 = statistics.median(values), pct(values, 0.95)
        ratio = p50 / base_p50
        rows.append(
            {
                "name": name,
                "runs": len(values),
                "p50_ms": round(p50, 1),
                "p95_ms": round(p95, 1),
                "p50_over_baseline": round(ratio, 2),
            }
        )
        print(f"{name:<20} {p50:>8.0f} {p95:>8.0f} {ratio:>15.2f}")
    load = os.getloadavg()[0]
    print(f"(load average {load:.1f}; {args.transcript_turns} turns in the transcript)")
    out = (
        REPO
        / "bench"
        / "results"
        / f"agent-hooks-{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime())}.json"
    )
    out.parent.mkdir(exist_ok=True)
    out.write_text(json.dumps({"rows": rows, "load_average": load, "runs": args.runs}, indent=2))


if __name__ == "__main__":
    main()
