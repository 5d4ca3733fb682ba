"""The memory tool served from a store: every command, every error string, the traversal corpus.

Through the HTTP endpoint with the Flask client and a real storage root; the store's own
API (list, versions) is the witness of what changed.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import Any

import pytest
from flask import Flask
from flask.testing import FlaskClient

from app.services.memory_tool import MemoryTool, ToolError, human_size, parse_path
from app.storage.core.names import Scope
from tests.api.test_memory_stores import BASE, Api, assert_error
from tests.conftest import Tokens


@pytest.fixture
def api(client: FlaskClient, tokens: Tokens) -> Api:
    return Api(client, tokens)


@pytest.fixture
def store_id(api: Api) -> str:
    return str(api.store("Agent Memory")["id"])


class Tool:
    """Send tool inputs to one store's memory_tool endpoint."""

    def __init__(self, api: Api, store_id: str) -> None:
        self.api = api
        self.store_id = store_id

    def raw(self, body: Any, who: str = "writer") -> Any:
        return self.api.as_(who).post(f"{BASE}/{self.store_id}/memory_tool", json=body)

    def __call__(self, **tool_input: Any) -> tuple[str, bool]:
        r = self.raw(tool_input)
        assert r.status_code == 200, r.json
        assert r.json["type"] == "memory_tool_result"
        return r.json["content"], r.json["is_error"]

    def ok(self, **tool_input: Any) -> str:
        text, is_error = self(**tool_input)
        assert not is_error, text
        return text

    def err(self, **tool_input: Any) -> str:
        text, is_error = self(**tool_input)
        assert is_error, text
        return text

    def tree(self) -> dict[str, str]:
        """Path -> content of every memory, through the store API."""
        r = self.api.get(f"{BASE}/{self.store_id}/memories", query_string={"limit": 100})
        out = {}
        for item in r.json["data"]:
            got = self.api.get(f"{BASE}/{self.store_id}/memories/{item['id']}")
            out[item["path"]] = got.json["content"]
        return out


@pytest.fixture
def tool(api: Api, store_id: str) -> Tool:
    return Tool(api, store_id)


