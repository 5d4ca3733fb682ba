"""Every kind of write, delete and read at once, at full load, for half an hour (``make soak``).

A real gunicorn (2 workers of 16 threads) over the tree, 16 client threads, 4 projects of 2
memory stores each. 14 clients speak the API and MCP: turns as JSON and as one multipart
request with their artifacts, artifact PUTs, deletes of tasks, turns, artifacts and memories
(fewer than the writes, so that each index keeps growing while it takes thousands of
deletes: what once took a project's FTS5 structure past what SQLite reads), memory creates,
edits and reads, MCP sessions (initialize once, then record_turn, search, read_turn and the
memory tool), searches, listings and project.md. 2 are signed-in console sessions that edit,
create and delete memories and delete turns and tasks through the console's forms, as a
browser posts them. The housekeeper sweeps every minute, as a deployment's does, only more
often.

Every answer is counted by kind and status. The run fails on any 5xx but a 503 that carries
Retry-After (those are counted and printed); on an MCP tool's internal failure (the MCP door
answers it as an error result, not a 500); on a refusal the mix never provokes (a 400, 403 or
422 says the test sends something wrong, or the server refuses what it should take: either
way the load is not what it claims); on a traceback in the server's log; when a worker's RSS
grows over the second half of the run by more than test_rss_soak allows; when an index ends
with more FTS5 levels than a purge leaves (LEVEL_BOUND + 2); or when fsck finds a problem
after the stop.

``MEMORY_SOAK_MIXED_SECONDS`` (default 1800) sets the length. With ``-s`` it prints the RSS
samples as it goes (``RSS <seconds> <worker MiB> ...``, with the load average and the most
levels any index has), then requests by kind and status, deletes per project and store, each
index's level count and the RSS plateau (``RSS_PLATEAU``).
"""

from __future__ import annotations

import html
import json
import os
import random
import re
import sqlite3
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import requests

from app.storage.core.names import Scope
from app.storage.tree.backend import TreeStorage
from app.storage.tree.fs.layout import Layout
from app.storage.tree.sqlite import fts
from tests.robust.faultkit import MS, PM
from tests.robust.helpers import Live
from tests.robust.test_rss_soak import LATE_GROWTH, PEAK, SAMPLE, MiB, _rss

pytestmark = [
    pytest.mark.soak,
    pytest.mark.e2e,
    pytest.mark.tree_only("reads the tree's search indexes and runs its fsck"),
]

TENANT = "acme"
# Few enough that each project takes thousands of deletes in half an hour (a few a second).
PROJECTS = [f"mix{n}" for n in range(4)]
STORES = 2
API_CLIENTS = 14
CONSOLE_CLIENTS = 2
TIMEOUT = 60
# Live memories one client keeps in a store: past it, it deletes before it creates, so that no
# store nears its 10,000-memory cap however long the run (14 clients x 300 at most).
KEEP_MEMORIES = 300
# Turns a task grows to; past it, a write rewrites one of them.
TURNS = 5
MCP_VERSION = "2025-11-25"
# Calls an MCP session makes before its client starts a new one (initialize again).
MCP_SESSION_CALLS = 200
# What the mix provokes on purpose or by its own races: a delete another client's delete
# beat (404), a console edit another client's update beat (409), a stale If-Match (412).
EXPECTED = frozenset({200, 204, 303, 404, 409, 412})
PAGES = frozenset({200, 404})  # a console page: shown, or of something deleted meanwhile
# What an MCP tool says for a storage 503, and for an exception it did not expect.
MCP_BUSY = "try again in a few seconds"
MCP_INTERNAL = "an internal error"
SAME_SITE = {"Sec-Fetch-Site": "same-origin"}
# The vocabulary of every summary, memory and query: few enough words that each search hits.
WORDS = (  # noqa: SIM905 - a word list reads better as one string
    "alpha beta gamma delta build test deploy cache index merge rebase lint token session"
    " schema migrate retry timeout socket worker thread queue flush commit branch release"
    " parser lexer bundle vendor docker kernel mount volume backup restore quota budget"
).split()
QUERIES = ("alpha", "build test", '"cache index"', "merg*", "session timeout", "worker")
_CSRF = re.compile(r'name="csrf" value="([^"]+)"')
_RECORDED = re.compile(r"Recorded turn (\d+) of task")


def _words(rng: random.Random, low: int, high: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(rng.randrange(low, high)))


def _hidden(page: str, name: str) -> str | None:
    found = re.search(rf'name="{name}" value="([^"]*)"', page)
    return html.unescape(found.group(1)) if found else None


