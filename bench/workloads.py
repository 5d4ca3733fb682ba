"""The workloads: what one op is on each server (ours, hello-world, MLflow).

Sizes follow issue 8: summary about 1 KB, one 16 KiB artifact, meta as in seed 000.
"""

from __future__ import annotations

import json
import random
from typing import Any
from urllib.parse import quote

from .loadgen import Op, Session

API = "/sandbox/memory/v1"
SUMMARY = ("Fixed the flaky upload test by streaming the body to a temp file; " * 16)[:1000]
ARTIFACT = bytes(random.Random(8).randbytes(16 * 1024))
READ_TASKS = 64  # preloaded tasks (one turn each) that the read workload picks from


def meta(client: int, seq: int) -> dict[str, Any]:
    return {
        "agent_id": f"agent-{client}",
        "model": "claude-sonnet-4-5",
        "job_id": f"job-{seq}",
        "sandbox_id": f"sb-{client:04d}",
        "commit": "3f9c2d1e8b7a6f5e4d3c2b1a0f9e8d7c6b5a4f3e",
        "exit_code": 0,
        "started_at": "2026-11-29T21:00:00Z",
        "ended_at": "2026-11-29T21:04:10Z",
        "tokens": {"input": 51234, "output": 2048},
        "cost": 0.4312,
        "claude_session_id": "c0ffee00-1234-4abc-9def-0123456789ab",
    }


def turn_body(client: int, seq: int) -> bytes:
    return json.dumps({"meta": meta(client, seq), "summary_md": SUMMARY}).encode()


JSON = {"Content-Type": "application/json"}
OCTETS = {"Content-Type": "application/octet-stream"}


# -- ours ------------------------------------------------------------------------------------
def ours_record(tag: str, turns_per_task: int = 10) -> Op:
    """Record a turn: PUT the turn, then PUT one 16 KiB artifact (two fsynced writes)."""

    def op(s: Session, client: int, seq: int) -> None:
        base = f"{API}/tasks/{tag}-c{client}-t{seq // turns_per_task}/turns/{seq % turns_per_task}"
        s.request("PUT", base, turn_body(client, seq), JSON)
        s.request("PUT", f"{base}/artifacts/out.bin", ARTIFACT, OCTETS)

    return op


BOUNDARY = "pm-bench-3f9c2d1e8b7a"
FORM = {"Content-Type": f"multipart/form-data; boundary={BOUNDARY}"}


def turn_form(client: int, seq: int, artifacts: dict[str, bytes]) -> bytes:
    """A turn and its artifacts as one multipart/form-data body (app/api/turn_form.py)."""
    head = f'--{BOUNDARY}\r\nContent-Disposition: form-data; name="turn"\r\n'
    out = [head.encode(), b"Content-Type: application/json\r\n\r\n", turn_body(client, seq)]
    for name, data in artifacts.items():
        part = f'\r\n--{BOUNDARY}\r\nContent-Disposition: form-data; name="artifact"; filename="{name}"'
        out += [part.encode(), b"\r\nContent-Type: application/octet-stream\r\n\r\n", data]
    out.append(f"\r\n--{BOUNDARY}--\r\n".encode())
    return b"".join(out)


def ours_record_one(tag: str, turns_per_task: int = 10) -> Op:
    """Record a turn in one request: the turn and its 16 KiB artifact as one multipart PUT."""

    def op(s: Session, client: int, seq: int) -> None:
        base = f"{API}/tasks/{tag}-c{client}-t{seq // turns_per_task}/turns/{seq % turns_per_task}"
        s.request("PUT", base, turn_form(client, seq, {"out.bin": ARTIFACT}), FORM)

    return op


def ours_put_turn(task_of_client: str) -> Op:
    """PUT (upsert) turn 1 of the client's own existing task: no lock contention between clients."""

    def op(s: Session, client: int, seq: int) -> None:
        path = f"{API}/tasks/{task_of_client.format(client=client)}/turns/1"
        s.request("PUT", path, turn_body(client, seq), JSON)

    return op