def sha(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


# -- view ----------------------------------------------------------------------------------
def test_view_of_an_empty_store_is_the_header_and_the_root(tool: Tool) -> None:
    assert tool.ok(command="view", path="/memories") == (
        "Here're the files and directories up to 2 levels deep in /memories, excluding hidden"
        " items and node_modules:\n0B\t/memories"
    )


def test_view_lists_two_levels_with_sizes_skipping_hidden_and_node_modules(tool: Tool) -> None:
    tool.ok(command="create", path="/memories/b.md", file_text="x" * 5632)  # 5.5K
    tool.ok(command="create", path="/memories/a/one.md", file_text="1")
    tool.ok(command="create", path="/memories/a/deep/two.md", file_text="22")
    tool.ok(command="create", path="/memories/a/deep/er/three.md", file_text="333")
    tool.ok(command="create", path="/memories/.hidden.md", file_text="h")
    tool.ok(command="create", path="/memories/a/node_modules/x.js", file_text="n")
    text = tool.ok(command="view", path="/memories")
    header, *lines = text.split("\n")
    assert header.startswith("Here're the files and directories up to 2 levels deep in /memories")
    assert lines == [
        f"{human_size(5632 + 6)}\t/memories",
        "6B\t/memories/a/",
        "5B\t/memories/a/deep/",
        "1B\t/memories/a/one.md",
        "5.5K\t/memories/b.md",
    ]
    sub = tool.ok(command="view", path="/memories/a/")
    assert sub.split("\n")[1:] == [
        "6B\t/memories/a",
        "5B\t/memories/a/deep/",
        "3B\t/memories/a/deep/er/",
        "2B\t/memories/a/deep/two.md",
        "1B\t/memories/a/one.md",
    ]


def test_human_sizes() -> None:
    assert [human_size(n) for n in (0, 1, 1023, 1024, 5632, 1258291)] == [
        "0B",
        "1B",
        "1023B",
        "1K",
        "5.5K",
        "1.2M",
    ]


def test_view_file_numbers_lines_and_honours_view_range(tool: Tool) -> None:
    tool.ok(command="create", path="/memories/f.md", file_text="a\nb\nc\nd\n")
    assert tool.ok(command="view", path="/memories/f.md") == (
        "Here's the content of /memories/f.md with line numbers:\n"
        "     1\ta\n     2\tb\n     3\tc\n     4\td"
    )
    ranged = tool.ok(command="view", path="/memories/f.md", view_range=[2, 3])
    assert ranged.split("\n")[1:] == ["     2\tb", "     3\tc"]
    to_end = tool.ok(command="view", path="/memories/f.md", view_range=[3, -1])
    assert to_end.split("\n")[1:] == ["     3\tc", "     4\td"]


@pytest.mark.parametrize(
    ("view_range", "expected"),
    [
        ([0, 2], "Error: Invalid `view_range` parameter: [0, 2]. Its first element `0`"),
        ([9, -1], "Error: Invalid `view_range` parameter: [9, -1]. Its first element `9`"),
        ([3, 2], "Error: Invalid `view_range` parameter: [3, 2]. Its second element `2`"),
        ([1], "Error: Invalid `view_range` parameter: it should be a list of two integers"),
        (["1", 2], "Error: Invalid `view_range` parameter: it should be a list of two integers"),
    ],
)
def test_view_range_errors(tool: Tool, view_range: Any, expected: str) -> None:
    tool.ok(command="create", path="/memories/f.md", file_text="a\nb\nc\n")
    assert tool.err(command="view", path="/memories/f.md", view_range=view_range).startswith(
        expected
    )


def test_view_of_a_missing_path(tool: Tool) -> None:
    assert tool.err(command="view", path="/memories/nope.md") == (
        "The path /memories/nope.md does not exist. Please provide a valid path."
    )


def test_view_truncates_long_files_and_refuses_too_many_lines(
    app: Flask, tool: Tool, store_id: str
) -> None:
    text = "".join(f"line {i}\n" for i in range(5000))
    tool.ok(command="create", path="/memories/long.md", file_text=text)
    shown = tool.ok(command="view", path="/memories/long.md")
    assert len(shown) <= 16_000 + 200
    assert shown.endswith("use view_range to see the rest)")
    assert "(truncated after line " in shown
    # The 999,999-line limit cannot be reached within the store's 100 kB: a smaller limit
    # shows the same path through the code.
    small = MemoryTool(
        app.extensions["storage"].stores, Scope("acme", "web"), store_id, actor=None, max_lines=3
    )
    result = small.run({"command": "view", "path": "/memories/long.md"})
    assert result.is_error
    assert result.content == "File /memories/long.md exceeds maximum line limit of 3 lines."


# -- create --------------------------------------------------------------------------------
def test_create_makes_a_created_version_and_never_overwrites(tool: Tool, api: Api) -> None:
    assert tool.ok(command="create", path="/memories/p/prefs.md", file_text="tea\n") == (
        "File created successfully at: /memories/p/prefs.md"
    )
    assert tool.tree() == {"/p/prefs.md": "tea\n"}
    (version,) = api.versions(tool.store_id)
    assert version["operation"] == "created" and version["path"] == "/p/prefs.md"
    assert version["created_by"] == {"type": "api_actor", "api_key_id": api.tokens.ids["writer"]}
    assert tool.err(command="create", path="/memories/p/prefs.md", file_text="coffee") == (
        "Error: File /memories/p/prefs.md already exists"
    )
    assert tool.err(command="create", path="/memories/p", file_text="dir") == (
        "Error: File /memories/p already exists"
    )
    assert tool.err(command="create", path="/memories/p/prefs.md/x", file_text="under") == (
        "Error: Cannot create /memories/p/prefs.md/x: /memories/p/prefs.md is a file,"
        " not a directory"
    )
    assert tool.err(command="create", path="/memories", file_text="root") == (
        "Error: File /memories already exists"
    )
    assert tool.tree() == {"/p/prefs.md": "tea\n"}
    assert len(api.versions(tool.store_id)) == 1


def test_create_refuses_oversize_content(tool: Tool) -> None:
    text = tool.err(command="create", path="/memories/big.md", file_text="x" * 102_401)
    assert (
        text
        == "Error: /memories/big.md was not written: content must be at most 102400 bytes of UTF-8"
    )
    assert tool.tree() == {}


# -- str_replace ---------------------------------------------------------------------------
def test_str_replace_edits_with_a_snippet_and_a_modified_version(tool: Tool, api: Api) -> None:
    tool.ok(command="create", path="/memories/f.md", file_text="1\n2\n3\nfour\n5\n6\n7\n")
    text = tool.ok(command="str_replace", path="/memories/f.md", old_str="four", new_str="4")
    assert text == (
        "The memory file has been edited. Here is the snippet showing the change (with line"
        " numbers):\n     2\t2\n     3\t3\n     4\t4\n     5\t5\n     6\t6"
    )
    assert tool.tree() == {"/f.md": "1\n2\n3\n4\n5\n6\n7\n"}
    newest = api.versions(tool.store_id)[0]
    assert newest["operation"] == "modified" and newest["content_sha256"] == sha(
        "1\n2\n3\n4\n5\n6\n7\n"
    )
    # new_str omitted deletes old_str
    tool.ok(command="str_replace", path="/memories/f.md", old_str="7\n")
    assert tool.tree() == {"/f.md": "1\n2\n3\n4\n5\n6\n"}


def test_str_replace_errors(tool: Tool, api: Api) -> None:
    tool.ok(command="create", path="/memories/d/f.md", file_text="a x\nb x\nc\n")
    before = api.versions(tool.store_id)
    assert tool.err(command="str_replace", path="/memories/d/f.md", old_str="zz", new_str="") == (
        "No replacement was performed, old_str `zz` did not appear verbatim in /memories/d/f.md."
    )
    assert tool.err(command="str_replace", path="/memories/d/f.md", old_str="x", new_str="y") == (
        "No replacement was performed. Multiple occurrences of old_str `x` in lines: 1, 2."
        " Please ensure it is unique"
    )
    missing = "Error: The path {} does not exist. Please provide a valid path."
    assert tool.err(
        command="str_replace", path="/memories/none.md", old_str="a", new_str="b"
    ) == missing.format("/memories/none.md")
    assert tool.err(
        command="str_replace", path="/memories/d", old_str="a", new_str="b"
    ) == missing.format("/memories/d")
    assert api.versions(tool.store_id) == before


def test_str_replace_applies_to_the_latest_content(tool: Tool, api: Api) -> None:
    """The read-modify-write carries a content_sha256 precondition and re-reads on failure."""
    tool.ok(command="create", path="/memories/f.md", file_text="keep\nold\n")
    memory_id = api.get(f"{BASE}/{tool.store_id}/memories").json["data"][0]["id"]
    r = api.post(
        f"{BASE}/{tool.store_id}/memories/{memory_id}", json={"content": "keep\nold\nmore\n"}
    )
    assert r.status_code == 200
    tool.ok(command="str_replace", path="/memories/f.md", old_str="old", new_str="new")
    assert tool.tree() == {"/f.md": "keep\nnew\nmore\n"}


# -- insert --------------------------------------------------------------------------------
def test_insert_at_start_middle_and_end(tool: Tool) -> None:
    tool.ok(command="create", path="/memories/f.md", file_text="b\nd")
    assert tool.ok(command="insert", path="/memories/f.md", insert_line=0, insert_text="a\n") == (
        "The file /memories/f.md has been edited."
    )
    tool.ok(command="insert", path="/memories/f.md", insert_line=2, insert_text="c")
    tool.ok(command="insert", path="/memories/f.md", insert_line=4, insert_text="e\n")
    assert tool.tree() == {"/f.md": "a\nb\nc\nd\ne\n"}


def test_insert_errors(tool: Tool) -> None:
    tool.ok(command="create", path="/memories/f.md", file_text="1\n2\n")
    assert tool.err(command="insert", path="/memories/f.md", insert_line=3, insert_text="x") == (
        "Error: Invalid `insert_line` parameter: 3. It should be within the range of lines of"
        " the file: [0, 2]"
    )
    assert tool.err(command="insert", path="/memories/f.md", insert_line=-1, insert_text="x") == (
        "Error: Invalid `insert_line` parameter: -1. It should be within the range of lines of"
        " the file: [0, 2]"
    )
    assert tool.err(command="insert", path="/memories/g.md", insert_line=0, insert_text="x") == (
        "Error: The path /memories/g.md does not exist"
    )
    assert tool.err(command="insert", path="/memories/f.md", insert_line=True, insert_text="x") == (
        "Error: Parameter `insert_line` must be of type int"
    )
    assert tool.tree() == {"/f.md": "1\n2\n"}


# -- delete --------------------------------------------------------------------------------
def test_delete_a_file_and_a_directory_recursively(tool: Tool, api: Api) -> None:
    for path in ("/memories/a.md", "/memories/d/x.md", "/memories/d/e/y.md", "/memories/dd.md"):
        tool.ok(command="create", path=path, file_text=path)
    assert tool.ok(command="delete", path="/memories/a.md") == "Successfully deleted /memories/a.md"
    assert tool.ok(command="delete", path="/memories/d/") == "Successfully deleted /memories/d/"
    assert tool.tree() == {"/dd.md": "/memories/dd.md"}
    deleted = api.versions(tool.store_id, operation="deleted")
    assert sorted(v["path"] for v in deleted) == ["/a.md", "/d/e/y.md", "/d/x.md"]


def test_delete_errors(tool: Tool) -> None:
    tool.ok(command="create", path="/memories/a.md", file_text="a")
    assert tool.err(command="delete", path="/memories/none") == (
        "Error: The path /memories/none does not exist"
    )
    for root in ("/memories", "/memories/"):
        assert tool.err(command="delete", path=root) == (
            "Error: Cannot delete the /memories directory itself"
        )
    assert tool.tree() == {"/a.md": "a"}


# -- rename --------------------------------------------------------------------------------
def test_rename_a_file_and_a_directory(tool: Tool, api: Api) -> None:
    tool.ok(command="create", path="/memories/a.md", file_text="A")
    tool.ok(command="create", path="/memories/d/x.md", file_text="X")
    tool.ok(command="create", path="/memories/d/e/y.md", file_text="Y")
    memory_ids = {
        m["path"]: m["id"] for m in api.get(f"{BASE}/{tool.store_id}/memories").json["data"]
    }
    assert tool.ok(command="rename", old_path="/memories/a.md", new_path="/memories/n/b.md") == (
        "Successfully renamed /memories/a.md to /memories/n/b.md"
    )
    tool.ok(command="rename", old_path="/memories/d", new_path="/memories/z")
    assert tool.tree() == {"/n/b.md": "A", "/z/e/y.md": "Y", "/z/x.md": "X"}
    after = {m["path"]: m["id"] for m in api.get(f"{BASE}/{tool.store_id}/memories").json["data"]}
    assert after["/n/b.md"] == memory_ids["/a.md"]  # a rename keeps the memory (and its history)
    assert after["/z/x.md"] == memory_ids["/d/x.md"]
    assert len(api.versions(tool.store_id, operation="modified")) == 3


def test_rename_errors_never_overwrite(tool: Tool, api: Api) -> None:
    tool.ok(command="create", path="/memories/a.md", file_text="A")
    tool.ok(command="create", path="/memories/b.md", file_text="B")
    tool.ok(command="create", path="/memories/d/x.md", file_text="X")
    before = api.versions(tool.store_id)
    assert tool.err(command="rename", old_path="/memories/a.md", new_path="/memories/b.md") == (
        "Error: The destination /memories/b.md already exists"
    )
    assert tool.err(command="rename", old_path="/memories/a.md", new_path="/memories/d") == (
        "Error: The destination /memories/d already exists"
    )
    assert tool.err(command="rename", old_path="/memories/none", new_path="/memories/c.md") == (
        "Error: The path /memories/none does not exist"
    )
    assert tool.err(command="rename", old_path="/memories", new_path="/memories/all") == (
        "Error: Cannot rename the /memories directory itself"
    )
    assert tool.err(command="rename", old_path="/memories/a.md", new_path="/memories") == (
        "Error: The destination /memories already exists"
    )
    assert tool.err(command="rename", old_path="/memories/d", new_path="/memories/d/e") == (
        "Error: Cannot move the directory /memories/d into itself"
    )
    assert tool.err(command="rename", old_path="/memories/d", new_path="/memories/a.md/d") == (
        "Error: Cannot rename /memories/d to /memories/a.md/d: /memories/a.md is a file,"
        " not a directory"
    )
    assert tool.tree() == {"/a.md": "A", "/b.md": "B", "/d/x.md": "X"}
    assert api.versions(tool.store_id) == before


# -- input errors --------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("tool_input", "expected"),
    [
        ({"command": "erase", "path": "/memories"}, "Error: Unknown command 'erase'."),
        ({"path": "/memories"}, "Error: Unknown command None."),
        ({"command": "view"}, "Error: Missing required parameter `path` for `view`"),
        (
            {"command": "create", "path": "/memories/a"},
            "Error: Missing required parameter `file_text`",
        ),
        ({"command": "view", "path": 3}, "Error: Parameter `path` must be of type str"),
        (
            {"command": "rename", "old_path": "/memories/a"},
            "Error: Missing required parameter `new_path`",
        ),
        (
            {"command": "str_replace", "path": "/memories/a", "old_str": ""},
            "Error: Parameter `old_str` must not be empty",
        ),
        (
            {"command": "view", "path": "/memories//a"},
            "Error: Invalid path /memories//a: must not contain empty segments",
        ),
        (
            {"command": "view", "path": "/memories/a\u202e"},
            "Error: Invalid path /memories/a\u202e: must not contain control",
        ),
    ],
)
def test_malformed_input_is_an_error_result(tool: Tool, tool_input: Any, expected: str) -> None:
    assert tool.err(**tool_input).startswith(expected)


