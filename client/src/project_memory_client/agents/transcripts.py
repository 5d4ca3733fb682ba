"""What one agent turn was, read from the agent's own transcript (JSON lines).

Claude Code (``~/.claude/projects/<dir>/<session>.jsonl``): ``user`` lines hold the prompts
and the tool results, ``assistant`` lines the model's messages with their ``usage``; one
API message that has several content blocks is written as several lines with the same
``message.id`` and the same usage, so usage is counted once per id. The lines after the
last turn recorded (the hook keeps that offset per session) are read as turns, each apart:
a prompt that comes after the model's output starts the next one. Without an offset (hooks
installed mid-session), the current turn alone, from its last prompt.

Codex CLI (``$CODEX_HOME/sessions/.../rollout-*.jsonl``): every line has ``timestamp``,
``type`` and ``payload``; the lines of one turn carry its ``turn_id`` (``task_started``,
the ``UserMessage`` item, one ``token_usage_record`` per model call). Codex counts cached
input inside ``input_tokens``; the turn's ``tokens.input`` leaves it out, as Anthropic's
usage does, so both agents' numbers add up the same way. The turns after the last one
recorded are named by the order of their ``task_started`` lines.

Only the tail of a transcript is read (``MAX_TAIL_BYTES``): a long session costs the hook
no more than a short one.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

MAX_TAIL_BYTES = 8 * 1024 * 1024
TOKEN_KEYS = ("input", "output", "cache_read", "cache_creation")


class TurnFacts:
    """One turn as a transcript tells it. ``end_key`` names the turn's last line (what makes
    its record id), ``end_offset`` the byte after it (where the next turn starts). (A plain
    class: the Stop hook loads it at every start.)"""

    def __init__(self, *, end_offset: int = 0, end_key: str | None = None) -> None:
        self.prompts: list[str] = []
        self.answer = ""
        self.model: str | None = None
        self.tokens: dict[str, int] = dict.fromkeys(TOKEN_KEYS, 0)
        self.started_at: str | None = None
        self.ended_at: str | None = None
        self.end_key = end_key
        self.end_offset = end_offset
        self.model_calls = 0
        self.lines: list[bytes] = []


def _tail(path: Path, start: int | None) -> tuple[int, bytes]:
    """The bytes of ``path`` from ``start`` (None, or a start beyond the end: the last
    MAX_TAIL_BYTES) up to its last complete line, and the offset they begin at."""
    with open(path, "rb") as fh:
        size = os.fstat(fh.fileno()).st_size
        window = max(0, size - MAX_TAIL_BYTES)
        windowed = start is None or start > size or start < window
        if windowed:
            start = window
        assert start is not None
        fh.seek(start)
        data = fh.read(size - start)
    if windowed and start > 0:
        # Mid-line, perhaps: what a window starts with up to its first newline is a part.
        cut = data.find(b"\n")
        start += cut + 1 if cut >= 0 else len(data)
        data = data[cut + 1 :] if cut >= 0 else b""
    end = data.rfind(b"\n")
    return start, data[: end + 1] if end >= 0 else b""


def _lines(data: bytes) -> list[tuple[bytes, dict[str, Any]]]:
    return [(raw, value) for _, raw, value in _lines_at(data, 0)]


def _lines_at(data: bytes, begin: int) -> list[tuple[int, bytes, dict[str, Any]]]:
    """The JSON objects of ``data`` (which starts at byte ``begin``), each with the offset
    its line starts at."""
    out = []
    at = begin
    for raw in data.splitlines(keepends=True):
        try:
            value = json.loads(raw)
        except (ValueError, RecursionError):
            value = None  # a torn, foreign or too deeply nested line: skipped, never fatal
        if isinstance(value, dict):
            out.append((at, raw, value))
        at += len(raw)
    return out


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    parts = []
    for block in content or ():
        if isinstance(block, dict) and block.get("type") in ("text", "input_text", "output_text"):
            parts.append(str(block.get("text", "")))
    return "\n".join(parts)


# -- Claude Code -----------------------------------------------------------------------------
def _claude_prompt(line: dict[str, Any]) -> str | None:
    """The prompt a ``user`` line holds, or None for tool results and injected lines."""
    if line.get("type") != "user" or line.get("isMeta") or line.get("isSidechain"):
        return None
    content = (line.get("message") or {}).get("content")
    if isinstance(content, list) and any(
        isinstance(b, dict) and b.get("type") == "tool_result" for b in content
    ):
        return None
    text = _text(content).strip()
    if not text or text.startswith(("<command-", "<local-command", "[Request interrupted")):
        return None
    return text


def claude_turns(path: Path, start: int | None, last_answer: str | None) -> list[TurnFacts]:
    """Every turn after byte ``start`` of a Claude Code transcript, each apart, oldest
    first (None: the current turn only, from its last prompt). A turn whose hook never
    recorded it (killed, or with nowhere to write) is still its own turn when the next hook
    reads it with the next one: a prompt that comes after the model's output starts a new
    turn. Turns with nothing the model said are left out; ``last_answer`` (the agent's own
    copy of its last answer) is the last turn's."""
    begin, data = _tail(path, start)
    lines = _lines_at(data, begin)
    if start is None or begin != start:
        prompts_at = [i for i, (_, _, line) in enumerate(lines) if _claude_prompt(line)]
        if prompts_at:
            lines = lines[prompts_at[-1] :]
    parts: list[list[tuple[int, bytes, dict[str, Any]]]] = [[]]
    answered = False
    for item in lines:
        line = item[2]
        if not line.get("isSidechain"):
            if answered and _claude_prompt(line) is not None:
                parts.append([])
                answered = False
            answered = answered or line.get("type") == "assistant"
        parts[-1].append(item)
    ends = [part[0][0] for part in parts[1:]] + [begin + len(data)]
    turns = [_claude_facts(part, end) for part, end in zip(parts, ends, strict=True) if part]
    found = [t for t in turns if t is not None]
    if found and last_answer and turns[-1] is not None:
        found[-1].answer = last_answer
    return found


