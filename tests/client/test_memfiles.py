"""``project-memory import`` and ``export`` against the real server, on real files.

A fixture repository holds every kind of memory file (CLAUDE.md with imports, AGENTS.md at
two levels, Cursor rules old and new, an MCP memory file as the reference server writes it)
and a home with Claude Code's auto-memory folder for it; hostile files sit beside them.

tests/client/golden/memfiles-json.json pins the ``--json`` output. After a deliberate change,
rewrite it with PROJECT_MEMORY_UPDATE_GOLDEN=1 and review the diff.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import threading
import uuid
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
from project_memory_client.memfiles.claude import project_key
from project_memory_client.memfiles.sources import collect
from project_memory_client.memfiles.store import apply, find_store, plan
from project_memory_client.mount.http import StoreClient

from tests.client.conftest import Cli, cli_env
from tests.client.mount.helpers import Remote
from tests.client.test_cli import normalise
from tests.e2e.conftest import Server

pytestmark = pytest.mark.e2e

GOLDEN = Path(__file__).parent / "golden" / "memfiles-json.json"

# What @modelcontextprotocol/server-memory writes: entities, then relations, JSON.stringify'd,
# joined by "\n", no final newline.
MEMORY_JSON = "\n".join(
    [
        '{"type":"entity","name":"Alice","entityType":"person","observations":["Likes tea","Says \\"hi\\"\\nthen leaves"]}',
        '{"type":"entity","name":"Acme Corp","entityType":"organization","observations":[]}',
        '{"type":"entity","name":"alice","entityType":"person","observations":["  the other one → lowercase"]}',
        '{"type":"relation","from":"Alice","to":"Acme Corp","relationType":"works_at"}',
        '{"type":"relation","from":"Ghost","to":"Alice","relationType":"haunts"}',
        '{"type":"relation","from":"Alice","to":"alice","relationType":"knows"}',
    ]
)  # fmt: skip

BROKEN_JSONL = (
    '{"type":"entity","name":"Bob","entityType":"person","observations":["ok"]}\n'
    '{"type":"entity","name":"Bob\n'
    '{"type":"relation","from":"Bob","to":"Bob","relationType":"is"}\n'
)
BROKEN_JSONL_KEPT = "\n".join(
    line for i, line in enumerate(BROKEN_JSONL.split("\n")) if i in (0, 2)
)

CLAUDE_MD = """# Project

Style: @docs/style.md
Shared: @~/.claude/shared.md
Escapes: @../outside.md and @/etc/hostname