# -- traversal corpus ----------------------------------------------------------------------
TRAVERSAL = [
    "/memories/../secrets.env",
    "/memories/../../etc/passwd",
    "/memories/a/../../x",
    "/memories/..",
    "/memories/./a.md",
    "/memories/..%2fsecrets.env",
    "/memories/..%2Fsecrets.env",
    "/memories/%2e%2e/secrets.env",
    "/memories/%2E%2E%2Fsecrets.env",
    "/memories/%2e%2e%2f%2e%2e%2fetc%2fpasswd",
    "/memories/%252e%252e%252fsecrets.env",
    "/memories/a%2fb",
    "/memories/..\\secrets.env",
    "/memories/a%5c..%5cb",
    "/memories%2f..%2fsecrets.env",
    "/etc/passwd",
    "/memoriesx/a.md",
    "/memories-evil/a.md",
    "memories/a.md",
    "/",
    "/tmp/memories/a.md",
    "../memories/a.md",
]
OUTSIDE = {
    "/etc/passwd",
    "/memoriesx/a.md",
    "/memories-evil/a.md",
    "memories/a.md",
    "/",
    "/tmp/memories/a.md",
}


def _snapshot(root: Path) -> dict[str, tuple[int, bytes]]:
    out = {}
    for dirpath, _dirs, files in os.walk(root):
        for name in files:
            path = Path(dirpath) / name
            out[str(path)] = (path.stat().st_mtime_ns, path.read_bytes())
    return out


