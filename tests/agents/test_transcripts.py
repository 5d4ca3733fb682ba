"""Reading one turn out of an agent's transcript: Claude Code's and Codex's formats."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from project_memory_client.agents import transcripts
from project_memory_client.agents.transcripts import claude_turn, codex_turn

from tests.agents.conftest import Transcript


def test_a_claude_turn_counts_each_api_message_once(tmp_path: Path) -> None:
    t = Transcript(tmp_path / "t.jsonl", "s", tmp_path)
    t.turn("first", "one")
    facts = claude_turn(t.path, None, None)
    assert facts is not None
    assert facts.prompts == ["first"] and facts.answer == "one" and facts.model == "claude-test-1"
    assert facts.tokens == {"input": 200, "output": 30, "cache_read": 2000, "cache_creation": 10}
    assert facts.model_calls == 2 and facts.end_offset == t.path.stat().st_size
    t.turn("second", "two")
    nxt = claude_turn(t.path, facts.end_offset, "two, as the hook said")
    assert nxt is not None and nxt.prompts == ["second"] and nxt.answer == "two, as the hook said"
    assert nxt.end_key != facts.end_key
    assert claude_turn(t.path, nxt.end_offset, None) is None  # nothing since


def test_without_state_only_the_last_turn_is_read(tmp_path: Path) -> None:
    t = Transcript(tmp_path / "t.jsonl", "s", tmp_path)
    t.turn("old", "old answer")
    t.turn("new", "new answer")
    facts = claude_turn(t.path, None, None)
    assert facts is not None and facts.prompts == ["new"]
    assert facts.tokens["output"] == 30


def test_lines_that_are_not_prompts(tmp_path: Path) -> None:
    t = Transcript(tmp_path / "t.jsonl", "s", tmp_path)
    t.prompt("real prompt")
    t._write(
        {"type": "user", "isMeta": True, "message": {"role": "user", "content": "Caveat: injected"}}
    )
    t._write(
        {
            "type": "user",
            "message": {"role": "user", "content": "<command-name>/clear</command-name>"},
        }
    )
    t._write(
        {
            "type": "user",
            "isSidechain": True,
            "message": {"role": "user", "content": "subagent task"},
        }
    )
    t._write({"type": "attachment", "attachment": {"type": "hook_success"}})
    with open(t.path, "a") as fh:
        fh.write("{torn line without an end")
    t2 = claude_turn(t.path, 0, None)
    assert t2 is None  # no model output yet
    t.path.write_text(t.path.read_text().rsplit("\n", 1)[0] + "\n")
    t.assistant(
        "m1",
        [{"type": "text", "text": "answer"}],
        {"input_tokens": 1, "output_tokens": 2},
        model="<synthetic>",
    )
    facts = claude_turn(t.path, 0, None)
    assert facts is not None and facts.prompts == ["real prompt"] and facts.model is None


def test_a_long_transcript_is_read_from_its_tail(tmp_path: Path, monkeypatch: Any) -> None:
    monkeypatch.setattr(transcripts, "MAX_TAIL_BYTES", 4096)
    t = Transcript(tmp_path / "t.jsonl", "s", tmp_path)
    for i in range(40):
        t.turn(f"prompt {i}", f"answer {i}")
    assert t.path.stat().st_size > 4096 * 4
    facts = claude_turn(t.path, 10, None)  # a start long before the window: the tail only
    assert facts is not None and facts.prompts == ["prompt 39"]


def rollout(path: Path, turn_id: str, prompt: str, answer: str, calls: int) -> None:
    lines: list[dict[str, Any]] = [
        {"type": "session_meta", "payload": {"session_id": "cx"}},
        {"type": "event_msg", "payload": {"type": "task_started", "turn_id": turn_id}},
        {
            "type": "event_msg",
            "payload": {
                "type": "item_completed",
                "turn_id": turn_id,
                "item": {"type": "UserMessage", "content": [{"type": "text", "text": prompt}]},
            },
        },
    ]
    for _ in range(calls):
        usage = {
            "input_tokens": 900,
            "cached_input_tokens": 300,
            "cache_write_input_tokens": 4,
            "output_tokens": 21,
        }
        lines.append(
            {"type": "token_usage_record", "payload": {"turn_id": turn_id, "usage": usage}}
        )
    lines.append(
        {
            "type": "event_msg",
            "payload": {"type": "task_complete", "turn_id": turn_id, "last_agent_message": answer},
        }
    )
    with open(path, "a") as fh:
        for i, line in enumerate(lines):
            fh.write(json.dumps({"timestamp": f"2026-12-01T10:00:{i:02d}.000Z", **line}) + "\n")


def test_a_codex_turn(tmp_path: Path) -> None:
    path = tmp_path / "rollout.jsonl"
    rollout(path, "turn-a", "first", "one", 1)
    rollout(path, "turn-b", "second", "two", 2)
    facts = codex_turn(path, "turn-b", None)
    assert facts is not None and facts.prompts == ["second"] and facts.answer == "two"
    # Codex counts cached input in input_tokens: left out of tokens.input, as Anthropic does.
    assert facts.tokens == {"input": 1200, "output": 42, "cache_read": 600, "cache_creation": 8}
    assert facts.started_at == "2026-12-01T10:00:01.000Z" and facts.end_key == "turn-b"
    latest = codex_turn(path, None, "said")
    assert latest is not None and latest.end_key == "turn-b" and latest.answer == "said"
    assert codex_turn(path, "turn-z", None) is None


def test_claude_turns_since_the_last_one_recorded_are_read_each_apart(tmp_path: Path) -> None:
    t = Transcript(tmp_path / "t.jsonl", "s", tmp_path)
    t.turn("zero", "answer 0")
    recorded = claude_turn(t.path, 0, None)
    assert recorded is not None
    for n in (1, 2, 3):
        t.turn(f"prompt {n}", f"answer {n}")
    t.prompt("four, no answer yet")
    turns = transcripts.claude_turns(t.path, recorded.end_offset, "answer 3, as the hook said")
    assert [f.prompts for f in turns] == [["prompt 1"], ["prompt 2"], ["prompt 3"]]
    assert [f.answer for f in turns] == ["answer 1", "answer 2", "answer 3"]  # not the last line's
    assert [f.tokens["output"] for f in turns] == [30, 30, 30]
    assert len({f.end_key for f in turns}) == 3
    # Each ends where the next begins; the prompt with no answer is left for the next hook.
    again = transcripts.claude_turns(t.path, turns[0].end_offset, None)
    assert [f.prompts for f in again] == [["prompt 2"], ["prompt 3"]]
    assert [f.end_key for f in again] == [f.end_key for f in turns[1:]]
    assert transcripts.claude_turns(t.path, turns[-1].end_offset, None) == []
    t.assistant("m4", [{"type": "text", "text": "answer 4"}], {"output_tokens": 1})
    [last] = transcripts.claude_turns(t.path, turns[-1].end_offset, "answer 4")
    assert last.prompts == ["four, no answer yet"] and last.answer == "answer 4"
    assert last.end_offset == t.path.stat().st_size


def test_prompts_with_no_answer_between_them_stay_one_turn(tmp_path: Path) -> None:
    t = Transcript(tmp_path / "t.jsonl", "s", tmp_path)
    t.prompt("first try")
    t._write(
        {"type": "user", "message": {"role": "user", "content": "[Request interrupted by user]"}}
    )
    t.prompt("second try")
    t.assistant("m1", [{"type": "text", "text": "done"}], {"output_tokens": 1})
    [turn] = transcripts.claude_turns(t.path, 0, None)
    assert turn.prompts == ["first try", "second try"] and turn.answer == "done"


def test_codex_turns_after_the_last_one_recorded(tmp_path: Path) -> None:
    path = tmp_path / "rollout.jsonl"
    for turn_id in ("turn-a", "turn-b", "turn-c", "turn-d"):
        rollout(path, turn_id, f"prompt {turn_id}", f"answer {turn_id}", 1)
    turns = transcripts.codex_turns(path, "turn-a", "turn-d", "said")
    assert [f.end_key for f in turns] == ["turn-b", "turn-c", "turn-d"]
    assert [f.answer for f in turns] == ["answer turn-b", "answer turn-c", "said"]
    assert [f.end_key for f in transcripts.codex_turns(path, "", "turn-b", None)] == [
        "turn-a",
        "turn-b",
    ]
    # Not in the rollout's tail: the hook's own turn only.
    assert [f.end_key for f in transcripts.codex_turns(path, "gone", "turn-c", None)] == ["turn-c"]
    assert [f.end_key for f in transcripts.codex_turns(path, None, None, None)] == ["turn-d"]