```
@docs/in-a-code-block.md
```
Not `@docs/in-a-code-span.md` either. <!-- @docs/in-a-comment.md -->
"""


def write(path: Path, data: str | bytes) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    if isinstance(data, str):
        data = data.encode("utf-8")
    path.write_bytes(data)
    return path


def make_repo(root: Path, home: Path) -> dict[str, bytes]:
    """The fixture repository and home; the store path -> bytes of each verbatim file."""
    verbatim = {
        "/CLAUDE.md": CLAUDE_MD,
        "/CLAUDE.local.md": "Local notes: @CLAUDE.md (already read)\r\nwith a CRLF\r\n",
        "/.claude/CLAUDE.md": "\ufeffThe alternate project file, with a BOM.\n",
        "/docs/style.md": "Use ruff. See @cycle.md\n",
        "/docs/cycle.md": "Back to @style.md (a cycle).\n",
        "/AGENTS.md": "# Agents\n\nRun `make test`.\n",
        "/api/AGENTS.md": "API agents: no mocks.\n",
        "/.cursor/rules/python.mdc": "---\ndescription: Python\nglobs: *.py\n---\nType everything.\n",
        "/.cursorrules": "Legacy Cursor rules: be brief.",
        "/~home/.claude/shared.md": "Shared across projects: 漢字 and 🙂\n",
    }
    for path, text in verbatim.items():
        if path.startswith("/~home/"):
            write(home / path[len("/~home/") :], text)
        else:
            write(root / path[1:], text)
    write(root / "memory.json", MEMORY_JSON)
    # The newer default name, with a line the server could not read: reported, the rest kept.
    write(root / "memory.jsonl", BROKEN_JSONL)
    write(root.parent / "outside.md", "outside the repository\n")
    key = project_key(os.path.realpath(root))
    memory_dir = home / ".claude" / "projects" / key / "memory"
    auto = {
        "/~claude-memory/MEMORY.md": "- [Testing](testing.md): how tests run\n",
        "/~claude-memory/testing.md": "---\nname: testing\n---\nReal servers, no mocks.\n",
    }
    for path, text in auto.items():
        write(memory_dir / path.rsplit("/", 1)[1], text)
    # Hostile: not UTF-8, a link to a file, a linked rules folder, a file too big.
    write(root / "legacy" / "CLAUDE.md", b"caf\xe9 in Latin-1\n")
    (root / "docs" / "AGENTS.md").symlink_to("../AGENTS.md")
    write(root.parent / "elsewhere" / "rules" / "evil.md", "never read\n")
    (root / ".claude" / "rules").symlink_to(root.parent / "elsewhere" / "rules")
    write(root / "big" / "AGENTS.md", "x" * 102_401)
    return {p: t.encode("utf-8") for p, t in {**verbatim, **auto}.items()}


def expected_skips(tmp_path: Path) -> set[tuple[str, str]]:
    return {
        ("/etc/hostname", "outside"),
        (str(tmp_path / "outside.md"), "outside"),
        ("docs/style.md", "cycle"),
        ("legacy/CLAUDE.md", "not-utf8"),
        ("docs/AGENTS.md", "symlink"),
        (".claude/rules", "symlink"),
        ("big/AGENTS.md", "too-big"),
        ("memory.jsonl:2", "malformed"),
    }


@pytest.fixture
def repo(tmp_path: Path) -> tuple[Path, Path, dict[str, bytes]]:
    root = tmp_path / "repo"
    home = tmp_path / "home"
    (root / ".git").mkdir(parents=True)
    return root, home, make_repo(root, home)


@pytest.fixture
def mf_cli(pm_server: Server, tmp_path: Path) -> Cli:
    """The CLI with a project of its own, HOME in tmp_path, and no agent variables."""
    token = pm_server.token("writer", project=f"mf-{uuid.uuid4().hex[:8]}")
    env = cli_env(pm_server.url, token, tmp_path / "config")
    for name in ("CLAUDE_CONFIG_DIR", "CODEX_HOME", "CLAUDE_CODE_REMOTE_MEMORY_DIR"):
        env.pop(name, None)
    env["HOME"] = str(tmp_path / "home")
    work = tmp_path / "work"
    work.mkdir()
    return Cli(env, work)


def remote_of(pm_server: Server, cli: Cli) -> Remote:
    return Remote(pm_server, cli.env["PROJECT_MEMORY_TOKEN"])


def store_id(remote: Remote, name: str) -> str | None:
    stores = remote.call("GET", "", params={"limit": 100})["data"]
    return next((s["id"] for s in stores if s["name"] == name), None)


def graph_lines(found: str) -> list[str]:
    return found.split("\n")


def test_import_gives_the_expected_paths_and_a_second_run_changes_nothing(
    mf_cli: Cli, pm_server: Server, repo: tuple[Path, Path, dict[str, bytes]], tmp_path: Path
) -> None:
    root, _, verbatim = repo
    ran = mf_cli("import", "--store", "Team memory", str(root), "--json")
    assert ran.code == 0, ran.stdout + ran.stderr
    out = ran.json()["data"]
    remote = remote_of(pm_server, mf_cli)
    try:
        sid = store_id(remote, "Team memory")
        assert sid is not None and out["store"] == {
            "id": sid,
            "name": "Team memory",
            "created": True,
        }
        tree = remote.tree(sid)
        graph = {"/memory.json/Alice.md", "/memory.json/Acme-Corp.md", "/memory.json/alice-2.md"}
        graph |= {"/memory.json/_relations.md", "/memory.jsonl/Bob.md"}
        assert set(tree) == set(verbatim) | graph
        for path, data in verbatim.items():
            assert tree[path].encode("utf-8") == data, path
        assert out["counts"]["create"] == len(tree) and out["counts"]["update"] == 0
        alice = tree["/memory.json/Alice.md"]
        assert '- "Says \\"hi\\"\\nthen leaves"' in alice and "- works_at → Acme Corp" in alice
        assert "- Ghost → haunts → Alice" in tree["/memory.json/_relations.md"]
        skipped = {(s["source"], s["reason"]) for s in out["skipped"]}
        assert skipped == expected_skips(tmp_path)
        kinds = {m["path"]: m["kind"] for m in out["memories"]}
        assert kinds["/CLAUDE.md"] == "claude-md" and kinds["/docs/style.md"] == "import"
        assert kinds["/~claude-memory/MEMORY.md"] == "claude-memory"
        versions = len(remote.versions(sid))

        again = mf_cli("import", "--store", "Team memory", str(root), "--json")
        assert again.code == 0, again.stderr
        counts = again.json()["data"]["counts"]
        assert counts["unchanged"] == len(tree)
        assert counts["create"] == counts["update"] == counts["conflict"] == 0
        assert len(remote.versions(sid)) == versions
    finally:
        remote.close()


def test_dry_run_writes_nothing_and_lists_the_plan(
    mf_cli: Cli, pm_server: Server, repo: tuple[Path, Path, dict[str, bytes]]
) -> None:
    root, _, verbatim = repo
    remote = remote_of(pm_server, mf_cli)
    try:
        first = mf_cli("import", "--store", "Dry", str(root), "--dry-run")
        assert first.code == 0, first.stderr
        assert store_id(remote, "Dry") is None  # not even the store
        assert "store 'Dry': would be created" in first.stdout
        assert re.search(r"^create +/CLAUDE\.md +CLAUDE\.md$", first.stdout, re.M)
        assert first.stdout.rstrip().endswith("nothing written")

        assert mf_cli("import", "--store", "Dry", str(root)).code == 0
        sid = store_id(remote, "Dry")
        assert sid is not None
        before = remote.tree(sid), len(remote.versions(sid))
        write(root / "AGENTS.md", "# Agents, edited\n")
        write(root / "tools" / "AGENTS.md", "new\n")
        planned = mf_cli("import", "--store", sid, str(root), "--dry-run", "--json")
        assert planned.code == 0, planned.stderr
        actions = {m["path"]: m["action"] for m in planned.json()["data"]["memories"]}
        assert actions.pop("/AGENTS.md") == "update"
        assert actions.pop("/tools/AGENTS.md") == "create"
        assert set(actions.values()) == {"unchanged"}
        assert (remote.tree(sid), len(remote.versions(sid))) == before
    finally:
        remote.close()


def test_export_round_trips_the_files_byte_for_byte(
    mf_cli: Cli, pm_server: Server, repo: tuple[Path, Path, dict[str, bytes]], tmp_path: Path
) -> None:
    root, _, verbatim = repo
    assert mf_cli("import", "--store", "Round", str(root)).code == 0
    out = tmp_path / "out"
    ran = mf_cli("export", "--store", "Round", str(out), "--json")
    assert ran.code == 0, ran.stdout + ran.stderr
    files = sorted(
        p.relative_to(out).as_posix() for p in out.rglob("*") if p.is_file() or p.is_symlink()
    )
    assert files == sorted([p[1:] for p in verbatim] + ["memory.json", "memory.jsonl"])
    for path, data in verbatim.items():
        assert (out / path[1:]).read_bytes() == data, path
    # The MCP memory file as the server wrote it, byte for byte; the broken one without the
    # line the import reported (and, as the server writes it, without a final newline).
    assert (out / "memory.json").read_bytes() == (root / "memory.json").read_bytes()
    assert (out / "memory.jsonl").read_text() == BROKEN_JSONL_KEPT
    # A second export finds every file as it would write it.
    again = mf_cli("export", "--store", "Round", str(out), "--json")
    assert {f["action"] for f in again.json()["data"]["files"]} == {"unchanged"}

    # A differing file is left alone without --force, overwritten with it.
    write(out / "AGENTS.md", "mine\n")
    kept = mf_cli("export", "--store", "Round", str(out))
    assert kept.code == 1 and re.search(
        r"^differs +AGENTS\.md +a file with other", kept.stderr, re.M
    )
    assert (out / "AGENTS.md").read_text() == "mine\n"
    forced = mf_cli("export", "--store", "Round", str(out), "--force", "--json")
    assert forced.code == 0
    assert {f["file"]: f["action"] for f in forced.json()["data"]["files"]}[
        "AGENTS.md"
    ] == "overwrite"
    assert (out / "AGENTS.md").read_bytes() == verbatim["/AGENTS.md"]

    # A link planted where a file or a folder goes is never written through.
    target = tmp_path / "victim"
    write(target / "CLAUDE.md", "victim's\n")
    (out / "CLAUDE.md").unlink()
    (out / "CLAUDE.md").symlink_to(target / "CLAUDE.md")
    shutil.rmtree(out / "docs")
    (out / "docs").symlink_to(target)
    linked = mf_cli("export", "--store", "Round", str(out), "--force", "--json")
    assert linked.code == 1
    actions = {f["file"]: f["action"] for f in linked.json()["data"]["files"]}
    assert actions["CLAUDE.md"] == actions["docs/style.md"] == actions["docs/cycle.md"] == "refused"
    assert sorted(p.name for p in target.iterdir()) == ["CLAUDE.md"]
    assert (target / "CLAUDE.md").read_text() == "victim's\n"


def test_an_edit_on_the_server_between_plan_and_write_is_a_conflict(
    mf_cli: Cli, pm_server: Server, repo: tuple[Path, Path, dict[str, bytes]]
) -> None:
    root, home, _ = repo
    assert mf_cli("import", "--store", "Race", str(root)).code == 0
    write(root / "AGENTS.md", "# Agents, edited here\n")
    write(root / "api" / "AGENTS.md", "API agents, edited here too\n")
    client = StoreClient(pm_server.url, mf_cli.env["PROJECT_MEMORY_TOKEN"])
    remote = remote_of(pm_server, mf_cli)
    try:
        store = find_store(client, "Race", create=False)
        found = collect(
            str(root), home=str(home), auto_memory=None, codex_memories=None, mcp_files=[]
        )
        steps = plan(client, store, found.memories.values())
        assert {s.path for s in steps if s.action == "update"} == {"/AGENTS.md", "/api/AGENTS.md"}
        assert store.id is not None
        remote.put(store.id, "/AGENTS.md", "edited on the server meanwhile\n")
        apply(client, store.id, steps)
        outcome = {s.path: s.action for s in steps if s.action not in ("unchanged",)}
        assert outcome == {"/AGENTS.md": "conflict", "/api/AGENTS.md": "update"}
        tree = remote.tree(store.id)
        assert tree["/AGENTS.md"] == "edited on the server meanwhile\n"
        assert tree["/api/AGENTS.md"] == "API agents, edited here too\n"
    finally:
        client.close()
        remote.close()


def test_an_entity_gone_from_the_file_is_listed_not_deleted(
    mf_cli: Cli, pm_server: Server, repo: tuple[Path, Path, dict[str, bytes]]
) -> None:
    root, _, _ = repo
    assert mf_cli("import", "--store", "Stale", str(root)).code == 0
    lines = MEMORY_JSON.split("\n")
    write(root / "memory.json", "\n".join(lines[:2] + lines[3:5]))  # "alice" and its relation go
    ran = mf_cli("import", "--store", "Stale", str(root), "--json")
    assert ran.code == 0, ran.stderr
    actions = {m["path"]: m["action"] for m in ran.json()["data"]["memories"]}
    assert actions["/memory.json/alice-2.md"] == "stale"
    assert actions["/memory.json/Alice.md"] == "update"  # its relation to "alice" went too
    remote = remote_of(pm_server, mf_cli)
    try:
        sid = store_id(remote, "Stale")
        assert sid is not None and "/memory.json/alice-2.md" in remote.memories(sid)
    finally:
        remote.close()


def test_codex_memories_come_from_codex_home_when_asked(mf_cli: Cli, tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    codex_home = tmp_path / "codex-home"
    write(codex_home / "memories" / "MEMORY.md", "# Codex memory\n")
    ran = mf_cli("import", "--store", "C", str(tmp_path / "empty"), "--dry-run", "--json")
    assert ran.json()["data"]["memories"] == []  # not without the flag
    mf_cli.env["CODEX_HOME"] = str(codex_home)
    ran = mf_cli(
        "import", "--store", "C", str(tmp_path / "empty"), "--codex-memories", "--dry-run", "--json"
    )
    assert ran.code == 0, ran.stderr
    memories = ran.json()["data"]["memories"]
    assert [(m["path"], m["source"]) for m in memories] == [
        ("/~codex-memories/MEMORY.md", f"{codex_home}/memories/MEMORY.md")
    ]


class Hostile(BaseHTTPRequestHandler):
    """A server whose store holds paths no real one would: each must stay inside DIR."""

    STORE = "memstore_01JABCDEFGHJKMNPQRSTVWXYZ0"
    PATHS = ["/../escaped.md", "/a/../../escaped.md", "//abs.md", "/nul\x00.md", "/ok.md"]
    PATHS += ["/a\\..\\..\\escaped.md", "relative.md", "/.", "/.~tmp-x"]

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def do_GET(self) -> None:  # noqa: N802 (the name http.server calls)
        path = urlsplit(self.path).path
        if path == f"/v1/memory_stores/{self.STORE}":
            body: dict[str, Any] = {"type": "memory_store", "id": self.STORE, "name": "Evil"}
        elif path == f"/v1/memory_stores/{self.STORE}/memories":
            data = [
                {"type": "memory", "id": f"mem_{i}", "path": p, "content": "pwned\n"}
                for i, p in enumerate(self.PATHS)
            ]
            body = {"data": data, "next_page": None}
        else:
            self.send_response(404)
            self.end_headers()
            return
        raw = json.dumps(body).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(raw)))
        self.end_headers()
        self.wfile.write(raw)


@pytest.fixture
def hostile(tmp_path: Path) -> Iterator[Cli]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), Hostile)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    work = tmp_path / "deep" / "work"
    work.mkdir(parents=True)
    url = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        yield Cli(cli_env(url, "pm_anything", tmp_path / "config"), work)
    finally:
        server.shutdown()
        server.server_close()


def test_export_refuses_paths_from_a_hostile_server(hostile: Cli, tmp_path: Path) -> None:
    ran = hostile("export", "--store", Hostile.STORE, "out", "--json")
    assert ran.code == 1, ran.stdout + ran.stderr
    files = ran.json()["data"]["files"]
    assert [f["action"] for f in files if f["file"] == "ok.md"] == ["write"]
    assert sorted(f["action"] for f in files) == ["refused"] * 8 + ["write"]
    written = sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*") if p.is_file())
    assert written == ["deep/work/out/ok.md"]


def test_json_output_is_the_golden_one(mf_cli: Cli, tmp_path: Path) -> None:
    root, home = tmp_path / "small", tmp_path / "home"
    write(root / "CLAUDE.md", "See @docs/style.md\n")
    write(root / "docs" / "style.md", "Use ruff.\n")
    write(root / "AGENTS.md", "Run make test.\n")
    write(root / ".cursor" / "rules" / "python.mdc", "---\nglobs: *.py\n---\nType it.\n")
    write(root / "memory.json", MEMORY_JSON.split("\n")[0] + "\n" + MEMORY_JSON.split("\n")[3])
    (root / "docs" / "CLAUDE.md").symlink_to("../CLAUDE.md")
    write(home / "notes" / "MEMORY.md", "- an auto memory\n")
    base = ["--store", "Golden", str(root), "--auto-memory", str(home / "notes")]
    cases = {
        "import --dry-run": ["import", *base, "--dry-run"],
        "import": ["import", *base],
        "import again": ["import", *base],
        "export": ["export", "--store", "Golden", str(tmp_path / "out")],
        "export, a file differs": ["export", "--store", "Golden", str(tmp_path / "out")],
        "error: no such store": ["export", "--store", "Nobody", str(tmp_path / "none")],
    }
    got = {}
    replace = {str(tmp_path): "<tmp>"}
    for name, args in cases.items():
        if name == "export, a file differs":
            write(tmp_path / "out" / "AGENTS.md", "edited\n")
        ran = mf_cli(*args, "--json")
        assert ran.code == (1 if "error" in name or "differs" in name else 0), (name, ran.stderr)
        got[name] = normalise(ran.json(), replace)
    if os.environ.get("PROJECT_MEMORY_UPDATE_GOLDEN"):
        GOLDEN.write_text(json.dumps(got, indent=2, ensure_ascii=False) + "\n")
    assert got == json.loads(GOLDEN.read_text())
