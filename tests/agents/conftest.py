"""A real server for the agent tests, a switch in front of it, and the hook run as the agents
run it: ``project-memory agent hook <event>`` in a process of its own, JSON on stdin.

The switch (:class:`Switch`) is a TCP relay on a fixed port: ``up`` forwards to gunicorn,
``down`` refuses connections (a stopped server), ``slow`` accepts and never answers (a hung
one). The URL the hooks know stays the same through all three, as a user's does.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import requests

from app.storage.core.users import User, user_id
from app.storage.tree.fs.layout import Layout
from app.storage.tree.tokens import TokenRegistry
from app.storage.tree.users import UserFiles
from tests.agents.harness import EgressProbe
from tests.e2e.conftest import Server, start_server

VENV_BIN = Path(sys.executable).parent
CLI = str(VENV_BIN / "project-memory")
API = "/sandbox/memory/v1"


class Switch:
    """127.0.0.1:<port> → ``target``, in one of three states: up, down, slow."""

    def __init__(self, target: tuple[str, int]) -> None:
        self.target = target
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            self.port = probe.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self.state = "down"
        self.listener: socket.socket | None = None
        self.held: list[socket.socket] = []
        self.lock = threading.Lock()

    def set(self, state: str) -> None:
        with self.lock:
            if state == "down":
                self._close()
            elif self.listener is None:
                sock = socket.socket()
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                sock.bind(("127.0.0.1", self.port))
                sock.listen(64)
                self.listener = sock
                threading.Thread(target=self._accept, args=(sock,), daemon=True).start()
            self.state = state

    def _close(self) -> None:
        if self.listener is not None:
            # shutdown first: close alone leaves a thread blocked in accept() accepting
            with contextlib.suppress(OSError):
                self.listener.shutdown(socket.SHUT_RDWR)
            self.listener.close()
            self.listener = None
        for held in self.held:
            held.close()
        self.held.clear()

    def _accept(self, sock: socket.socket) -> None:
        while True:
            try:
                client, _ = sock.accept()
            except OSError:
                return
            if self.state == "slow":
                self.held.append(client)  # read nothing, answer nothing
                continue
            try:
                upstream = socket.create_connection(self.target, timeout=5)
            except OSError:
                client.close()
                continue
            threading.Thread(target=self._relay, args=(client, upstream), daemon=True).start()

    @staticmethod
    def _relay(client: socket.socket, upstream: socket.socket) -> None:
        """Both directions until both ends are done; then both sockets are closed."""
        peers = {client: upstream, upstream: client}
        open_ = set(peers)
        try:
            while open_:
                ready, _, _ = select.select(list(open_), [], [], 30)
                if not ready:
                    return
                for sock in ready:
                    data = sock.recv(65536)
                    if data:
                        peers[sock].sendall(data)
                    else:
                        open_.discard(sock)
                        with contextlib.suppress(OSError):
                            peers[sock].shutdown(socket.SHUT_WR)
        except OSError:
            pass
        finally:
            client.close()
            upstream.close()

    def close(self) -> None:
        with self.lock:
            self._close()


ANA = user_id("https://idp.example", "ana")


@dataclass
class Memory:
    """The server behind its switch, and tokens: a writer's and a reader's of acme/web, and a
    writer's of every project of acme."""

    server: Server
    switch: Switch
    writer: str
    reader: str
    tenant_writer: str
    # A writer's of acme/web that belongs to a user (ANA): one with a private space.
    ana: str

    @property
    def url(self) -> str:
        return self.switch.url

    def api(
        self, method: str, path: str, token: str | None = None, **kwargs: Any
    ) -> requests.Response:
        headers = {"Authorization": f"Bearer {token or self.writer}", **kwargs.pop("headers", {})}
        return requests.request(
            method, f"{self.server.url}{API}{path}", headers=headers, timeout=10, **kwargs
        )

    def task(self, task_id: str) -> dict[str, Any] | None:
        r = self.api("GET", f"/tasks/{task_id}")
        if r.status_code == 404:
            return None
        r.raise_for_status()
        return dict(r.json())

    def turns(self, task_id: str) -> list[dict[str, Any]]:
        """Every turn of the task, whole (meta, summary), by number."""
        index = self.task(task_id)
        if index is None:
            return []
        out = []
        for entry in index["turns"]:
            r = self.api("GET", f"/tasks/{task_id}/turns/{entry['turn']}")
            r.raise_for_status()
            out.append(r.json())
        return out


