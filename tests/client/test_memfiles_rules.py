"""The rules under ``project-memory import``/``export`` that need no server: Claude Code's
@imports and project folders, the MCP memory graph's round trip, reads that never follow a
link, and the export's plan. Files are real, in tmp_path."""

from __future__ import annotations

import json
import os
import random
import shutil
import subprocess
from pathlib import Path

import pytest
from hypothesis import given, settings, strategies as st
from project_memory_client.memfiles import graph
from project_memory_client.memfiles.claude import (
    auto_memory_dir,
    import_targets,
    project_key,
    working_copy_root,
)
from project_memory_client.memfiles.export import plan_files
from project_memory_client.memfiles.sources import Unreadable, collect, read_under

# -- @imports --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("markdown", "targets"),
    [
        ("@a.md", ["a.md"]),
        ("see @./b.md and @~/c.md and @/abs/d.md", ["./b.md", "~/c.md", "/abs/d.md"]),
        ("@../up.md\n@docs/x.md#a-section", ["../up.md", "docs/x.md"]),
        ("@with\\ space.md", ["with space.md"]),
        ("mail a@b.com, (@paren.md), @/ and @#tag and @@twice", []),
        ("`@span.md` and ``@two `ticks`.md`` but @after.md", ["after.md"]),
        ("an unmatched ` tick, then @still.md", ["still.md"]),
        ("```\n@fenced.md\n```\n~~~~\n@tilde.md\n~~~~\n@out.md", ["out.md"]),
        ("para\n\n    @indented.md\n\n@real.md", ["real.md"]),
        ("text\n    @continues-the-paragraph.md", ["continues-the-paragraph.md"]),
        # As Claude Code reads an HTML block: the comment cut out, the rest of its line kept.
        ("<!-- @comment.md\n still @comment2.md -->@glued.md @kept.md", ["glued.md", "kept.md"]),
        ("@a.md @a.md", ["a.md"]),
    ],
)
def test_import_targets_follow_claude_codes_rule(markdown: str, targets: list[str]) -> None:
    assert import_targets(markdown) == targets


def test_the_project_key_is_claude_codes() -> None:
    # Values from Claude Code's own function, run under node.
    assert project_key("/home/ana/src/my-app") == "-home-ana-src-my-app"
    assert project_key("/home/ana/src/café 🙂") == "-home-ana-src-caf----"
    long = project_key("/srv/" + "x" * 210)
    assert long == "-srv-" + "x" * 195 + "-o7zi13"


def test_a_worktree_shares_its_main_working_copys_memory(tmp_path: Path) -> None:
    main = tmp_path / "main"
    (main / ".git" / "worktrees" / "wt").mkdir(parents=True)
    (main / ".git" / "worktrees" / "wt" / "commondir").write_text("../..\n")
    wt = tmp_path / "wt"
    (wt / "sub").mkdir(parents=True)
    (wt / ".git").write_text(f"gitdir: {main}/.git/worktrees/wt\n")
    assert working_copy_root(str(wt / "sub")) == str(main)
    assert working_copy_root(str(main)) == str(main)
    assert working_copy_root(str(tmp_path)) == str(tmp_path)


def test_the_users_settings_may_move_the_auto_memory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("CLAUDE_CONFIG_DIR", raising=False)
    home, repo = tmp_path / "home", tmp_path / "repo"
    repo.mkdir()
    default = auto_memory_dir(str(repo), str(home))
    assert default == f"{home}/.claude/projects/{project_key(str(repo))}/memory"
    _write(home / ".claude" / "settings.json", '{"autoMemoryDirectory": "~/notes/mem"}')
    assert auto_memory_dir(str(repo), str(home)) == f"{home}/notes/mem"
    monkeypatch.setenv("CLAUDE_CONFIG_DIR", str(tmp_path / "cfg"))
    assert auto_memory_dir(str(repo), str(home)).startswith(f"{tmp_path}/cfg/projects/")


def test_codex_memories_are_their_markdown_files(tmp_path: Path) -> None:
    codex = tmp_path / "codex" / "memories"
    for rel in ["MEMORY.md", "memory_summary.md", "rollout_summaries/2026-x.md"]:
        _write(codex / rel, rel)
    _write(codex / "skills" / "deploy" / "SKILL.md", "skill")
    _write(codex / "skills" / "deploy" / "scripts" / "run.sh", "not markdown")
    _write(codex / ".git" / "HEAD.md", "version control, not a memory")
    found = collect(
        str(tmp_path / "repo"),
        home=str(tmp_path),
        auto_memory=None,
        codex_memories=str(codex),
        mcp_files=[],
    )
    assert sorted(found.memories) == [
        "/~codex-memories/MEMORY.md",
        "/~codex-memories/memory_summary.md",
        "/~codex-memories/rollout_summaries/2026-x.md",
        "/~codex-memories/skills/deploy/SKILL.md",
    ]
    assert found.memories["/~codex-memories/MEMORY.md"].source == "~/codex/memories/MEMORY.md"