def ours_read() -> Op:
    def op(s: Session, client: int, seq: int) -> None:
        s.request("GET", f"{API}/tasks/pre-{(client * 7919 + seq) % READ_TASKS}/turns/0")

    return op


def ours_list() -> Op:
    def op(s: Session, client: int, seq: int) -> None:
        s.request("GET", f"{API}/tasks?limit=50")

    return op


def ours_digest() -> Op:
    def op(s: Session, client: int, seq: int) -> None:
        s.request("GET", f"{API}/project.md")

    return op


def ours_preload(s: Session) -> None:
    for i in range(READ_TASKS):
        base = f"{API}/tasks/pre-{i}/turns/0"
        s.request("PUT", base, turn_body(i, 0), JSON)
        s.request("PUT", f"{base}/artifacts/out.bin", ARTIFACT, OCTETS)


# -- hello-world ceiling -----------------------------------------------------------------------
def hello() -> Op:
    def op(s: Session, client: int, seq: int) -> None:
        s.request("GET", "/hello")

    return op


# -- MLflow ------------------------------------------------------------------------------------
ML = "/api/2.0/mlflow"


def _post(s: Session, path: str, obj: dict[str, Any]) -> dict[str, Any]:
    return json.loads(s.request("POST", path, json.dumps(obj).encode(), JSON) or b"{}")


def mlflow_experiment(s: Session, name: str) -> str:
    return str(_post(s, f"{ML}/experiments/create", {"name": name})["experiment_id"])


def mlflow_turn(s: Session, experiment_id: str, client: int, seq: int) -> str:
    """Create run + log-batch of the meta as params/tags + upload summary and artifact + finish."""
    run = _post(
        s,
        f"{ML}/runs/create",
        {"experiment_id": experiment_id, "start_time": 1_700_000_000_000 + seq},
    )["run"]["info"]
    run_id = run["run_id"]
    m = meta(client, seq)
    params = [
        {"key": k, "value": json.dumps(v) if isinstance(v, dict) else str(v)} for k, v in m.items()
    ]
    tags = [{"key": "task_id", "value": f"c{client}-t{seq // 10}"}, {"key": "turn", "value": "0"}]
    _post(s, f"{ML}/runs/log-batch", {"run_id": run_id, "params": params, "tags": tags})
    # --serve-artifacts: uploads go through the tracking server's artifact proxy.
    prefix = run["artifact_uri"].removeprefix("mlflow-artifacts:").lstrip("/")
    proxy = f"/api/2.0/mlflow-artifacts/artifacts/{prefix}"
    s.request("PUT", f"{proxy}/summary.md", SUMMARY.encode(), {"Content-Type": "text/markdown"})
    s.request("PUT", f"{proxy}/out.bin", ARTIFACT, OCTETS)
    _post(
        s,
        f"{ML}/runs/update",
        {"run_id": run_id, "status": "FINISHED", "end_time": 1_700_000_100_000 + seq},
    )
    return str(run_id)


def mlflow_record(experiment_id: str) -> Op:
    def op(s: Session, client: int, seq: int) -> None:
        mlflow_turn(s, experiment_id, client, seq)

    return op


def mlflow_read(run_ids: list[str]) -> Op:
    def op(s: Session, client: int, seq: int) -> None:
        run_id = run_ids[(client * 7919 + seq) % len(run_ids)]
        s.request("GET", f"{ML}/runs/get?run_id={run_id}")

    return op


def mlflow_list(experiment_id: str) -> Op:
    body = {
        "experiment_ids": [experiment_id],
        "max_results": 50,
        "order_by": ["attributes.start_time DESC"],
    }

    def op(s: Session, client: int, seq: int) -> None:
        _post(s, f"{ML}/runs/search", body)

    return op


# -- memory stores (issue 5), run once /v1/memory_stores answers --------------------------------
MS = "/v1/memory_stores"
MEMORY = ("Prefer streaming uploads to temp files; fsync before rename. " * 17)[:1000]