def claude_turn(path: Path, start: int | None, last_answer: str | None) -> TurnFacts | None:
    """The last turn after byte ``start`` (:func:`claude_turns`); None when there is none."""
    turns = claude_turns(path, start, last_answer)
    return turns[-1] if turns else None


def _claude_facts(lines: list[tuple[int, bytes, dict[str, Any]]], end: int) -> TurnFacts | None:
    """One turn's lines, ending at byte ``end``; None when nothing the model said is in it."""
    facts = TurnFacts(end_offset=end)
    usage: dict[str, dict[str, Any]] = {}
    for _, raw, line in lines:
        facts.lines.append(raw)
        if line.get("isSidechain"):
            continue  # a subagent's lines: its own usage is in the agent's result
        prompt = _claude_prompt(line)
        if prompt is not None:
            facts.prompts.append(prompt)
            facts.started_at = facts.started_at or line.get("timestamp")
        if line.get("type") != "assistant":
            continue
        message = line.get("message") or {}
        model = message.get("model")
        if isinstance(model, str) and model and not model.startswith("<"):
            facts.model = model
        key = str(message.get("id") or line.get("requestId") or line.get("uuid"))
        if isinstance(message.get("usage"), dict):
            usage[key] = message["usage"]
        text = _text(message.get("content")).strip()
        if text:
            facts.answer = text
        facts.ended_at = line.get("timestamp") or facts.ended_at
        facts.end_key = str(line.get("uuid") or key)
    if not usage and not facts.answer:
        return None
    for counts in usage.values():
        facts.tokens["input"] += _int(counts.get("input_tokens"))
        facts.tokens["output"] += _int(counts.get("output_tokens"))
        facts.tokens["cache_read"] += _int(counts.get("cache_read_input_tokens"))
        facts.tokens["cache_creation"] += _int(counts.get("cache_creation_input_tokens"))
    facts.model_calls = len(usage)
    return facts


# -- Codex CLI -------------------------------------------------------------------------------
def codex_turns(
    path: Path, after: str | None, turn_id: str | None, last_answer: str | None
) -> list[TurnFacts]:
    """Turn ``turn_id`` of a Codex rollout (None: its last turn), and before it every turn
    that started after turn ``after`` (the last one recorded: turns whose hook never
    recorded them, each apart), oldest first; turns not in the rollout's tail are left out.
    ``last_answer`` is ``turn_id``'s."""
    begin, data = _tail(path, None)
    lines = _lines(data)
    started = [
        str(payload.get("turn_id"))
        for _, line in lines
        if isinstance(payload := line.get("payload"), dict)
        and payload.get("type") == "task_started"
        and payload.get("turn_id")
    ]
    if turn_id is None:
        if not started:
            return []
        turn_id = started[-1]
    wanted = [turn_id]
    # after == "": the session's first hook, before any turn was recorded (hooks.py).
    if after is not None and (after == "" or after in started) and turn_id in started:
        first, last = (started.index(after) + 1 if after else 0), started.index(turn_id)
        wanted = [t for t in dict.fromkeys(started[first:last]) if t != turn_id] + wanted
    turns = []
    for wanted_id in wanted:
        facts = _codex_facts(lines, wanted_id, begin + len(data))
        if facts is not None:
            turns.append(facts)
    if turns and last_answer and turns[-1].end_key == turn_id:
        turns[-1].answer = last_answer
    return turns


def codex_turn(path: Path, turn_id: str | None, last_answer: str | None) -> TurnFacts | None:
    """Turn ``turn_id`` of a Codex rollout (None: its last turn); None when it is not there."""
    turns = codex_turns(path, None, turn_id, last_answer)
    return turns[-1] if turns else None


def _codex_facts(
    lines: list[tuple[bytes, dict[str, Any]]], turn_id: str, end: int
) -> TurnFacts | None:
    facts = TurnFacts(end_offset=end, end_key=turn_id)
    for raw, line in lines:
        payload = line.get("payload")
        if not isinstance(payload, dict) or payload.get("turn_id") != turn_id:
            continue
        facts.lines.append(raw)
        stamp = line.get("timestamp")
        kind = payload.get("type")
        if kind == "task_started":
            facts.started_at = stamp
        if line.get("type") == "token_usage_record" and isinstance(payload.get("usage"), dict):
            counts = payload["usage"]
            cached = _int(counts.get("cached_input_tokens"))
            facts.tokens["input"] += max(0, _int(counts.get("input_tokens")) - cached)
            facts.tokens["output"] += _int(counts.get("output_tokens"))
            facts.tokens["cache_read"] += cached
            facts.tokens["cache_creation"] += _int(counts.get("cache_write_input_tokens"))
            facts.model_calls += 1
        item = payload.get("item") if kind == "item_completed" else None
        if isinstance(item, dict) and item.get("type") == "UserMessage":
            text = _text(item.get("content")).strip()
            if text:
                facts.prompts.append(text)
        if kind == "task_complete" and isinstance(payload.get("last_agent_message"), str):
            facts.answer = payload["last_agent_message"]
        facts.ended_at = stamp or facts.ended_at
    return facts if facts.lines else None


def _int(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 0
