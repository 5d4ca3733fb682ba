"""What a person waits for at each prompt: ``project-memory agent hook user-prompt-submit``
as a whole process, in a fresh non-editable install of the client, with the prompt context
on and off, and the server up, slow, hung and down.

    python -m bench.prompt_hook [--runs 40] [--hogs 2] [--turns 2000] [--slow 0.3]

Builds a venv with ``pip install ./client`` of this checkout (bench.agent_hooks.client_venv),
starts the service (as `make run` does) on 127.0.0.1, records ``--turns`` turns in tasks of
twenty (a hundred words each; one in fifty about the prompt's subject) and ten memories, and
measures, interleaved run by run:

* ``off``: ``PROJECT_MEMORY_PROMPT_CONTEXT=off``, the process alone: what the hook costs a
  prompt when turned off (without the hook in the agent's settings a prompt waits for none);
* ``on, up``: a prompt that matches (its context printed), and one that matches nothing;
* ``on, slow``: a relay that holds each answer ``--slow`` seconds;
* ``on, hung``: a socket that accepts and never answers (the hook gives up);
* ``on, down``: a port that refuses;
* ``recall, server``: ``POST /recall`` alone over one kept connection (the server's share),
  and with a prompt of words every turn holds (the search ranks the whole project).

``--hogs N`` runs N ``yes > /dev/null`` beside the whole run. Prints p50/p95 in ms (and the
CPU of each process) with the load average, and writes bench/results/prompt-hook-<time>.json.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import random
import shutil
import signal
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.agent_hooks import client_venv, hogs, pct, run_once, server_states
from bench.servers import REPO, start_ours

API = "/sandbox/memory/v1"
STORES = "/v1/memory_stores"
PROMPT = "When does the deploy key rotate, and which vault job does the rotation?"
NO_MATCH = "Reticulate the xyloquartz fimblewheels before lunch."
_VOCABULARY = (
    "cache session login parser upload migration schema index worker queue token retry "
    "timeout header cursor digest summary branch commit review release config logging "
    "metrics database backup restore archive payload client server request response"
)
WORDS = _VOCABULARY.split()


def _connect(url: str) -> http.client.HTTPConnection:
    host, port = url.removeprefix("http://").split(":")
    return http.client.HTTPConnection(host, int(port), timeout=30)


def _request(
    conn: http.client.HTTPConnection, method: str, path: str, token: str, body: Any
) -> Any:
    headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}
    conn.request(method, path, json.dumps(body), headers)
    answer = conn.getresponse()
    data = answer.read()
    if answer.status >= 300:
        raise RuntimeError(f"{method} {path}: {answer.status} {data[:200]!r}")
    return json.loads(data) if data else None


def seed(url: str, token: str, turns: int) -> None:
    conn = _connect(url)
    rng = random.Random(7)
    for n in range(turns):
        words = " ".join(rng.choice(WORDS) for _ in range(100))
        if n % 50 == 0:
            words += f" The deploy key rotates every Tuesday ({n}), by the vault job."
        _request(conn, "PUT", f"{API}/tasks/task-{n // 20:04d}/turns/{n % 20}", token,
                 {"summary_md": f"## Prompt\n\nStep {n}.\n\n## Answer\n\n{words}"})  # fmt: skip
    store = _request(conn, "POST", STORES, token, {"name": "bench"})
    for n in range(10):
        content = " ".join(rng.choice(WORDS) for _ in range(60))
        if n == 3:
            content += " Key rotation: the deploy key, weekly."
        _request(conn, "POST", f"{STORES}/{store['id']}/memories", token,
                 {"path": f"/notes/{n}.md", "content": content})  # fmt: skip
    conn.close()


# Words every turn holds: the search matches the whole project (a recall's worst case).
COMMON = "Review the cache, session, login, parser, upload, migration and schema code paths."


def server_recall(url: str, token: str, runs: int, prompt: str = PROMPT) -> list[float]:
    """Wall ms of ``POST /recall`` alone, over one kept connection."""
    conn = _connect(url)
    out = []
    for _ in range(runs):
        started = time.perf_counter()
        body = {"prompt": prompt, "task_id": "task-0001"}
        found = _request(conn, "POST", f"{API}/recall", token, body)
        out.append((time.perf_counter() - started) * 1000)
        assert found["context"], "the bench's prompt matches its turns"
    conn.close()
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=40, help="runs of each figure")
    parser.add_argument("--hogs", type=int, default=0, help="yes > /dev/null processes beside")
    parser.add_argument("--turns", type=int, default=2000, help="turns in the project")
    parser.add_argument("--slow", type=float, default=0.3, help="seconds a slow answer is held")
    args = parser.parse_args()
    # A SIGTERM ends the run through its finally blocks: the hogs and the server stop too.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(1))
    work = Path(tempfile.mkdtemp(prefix="bench-prompt-"))
    cli = client_venv(work, "this", None)
    server = start_ours(work / "server")
    figures: dict[str, list[float]] = {}
    loads: list[float] = []
    printed: list[int] = []
    try:
        sys.path.insert(0, str(REPO))
        from app.storage.tree.tokens import TokenRegistry

        token = TokenRegistry(work / "server" / "tokens.json").create(
            role="writer", tenant="bench", project="bench"
        )[1]
        seed(server.url, token, args.turns)
        repo = work / "repo"
        repo.mkdir()
        with server_states(server.url, args.slow) as urls:
            base = {k: v for k, v in os.environ.items() if not k.startswith("PROJECT_MEMORY_")}
            plan = [
                ("off", "up", PROMPT, {"PROJECT_MEMORY_PROMPT_CONTEXT": "off"}),
                ("on, up", "up", PROMPT, {}),
                ("on, up, nothing matches", "up", NO_MATCH, {}),
                (f"on, slow ({args.slow:g} s)", "slow", PROMPT, {}),
                ("on, hung", "hung", PROMPT, {}),
                ("on, down", "down", PROMPT, {}),
            ]
            with hogs(args.hogs):
                figures["recall, server"] = server_recall(server.url, token, args.runs)
                figures["recall, server, every turn matches"] = server_recall(
                    server.url, token, args.runs, COMMON
                )
                for _ in range(args.runs):
                    for name, state, prompt, extra in plan:
                        env = {**base, "HOME": str(work), "PROJECT_MEMORY_URL": urls[state],
                               "PROJECT_MEMORY_TOKEN": token, "PROJECT_MEMORY_TASK": "task-0001",
                               "PROJECT_MEMORY_STATE_DIR": str(work / "state"), **extra}  # fmt: skip
                        stdin = json.dumps({"session_id": "bench", "cwd": str(repo),
                                            "hook_event_name": "UserPromptSubmit",
                                            "prompt": prompt})  # fmt: skip
                        out: list[str] = []
                        wall, cpu = run_once([str(cli), "agent", "hook", "user-prompt-submit"],
                                             stdin, env, repo, out)  # fmt: skip
                        if name == "on, up":
                            printed.append(len(out[0]))
                        figures.setdefault(name, []).append(wall)
                        figures.setdefault(f"{name} (cpu)", []).append(cpu)
                        loads.append(os.getloadavg()[0])
    finally:
        server.stop()
        shutil.rmtree(work, ignore_errors=True)
    report(args, figures, loads, printed)


def report(
    args: argparse.Namespace,
    figures: dict[str, list[float]],
    loads: list[float],
    printed: list[int],
) -> None:
    rows = []
    print(f"{'prompt hook':<30} {'p50 ms':>8} {'p95 ms':>8}")
    for name, values in figures.items():
        row = {"name": name, "runs": len(values), "p50_ms": round(statistics.median(values), 1),
               "p95_ms": round(pct(values, 0.95), 1)}  # fmt: skip
        rows.append(row)
        print(f"{name:<30} {row['p50_ms']:>8.0f} {row['p95_ms']:>8.0f}")
    load = {"min": round(min(loads), 1), "median": round(statistics.median(loads), 1),
            "max": round(max(loads), 1)}  # fmt: skip
    chars = statistics.median(printed) if printed else 0
    assert chars > 0, "the hook printed no context for a prompt that matches"
    print(f"(load average {load}; {args.hogs} hog(s); {args.turns} turns; slow = answers held"
          f" {args.slow:g} s; the hook printed {chars:.0f} characters of JSON)")  # fmt: skip
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    out = REPO / "bench" / "results" / f"prompt-hook-{stamp}.json"
    out.parent.mkdir(exist_ok=True)
    out.write_text(json.dumps({"rows": rows, "load_average": load, "hogs": args.hogs,
                               "runs": args.runs, "turns": args.turns, "slow": args.slow},
                              indent=2))  # fmt: skip


if __name__ == "__main__":
    main()