def ms_setup(s: Session) -> tuple[str, list[tuple[str, str]]]:
    """Create a store and one memory per preloaded slot; return the store id and (id, sha)."""
    store = json.loads(s.request("POST", MS, json.dumps({"name": "bench"}).encode(), JSON))["id"]
    memories = []
    for i in range(READ_TASKS):
        body = {"path": f"/pre/m{i}.md", "content": f"{i} {MEMORY}"}
        m = json.loads(s.request("POST", f"{MS}/{store}/memories", json.dumps(body).encode(), JSON))
        memories.append((m["id"], m["content_sha256"]))
    return store, memories


def ms_create(store: str, tag: str) -> Op:
    def op(s: Session, client: int, seq: int) -> None:
        body = {"path": f"/{tag}/c{client}/m{seq}.md", "content": MEMORY}
        s.request("POST", f"{MS}/{store}/memories", json.dumps(body).encode(), JSON)

    return op


def ms_update(store: str, memories: list[tuple[str, str]]) -> Op:
    """Each client updates its own memory with If-content_sha256 precondition (never conflicts)."""
    current: dict[int, str] = {}

    def op(s: Session, client: int, seq: int) -> None:
        memory_id, _ = memories[client % len(memories)]
        if client not in current:
            # A fresh client process (each repetition forks anew): learn the current sha once.
            got = json.loads(s.request("GET", f"{MS}/{store}/memories/{memory_id}"))
            current[client] = got["content_sha256"]
        body = {
            "content": f"{client}-{seq} {MEMORY}",
            "precondition": {"type": "content_sha256", "content_sha256": current[client]},
        }
        m = json.loads(
            s.request("POST", f"{MS}/{store}/memories/{memory_id}", json.dumps(body).encode(), JSON)
        )
        current[client] = m["content_sha256"]

    return op


def ms_retrieve(store: str, memories: list[tuple[str, str]]) -> Op:
    def op(s: Session, client: int, seq: int) -> None:
        memory_id = memories[(client * 7919 + seq) % len(memories)][0]
        s.request("GET", f"{MS}/{store}/memories/{memory_id}")

    return op


def ms_list(store: str) -> Op:
    def op(s: Session, client: int, seq: int) -> None:
        s.request("GET", f"{MS}/{store}/memories?view=basic")

    return op


# -- search ------------------------------------------------------------------------------------
# A corpus of turns as agents write them: Markdown summaries of 1-3 KB (a heading, bullets,
# code spans, paths, figures, the odd non-ASCII word and typographic punctuation) over a
# vocabulary of about a hundred words, and meta with a ticket. The rarer words the queries look
# for are planted at known rates, so each query hits a realistic share of the turns.
_NOUNS = [
    "handler", "parser", "cache", "index", "queue", "worker", "scheduler", "router",
    "session", "token", "cookie", "quota", "listing", "digest", "export", "import",
    "backup", "journal", "lock", "retry", "timeout", "webhook", "fixture", "config",
    "migration", "schema", "cursor", "page", "snippet", "template", "console", "client",
    "server", "proxy", "gateway", "bucket", "uploader", "downloader", "watcher", "sweeper",
    "limiter", "counter", "encoder", "decoder", "validator", "serializer", "formatter",
    "logger", "tracer", "profiler", "benchmark", "installer", "packager", "linter"
]  # fmt: skip
_ADJECTIVES = [
    "slow", "flaky", "stale", "empty", "nested", "partial", "cached", "signed", "expired",
    "pending", "concurrent", "streaming", "retried", "orphaned", "duplicate", "truncated",
    "oversized", "idle", "busy", "naïve", "legacy"
]  # fmt: skip
_VERBS = [
    "fixed", "refactored", "profiled", "rewrote", "documented", "tested", "reverted",
    "simplified", "instrumented", "reviewed", "renamed", "bounded", "cached", "validated",
    "split", "merged"
]  # fmt: skip
_DIRS = ["app/api", "app/storage", "app/web", "tests", "client/src", "bench", "docs", "deploy"]
_WHY = [
    "so that a slow client no longer holds a worker",
    "because the deadline was too short under load",
    "after the test failed twice in CI",
    "to keep memory bounded on large inputs",
    "since the old code read the whole file",
    "which removes a lock from the hot path",
    "as the reviewer asked — with a test that fails without it",
    "so the error message names the field",
    "to match what the API documents",
    "because a restart lost the last write",
    "and the follow-up is in the next turn",
]
_NOTES = [
    "Ran the whole suite: {n} passed, 3 skipped.",
    "p99 went from {n} ms to {m} ms.",
    "No schema change; the index rebuilds on start.",
    "The user’s report is reproduced by the new test.",
    "Left a note for the retention sweep.",
    "Follow-up: check the nightly job (ticket WEB-{n}).",
]
# Planted sentences and the share of turns that carry each.
SEARCH_PLANTED = {
    "The login bug came back after the cookie expired.": 0.03,
    "Raised the session timeout for the upload of large files.": 0.04,
    "The flaky upload test is quarantined.": 0.02,
    "Wrote the database migration for the café locale.": 0.02,
    "Streaming the response keeps the worker free.": 0.05,
}
SEARCH_QUERIES = [
    "handler",  # a common word: about a third of the turns
    "migrat*",  # a prefix
    '"session timeout"',  # a phrase
    "login bug",  # two words
    "cookie expired login",  # several terms
    "stream*",  # a prefix of a planted word
    "WEB-242",  # a ticket number (in meta and notes): a handful of turns
    "cafe",  # a word the text writes with a diacritic
    "retention sweep",  # two words of a note
    "kubernetes",  # no hit
    "flaky upload",  # two words, one of them common
    '"lock from the hot path"',  # a long phrase
]