def _cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat", encoding="ascii") as fh:
        fields = fh.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class Tally:
    """Every answer by kind and status, the deletes that took, and what fails the run."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.answers: Counter[tuple[str, str]] = Counter()
        self.deletes: Counter[str] = Counter()  # a project, or "project/store id"
        self.failures: list[str] = []

    def count(self, kind: str, label: str, failure: str | None = None) -> None:
        with self.lock:
            self.answers[kind, label] += 1
            if failure is not None:
                self.failures.append(failure)

    def fail(self, failure: str) -> None:
        with self.lock:
            self.failures.append(failure)

    def deleted(self, where: str) -> None:
        with self.lock:
            self.deletes[where] += 1

    def http(self, kind: str, r: requests.Response, expected: frozenset[int] = EXPECTED) -> int:
        status = r.status_code
        said = f"{kind}: {status} {r.request.method} {r.request.url}: {r.text[:300]!r}"
        if status == 503:
            ok = bool(r.headers.get("Retry-After"))
            self.count(kind, "503 Retry-After" if ok else "503", None if ok else said)
        else:
            self.count(kind, str(status), None if status in expected else said)
        return status

    def mcp(self, kind: str, r: requests.Response, *, may_refuse: bool = False) -> str | None:
        """The text of a tool's result (None when it is not one); ``may_refuse``: an error
        result is what the mix can provoke (a turn or memory deleted by another client)."""
        if r.status_code not in (200, 202):
            self.http(kind, r)
            return None
        if r.status_code == 202:  # a notification
            self.count(kind, "202")
            return None
        body = r.json()
        if "error" in body:
            self.count(kind, f"200 rpc {body['error'].get('code')}", f"{kind}: {body}")
            return None
        result = body["result"]
        if "content" not in result:  # initialize
            self.count(kind, "200")
            return None
        text = str(result["content"][0]["text"])
        if not result["isError"]:
            self.count(kind, "200")
        elif MCP_INTERNAL in text:
            self.count(kind, "200 internal error", f"{kind}: {text[:300]}")
        elif MCP_BUSY in text:  # the storage's 503, in the tool's words
            self.count(kind, "200 busy")
        else:
            self.count(kind, "200 isError", None if may_refuse else f"{kind}: {text[:300]}")
        return text if not result["isError"] else None


@dataclass
class Owned:
    """What one client made in one project and has not seen deleted."""

    tasks: dict[str, dict[int, set[str]]] = field(default_factory=dict)  # task -> turn -> names
    memories: dict[str, list[str]] = field(default_factory=dict)  # store -> memory ids
    files: dict[str, dict[str, int]] = field(default_factory=dict)  # store -> MCP path -> state
    mcp_calls: int = -1  # calls since the MCP session's initialize (-1: no session yet)


class ApiClient:
    """One agent's traffic over the API and MCP, in every project, as a weighted mix."""

    def __init__(
        self,
        number: int,
        url: str,
        secrets: dict[str, str],
        stores: dict[str, list[str]],
        tally: Tally,
        stop: threading.Event,
    ) -> None:
        self.n, self.url, self.secrets, self.stores = number, url, secrets, stores
        self.tally, self.stop = tally, stop
        self.rng = random.Random()
        self.s = requests.Session()
        self.owned = {p: Owned() for p in PROJECTS}
        self.made = 0
        self.project = PROJECTS[0]
        self.mine = self.owned[self.project]
        self.h: dict[str, str] = {}
        # Writes outnumber deletes, so that every index keeps growing (a delete that finds
        # nothing of this client's to delete writes instead); deletes are about a fifth of all.
        self.mix: list[tuple[Callable[[], None], int]] = [
            (self.put_turn, 13),
            (self.put_turn_form, 7),
            (self.put_artifact, 5),
            (self.delete_artifact, 3),
            (self.delete_turn, 5),
            (self.delete_task, 3),
            (self.create_memory, 10),
            (self.update_memory, 5),
            (self.delete_memory, 9),
            (self.read_memory, 2),
            (self.search, 9),
            (self.list_tasks, 4),
            (self.project_md, 3),
            (self.get_turn, 2),
            (self.list_memories, 2),
            (self.mcp, 18),
        ]

    def run(self) -> None:
        actions, weights = zip(*self.mix, strict=True)
        while not self.stop.is_set():
            self.project = self.rng.choice(PROJECTS)
            self.mine = self.owned[self.project]
            self.h = {"Authorization": f"Bearer {self.secrets[self.project]}"}
            action = self.rng.choices(actions, weights)[0]
            try:
                action()
            except Exception as exc:  # counted; the client goes on loading
                self.tally.fail(f"{action.__name__}: {exc!r}")

    # -- what this client owns ------------------------------------------------------------
    def _name(self, what: str) -> str:
        self.made += 1
        return f"c{self.n}-{what}{self.made}"

    def _some_turn(self) -> tuple[str, int] | None:
        if not self.mine.tasks:
            return None
        task = self.rng.choice(list(self.mine.tasks))
        return task, self.rng.choice(list(self.mine.tasks[task]))

    def _target(self) -> tuple[str, int]:
        """A turn to write: the next of one of this client's tasks, one of its turns again
        once it has TURNS, or the first of a new task."""
        if self.mine.tasks and self.rng.random() < 0.6:
            task = self.rng.choice(list(self.mine.tasks))
            turns = self.mine.tasks[task]
            if len(turns) < TURNS:
                return task, max(turns) + 1
            return task, self.rng.choice(list(turns))
        return self._name("t"), 0

    def _forget(self, task: str, turn: int | None = None) -> None:
        turns = self.mine.tasks.get(task)
        if turns is None:
            return
        if turn is not None:
            turns.pop(turn, None)
        if turn is None or not turns:  # a task's last turn takes the task with it
            del self.mine.tasks[task]

    def _wrote(self, r: requests.Response, task: str, turn: int) -> None:
        names = {a["name"] for a in r.json()["artifacts"]}
        self.mine.tasks.setdefault(task, {})[turn] = names

    def _turn_body(self) -> dict[str, Any]:
        return {
            "summary_md": f"## {_words(self.rng, 3, 6)}\n\n{_words(self.rng, 30, 300)}",
            "meta": {"model": "soak", "agent_id": f"c{self.n}", "exit_code": self.rng.randrange(3)},
        }

    def _artifact(self) -> tuple[str, str, bytes]:
        name = self.rng.choice(("build.log", "diff.patch", "report.json", "out.bin"))
        if name == "out.bin":
            return name, "application/octet-stream", os.urandom(self.rng.randrange(64, 8192))
        return name, "text/plain", _words(self.rng, 20, 1200).encode()

    # -- turns and artifacts ---------------------------------------------------------------
    def put_turn(self) -> None:
        task, turn = self._target()
        r = self.s.put(
            f"{self.url}{PM}/tasks/{task}/turns/{turn}",
            headers=self.h,
            json=self._turn_body(),
            timeout=TIMEOUT,
        )
        if self.tally.http("put turn", r) == 200:
            self._wrote(r, task, turn)

    def put_turn_form(self) -> None:
        """A turn and 1-3 artifacts in one multipart request (app/api/turn_form.py)."""
        task, turn = self._target()
        boundary = f"soak-{os.urandom(12).hex()}"
        parts = [("turn", None, "application/json", json.dumps(self._turn_body()).encode())]
        chosen = {a[0]: a for a in (self._artifact() for _ in range(self.rng.randrange(1, 4)))}
        parts += [("artifact", name, ctype, data) for name, ctype, data in chosen.values()]
        body = b""
        for name, filename, ctype, data in parts:
            disposition = f'form-data; name="{name}"'
            if filename is not None:
                disposition += f'; filename="{filename}"'
            body += f"--{boundary}\r\nContent-Disposition: {disposition}\r\n".encode()
            body += f"Content-Type: {ctype}\r\n\r\n".encode() + data + b"\r\n"
        body += f"--{boundary}--\r\n".encode()
        r = self.s.put(
            f"{self.url}{PM}/tasks/{task}/turns/{turn}",
            headers={**self.h, "Content-Type": f"multipart/form-data; boundary={boundary}"},
            data=body,
            timeout=TIMEOUT,
        )
        if self.tally.http("put turn multipart", r) == 200:
            self._wrote(r, task, turn)

    def put_artifact(self) -> None:
        found = self._some_turn()
        if found is None:
            return self.put_turn_form()
        task, turn = found
        name, ctype, data = self._artifact()
        r = self.s.put(
            f"{self.url}{PM}/tasks/{task}/turns/{turn}/artifacts/{name}",
            headers={**self.h, "Content-Type": ctype},
            data=data,
            timeout=TIMEOUT,
        )
        status = self.tally.http("put artifact", r)
        if status == 200:
            self.mine.tasks[task][turn].add(name)
        elif status == 404:  # a console deleted the turn or its task
            self._forget(task, turn)

    def delete_artifact(self) -> None:
        held = [
            (task, turn, name)
            for task, turns in self.rng.sample(
                list(self.mine.tasks.items()), min(5, len(self.mine.tasks))
            )
            for turn, names in turns.items()
            for name in names
        ]
        if not held:
            return self.put_turn_form()
        task, turn, name = self.rng.choice(held)
        r = self.s.delete(
            f"{self.url}{PM}/tasks/{task}/turns/{turn}/artifacts/{name}",
            headers=self.h,
            timeout=TIMEOUT,
        )
        status = self.tally.http("delete artifact", r)
        if status == 204:
            self.tally.deleted(self.project)
            self.mine.tasks[task][turn].discard(name)
        elif status == 404:
            self._forget(task, turn)

    def delete_turn(self) -> None:
        found = self._some_turn()
        if found is None:
            return self.put_turn()
        task, turn = found
        r = self.s.delete(
            f"{self.url}{PM}/tasks/{task}/turns/{turn}", headers=self.h, timeout=TIMEOUT
        )
        status = self.tally.http("delete turn", r)
        if status == 204:
            self.tally.deleted(self.project)
        if status in (204, 404):
            self._forget(task, turn)

    def delete_task(self) -> None:
        if not self.mine.tasks:
            return self.put_turn()
        task = self.rng.choice(list(self.mine.tasks))
        r = self.s.delete(f"{self.url}{PM}/tasks/{task}", headers=self.h, timeout=TIMEOUT)
        status = self.tally.http("delete task", r)
        if status == 204:
            self.tally.deleted(self.project)
        if status in (204, 404):
            self._forget(task)

    def get_turn(self) -> None:
        found = self._some_turn()
        if found is None:
            return self.list_tasks()
        task, turn = found
        r = self.s.get(f"{self.url}{PM}/tasks/{task}/turns/{turn}", headers=self.h, timeout=TIMEOUT)
        if self.tally.http("get turn", r) == 404:
            self._forget(task, turn)

    # -- reads --------------------------------------------------------------------------
    def search(self) -> None:
        r = self.s.get(
            f"{self.url}{PM}/search",
            headers=self.h,
            params={"q": self.rng.choice(QUERIES), "limit": self.rng.choice((5, 20))},
            timeout=TIMEOUT,
        )
        self.tally.http("search", r)

    def list_tasks(self) -> None:
        r = self.s.get(
            f"{self.url}{PM}/tasks", headers=self.h, params={"limit": 20}, timeout=TIMEOUT
        )
        if self.tally.http("list tasks", r) == 200 and r.json().get("next_cursor"):
            r = self.s.get(
                f"{self.url}{PM}/tasks",
                headers=self.h,
                params={"limit": 20, "cursor": r.json()["next_cursor"]},
                timeout=TIMEOUT,
            )
            self.tally.http("list tasks", r)

    def project_md(self) -> None:
        r = self.s.get(f"{self.url}{PM}/project.md", headers=self.h, timeout=TIMEOUT)
        self.tally.http("project.md", r)

    # -- memories over the API ------------------------------------------------------------
    def _store(self) -> str:
        """The project's first store three times as often as another, as agents favour the
        store they share: it takes well over a thousand deletes in half an hour."""
        return self.rng.choices(self.stores[self.project], [3] + [1] * (STORES - 1))[0]

    def _memories(self) -> tuple[str, list[str]]:
        store = self._store()
        return store, self.mine.memories.setdefault(store, [])

    def create_memory(self) -> None:
        store, held = self._memories()
        if len(held) >= KEEP_MEMORIES:
            return self.delete_memory()
        r = self.s.post(
            f"{self.url}{MS}/{store}/memories",
            headers=self.h,
            json={"path": f"/c{self.n}/{self._name('m')}.md", "content": _words(self.rng, 10, 400)},
            timeout=TIMEOUT,
        )
        if self.tally.http("create memory", r) == 200:
            held.append(r.json()["id"])

    def update_memory(self) -> None:
        store, held = self._memories()
        if not held:
            return self.create_memory()
        memory = self.rng.choice(held)
        r = self.s.post(
            f"{self.url}{MS}/{store}/memories/{memory}",
            headers=self.h,
            json={"content": _words(self.rng, 10, 400)},
            timeout=TIMEOUT,
        )
        if self.tally.http("update memory", r) == 404:  # a console deleted it
            held.remove(memory)

    def delete_memory(self) -> None:
        store, held = self._memories()
        if not held:
            return self.create_memory()
        memory = self.rng.choice(held)
        r = self.s.delete(
            f"{self.url}{MS}/{store}/memories/{memory}", headers=self.h, timeout=TIMEOUT
        )
        status = self.tally.http("delete memory", r)
        if status == 200:
            self.tally.deleted(f"{self.project}/{store}")
        if status in (200, 404):
            held.remove(memory)

    def read_memory(self) -> None:
        store, held = self._memories()
        if not held:
            return self.list_memories()
        memory = self.rng.choice(held)
        r = self.s.get(f"{self.url}{MS}/{store}/memories/{memory}", headers=self.h, timeout=TIMEOUT)
        if self.tally.http("read memory", r) == 404:
            held.remove(memory)

    def list_memories(self) -> None:
        store = self._store()
        r = self.s.get(
            f"{self.url}{MS}/{store}/memories",
            headers=self.h,
            params={"path_prefix": f"/c{self.n}/", "limit": 20},
            timeout=TIMEOUT,
        )
        self.tally.http("list memories", r)

    # -- MCP ----------------------------------------------------------------------------
    def _rpc(self, body: dict[str, Any], *, session: bool = True) -> requests.Response:
        headers = {
            **self.h,
            "Content-Type": "application/json",
            "Accept": "application/json, text/event-stream",
        }
        if session:
            headers["MCP-Protocol-Version"] = MCP_VERSION
        return self.s.post(
            f"{self.url}/mcp", data=json.dumps(body), headers=headers, timeout=TIMEOUT
        )

    def _tool(self, name: str, *, may_refuse: bool = False, **arguments: Any) -> str | None:
        self.mine.mcp_calls += 1
        r = self._rpc(
            {
                "jsonrpc": "2.0",
                "id": self.mine.mcp_calls,
                "method": "tools/call",
                "params": {"name": name, "arguments": arguments},
            }
        )
        kind = f"mcp {name} {arguments['command']}" if name == "memory" else f"mcp {name}"
        return self.tally.mcp(kind, r, may_refuse=may_refuse)

    def mcp(self) -> None:
        """A tool call of this client's session in the project; a new session first when it
        has none, or has made MCP_SESSION_CALLS calls."""
        if not 0 <= self.mine.mcp_calls < MCP_SESSION_CALLS:
            init = {
                "jsonrpc": "2.0",
                "id": 0,
                "method": "initialize",
                "params": {
                    "protocolVersion": MCP_VERSION,
                    "capabilities": {},
                    "clientInfo": {"name": "soak", "version": "1"},
                },
            }
            self.tally.mcp("mcp initialize", self._rpc(init, session=False))
            note = {"jsonrpc": "2.0", "method": "notifications/initialized"}
            self.tally.mcp("mcp initialize", self._rpc(note))
            self.mine.mcp_calls = 0
        roll = self.rng.random()
        if roll < 0.28:
            self._record_turn()
        elif roll < 0.50:
            self._tool("search", query=self.rng.choice(QUERIES), limit=10)
        elif roll < 0.66:
            found = self._some_turn()
            if found is None:
                return self._record_turn()
            self._tool("read_turn", may_refuse=True, task_id=found[0], turn=found[1])
        else:
            self._memory_tool()

    def _record_turn(self) -> None:
        task = self.rng.choice(list(self.mine.tasks)) if self.mine.tasks else self._name("t")
        if len(self.mine.tasks.get(task, ())) >= TURNS:
            task = self._name("t")
        text = self._tool(
            "record_turn",
            task_id=task,
            summary_md=_words(self.rng, 20, 200),
            meta={"model": "soak", "agent_id": f"mcp{self.n}"},
        )
        found = _RECORDED.match(text or "")
        if found is not None:
            self.mine.tasks.setdefault(task, {})[int(found.group(1))] = set()

    def _memory_tool(self) -> None:
        store = self._store()
        files = self.mine.files.setdefault(store, {})
        roll = self.rng.random()
        if not files or (roll < 0.35 and len(files) < KEEP_MEMORIES):
            path = f"/memories/mcp{self.n}/{self._name('f')}.md"
            text = f"# {_words(self.rng, 2, 5)}\nstate: 0\n{_words(self.rng, 10, 200)}\n"
            if self._tool("memory", store=store, command="create", path=path, file_text=text):
                files[path] = 0
            return
        path = self.rng.choice(list(files))
        if roll < 0.50:
            if (
                self._tool("memory", may_refuse=True, store=store, command="view", path=path)
                is None
            ):
                del files[path]  # a console deleted or rewrote it
        elif roll < 0.80:
            state = files[path]
            done = self._tool(
                "memory",
                may_refuse=True,
                store=store,
                command="str_replace",
                path=path,
                old_str=f"state: {state}",
                new_str=f"state: {state + 1}",
            )
            if done is None:
                del files[path]
            else:
                files[path] = state + 1
        else:
            done = self._tool("memory", may_refuse=True, store=store, command="delete", path=path)
            if done is not None:
                self.tally.deleted(f"{self.project}/{store}")
            del files[path]