@pytest.mark.parametrize("bad", TRAVERSAL)
def test_traversal_corpus_is_refused_without_touching_the_store(
    app: Flask, tool: Tool, api: Api, bad: str
) -> None:
    tool.ok(command="create", path="/memories/a.md", file_text="a")
    root = Path(app.config["STORAGE_ROOT"])
    before = _snapshot(root)
    versions = api.versions(tool.store_id)
    inputs = [
        {"command": "view", "path": bad},
        {"command": "create", "path": bad, "file_text": "pwned"},
        {"command": "str_replace", "path": bad, "old_str": "a", "new_str": "b"},
        {"command": "insert", "path": bad, "insert_line": 0, "insert_text": "x"},
        {"command": "delete", "path": bad},
        {"command": "rename", "old_path": bad, "new_path": "/memories/b.md"},
        {"command": "rename", "old_path": "/memories/a.md", "new_path": bad},
    ]
    for tool_input in inputs:
        text = tool.err(**tool_input)
        if bad in OUTSIDE:
            assert "is outside the memory directory" in text, text
        else:
            assert "would escape /memories" in text, text
    # Not a byte of the storage root changed (the index and the version files included).
    index_files = {k for k in _snapshot(root) if "index.sqlite3" in k}
    assert {k: v for k, v in _snapshot(root).items() if k not in index_files} == {
        k: v for k, v in before.items() if k not in index_files
    }
    assert api.versions(tool.store_id) == versions
    assert tool.tree() == {"/a.md": "a"}