def search_summary(rnd: random.Random, n: int) -> str:
    """A turn's summary: 1-3 KB of Markdown."""

    def thing() -> str:
        return f"the {rnd.choice(_ADJECTIVES)} {rnd.choice(_NOUNS)}"

    size = rnd.randint(1000, 3000)
    out = [f"## Turn {n}: {rnd.choice(_VERBS)} {thing()}\n"]
    length = len(out[0])
    while length < size:
        kind = rnd.random()
        if kind < 0.55:
            path = f"{rnd.choice(_DIRS)}/{rnd.choice(_NOUNS)}.py"
            line = f"- {rnd.choice(_VERBS).capitalize()} {thing()} in `{path}` {rnd.choice(_WHY)}."
        elif kind < 0.9:
            note = rnd.choice(_NOTES).format(n=rnd.randrange(5000), m=rnd.randrange(100))
            line = f"{note} Then {rnd.choice(_VERBS)} {thing()} {rnd.choice(_WHY)}."
        else:
            line = f"\n### {thing().capitalize()}\n"
        out.append(line)
        length += len(line) + 1
    for sentence, rate in SEARCH_PLANTED.items():
        if rnd.random() < rate:
            out.insert(rnd.randrange(1, len(out)), f"- {sentence}")
    return "\n".join(out)[:size] + "\n"


def search_turn(n: int) -> bytes:
    """Turn ``n`` of the search corpus (deterministic: both servers get the same text)."""
    rnd = random.Random(n)
    body = {
        "meta": {**meta(n % 8, n), "ticket": f"WEB-{n % 500}"},
        "summary_md": search_summary(rnd, n),
    }
    return json.dumps(body).encode()


def search_seed(s: Session, turns: int, start: int = 0, step: int = 1) -> None:
    """PUT turns ``start``, ``start + step``, ... of the corpus below ``turns``, one task each."""
    for n in range(start, turns, step):
        s.request("PUT", f"{API}/tasks/search-{n}/turns/0", search_turn(n), JSON)


def ours_search() -> Op:
    """GET one query of :data:`SEARCH_QUERIES`, the clients walking the rotation apart."""
    paths = [f"{API}/search?q={quote(q)}&limit=20" for q in SEARCH_QUERIES]

    def op(s: Session, client: int, seq: int) -> None:
        s.request("GET", paths[(client * 5 + seq) % len(paths)])

    return op
