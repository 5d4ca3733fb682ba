"""The web console at 10 and at 100,000 tasks: the task list and a task page, p50 latency.

One server (as `make run` starts it) over one root with two projects: `p10` (10 tasks) and
`p100k` (100,000 tasks). Every task of `p10` and the newest 10 of `p100k` are full trees
written through TaskStore.put_turn (5 turns each, the page opened is one of them); the other
99,990 tasks of `p100k` are listing rows only (what the list pages read), written through
Listing.put_turn as bench/loader.py does, with an owner, a model and an exit code so the
filtered list has something to find. Loading skips fsync in this process only
(bench.loader.unsafe_fast_mode); the server measured is never patched.

The pages are fetched over HTTP with a signed-in session, the sizes interleaved (10, 100k,
10, 100k, ...) so the two compare like with like. Never part of `make test`; nothing asserts
on time.

    python -m bench.console [--n 200] [--reps 3] [--tasks 100000]
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import tempfile
import time
from pathlib import Path

import requests

from app.storage import Scope
from app.storage.core.digest import Section
from app.storage.tree.fs.atomic import make_dirs
from app.storage.tree.sqlite.listing_sql import TurnRow
from app.storage.tree.tasks import TaskStore
from app.storage.tree.tokens import TokenRegistry

from . import servers, workloads as w
from .loader import unsafe_fast_mode

TENANT = "bench"
OPENED = "open-0009"  # one of the full tasks, the newest of each project
TURNS = 5


def build(root: Path, project: str, count: int) -> float:
    """``count`` tasks: the newest 10 as full trees, the rest as listing rows; seconds taken."""
    store = TaskStore(root)
    scope = Scope(TENANT, project)
    make_dirs(store.layout.project_dir(scope), store.layout.root)
    t0 = time.perf_counter()
    rows_only = max(0, count - 10)
    if rows_only:
        listing = store.listing(scope)
        now = store.now_us()
        retain = now + store._retention_us
        for i in range(rows_only):
            row = TurnRow(0, now - count + i, retain, "tok_loader", f"model-{i % 4}", None, i % 3)
            text = f"\n## t{i:06d}\n\nLatest turn: 0\n\n".encode()
            listing.put_turn(f"t{i:06d}", row, Section(0, retain, text))
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
    return time.perf_counter() - t0


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


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--n", type=int, default=200, help="requests per page per repetition")
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--tasks", type=int, default=100_000, help="size of the large project")
    args = parser.parse_args()
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
            pages = {
                "task list": "/tasks",
                "task list, page 2": None,  # the next-page link of the first
                "task list, filtered": "/tasks?model=model-1&failed=1",
                "task page": f"/tasks/{OPENED}",
            }
            results: dict[str, dict[int, list[float]]] = {p: {n: [] for n in levels} for p in pages}
            urls: dict[tuple[str, int], str] = {}
            rows: dict[int, int] = {}
            for count, project in levels.items():
                base = f"{server.url}/console/p/{TENANT}/{project}"
                first = session.get(base + "/tasks", timeout=30).text
                rows[count] = first.count('<td class="owner">')
                following = re.search(r'href="([^"]+)" rel="next"', first)
                for page, path in pages.items():
                    if path is None:
                        path = following.group(1).replace("&amp;", "&") if following else None
                        urls[(page, count)] = server.url + path if path else base + "/tasks"
                    else:
                        urls[(page, count)] = base + path
            for _ in range(args.reps):
                for page in pages:
                    for count in levels:
                        url = urls[(page, count)]
                        timed(session, url, 5)  # warm the worker's caches
                        results[page][count].append(statistics.median(timed(session, url, args.n)))
        finally:
            server.stop()
    small, large = levels
    print(f"\nconsole p50 latency, ms (median of {args.reps} x {args.n} requests)")
    print(f"rows on a list page: {rows[small]} at {small} tasks, {rows[large]} at {large}")
    print(f"{'page':<22} {small:>10} {large:>10}   ratio")
    out = {}
    for page, by_size in results.items():
        a, b = statistics.median(by_size[small]), statistics.median(by_size[large])
        out[page] = {str(small): round(a, 3), str(large): round(b, 3)}
        print(f"{page:<22} {a:>10.2f} {b:>10.2f}   {b / a:5.2f}")
    print(json.dumps(out))


if __name__ == "__main__":
    main()
