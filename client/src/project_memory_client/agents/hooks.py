"""``project-memory agent hook <event>``: what Claude Code and Codex run at their hooks.

The agent sends the event as JSON on stdin; the hook answers on stdout in the form the
agent reads, and always exits 0: a hook never blocks or fails the agent's session.

* ``session-start`` (startup, resume, clear, compact): prints context for the model, which
  the server assembles in one request within a byte budget (GET /context: the current
  task's last turns, the newest sections of project.md, other mentions of the task, stored
  text framed), and a line on searching with the MCP tool; then sends what the spool holds.
* ``stop`` (each finished turn) and ``pre-compact`` (before the agent compacts its context):
  records the turn since the last one recorded: its prompt and last answer as the summary,
  its meta (agent, model, session, commit, times, tokens, cwd, branch) from the transcript,
  masked (agents/secrets.py, over the scanner the server shares). The turn is spooled
  first, then sent (agents/spool.py).

With ``agent install claude-code --share-memory``, ``session-start`` and ``stop`` also sync
Claude Code's auto-memory folder with a memory store (agents/shared_memory.py): at the start
before the context, with part of its time; after a turn once the turn is sent.

Turns are never lost nor merged. The session's state (``sessions/``) says where the last
recorded turn ended; it moves only once a turn is spooled or on the server, so a turn whose
hook never got that far (killed, or with a full disk and no server) is read again by the
next hook, as a turn of its own (transcripts.py cuts at each prompt after an answer).
``session-start`` marks where a new session's transcript begins, so that this holds for a
session's first turn too.

The task is ``PROJECT_MEMORY_TASK`` when set, else the git branch made into a task id, else
``session-<session id>``.

Time: nothing local is ever cut: the settings, the transcript's tail, git (with its own
time limits) and the spool come first, with no clock running. The network part's time
starts when its first request can: SESSION_START_TIMEOUT or STOP_TIMEOUT seconds (or
``PROJECT_MEMORY_HOOK_TIMEOUT``), and by default never past AGENT_LIMIT less a margin after
the process started, so that the hook ends before the agent stops waiting for it. A timer
interrupts whatever is waiting on the network; what was not sent stays in the spool. When
the spool cannot be written (a full disk), the turns are sent at once, each as its own.
Errors go to ``<state dir>/hook.log``, never to the agent.

The hook process imports what it uses and no more (no httpx, no argparse: cli.py hands
``agent hook`` straight to :func:`main_argv`), and speaks HTTP through agents/wire.py.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .spool import FINAL_STATUSES, Entry, Spool, private_dir, send, state_dir, write_private

if TYPE_CHECKING:
    from ..settings import Settings
    from .share_record import Share
    from .transcripts import TurnFacts
    from .wire import HookClient

EVENTS = ("session-start", "stop", "pre-compact")
PRIVATE_FLAG = "--private"  # the turns go to the user's private space of the project
AGENTS = ("claude-code", "codex")
TASK_ENV = "PROJECT_MEMORY_TASK"
HOOKS_ENV = "PROJECT_MEMORY_HOOKS"  # "off": every hook does nothing
TIMEOUT_ENV = "PROJECT_MEMORY_HOOK_TIMEOUT"
BUDGET_ENV = "PROJECT_MEMORY_CONTEXT_BYTES"
TURNS_ENV = "PROJECT_MEMORY_CONTEXT_TURNS"
ARTIFACTS_ENV = "PROJECT_MEMORY_ARTIFACTS"  # "transcript", "diff", or both, comma-separated
# The agents give a hook 10 s (the timeout install writes) and then kill it.
AGENT_LIMIT = 10.0
AGENT_MARGIN = 1.0  # seconds kept between the hook's end and the agent's limit
# The network part's time, counted from when its first request can start (bench/README.md,
# "Hooks": chosen from the hooks' wall times with the server up, slow and down, idle and
# under load). A session waits for its start hook, so that one gives up sooner.
SESSION_START_TIMEOUT = 6.0
STOP_TIMEOUT = 8.0
MIN_WORK = 0.3  # seconds the network part gets however long the local part took
DEFAULT_BUDGET = 9_000  # bytes of context: the server's own default (GET /context)
MIN_BUDGET = 500
DEFAULT_TURNS = 3
MAX_TURNS = 20
# Codex 0.171's limit on a hook's additionalContext (characters; a longer one is cut).
CODEX_CONTEXT_CHARS = 10_000
PROMPT_CHARS = 16_000
ANSWER_CHARS = 48_000
DIFF_BYTES = 4 * 1024 * 1024
LOG_BYTES = 256 * 1024
GIT_TIMEOUT = 0.5
_TASK_CHARS = re.compile(r"[^A-Za-z0-9._-]+")


class Deadline(BaseException):
    """The hook's time is up (raised by the timer; a BaseException, so that no library's
    ``except Exception`` takes it for an error of its own)."""


class Git:
    __slots__ = ("branch", "commit")

    def __init__(self, branch: str | None, commit: str | None) -> None:
        self.branch = branch
        self.commit = commit


class Recorded:
    """What a stop hook read and spooled: each turn with its entry and artifacts, and how
    many of them (the first ones) are in the spool."""

    def __init__(
        self, state_path: Path, turns: list[tuple[TurnFacts, Entry, dict[str, tuple[bytes, str]]]]
    ) -> None:
        self.state_path = state_path
        self.turns = turns
        self.spooled = 0


def git_info(cwd: str) -> Git:
    def run(*args: str) -> str | None:
        try:
            done = subprocess.run(
                ["git", *args],
                cwd=cwd,
                capture_output=True,
                text=True,
                timeout=GIT_TIMEOUT,
                check=False,
            )
        except (OSError, subprocess.SubprocessError):
            return None
        return done.stdout if done.returncode == 0 else None

    both = run("rev-parse", "HEAD", "--abbrev-ref", "HEAD")
    if both is not None and len(both.split()) == 2:
        commit, branch = both.split()
    else:  # no commit yet: the branch is still named
        commit, branch = None, (run("symbolic-ref", "--short", "-q", "HEAD") or "").strip()
    return Git(branch=None if branch in ("", "HEAD") else branch, commit=commit)


def to_task_id(text: str) -> str | None:
    """``text`` made into a task id (the server's rule: ``[A-Za-z0-9][A-Za-z0-9._-]{0,127}``,
    no final dot): other characters become ``-``."""
    value = _TASK_CHARS.sub("-", text).lstrip("-._")
    value = re.sub(r"-{2,}", "-", value)[:128].rstrip("-.")
    return value or None


def task_id_for(env: Mapping[str, str], git: Git, session_id: str) -> str:
    """``PROJECT_MEMORY_TASK``, else the branch, else ``session-<id>``."""
    for candidate in (env.get(TASK_ENV), git.branch):
        if candidate:
            found = to_task_id(candidate)
            if found:
                return found
    return to_task_id(f"session-{session_id}") or "session"


# -- plumbing -----------------------------------------------------------------------------
class Log:
    def __init__(self, root: Path) -> None:
        self.path = root / "hook.log"

    def write(self, message: str) -> None:
        with contextlib.suppress(OSError):
            private_dir(self.path.parent)
            if self.path.exists() and self.path.stat().st_size > LOG_BYTES:
                keep = self.path.read_bytes()[-LOG_BYTES // 2 :]
                write_private(self.path, keep)
            fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW, 0o600)
            with os.fdopen(fd, "a", encoding="utf-8") as fh:
                fh.write(f"{time.strftime('%Y-%m-%dT%H:%M:%S')} {message}\n")


@contextlib.contextmanager
def deadline_after(seconds: float) -> Iterator[None]:
    """Raise Deadline in this (main) thread once ``seconds`` have passed."""

    def fire(signum: int, frame: Any) -> None:
        raise Deadline()

    previous = signal.signal(signal.SIGALRM, fire)
    signal.setitimer(signal.ITIMER_REAL, max(0.01, seconds))
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


@contextlib.contextmanager
def no_deadline() -> Iterator[None]:
    """Hold the timer back while the spool and the session state change together."""
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGALRM})
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGALRM})


def process_started() -> float:
    """When this process started, on the ``time.monotonic()`` clock: the hook's time counts
    from there, so that a slow start (a loaded machine, a cold disk) is not time it has
    again. Linux reads it from /proc; elsewhere it is now."""
    try:
        with open("/proc/self/stat", "rb") as fh:
            ticks = int(fh.read().rsplit(b")", 1)[1].split()[19])  # field 22: starttime
        with open("/proc/uptime", "rb") as fh:
            uptime = float(fh.read().split()[0])
        age = uptime - ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return time.monotonic()
    return time.monotonic() - max(0.0, min(age, 5.0))


def _float(env: Mapping[str, str], name: str, default: float) -> float:
    try:
        value = float(env.get(name, default))
    except ValueError:
        return default
    return value if value > 0 else default


class Hook:
    """One hook run: the event, its JSON, the settings, the state directory, a time limit."""

    def __init__(
        self,
        agent: str,
        event: str,
        data: dict[str, Any],
        env: Mapping[str, str],
        *,
        private: bool = False,
    ):
        self.agent = agent
        # The turns go to the user's private space (``--private``, or install's record).
        self.private = private
        self.event = event
        self.data = data
        self.env = env
        self.root = state_dir(dict(env))
        self.log = Log(self.root)
        self.spool = Spool(self.root)
        self.started = process_started()
        self.limit = _float(env, TIMEOUT_ENV, 0.0) or None  # None: the event's default
        self.ends: float | None = None  # when the network part must be done (start_clock)
        self.budget = 0.0
        self._client: HookClient | None = None
        self._settings: Settings | None = None

    @property
    def session_id(self) -> str:
        return str(self.data.get("session_id") or "unknown")

    @property
    def cwd(self) -> str:
        return str(self.data.get("cwd") or os.getcwd())

    def left(self) -> float:
        return (self.ends - time.monotonic()) if self.ends is not None else self.budget

    def start_clock(self) -> float:
        """Start the network part's time, now that its first request can start: the given
        limit, else the event's default, ended early enough for the agent's own limit
        (counted from the process's start) and at least MIN_WORK."""
        if self.limit is not None:
            budget = self.limit
        else:
            default = SESSION_START_TIMEOUT if self.event == "session-start" else STOP_TIMEOUT
            spent = time.monotonic() - self.started
            budget = max(MIN_WORK, min(default, AGENT_LIMIT - AGENT_MARGIN - spent))
        self.budget = budget
        self.ends = time.monotonic() + budget
        return budget

    def settings(self) -> Settings:
        if self._settings is None:
            from ..settings import load_settings

            loaded = load_settings(env=self.env).require()
            if self.private:
                loaded = loaded.with_overrides(visibility="private")
            self._settings = loaded
        return self._settings

    def client(self) -> HookClient:
        if self._client is None:
            from .wire import HookClient

            # Each request gets what is left of the hook's time; no waiting out a 429/503.
            deadline = self.ends if self.ends is not None else time.monotonic() + self.left()
            self._client = HookClient(self.settings(), deadline=deadline)
        return self._client

    def close(self) -> None:
        if self._client is not None:
            with contextlib.suppress(Exception):
                self._client.close()

    def flush(self, share: float = 1.0) -> None:
        """Send what the spool holds, for at most ``share`` of the time left."""
        if not self.spool.count():
            return
        deadline = time.monotonic() + self.left() * share
        settings = self.settings()
        outcome = self.spool.flush(
            self.client(),
            url=settings.url or "",
            tenant=settings.tenant,
            project=settings.project,
            visibility=settings.visibility,
            deadline=deadline,
        )
        if outcome.rejected:
            self.log.write(
                f"{self.event}: {outcome.rejected} turn(s) refused for good, moved to"
                f" {self.spool.dir / 'rejected'}: {'; '.join(outcome.rejections[:3])}"
            )
        if outcome.kept:
            reasons = {r.split(": ", 1)[-1] for r in outcome.rejections}
            for error in [e for e in outcome.errors if e not in reasons][:3]:
                self.log.write(f"{self.event}: kept in the spool: {error}")

    # -- session start ------------------------------------------------------------------
    def session_start(self, task_id: str, note: str = "") -> str:
        """The context, in one request to the server (GET /context), then the spool.
        ``note`` (the shared memory's new index) goes in before the closing line."""
        from ..errors import NotFound

        tool = "mcp__project-memory__search" if self.agent == "claude-code" else "search"
        line = (
            f"To look further back, search this project's memory with the {tool} tool"
            " of the project-memory MCP server (then read_task / read_turn for a task's"
            " history)."
        )
        budget = int(_float(self.env, BUDGET_ENV, DEFAULT_BUDGET))
        if self.agent == "codex":
            # Codex cuts a longer context to its head and tail: keep the whole under it.
            budget = min(budget, CODEX_CONTEXT_CHARS - 100)
        budget = max(MIN_BUDGET, budget - len(line.encode()) - 2 - len(note.encode()))
        turns = min(MAX_TURNS, int(_float(self.env, TURNS_ENV, DEFAULT_TURNS)))
        out = start_output(note) if note else ""
        try:
            found = self.client().get_context(task_id, max_bytes=budget, turns=turns)
        except NotFound:
            self.log.write(
                "session-start: the server gives no context (GET /context: 404); it is older"
                " than this client"
            )
        else:
            note_part = f"{note}\n\n" if note else ""
            out = start_output(found["context"].rstrip("\n") + "\n\n" + note_part + line)
        # What waits in the spool goes next, in the time left: the context comes first.
        with contextlib.suppress(Deadline):
            self.flush()
        return out

    def sync_memory(self, share: Share, *, starting: bool) -> str:
        """Sync the shared auto-memory (agents/shared_memory.py): at a session's start with
        a part of the time left, before the context; after a turn with what is left. At the
        start, what the context gets when the index changed."""
        from .shared_memory import SYNC_SHARE, sync_for_hook

        part = SYNC_SHARE if starting else 1.0
        ends = time.monotonic() + self.left() * part
        return sync_for_hook(
            share,
            self.settings,
            self.root,
            self.log.write,
            self.event,
            deadline=ends,
            note=starting,
        )

    # -- a finished turn ----------------------------------------------------------------
    def state_path(self) -> Path:
        name = f"{self.agent}-{hashlib.sha256(self.session_id.encode()).hexdigest()[:24]}.json"
        return self.root / "sessions" / name

    def begin_session(self) -> None:
        """Mark where a session's transcript begins (no clock running: local, milliseconds),
        unless a turn of it was recorded already: a first turn whose hook never recorded it
        is then read by the next, not lost."""
        raw = self.data.get("transcript_path")
        if not raw:
            return
        try:
            path = self.state_path()
            if path.exists():
                return
            transcript = Path(str(raw))
            if self.agent == "codex":
                from .transcripts import codex_turns

                # Turns are named, not placed: every turn after the last one started so far.
                last = codex_turns(transcript, None, None, None) if transcript.is_file() else []
                state: dict[str, Any] = {"end_key": last[-1].end_key if last else ""}
            else:
                state = {"offset": transcript.stat().st_size if transcript.is_file() else 0}
            private_dir(path.parent)
            write_private(path, json.dumps(state).encode(), replace=False)
        except OSError as exc:
            self.log.write(f"{self.event}: the session's start not recorded: {exc}")

    def record(self) -> Recorded | None:
        """Read every turn since the last one recorded and spool each, with no clock running
        (all of it local); the session's state then moves past what was spooled."""
        settings = self.settings()
        state_path = self.state_path()
        turns = self._facts(_read_json(state_path))
        if not turns:
            return None
        git = git_info(self.cwd)
        secret = (settings.token,) if settings.token else ()
        recorded = Recorded(state_path, [])
        created = time.time()
        for n, facts in enumerate(turns):
            entry = self._entry(facts, git, secret, created + n * 1e-6)
            # The diff is of the work tree now: the current turn's alone.
            artifacts = self._artifacts(facts, secret, diff=n == len(turns) - 1)
            recorded.turns.append((facts, entry, artifacts))
        for _, entry, artifacts in recorded.turns:
            try:
                self.spool.add(entry, artifacts)
            except OSError as exc:
                left = len(recorded.turns) - recorded.spooled
                self.log.write(
                    f"{self.event}: the spool cannot be written ({exc}): {left} turn(s) are"
                    " sent directly"
                )
                break
            recorded.spooled += 1
        if recorded.spooled:
            self._save_state(state_path, recorded.turns[recorded.spooled - 1][0])
        return recorded

    def deliver(self, recorded: Recorded | None) -> None:
        """Send, under the time limit: what the spool holds (oldest first), then the turns
        the spool could not take, in order, each as its own; the state moves past each one
        the server holds (or refused for good: nowhere to keep it)."""
        self.flush()
        if recorded is None or recorded.spooled == len(recorded.turns):
            return
        from ..errors import ApiError, ClientError
        from ..models import Upload

        client = self.client()
        for facts, entry, artifacts in recorded.turns[recorded.spooled :]:
            uploads = [Upload(name, data, kind) for name, (data, kind) in artifacts.items()]
            try:
                send(client, entry, uploads)
            except ApiError as exc:
                if exc.status not in FINAL_STATUSES:
                    self.log.write(f"{self.event}: not sent, read again next time: {exc}")
                    break
                self.log.write(
                    f"{self.event}: turn {entry.record_id} refused for good and not spooled"
                    f" (the spool cannot be written): {exc.status} {exc.message}"
                )
            except (ClientError, RuntimeError) as exc:
                self.log.write(f"{self.event}: not sent, read again next time: {exc}")
                break
            with no_deadline():
                self._save_state(recorded.state_path, facts)

    def _save_state(self, path: Path, facts: TurnFacts) -> None:
        """The session's state: where the last turn recorded ends. Not written (a full disk):
        the next hook reads that turn again, finds its record id on the server or in the
        spool, and does not record it twice."""
        state = {"offset": facts.end_offset, "end_key": facts.end_key}
        try:
            private_dir(path.parent)
            write_private(path, json.dumps(state).encode())
        except OSError as exc:
            self.log.write(f"{self.event}: the session's state not written: {exc}")

    def _entry(self, facts: TurnFacts, git: Git, secret: tuple[str, ...], created: float) -> Entry:
        from .secrets import mask, mask_value

        settings = self.settings()
        key = f"{self.agent}:{self.session_id}:{facts.end_key}"
        record_id = hashlib.sha256(key.encode()).hexdigest()[:32]
        meta: dict[str, Any] = {
            "agent_id": self.agent,
            "model": facts.model or self.data.get("model"),
            "commit": git.commit,
            "started_at": facts.started_at,
            "ended_at": facts.ended_at,
            "tokens": facts.tokens,
            "cwd": self.cwd,
            "branch": git.branch,
            "hook_event": self.event,
        }
        meta["claude_session_id" if self.agent == "claude-code" else "codex_session_id"] = (
            self.session_id
        )
        meta = mask_value({k: v for k, v in meta.items() if v is not None}, secret)
        return Entry(
            record_id=record_id,
            agent=self.agent,
            url=settings.url or "",
            tenant=settings.tenant,
            project=settings.project,
            task_id=task_id_for(self.env, git, self.session_id),
            meta=meta,
            summary_md=mask(summary_of(facts), secret),
            created_at=created,
            visibility=settings.visibility,
        )

    def _facts(self, state: dict[str, Any]) -> list[TurnFacts]:
        from .transcripts import claude_turns, codex_turns

        raw = self.data.get("transcript_path")
        if not raw:
            return []
        path = Path(str(raw))
        if not path.is_file():
            return []
        answer = self.data.get("last_assistant_message")
        answer = answer if isinstance(answer, str) and answer.strip() else None
        if self.agent == "codex":
            turn = self.data.get("turn_id")
            after = state.get("end_key")
            return codex_turns(
                path, after if isinstance(after, str) else None, str(turn) if turn else None, answer
            )
        offset = state.get("offset")
        return claude_turns(path, offset if isinstance(offset, int) else None, answer)

    def _artifacts(
        self, facts: TurnFacts, secret: tuple[str, ...], *, diff: bool
    ) -> dict[str, tuple[bytes, str]]:
        from .secrets import mask

        wanted = {p.strip() for p in self.env.get(ARTIFACTS_ENV, "").split(",") if p.strip()}
        out: dict[str, tuple[bytes, str]] = {}
        if "transcript" in wanted and facts.lines:
            text = b"".join(facts.lines).decode("utf-8", "replace")
            out["transcript.jsonl"] = (mask(text, secret).encode(), "application/x-ndjson")
        if "diff" in wanted and diff:
            with contextlib.suppress(OSError, subprocess.SubprocessError):
                done = subprocess.run(
                    ["git", "diff", "HEAD", "--no-color", "--no-ext-diff"],
                    cwd=self.cwd,
                    capture_output=True,
                    timeout=GIT_TIMEOUT,
                    check=False,
                )
                if done.returncode == 0 and done.stdout:
                    diff_text = done.stdout[:DIFF_BYTES].decode("utf-8", "replace")
                    out["diff.patch"] = (mask(diff_text, secret).encode(), "text/x-diff")
        return out


def start_output(context: str) -> str:
    """What the session-start hook prints: ``context`` for the model."""
    return json.dumps(
        {"hookSpecificOutput": {"hookEventName": "SessionStart", "additionalContext": context}}
    )


def summary_of(facts: TurnFacts) -> str:
    """The turn as Markdown: its prompt (each, when the turn had several) and last answer."""
    parts = []
    # A turn cut by a compaction goes on after it without a prompt of its own.
    for prompt in facts.prompts or [
        "(the prompt is in the turn before: this turn goes on from it)"
    ]:
        parts += ["## Prompt", "", _cut(prompt.strip(), PROMPT_CHARS), ""]
    parts += ["## Answer", "", _cut(facts.answer.strip() or "(no answer)", ANSWER_CHARS)]
    return "\n".join(parts) + "\n"


def _cut(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 1].rstrip() + "…"


def _read_json(path: Path) -> dict[str, Any]:
    try:
        value = json.loads(path.read_bytes())
    except (OSError, ValueError, RecursionError):
        return {}
    return value if isinstance(value, dict) else {}


def run(
    agent: str, event: str, stdin: str, env: Mapping[str, str], *, private: bool = False
) -> str:
    """Run one hook; its stdout text. Never raises. ``private``: the turns go to the
    user's private space (as when install recorded ``--private`` for the repository)."""
    if env.get(HOOKS_ENV, "").lower() in ("off", "0", "false", "no"):
        return ""
    try:
        data = json.loads(stdin) if stdin.strip() else {}
    except (ValueError, RecursionError):  # nested past the parser's depth: not an event
        data = {}
    if not isinstance(data, dict):
        data = {}
    hook = Hook(agent, event, data, env, private=private)
    out = ""
    try:
        from .share_record import Share, find_record, is_private

        # What install recorded for the repository: the store its memory is shared through,
        # and whether its turns are private. Read before the turn is, which it decides.
        record = find_record(hook.root, hook.cwd, env.get("CLAUDE_PROJECT_DIR"))
        hook.private = private or is_private(record)
        # The local part first, with no clock running: a turn is never lost because the
        # machine was slow to start the process or to read the transcript.
        recorded = None
        task_id = ""
        if event == "session-start":
            hook.begin_session()
            task_id = task_id_for(env, git_info(hook.cwd), hook.session_id)
        else:
            recorded = hook.record()
        share = None
        if agent == "claude-code" and event in ("session-start", "stop") and record:
            share = Share.from_dict(record) if "store_id" in record else None
        # Then the network part, from when its first request can start.
        with deadline_after(hook.start_clock()):
            if event == "session-start":
                note = hook.sync_memory(share, starting=True) if share is not None else ""
                out = start_output(note) if note else ""  # should the context not come
                out = hook.session_start(task_id, note)
            else:
                hook.deliver(recorded)
                if share is not None:
                    hook.sync_memory(share, starting=False)
    except Deadline:
        hook.log.write(
            f"{event}: gave up after {hook.budget:g}s; the spool keeps what was not sent"
        )
    except Exception as exc:  # noqa: BLE001 - a hook must never fail the agent's session
        from ..errors import ApiError, ServerUnreachable, SettingsError

        if isinstance(exc, ServerUnreachable | SettingsError):
            hook.log.write(f"{event}: {exc}")
        elif isinstance(exc, ApiError):  # a refusal is one line (agent doctor shows it)
            hook.log.write(f"{event}: the server refused {exc.method} {exc.path}: {exc}")
        else:
            import traceback

            hook.log.write(f"{event}: {traceback.format_exc(limit=8)}")
    finally:
        hook.close()
    return out


def parse_argv(argv: list[str], events: tuple[str, ...] = EVENTS) -> tuple[str, str, bool] | None:
    """(agent, event, private) of ``EVENT [--agent AGENT] [--private]``, one of ``events``;
    None for another form."""
    agent = "claude-code"
    rest = list(argv)
    private = PRIVATE_FLAG in rest
    if private:
        rest.remove(PRIVATE_FLAG)
    if len(rest) == 3 and rest[1] == "--agent":
        agent = rest.pop(2)
        rest.pop(1)
    elif len(rest) == 2 and rest[1].startswith("--agent="):
        agent = rest.pop(1).split("=", 1)[1]
    if len(rest) != 1 or rest[0] not in events or agent not in AGENTS:
        return None
    return agent, rest[0], private


def main_argv(argv: list[str]) -> int | None:
    """``agent hook EVENT [--agent AGENT]`` as the agents run it, without argparse (its
    import and parser cost start-up time in every hook); None when ``argv`` is another
    form, which the full parser then reads (and refuses, if it must)."""
    parsed = parse_argv(argv)
    return None if parsed is None else main(*parsed)


def main(agent: str, event: str, private: bool = False) -> int:
    """Run the hook the agent started; always 0: whatever happens (an unreadable stdin, an
    agent that closed our stdout), the agent's session goes on."""
    try:
        out = run(agent, event, sys.stdin.read(), os.environ, private=private)
        if out:
            sys.stdout.write(out + "\n")
            sys.stdout.flush()
    except BaseException:  # noqa: BLE001 - a hook never fails the agent's session
        import traceback

        with contextlib.suppress(BaseException):
            Log(state_dir(dict(os.environ))).write(f"{event}: {traceback.format_exc(limit=4)}")
    return 0
