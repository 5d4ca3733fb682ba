"""``project-memory agent hook user-prompt-submit``: what the project's memory holds about a
prompt, given to the model with it (Claude Code's and Codex's ``UserPromptSubmit``).

One request, ``POST /sandbox/memory/v1/recall`` with the prompt in its body (never in a URL):
the server searches the project for the prompt's words and answers its best hits, the
current task's own turns first, within ``PROJECT_MEMORY_PROMPT_CONTEXT_CHARS`` characters
(1,500 by default). The hook prints them as ``hookSpecificOutput.additionalContext``, and
nothing at all when nothing matched. The task is the one the other hooks record to
(hooks.task_id_for).

A person waits for this hook at every prompt: everything it does, the settings and git
included, is over LIMIT seconds after the process started, else it gives up and prints
nothing, and the prompt goes to the model as typed. It records nothing and sends nothing of
the spool (the stop hook does); the prompt is written nowhere, the log included.
``PROJECT_MEMORY_PROMPT_CONTEXT=off`` turns it off (``PROJECT_MEMORY_HOOKS=off`` too).

cli.py hands ``agent hook user-prompt-submit`` here directly, as it hands the other events
to hooks.py, whose time and task helpers this module uses.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING

from .hooks import (
    HOOKS_ENV,
    Deadline,
    Log,
    deadline_after,
    git_info,
    parse_argv,
    process_started,
    task_id_for,
)
from .spool import state_dir

if TYPE_CHECKING:
    from .wire import HookClient

EVENT = "user-prompt-submit"
PROMPT_ENV = "PROJECT_MEMORY_PROMPT_CONTEXT"  # "off": no context at prompts
CHARS_ENV = "PROJECT_MEMORY_PROMPT_CONTEXT_CHARS"
DEFAULT_CHARS = 1_500
MIN_CHARS = 500
MAX_CHARS = 10_000  # the server's bound, and what Codex 0.171 passes whole
PROMPT_CHARS = 16_000  # what the server reads of a prompt
# Seconds after the process started: by then the hook has given up, so that the agent has
# its answer within a second whatever the server does (hung, slow, or a machine slow to start
# the hook), the shell the agent starts it with and the process's exit included.
LIMIT = 0.8
OFF = ("off", "0", "false", "no")


def _chars(env: Mapping[str, str]) -> int:
    try:
        value = int(env.get(CHARS_ENV, DEFAULT_CHARS))
    except ValueError:
        return DEFAULT_CHARS
    return max(MIN_CHARS, min(MAX_CHARS, value))


def run(stdin: str, env: Mapping[str, str], *, private: bool = False) -> str:
    """The hook's stdout text for one prompt ("" for none), the same for both agents (they
    read the same ``hookSpecificOutput``). Never raises. ``private`` (or install's record
    for the repository): recalled from the user's private space, where the turns go."""
    if env.get(HOOKS_ENV, "").lower() in OFF or env.get(PROMPT_ENV, "").lower() in OFF:
        return ""
    try:
        data = json.loads(stdin) if stdin.strip() else {}
    except (ValueError, RecursionError):
        data = {}
    prompt = data.get("prompt") if isinstance(data, dict) else None
    if not isinstance(prompt, str) or not prompt.strip():
        return ""
    started = process_started()
    log = Log(state_dir(dict(env)))
    client: HookClient | None = None
    context = ""
    try:
        with deadline_after(started + LIMIT - time.monotonic()):
            from ..settings import load_settings
            from .share_record import find_record, is_private
            from .wire import HookClient

            settings = load_settings(env=env).require()
            cwd = str(data.get("cwd") or os.getcwd())
            record = find_record(state_dir(dict(env)), cwd, env.get("CLAUDE_PROJECT_DIR"))
            if private or is_private(record):
                settings = settings.with_overrides(visibility="private")
            task_id = task_id_for(env, git_info(cwd), str(data.get("session_id") or "unknown"))
            client = HookClient(settings, deadline=started + LIMIT)
            found = client.recall(prompt[:PROMPT_CHARS], task_id=task_id, max_chars=_chars(env))
            context = found["context"]
    except Deadline:
        log.write(f"{EVENT}: gave up {LIMIT:g}s after the hook started; no context added")
    except Exception as exc:  # noqa: BLE001 - a hook never fails the agent's session
        log.write(f"{EVENT}: {_why(exc)}")
    finally:
        if client is not None:
            with contextlib.suppress(Exception):
                client.close()
    if not context.strip():
        return ""
    return json.dumps(
        {"hookSpecificOutput": {"hookEventName": "UserPromptSubmit", "additionalContext": context}}
    )


def _why(exc: Exception) -> str:
    """A line on what went wrong that cannot hold the prompt (a refusal's detail may quote
    what was sent; so may an exception's message)."""
    from ..errors import ApiError, ServerUnreachable, SettingsError

    if isinstance(exc, ApiError):
        if exc.status == 404:
            return "the server has no POST /recall (404): it is older than this client"
        return f"the server refused POST /recall: {exc.status}"
    if isinstance(exc, ServerUnreachable | SettingsError):
        return str(exc)
    tb = exc.__traceback__
    while tb is not None and tb.tb_next is not None:
        tb = tb.tb_next
    where = f" at {tb.tb_frame.f_code.co_filename}:{tb.tb_lineno}" if tb is not None else ""
    return f"{type(exc).__name__}{where}"


def main_argv(argv: list[str]) -> int | None:
    """``user-prompt-submit [--agent AGENT] [--private]``, read without argparse
    (hooks.main_argv)."""
    parsed = parse_argv(argv, (EVENT,))
    return None if parsed is None else main(parsed[0], parsed[2])


def main(agent: str, private: bool = False) -> int:
    """Run the hook for ``agent``; always 0: the prompt goes on to the model whatever
    happens here."""
    try:
        out = run(sys.stdin.read(), os.environ, private=private)
        if out:
            sys.stdout.write(out + "\n")
            sys.stdout.flush()
    except BaseException:  # noqa: BLE001 - a hook never fails the agent's session
        with contextlib.suppress(BaseException):
            Log(state_dir(dict(os.environ))).write(f"{EVENT}: the hook failed")
    return 0