def test_parse_path_keeps_literal_percent_names() -> None:
    # Not an encoded dot or slash: a literal file name, stored as given.
    assert parse_path("/memories/100%25done.md") == "/100%25done.md"
    assert parse_path("/memories/50%-off.md") == "/50%-off.md"
    assert parse_path("/memories/") == ""
    assert parse_path("/memories/notes/") == "/notes"


# -- HTTP errors ---------------------------------------------------------------------------
def test_transport_errors_use_the_envelope(tool: Tool, api: Api, client: FlaskClient) -> None:
    r = client.post(f"{BASE}/{tool.store_id}/memory_tool", json={"command": "view"})
    assert_error(r, 401, "authentication_error")
    r = tool.raw({"command": "create", "path": "/memories/a", "file_text": "x"}, who="reader")
    assert_error(r, 403, "permission_error")
    r = tool.raw({"command": "view", "path": "/memories"}, who="other_project")
    assert_error(r, 404, "not_found_error")
    r = api.post(
        f"{BASE}/memstore_01J00000000000000000000000/memory_tool", json={"command": "view"}
    )
    assert_error(r, 404, "not_found_error")
    r = tool.raw([{"command": "view"}])
    assert_error(r, 400, "invalid_request_error")
    r = api.post(
        f"{BASE}/{tool.store_id}/memory_tool", data=b"{nope", content_type="application/json"
    )
    assert_error(r, 400, "invalid_request_error")
    assert tool.tree() == {}