@pytest.fixture(scope="session")
def memory(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Memory]:
    """One server for every agent test of this process: each test uses tasks of its own."""
    base = tmp_path_factory.mktemp("agents-server")
    registry = TokenRegistry(base / "tokens.json")
    writer = registry.create(role="writer", tenant="acme", project="web")[1]
    reader = registry.create(role="reader", tenant="acme", project="web")[1]
    tenant_writer = registry.create(role="writer", tenant="acme")[1]
    ana = registry.create(role="writer", tenant="acme", project="web", user=ANA, name="laptop")[1]
    # Her user record, as her first sign-in leaves it: the role her tokens act in at most.
    UserFiles(Layout(base / "storage")).change(
        ANA,
        lambda _: User(
            ANA, "https://idp.example", "ana", "ana@example.com", "Ana", "2026-01-01T00:00:00Z",
            role="writer", tenant="acme", project="web",
        ),
    )  # fmt: skip
    server = start_server(base, workers=2, threads=4)
    host, port = server.url.removeprefix("http://").split(":")
    switch = Switch((host, int(port)))
    switch.set("up")
    try:
        yield Memory(server, switch, writer, reader, tenant_writer, ana)
    finally:
        switch.close()
        server.stop()


@pytest.fixture
def memory_up(memory: Memory) -> Iterator[Memory]:
    memory.switch.set("up")
    yield memory
    memory.switch.set("up")


def git_repo(path: Path, branch: str = "fix-login") -> str:
    """A git work tree at ``path`` on ``branch`` with one commit; its HEAD."""
    path.mkdir(parents=True, exist_ok=True)
    env = {
        **os.environ,
        "GIT_AUTHOR_NAME": "t",
        "GIT_AUTHOR_EMAIL": "t@example.com",
        "GIT_COMMITTER_NAME": "t",
        "GIT_COMMITTER_EMAIL": "t@example.com",
    }
    subprocess.run(["git", "init", "-q", "-b", branch], cwd=path, check=True, env=env)
    subprocess.run(
        ["git", "commit", "-q", "--allow-empty", "-m", "init"], cwd=path, check=True, env=env
    )
    head = subprocess.run(
        ["git", "rev-parse", "HEAD"], cwd=path, capture_output=True, text=True, check=True
    )
    return head.stdout.strip()


@pytest.fixture
def agent_env(tmp_path: Path, memory_up: Memory) -> dict[str, str]:
    """The environment an agent gives its hooks: an isolated HOME and state directory, the
    server's URL (through the switch) and a writer's token."""
    home = tmp_path / "home"
    home.mkdir()
    keep = {k: v for k, v in os.environ.items() if not k.startswith("PROJECT_MEMORY_")}
    return {
        **keep,
        "HOME": str(home),
        "XDG_CONFIG_HOME": str(home / ".config"),
        "PATH": f"{VENV_BIN}{os.pathsep}{os.environ.get('PATH', '')}",
        "PROJECT_MEMORY_URL": memory_up.url,
        "PROJECT_MEMORY_TOKEN": memory_up.writer,
        "PROJECT_MEMORY_STATE_DIR": str(tmp_path / "state"),
        # The network part's time, for every event alike: the tests of giving up use the
        # events' own defaults (:func:`default_timeout`).
        "PROJECT_MEMORY_HOOK_TIMEOUT": "8",
    }


def default_timeout(env: dict[str, str]) -> dict[str, str]:
    """``env`` with the hooks' own time limits (hooks.SESSION_START_TIMEOUT, STOP_TIMEOUT)."""
    return {k: v for k, v in env.items() if k != "PROJECT_MEMORY_HOOK_TIMEOUT"}


def run_hook(
    env: dict[str, str],
    event: str,
    payload: dict[str, Any],
    agent: str = "claude-code",
    flags: tuple[str, ...] = (),
) -> tuple[subprocess.CompletedProcess[str], float]:
    """Run one hook as the agent does (with ``flags`` after its own); the process and its
    wall time."""
    started = time.monotonic()
    done = subprocess.run(
        [CLI, "agent", "hook", event, "--agent", agent, *flags],
        input=json.dumps(payload),
        capture_output=True,
        text=True,
        env=env,
        cwd=payload.get("cwd"),
        timeout=30,
        check=False,
    )
    return done, time.monotonic() - started


def cli(
    env: dict[str, str], *args: str, cwd: Path | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [CLI, *args], capture_output=True, text=True, env=env, cwd=cwd, timeout=60, check=False
    )