def _write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def test_imports_stop_five_deep_and_leave_other_home_folders_alone(tmp_path: Path) -> None:
    repo, home = tmp_path / "repo", tmp_path / "home"
    _write(repo / "CLAUDE.md", "@d1.md @~/.claude/ok.md @~/.ssh/id.md @~/.codex/linked/x.md")
    for n in range(1, 7):
        _write(repo / f"d{n}.md", f"@d{n + 1}.md")
    _write(home / ".claude" / "ok.md", "shared")
    _write(home / ".ssh" / "id.md", "secret")
    _write(tmp_path / "elsewhere" / "x.md", "linked")
    (home / ".codex").mkdir()
    (home / ".codex" / "linked").symlink_to(tmp_path / "elsewhere")
    found = collect(str(repo), home=str(home), auto_memory=None, codex_memories=None, mcp_files=[])
    assert sorted(found.memories) == ["/CLAUDE.md", "/d1.md", "/d2.md", "/d3.md", "/d4.md"] + [
        "/~home/.claude/ok.md"
    ]
    reasons = {(s.source, s.reason) for s in found.skipped}
    assert reasons == {
        ("d5.md", "depth"),
        ("~/.ssh/id.md", "outside"),
        ("~/.codex/linked/x.md", "symlink"),
    }


def test_a_repository_folder_under_a_reserved_prefix_is_refused(tmp_path: Path) -> None:
    _write(tmp_path / "~claude-memory" / "AGENTS.md", "would shadow the auto memory")
    _write(tmp_path / "AGENTS.md", "@./~claude-memory/notes.md")
    _write(tmp_path / "~claude-memory" / "notes.md", "x")
    found = collect(
        str(tmp_path), home=str(tmp_path / "h"), auto_memory=None, codex_memories=None, mcp_files=[]
    )
    assert list(found.memories) == ["/AGENTS.md"]
    assert {(s.source, s.reason) for s in found.skipped} == {
        ("~claude-memory/AGENTS.md", "reserved"),
        ("~claude-memory/notes.md", "reserved"),
    }


# -- reads -----------------------------------------------------------------------------------


def test_reads_never_follow_a_link_and_never_block(tmp_path: Path) -> None:
    _write(tmp_path / "real" / "a.md", "a")
    (tmp_path / "linked").symlink_to(tmp_path / "real")
    (tmp_path / "file.md").symlink_to(tmp_path / "real" / "a.md")
    os.mkfifo(tmp_path / "fifo.md")
    _write(tmp_path / "big.md", "x" * 11)
    assert read_under(str(tmp_path), "real/a.md") == "a"
    for rel, reason in [
        ("linked/a.md", "symlink"),
        ("file.md", "symlink"),
        ("fifo.md", "not-a-file"),
        ("real", "not-a-file"),
        ("missing.md", "missing"),
        ("big.md/x", "not-a-file"),
    ]:
        with pytest.raises(Unreadable) as caught:
            read_under(str(tmp_path), rel)
        assert caught.value.reason == reason, rel
    with pytest.raises(Unreadable) as caught:
        read_under(str(tmp_path), "big.md", limit=10)
    assert caught.value.reason == "too-big"


# -- the MCP memory graph --------------------------------------------------------------------

TEXT = st.text(max_size=12) | st.sampled_from(["", " x", '"q', "a → b", "→", "-", "- x", "\n"])


@st.composite
def graphs(draw: st.DrawFn) -> tuple[list[graph.Entity], list[graph.Relation]]:
    names = draw(st.lists(TEXT, max_size=5))
    entities = [
        graph.Entity(name, draw(TEXT), draw(st.lists(TEXT, max_size=4)), i)
        for i, name in enumerate(names)
    ]
    endpoints = st.sampled_from(names) | TEXT if names else TEXT
    relations = [
        graph.Relation(draw(endpoints), draw(endpoints), draw(TEXT), i)
        for i in range(draw(st.integers(0, 6)))
    ]
    return entities, relations


@settings(max_examples=300, deadline=None)
@given(graphs())
def test_a_graph_comes_back_byte_for_byte(
    drawn: tuple[list[graph.Entity], list[graph.Relation]],
) -> None:
    entities, relations = drawn
    text = graph.serialize(entities, relations)
    parsed_entities, parsed_relations, problems = graph.parse_file(text)
    assert problems == []
    markdown = graph.memories(parsed_entities, parsed_relations)
    for name, content in markdown.items():
        content.encode("utf-8")  # a memory must be UTF-8: no lone surrogate left raw
        assert graph.kind_of(content) is not None and "/" not in name
    assert graph.rebuild([markdown[n] for n in sorted(markdown)]) == text