def test_an_archived_store_refuses_changes_but_can_be_viewed(tool: Tool, api: Api) -> None:
    tool.ok(command="create", path="/memories/a.md", file_text="a")
    tool.ok(command="create", path="/memories/b.md", file_text="b")
    assert api.post(f"{BASE}/{tool.store_id}/archive").status_code == 200
    assert tool.err(command="create", path="/memories/c.md", file_text="c") == (
        "Error: The memory store is archived and read-only; /memories/c.md was not changed"
    )
    assert tool.err(command="rename", old_path="/memories/a.md", new_path="/memories/d.md")
    assert "1B\t/memories/a.md" in tool.ok(command="view", path="/memories")
    # What must go can still go: a delete is allowed in an archived store.
    tool.ok(command="delete", path="/memories/b.md")
    assert "/memories/b.md" not in tool.ok(command="view", path="/memories")


def test_the_endpoint_is_in_the_openapi_document(client: FlaskClient) -> None:
    import yaml

    spec = yaml.safe_load(client.get("/sandbox/memory/v1/openapi.yaml").data)
    operation = spec["paths"]["/v1/memory_stores/{memory_store_id}/memory_tool"]["post"]
    assert operation["operationId"] == "run_memory_tool"
    assert operation["tags"] == ["memory-stores"]
    assert {"MemoryToolInput", "MemoryToolResult"} <= set(spec["components"]["schemas"])


def test_an_edit_that_races_a_concurrent_write_is_applied_to_the_fresh_content(
    app: Flask, tool: Tool, store_id: str
) -> None:
    """The read-modify-write fails its content_sha256 precondition and re-reads."""
    engine = app.extensions["storage"].stores
    scope = Scope("acme", "web")
    tool.ok(command="create", path="/memories/f.md", file_text="keep\nold\n")
    memory_tool = MemoryTool(engine, scope, store_id, actor=None)
    seen: list[str] = []

    def change(content: str) -> str:
        seen.append(content)
        if len(seen) == 1:  # another writer gets in between our read and our write
            found = engine.find_memory(scope, store_id, "/f.md", full=False)
            engine.update_memory(scope, store_id, found.id, content=content + "more\n", actor=None)
        return content.replace("old", "new")

    memory_tool._edit("/memories/f.md", "/f.md", change, "missing")
    assert seen == ["keep\nold\n", "keep\nold\nmore\n"]
    assert tool.tree() == {"/f.md": "keep\nnew\nmore\n"}

    def always_raced(content: str) -> str:
        found = engine.find_memory(scope, store_id, "/f.md", full=False)
        engine.update_memory(scope, store_id, found.id, content=content + "x", actor=None)
        return "mine"

    result = MemoryTool(engine, scope, store_id, actor=None)
    with pytest.raises(ToolError, match="kept changing while it was being edited"):
        result._edit("/memories/f.md", "/f.md", always_raced, "missing")
    assert tool.tree()["/f.md"].endswith("xxx")  # never overwritten by the stale edit
