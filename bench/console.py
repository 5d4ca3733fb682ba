"""The web console at 10 and at 100,000 tasks: every page, p50 latency and server time.

One server (as `make run` starts it) over one root with two projects: `p10` (10 tasks) and
`p100k` (100,000 tasks). Every task of `p10` and the newest 10 of `p100k` are full trees
written through TaskStore.put_turn (5 turns each, the page opened is one of them); the other
99,990 tasks of `p100k` are listing rows only (what the list pages read), written through
Listing.put_turn as bench/loader.py does, with an owner, a model, an agent, an exit code and
a size so the filters and orders have something to find. Each project also gets a memory
store, 30 days of traffic hours (for the usage charts) and, at the large size, 10,000 audit
events. Loading skips fsync in this process only (bench.loader.unsafe_fast_mode); the
server measured is never patched.

The pages are fetched over HTTP with a signed-in session, the sizes interleaved (10, 100k,
10, 100k, ...) so the two compare like with like. Server time is the request log's
``duration_ms`` of the same requests (the log lines each batch added). Never part of
`make test`; nothing asserts on time.

    python -m bench.console [--n 200] [--reps 3] [--tasks 100000] [--pages contains]
"""

from __future__ import annotations

import argparse
import json
import re
import sqlite3
import statistics
import tempfile
import time
from pathlib import Path

import requests
from ulid import ULID

from app.storage.core import audit
from app.storage.core.digest import Section
from app.storage.core.names import Scope
from app.storage.core.traffic import TrafficRow
from app.storage.core.usage import TurnUsage
from app.storage.tree.backend import TreeStorage
from app.storage.tree.fs.atomic import make_dirs
from app.storage.tree.sqlite.listing_sql import TurnRow
from app.storage.tree.tokens import TokenRegistry

from . import servers, workloads as w
from .loader import unsafe_fast_mode

TENANT = "bench"
OPENED = "open-0009"  # one of the full tasks, the newest of each project
TURNS = 5