class ConsoleClient:
    """A person in the console, signed in with a token: browses, searches, edits, creates
    and deletes memories, deletes turns and tasks, each through the page that shows the form
    and the POST the form makes (with its CSRF token), as a browser does."""

    def __init__(
        self,
        number: int,
        url: str,
        secret: str,
        stores: dict[str, list[str]],
        tally: Tally,
        stop: threading.Event,
    ) -> None:
        self.n, self.url, self.secret, self.stores = number, url, secret, stores
        self.tally, self.stop = tally, stop
        self.rng = random.Random()
        self.s = requests.Session()
        self.made = 0
        self.project = PROJECTS[0]
        self.mix: list[tuple[Callable[[], None], int]] = [
            (self.browse, 3),
            (self.search, 2),
            (self.edit_memory, 4),
            (self.create_memory, 2),
            (self.delete_memory, 2),
            (self.delete_turn, 2),
            (self.delete_task, 1),
        ]

    @property
    def base(self) -> str:
        return f"{self.url}/console/p/{TENANT}/{self.project}"

    def run(self) -> None:
        try:
            self.sign_in()
        except Exception as exc:  # counted: the run fails
            self.tally.fail(f"console sign-in: {exc!r}")
            return
        actions, weights = zip(*self.mix, strict=True)
        while not self.stop.is_set():
            self.project = self.rng.choice(PROJECTS)
            action = self.rng.choices(actions, weights)[0]
            try:
                action()
            except Exception as exc:  # counted; the client goes on loading
                self.tally.fail(f"console {action.__name__}: {exc!r}")

    def sign_in(self) -> None:
        form = self.s.get(f"{self.url}/console/signin", timeout=TIMEOUT)
        assert form.status_code == 200, form.text[:300]
        done = self.post(
            "console sign in", "/console/signin", {"token": self.secret}, form.text, root=True
        )
        assert done is not None and done.status_code == 303, done

    def page(self, kind: str, where: str, **params: str) -> str | None:
        """A page's HTML; None when it is gone (a 404: deleted meanwhile)."""
        r = self.s.get(f"{self.base}{where}", params=params, allow_redirects=False, timeout=TIMEOUT)
        # A redirect here would be to the sign-in page: the session was lost.
        return r.text if self.tally.http(kind, r, PAGES) == 200 else None

    def post(
        self, kind: str, path: str, data: dict[str, str], page: str, *, root: bool = False
    ) -> requests.Response | None:
        """The POST of the form on ``page``, with the page's CSRF token."""
        csrf = _CSRF.search(page)
        if csrf is None:
            self.tally.fail(f"{kind}: the form's page has no CSRF field: {page[:300]!r}")
            return None
        r = self.s.post(
            f"{self.url if root else self.base}{path}",
            data={"csrf": csrf.group(1), **data},
            headers={"Origin": self.url, **SAME_SITE},
            allow_redirects=False,
            timeout=TIMEOUT,
        )
        self.tally.http(kind, r)
        return r

    def browse(self) -> None:
        path = self.rng.choice(("/tasks", "/project.md", "/stores", "/usage"))
        self.page(f"console page {path}", path)

    def search(self) -> None:
        self.page("console search", "/search", q=self.rng.choice(QUERIES))

    # -- memories -----------------------------------------------------------------------
    def _memory(self) -> tuple[str, str] | None:
        """A memory found by walking the store's folders, as a person clicks through."""
        store = self.rng.choice(self.stores[self.project])
        params: dict[str, str] = {}
        for _ in range(3):
            page = self.page("console store", f"/stores/{store}", **params)
            if page is None:
                return None
            memories = re.findall(rf'/stores/{store}/memories/(mem_[0-9A-Za-z]+)"', page)
            folders = re.findall(rf'/stores/{store}\?path=([^"&]+)"', page)
            if memories and (not folders or self.rng.random() < 0.6):
                return store, self.rng.choice(memories)
            if not folders:
                return None
            params = {"path": requests.utils.unquote(html.unescape(self.rng.choice(folders)))}
        return None

    def edit_memory(self) -> None:
        found = self._memory()
        if found is None:
            return self.create_memory()
        store, memory = found
        form = self.page("console edit form", f"/stores/{store}/memories/{memory}/edit")
        if form is None:
            return
        self.post(
            "console edit memory",
            f"/stores/{store}/memories/{memory}/edit",
            {
                "content": f"# edited in the console\nstate: 0\n{_words(self.rng, 10, 200)}\n",
                "content_sha256": _hidden(form, "content_sha256") or "",
                "path_shown": _hidden(form, "path_shown") or "/",
            },
            form,
        )

    def create_memory(self) -> None:
        store = self.rng.choice(self.stores[self.project])
        form = self.page("console new form", f"/stores/{store}/memories/new", path="/console/")
        if form is None:
            return
        self.made += 1
        self.post(
            "console create memory",
            f"/stores/{store}/memories/new",
            {
                "path": f"/console/k{self.n}-{self.made}.md",
                "content": _words(self.rng, 10, 200),
            },
            form,
        )

    def delete_memory(self) -> None:
        found = self._memory()
        if found is None:
            return
        store, memory = found
        form = self.page("console confirm", f"/stores/{store}/memories/{memory}/delete")
        if form is None:
            return
        r = self.post(
            "console delete memory",
            f"/stores/{store}/memories/{memory}/delete",
            {"content_sha256": _hidden(form, "content_sha256") or ""},
            form,
        )
        if r is not None and r.status_code == 303:
            self.tally.deleted(f"{self.project}/{store}")

    # -- turns and tasks ----------------------------------------------------------------
    def _task(self) -> str | None:
        page = self.page("console page /tasks", "/tasks")
        if page is None:
            return None
        tasks = re.findall(rf'/console/p/{TENANT}/{self.project}/tasks/([0-9A-Za-z._-]+)"', page)
        return self.rng.choice(tasks) if tasks else None

    def delete_turn(self) -> None:
        task = self._task()
        if task is None:
            return
        page = self.page("console task", f"/tasks/{task}")
        turns = re.findall(rf'/tasks/{re.escape(task)}/turns/(\d+)"', page or "")
        if not turns:
            return
        turn = self.rng.choice(turns)
        form = self.page("console confirm", f"/tasks/{task}/turns/{turn}/delete")
        if form is None:
            return
        r = self.post(
            "console delete turn",
            f"/tasks/{task}/turns/{turn}/delete",
            {"if_match": _hidden(form, "if_match") or ""},
            form,
        )
        if r is not None and r.status_code == 303:
            self.tally.deleted(self.project)

    def delete_task(self) -> None:
        task = self._task()
        if task is None:
            return
        form = self.page("console confirm", f"/tasks/{task}/delete")
        if form is None:
            return
        r = self.post("console delete task", f"/tasks/{task}/delete", {}, form)
        if r is not None and r.status_code == 303:
            self.tally.deleted(self.project)