class Transcript:
    """A Claude Code transcript written line by line, as Claude Code writes it."""

    def __init__(self, path: Path, session_id: str, cwd: Path) -> None:
        self.path = path
        self.session_id = session_id
        self.cwd = cwd
        self.clock = 0
        path.parent.mkdir(parents=True, exist_ok=True)
        path.touch()

    def _stamp(self) -> str:
        self.clock += 1
        minutes, seconds = divmod(self.clock, 60)
        return f"2026-12-01T10:{minutes:02d}:{seconds:02d}.000Z"

    def _write(self, line: dict[str, Any]) -> None:
        line.setdefault("uuid", f"u-{self.clock}-{len(self.path.read_bytes())}")
        line.setdefault("timestamp", self._stamp())
        line.setdefault("sessionId", self.session_id)
        with open(self.path, "a", encoding="utf-8") as fh:
            fh.write(json.dumps(line) + "\n")

    def prompt(self, text: str) -> None:
        self._write({"type": "user", "message": {"role": "user", "content": text}})

    def assistant(
        self,
        message_id: str,
        content: list[dict[str, Any]],
        usage: dict[str, int],
        model: str = "claude-test-1",
    ) -> None:
        message = {
            "id": message_id,
            "type": "message",
            "role": "assistant",
            "model": model,
            "content": content,
            "usage": usage,
        }
        self._write({"type": "assistant", "message": message})

    def tool_result(self, tool_use_id: str, text: str) -> None:
        content = [{"type": "tool_result", "tool_use_id": tool_use_id, "content": text}]
        self._write({"type": "user", "message": {"role": "user", "content": content}})

    def turn(self, prompt: str, answer: str) -> None:
        """A prompt, one tool call (two lines of one API message), its result, an answer."""
        usage = {
            "input_tokens": 100,
            "output_tokens": 10,
            "cache_read_input_tokens": 1000,
            "cache_creation_input_tokens": 5,
        }
        self.prompt(prompt)
        n = self.clock
        self.assistant(f"msg_a{n}", [{"type": "text", "text": "Let me look."}], usage)
        self.assistant(
            f"msg_a{n}", [{"type": "tool_use", "id": f"t{n}", "name": "Bash", "input": {}}], usage
        )
        self.tool_result(f"t{n}", "ok")
        self.assistant(
            f"msg_b{n}", [{"type": "text", "text": answer}], {**usage, "output_tokens": 20}
        )

    def stop(self, last: str | None = None) -> dict[str, Any]:
        payload: dict[str, Any] = {
            "session_id": self.session_id,
            "transcript_path": str(self.path),
            "cwd": str(self.cwd),
            "hook_event_name": "Stop",
            "stop_hook_active": False,
        }
        if last is not None:
            payload["last_assistant_message"] = last
        return payload


@dataclass
class Work:
    """A git work tree on ``fix-login``, the hooks' environment, and the transcripts of its
    sessions (``PROJECT_MEMORY_TASK`` names the task when given)."""

    repo: Path
    head: str
    env: dict[str, str]
    tmp: Path

    def task(self, task_id: str, **extra: str) -> dict[str, str]:
        return {**self.env, "PROJECT_MEMORY_TASK": task_id, **extra}

    def session(self, session_id: str, *turns: tuple[str, str]) -> Transcript:
        transcript = Transcript(self.tmp / f"{session_id}.jsonl", session_id, self.repo)
        for prompt, answer in turns:
            transcript.turn(prompt, answer)
        return transcript

    def start(self, session_id: str) -> dict[str, Any]:
        """A SessionStart event of ``session_id``."""
        return {"session_id": session_id, "cwd": str(self.repo), "source": "startup"}

    def spooled(self) -> list[Path]:
        spool = Path(self.env["PROJECT_MEMORY_STATE_DIR"]) / "spool"
        return sorted(spool.glob("*.json")) if spool.is_dir() else []


@pytest.fixture
def work(tmp_path: Path, agent_env: dict[str, str]) -> Work:
    repo = tmp_path / "repo"
    return Work(repo, git_repo(repo), agent_env, tmp_path)


@pytest.fixture
def egress() -> Iterator[EgressProbe]:
    """Where the agents' HTTPS_PROXY points: any attempt to reach outside is recorded."""
    probe = EgressProbe()
    yield probe
    probe.close()


# The hogs take the machine's cores from everything else that runs beside the test (the other
# pytest worker included): the loaded and busy cases run in `make slow`, the idle one in
# `make test`. They run one at a time there (`make slow` hands out tests by xdist group):
# two of them side by side are twice the load the test is about, and a TUI it drives missed
# its 90 s.
HOGS = [pytest.mark.slow, pytest.mark.xdist_group("cpu_hogs")]
LOADED = pytest.param("loaded", marks=HOGS)
BUSY = pytest.param("busy", marks=HOGS)


@pytest.fixture(params=["idle", LOADED])
def load(request: pytest.FixtureRequest) -> Iterator[str]:
    """Runs a test as the machine is, and with CPU hogs (``yes > /dev/null``) beside the
    agent: ``loaded``, one per core and at least two (a busy laptop); ``busy``, four per
    core (the load average of 8 and more the hooks met on a shared machine), for a test
    that asks for it with ``@pytest.mark.parametrize("load", [...], indirect=True)``."""
    cores = os.cpu_count() or 2
    count = {"idle": 0, "loaded": max(2, cores), "busy": 4 * cores}[str(request.param)]
    hogs = [
        subprocess.Popen(["yes"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        for _ in range(count)
    ]
    try:
        yield str(request.param)
    finally:
        for hog in hogs:
            hog.kill()
            hog.wait()