def test_a_hand_edit_of_an_entity_is_kept_on_export() -> None:
    text = graph.serialize(
        [graph.Entity("Alice", "person", ["one"], 0)],
        [graph.Relation("Alice", "Bob", "knows", 0)],
    )
    entities, relations, _ = graph.parse_file(text)
    alice = graph.memories(entities, relations)["Alice.md"]
    edited = alice.replace("- one\n", "- one\n- two, by hand\n") + "- likes → Tea\n"
    assert graph.rebuild([edited]) == graph.serialize(
        [graph.Entity("Alice", "person", ["one", "two, by hand"])],
        [graph.Relation("Alice", "Bob", "knows"), graph.Relation("Alice", "Tea", "likes")],
    )
    with pytest.raises(graph.GraphError):
        graph.rebuild([alice.replace("- one\n", "one without a dash\n")])


def test_the_reader_reports_bad_lines_and_keeps_the_rest() -> None:
    text = "\n".join(
        [
            '{"type":"entity","name":"A","entityType":"t","observations":[]}',
            "{not json",
            '{"type":"entity","name":"B","entityType":"t","observations":[1]}',
            '{"type":"relation","from":"A","to":"B"}',
            '{"type":"other"}',
            "[" * 100_000,
            "   ",
            '{"type":"relation","from":"A","to":"B","relationType":"r","extra":1}',
        ]
    )
    entities, relations, problems = graph.parse_file(text)
    assert [e.name for e in entities] == ["A"] and [r.relation_type for r in relations] == ["r"]
    assert [p.line for p in problems] == [2, 3, 4, 5, 6]


NODE = shutil.which("node")
# The reference server's saveGraph, as published (src/memory/index.ts).
SAVE_GRAPH = """
const graph = JSON.parse(require("fs").readFileSync(0, "utf8"));
const lines = [
  ...graph.entities.map(e => JSON.stringify({type: "entity", name: e.name, entityType: e.entityType, observations: e.observations})),
  ...graph.relations.map(r => JSON.stringify({type: "relation", from: r.from, to: r.to, relationType: r.relationType})),
];
process.stdout.write(lines.join("\\n"));
"""


@pytest.mark.skipif(NODE is None, reason="node is not installed")
def test_serialize_writes_what_the_reference_server_writes() -> None:
    rng = random.Random(7)
    tricky = ["", "é漢🙂", "\x00\x01\x1f\x7f", '"\\/', "\u2028\u2029", "\ud800", "\udc00x\ud83d"]
    tricky += ["\b\f\n\r\t", "\ufeff", "\u0085"]
    pool = [chr(c) for c in (*range(0, 0x80), 0xA0, 0x2028, 0xD800, 0xDFFF, 0xFFFF, 0x1F642)]
    tricky += ["".join(rng.choice(pool) for _ in range(rng.randint(0, 12))) for _ in range(200)]
    # As a file gives them: a high then a low surrogate is one character (JSON reads the pair
    # as one), which concatenation in Python would not make.
    tricky = [json.loads(json.dumps(s)) for s in tricky]
    entities = [graph.Entity(s, s.upper(), [s, "~" + s], i) for i, s in enumerate(tricky)]
    relations = [graph.Relation(s, "x", s, i) for i, s in enumerate(tricky)]
    payload = {
        "entities": [
            {"name": e.name, "entityType": e.entity_type, "observations": e.observations}
            for e in entities
        ],
        "relations": [
            {"from": r.source, "to": r.target, "relationType": r.relation_type} for r in relations
        ],
    }
    assert NODE is not None
    ran = subprocess.run(
        [NODE, "-e", SAVE_GRAPH],
        input=json.dumps(payload).encode("ascii"),
        capture_output=True,
        check=True,
        timeout=60,
    )
    assert graph.serialize(entities, relations).encode("utf-8") == ran.stdout


# -- the export's plan -----------------------------------------------------------------------


def test_the_export_plan_refuses_what_it_cannot_write_faithfully() -> None:
    entities, relations, _ = graph.parse_file(
        '{"type":"entity","name":"A","entityType":"t","observations":["x"]}'
    )
    entity = graph.memories(entities, relations)["A.md"]
    memories = [
        {"path": "/g.json/A.md", "content": entity},
        {"path": "/g.json/notes.md", "content": "not an entity"},
        {"path": "/bad.json/A.md", "content": entity.replace("- x", "x")},
        {"path": "/ok.md", "content": "ok"},
        {"path": "/none.md", "content": None},
        {"path": "/A.md", "content": entity},
    ]
    planned = {f.file: (f.action, f.data) for f in plan_files(memories)}
    assert planned["ok.md"] == ("write", b"ok")
    assert planned["g.json"] == ("refused", None)  # other memories share its folder
    assert planned["g.json/notes.md"][0] == "write"
    assert planned["bad.json"][0] == "refused"
    assert planned["none.md"][0] == "refused"
    assert planned["/"][0] == "refused"