def build(root: Path, project: str, count: int) -> float:
    """``count`` tasks: the newest 10 as full trees, the rest as listing rows; a memory store;
    30 days of traffic; audit events at the large size. Seconds taken."""
    backend = TreeStorage(root)
    store = backend.tasks
    scope = Scope(TENANT, project)
    make_dirs(store.layout.project_dir(scope), store.layout.root)
    t0 = time.perf_counter()
    rows_only = max(0, count - 10)
    if rows_only:
        listing = store.listing(scope)
        now = store.now_us()
        retain = now + store.retention_us
        for i in range(rows_only):
            row = TurnRow(
                0, now - count + i, retain, "tok_loader", f"model-{i % 4}", f"agent-{i % 50}", i % 3
            )
            text = f"\n## t{i:06d}\n\nLatest turn: 0\n\n".encode()
            usage = TurnUsage(0, 0, 0, 100 + (i * 7919) % 50_000)
            listing.put_turn(f"t{i:06d}", row, Section(0, retain, text), usage=usage)
    for i in range(count - rows_only):
        for turn in range(TURNS):
            store.put_turn(
                scope,
                f"open-{i:04d}",
                turn,
                meta=w.meta(i, turn),
                summary_md="## Turn\n\n" + w.SUMMARY,
                actor="tok_loader",
            )
    made = backend.stores.create_store(scope, name="Team prefs", creator="tok_loader")
    memory = backend.stores.create_memory(
        scope, made.id, path="/style.md", content="Use ruff.\n" * 20, actor=None
    )
    hour = int(time.time() // 3600)
    backend.record_traffic(
        TrafficRow(h, TENANT, project, "tok_loader", 100 + h % 37, 5000 + h % 977, 20_000)
        for h in range(hour - 30 * 24, hour + 1)
    )
    if count > 10:
        # One event through the interface, then 10,000 in one transaction of the same file.
        backend.audit_log.record(
            TENANT, project, actor="tok_0", kind="task", action="created", subject="t000000"
        )
        now = store.now_us()
        with sqlite3.connect(backend.layout.audit()) as conn:
            conn.executemany(
                f"INSERT INTO events ({', '.join(audit.COLUMNS)}) VALUES ({', '.join('?' * 10)})",  # noqa: S608 - fixed column names
                [
                    audit.values(
                        audit.AuditEvent(
                            f"evt_{ULID()}",
                            now - i * 1000,
                            TENANT,
                            project,
                            actor=f"tok_{i % 7}",
                            kind=("task", "memory", "token")[i % 3],
                            action="created",
                            subject=f"t{i:06d}",
                        )
                    )
                    for i in range(1, 10_000)
                ],
            )
    IDS[project] = {"store": made.id, "memory": memory.id}
    backend.close()
    return time.perf_counter() - t0


IDS: dict[str, dict[str, str]] = {}


def sign_in(url: str, secret: str) -> requests.Session:
    session = requests.Session()
    form = session.get(f"{url}/console/signin", timeout=10)
    csrf = re.search(r'name="csrf" value="([^"]+)"', form.text)
    assert csrf, "no sign-in form"
    done = session.post(
        f"{url}/console/signin",
        data={"csrf": csrf.group(1), "token": secret},
        headers={"Origin": url, "Sec-Fetch-Site": "same-origin"},
        allow_redirects=False,
        timeout=10,
    )
    assert done.status_code == 303, done.text
    return session


def timed(session: requests.Session, url: str, n: int) -> list[float]:
    samples = []
    for _ in range(n):
        t0 = time.perf_counter()
        r = session.get(url, timeout=30)
        samples.append((time.perf_counter() - t0) * 1000)
        assert r.status_code == 200, (url, r.status_code)
    return samples


class ServerTimes:
    """The request log's duration_ms of the requests made since the last look."""

    def __init__(self, log_path: Path) -> None:
        self.path = log_path
        self.offset = log_path.stat().st_size

    def since(self) -> list[float]:
        with open(self.path, "rb") as fh:
            fh.seek(self.offset)
            data = fh.read()
        self.offset += len(data)
        found = []
        for line in data.decode(errors="replace").splitlines():
            start = line.find('{"time"')
            if start < 0:
                continue
            try:
                entry = json.loads(line[start:])
            except ValueError:
                continue
            if entry.get("method") == "GET" and entry.get("status") == 200:
                found.append(float(entry["duration_ms"]))
        return found


PAGES = {
    "task list": "/tasks",
    "task list, page 2": "next",  # the rel=next link of the first page
    "task list, page 1 again": "prev",  # page 2's rel=prev link
    "task list, filtered": "/tasks?model=model-1&failed=1",
    "by size": "/tasks?sort=size",
    "by turns": "/tasks?sort=turns",
    "by task id": "/tasks?sort=task_id",
    "by size, oldest first": "/tasks?sort=size&dir=asc",
    "model contains, common": "/tasks?model=DEL-2",
    "model contains, none": "/tasks?model=no-such-model",
    "agent contains": "/tasks?agent=agent-4",
    "task page": f"/tasks/{OPENED}",
    "turn page": f"/tasks/{OPENED}/turns/4",
    "delete-turn form": f"/tasks/{OPENED}/turns/4/delete",
    "usage": "/usage",
    "tokens": "/tokens",
    "new token form": "/tokens/new",
    "limits": "/limits",
    "audit": "/audit",
    "audit, one actor": "/audit?actor=tok_3",
    "audit, one kind": "/audit?kind=token",
    "stores": "/stores",
    "memory edit form": "/stores/{store}/memories/{memory}/edit",
    "projects": "PROJECTS",
}


def resolve(session: requests.Session, base: str, server: str, project: str) -> dict[str, str]:
    urls = {}
    first = session.get(base + "/tasks", timeout=30).text
    following = re.search(r'href="([^"]+)" rel="next"', first)
    second_url = server + following.group(1).replace("&amp;", "&") if following else None
    for page, path in PAGES.items():
        if path == "next":
            urls[page] = second_url or base + "/tasks"
        elif path == "prev":
            back = None
            if second_url:
                second = session.get(second_url, timeout=30).text
                back = re.search(r'href="([^"]+)" rel="prev"', second)
            urls[page] = server + back.group(1).replace("&amp;", "&") if back else base + "/tasks"
        elif path == "PROJECTS":
            urls[page] = server + "/console/projects"
        else:
            urls[page] = base + path.format(**IDS[project])
    return urls


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--n", type=int, default=200, help="requests per page per repetition")
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--tasks", type=int, default=100_000, help="size of the large project")
    parser.add_argument("--pages", default="", help="only the pages whose name holds this")
    args = parser.parse_args()
    pages = [p for p in PAGES if args.pages in p]
    levels = {10: "p10", args.tasks: "p100k"}
    with tempfile.TemporaryDirectory(prefix="pm-bench-console-") as tmp:
        workdir = Path(tmp)
        root = workdir / "storage"
        unsafe_fast_mode()
        for count, project in levels.items():
            seconds = build(root, project, count)
            print(f"built {project}: {count} tasks in {seconds:.1f} s")
        _, secret = TokenRegistry(workdir / "tokens.json").create(
            role="admin", tenant=TENANT, name="bench"
        )
        server = servers.start_ours(workdir)
        try:
            session = sign_in(server.url, secret)
            latency: dict[str, dict[int, list[float]]] = {p: {n: [] for n in levels} for p in PAGES}
            served: dict[str, dict[int, list[float]]] = {p: {n: [] for n in levels} for p in PAGES}
            urls = {
                count: resolve(
                    session, f"{server.url}/console/p/{TENANT}/{project}", server.url, project
                )
                for count, project in levels.items()
            }
            log = ServerTimes(server.log_path)
            for _ in range(args.reps):
                for page in pages:
                    for count in levels:
                        url = urls[count][page]
                        timed(session, url, 5)  # warm the worker's caches
                        log.since()
                        latency[page][count].append(statistics.median(timed(session, url, args.n)))
                        served[page][count] += log.since()
        finally:
            server.stop()
    small, large = levels
    print(f"\nconsole pages, ms (client p50: median of {args.reps} x {args.n} requests;")
    print("server: the request log's duration_ms of the same requests, p50 and max)")
    print(
        f"{'page':<26} {'p50 ' + str(small):>10} {'p50 ' + str(large):>12}   ratio"
        f" {'server p50':>11} {'server max':>11}"
    )
    out = {}
    for page in pages:
        a, b = statistics.median(latency[page][small]), statistics.median(latency[page][large])
        times = served[page][large]
        p50 = statistics.median(times) if times else float("nan")
        worst = max(times) if times else float("nan")
        out[page] = {
            str(small): round(a, 3),
            str(large): round(b, 3),
            "server_p50": round(p50, 3),
            "server_max": round(worst, 3),
        }
        print(f"{page:<26} {a:>10.2f} {b:>12.2f}   {b / a:5.2f} {p50:>11.2f} {worst:>11.2f}")
    print(json.dumps(out))


if __name__ == "__main__":
    main()