# -- the run ----------------------------------------------------------------------------
def _indexes(root: Path, stores: dict[str, list[str]]) -> dict[str, Path]:
    """Each project's listing and each store's index, by name."""
    layout = Layout(root)
    found = {}
    for project in PROJECTS:
        scope = Scope(TENANT, project)
        found[project] = layout.listing(scope)
        for store in stores[project]:
            found[f"{project}/{store}"] = layout.store_index(layout.store_dir(scope, store))
    return found


def _levels(path: Path) -> int | None:
    """The level count of the index's FTS5 structure; None when it cannot be read now (a
    compaction renaming its table, a file not made yet)."""
    try:
        conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=1.0)
    except sqlite3.Error:
        return None
    try:
        return fts.levels(conn)
    except sqlite3.Error:
        return None
    finally:
        conn.close()


def test_a_mixed_load_answers_no_500_and_levels_off(tmp_path: Path) -> None:
    seconds = float(os.environ.get("MEMORY_SOAK_MIXED_SECONDS", "1800"))
    root = tmp_path / "storage"
    server = Live(
        tmp_path=tmp_path,
        root=root,
        workers=2,
        threads=16,
        env_extra={
            "MEMORY_RATE_LIMIT_RPS": "0",
            # A floor of its own: a crowded machine's disk must not turn writes into 507s.
            "MEMORY_MIN_FREE_BYTES": "256MiB",
            "MEMORY_SWEEP_INTERVAL": "60",
        },
    ).start()
    tally = Tally()
    stop = threading.Event()
    try:
        secrets = {p: server.token("writer", tenant=TENANT, project=p) for p in PROJECTS}
        console_secret = server.token("tenant_admin", tenant=TENANT, project=None)
        stores: dict[str, list[str]] = {}
        for project in PROJECTS:
            h = {"Authorization": f"Bearer {secrets[project]}"}
            stores[project] = []
            for i in range(STORES):
                r = requests.post(
                    f"{server.url}{MS}", headers=h, json={"name": f"s{i}"}, timeout=TIMEOUT
                )
                assert r.status_code == 200, r.text
                stores[project].append(r.json()["id"])
        clients: list[ApiClient | ConsoleClient] = [
            ApiClient(n, server.url, secrets, stores, tally, stop) for n in range(API_CLIENTS)
        ]
        clients += [
            ConsoleClient(n, server.url, console_secret, stores, tally, stop)
            for n in range(CONSOLE_CLIENTS)
        ]
        threads = [threading.Thread(target=c.run, daemon=True) for c in clients]
        for thread in threads:
            thread.start()
        indexes = _indexes(root, stores)
        workers = server.worker_pids()
        cpu_before = {pid: _cpu_seconds(pid) for pid in workers}
        clients_before = sum(os.times()[:2])
        most: dict[str, int] = {}
        samples: list[tuple[float, list[int]]] = []
        started = time.monotonic()
        while time.monotonic() - started < seconds:
            time.sleep(min(SAMPLE, seconds - (time.monotonic() - started)))
            assert server.worker_pids() == workers, "a worker died or was replaced"
            sample = [_rss(pid) for pid in workers]
            samples.append((time.monotonic() - started, sample))
            for name, path in indexes.items():
                found = _levels(path)
                if found is not None:
                    most[name] = max(most.get(name, 0), found)
            print(
                "RSS",
                f"{samples[-1][0]:.0f}",
                *(f"{v / MiB:.1f}" for v in sample),
                f"load={os.getloadavg()[0]:.1f}",
                f"requests={sum(tally.answers.values())}",
                f"deletes={sum(tally.deletes.values())}",
                f"most_levels={max(most.values(), default=0)}",
                flush=True,
            )
        elapsed = time.monotonic() - started
        cpu = sum(_cpu_seconds(pid) - cpu_before[pid] for pid in workers)
        cpu_clients = sum(os.times()[:2]) - clients_before
        stop.set()
        for thread in threads:
            thread.join(timeout=120)
        assert not any(t.is_alive() for t in threads), "a client did not stop"
    finally:
        stop.set()
        server.stop()

    # What the run did: requests by kind and status, deletes, the workers' CPU.
    total = sum(tally.answers.values())
    busy = sum(
        n for (_, label), n in tally.answers.items() if label.startswith(("503", "200 busy"))
    )
    print(
        f"\nMIX {total} requests in {elapsed:.0f} s ({total / elapsed:.0f}/s),"
        f" {busy} answered 503 with Retry-After (or an MCP tool's 'try again')",
        flush=True,
    )
    print(
        f"CPU workers {cpu:.0f} s, clients {cpu_clients:.0f} s, in {elapsed:.0f} s"
        f" on {os.cpu_count()} cores"
    )
    for (kind, label), count in sorted(tally.answers.items()):
        print(f"  {kind:<32} {label:<20} {count:>8}")
    print("DELETES (turns, tasks and artifacts of a project; memories of a store)")
    for where, count in sorted(tally.deletes.items()):
        print(f"  {where:<44} {count:>8}")

    # The indexes as the server left them, then the whole tree checked.
    levels = {}
    for name, path in indexes.items():
        assert path.exists(), f"{name}: no index at {path}"
        conn = sqlite3.connect(path)
        try:
            levels[name] = fts.levels(conn)
        finally:
            conn.close()
        print(f"LEVELS {name:<44} end={levels[name]:>3} most={most.get(name, '-')}")
    storage = TreeStorage(root, lock_timeout=10.0)
    try:
        report = storage.fsck()
    finally:
        storage.close()
    tracebacks = server.log().count("Traceback")
    print(f"FSCK problems={len(report.problems)} TRACEBACKS={tracebacks}")
    print(f"FAILURES {len(tally.failures)}", *tally.failures[:20], sep="\n  ")

    half = [s for t, s in samples if t >= elapsed / 2]
    assert half, samples
    for index, pid in enumerate(workers):
        series = [s[index] for _, s in samples]
        late = [s[index] for s in half]
        print(
            f"RSS_PLATEAU worker={pid} first={series[0] / MiB:.1f}MiB half={late[0] / MiB:.1f}MiB"
            f" last={series[-1] / MiB:.1f}MiB peak={max(series) / MiB:.1f}MiB"
            f" late_growth={(max(late) - late[0]) / MiB:.1f}MiB",
            flush=True,
        )

    assert not tally.failures, tally.failures[:20]
    assert tracebacks == 0, server.log()[-20000:]
    assert all(n <= fts.LEVEL_BOUND + 2 for n in levels.values()), levels
    assert report.problems == [], report.problems
    for index in range(len(workers)):
        series = [s[index] for _, s in samples]
        late = [s[index] for s in half]
        assert max(late) - late[0] <= LATE_GROWTH, series
        assert max(series) <= PEAK, series
