"""Private spaces: what a user keeps private in a project is invisible to everyone else.

Ana (a user's token, writer in acme/web) keeps a task and a memory store in her private
space (``?visibility=private``); the team keeps a task and a store in the project. Every read
path is then asked, as a team writer, a project_admin, a tenant_admin and another user (Bob):
each answers with the team's things and nothing of Ana's, and a read of one of Ana's by its
id answers exactly as one that never existed. Ana sees hers, with the same paths. On every
backend (MEMORY_TEST_BACKENDS).
"""

from __future__ import annotations

import json
import tarfile
from dataclasses import replace
from pathlib import Path
from typing import Any

import httpx
import pytest
from flask import Flask
from flask.testing import FlaskClient
from project_memory_client.mount.http import StoreClient
from project_memory_client.mount.sync import MARKER, StoreSync, marker_text
from werkzeug.test import TestResponse

from app.storage.core.names import Scope
from app.storage.core.users import User, user_id
from tests.api.test_mcp import Mcp
from tests.conftest import Tokens
from tests.console.conftest import sign_in

pytestmark = pytest.mark.all_backends
PM = "/sandbox/memory/v1"
STORES = "/v1/memory_stores"
ISSUER = "https://idp.example"
ANA = user_id(ISSUER, "ana")
BOB = user_id(ISSUER, "bob")
SECRET = "zebracorn"  # in every text Ana keeps private, and nowhere else
TEAM = "teamword"  # in every text the team keeps
PRIVATE = {"visibility": "private"}
VIEWERS = ("writer", "project_admin", "tenant_admin", "bob")
# A tenant_admin's token covers every project of the tenant: it names the one it acts in.
HEADERS = {"tenant_admin": {"X-Sandbox-Project-Id": "web"}}
MISSING_TASK = "never-was"
MISSING_STORE = "memstore_01JZZZZZZZZZZZZZZZZZZZZZZZ"


def add_user(app: Flask, uid: str, subject: str, role: str = "writer") -> None:
    """A user as their sign-in leaves them: a writer of acme/web by the rules."""
    app.extensions["storage"].users.change(
        uid,
        lambda _: User(uid, ISSUER, subject, f"{subject}@example.com", subject.title(),
                       "2026-01-01T00:00:00Z", role=role, tenant="acme", project="web"),
    )  # fmt: skip


class ScopedMcp(Mcp):
    """MCP over POST /mcp, naming the project for a token that covers several."""

    def post(self, body: Any, **headers: str) -> TestResponse:
        return super().post(body, **HEADERS.get(self.who, {}), **headers)


class World:
    """Ana's private things and the team's, written through the API."""

    def __init__(self, app: Flask, client: FlaskClient, tokens: Tokens) -> None:
        self.app, self.client, self.tokens = app, client, tokens
        for uid, subject in ((ANA, "ana"), (BOB, "bob")):
            add_user(app, uid, subject)
        tokens.add("ana", role="writer", tenant="acme", project="web", user=ANA)
        tokens.add("bob", role="writer", tenant="acme", project="web", user=BOB)
        self.put_turn("ana", "ana-task", PRIVATE, f"{SECRET} plans", {"model": SECRET})
        r = self.call(
            "ana",
            "PUT",
            f"{PM}/tasks/ana-task/turns/0/artifacts/notes.txt",
            PRIVATE,
            data=f"{SECRET} notes".encode(),
            headers={"Content-Type": "text/plain"},
        )
        assert r.status_code == 200, r.json
        self.put_turn("writer", "team-task", {}, f"{TEAM} plans", {"model": TEAM})
        self.ana_store = self.store("ana", PRIVATE, f"{SECRET} store", f"{SECRET} memory")
        self.ana_memory = self.memories("ana", self.ana_store, PRIVATE)[0]
        self.team_store = self.store("writer", {}, f"{TEAM} store", f"{TEAM} memory")

    def call(
        self, who: str, method: str, url: str, query: dict[str, str], **kwargs: Any
    ) -> TestResponse:
        headers = {**self.tokens.headers(who), **HEADERS.get(who, {}), **kwargs.pop("headers", {})}
        return self.client.open(url, method=method, query_string=query, headers=headers, **kwargs)

    def put_turn(
        self, who: str, task: str, query: dict[str, str], summary: str, meta: dict[str, Any]
    ) -> None:
        meta = {**meta, "tokens": {"input": 10, "output": 1}, "started_at": "2026-01-01T00:00:00Z"}
        body = {"meta": meta, "summary_md": summary}
        r = self.call(who, "PUT", f"{PM}/tasks/{task}/turns/0", query, json=body)
        assert r.status_code == 200, r.json

    def store(self, who: str, query: dict[str, str], name: str, content: str) -> str:
        r = self.call(who, "POST", STORES, query, json={"name": name})
        assert r.status_code == 200, r.json
        store_id = str(r.json["id"])
        body = {"path": "/notes.md", "content": content}
        r = self.call(who, "POST", f"{STORES}/{store_id}/memories", query, json=body)
        assert r.status_code == 200, r.json
        return store_id

    def memories(self, who: str, store_id: str, query: dict[str, str]) -> list[str]:
        r = self.call(who, "GET", f"{STORES}/{store_id}/memories", query)
        assert r.status_code == 200, r.json
        return [m["id"] for m in r.json["data"]]


@pytest.fixture
def world(app: Flask, client: FlaskClient, tokens: Tokens) -> World:
    return World(app, client, tokens)


def text_of(r: TestResponse) -> str:
    assert r.status_code == 200, r.get_data(as_text=True)[:500]
    return r.get_data(as_text=True)


def shows_team_only(body: str) -> None:
    """What a team read answers: the team's things, none of Ana's (a read that answered
    nothing at all would pass the second half alone: the first keeps the test honest)."""
    assert TEAM in body or "team-task" in body, body[:500]
    for hers in (SECRET, "ana-task"):
        assert hers not in body, body[:2000]


def answers_as_missing(world: World, who: str, url: str, missing_url: str, **kw: Any) -> None:
    """``url`` (one of Ana's) answers ``who`` exactly as ``missing_url`` (never written)."""
    method = kw.pop("method", "GET")
    hers = world.call(who, method, url, {}, **kw)
    never = world.call(who, method, missing_url, {}, **kw)
    assert hers.status_code == never.status_code == 404, (hers.status_code, never.status_code)
    mine = hers.get_data(as_text=True)
    for her_id, missing in (("ana-task", MISSING_TASK), (world.ana_store, MISSING_STORE)):
        mine = mine.replace(her_id, missing)
    strip = ("request_id",)
    a, b = json.loads(mine), never.get_json()
    for key in strip:
        a.pop(key, None), b.pop(key, None)
    assert a == b


# -- one test per read path, as each of the others -------------------------------------------
@pytest.mark.parametrize("who", VIEWERS)
def test_task_list(world: World, who: str) -> None:
    body = text_of(world.call(who, "GET", f"{PM}/tasks", {}))
    shows_team_only(body)
    assert json.loads(body)["total"] == 1


@pytest.mark.parametrize("who", VIEWERS)
def test_task_get_turn_and_artifact(world: World, who: str) -> None:
    answers_as_missing(world, who, f"{PM}/tasks/ana-task", f"{PM}/tasks/{MISSING_TASK}")
    answers_as_missing(
        world, who, f"{PM}/tasks/ana-task/turns/0", f"{PM}/tasks/{MISSING_TASK}/turns/0"
    )
    answers_as_missing(
        world,
        who,
        f"{PM}/tasks/ana-task/turns/0/artifacts/notes.txt",
        f"{PM}/tasks/{MISSING_TASK}/turns/0/artifacts/notes.txt",
    )
    shows_team_only(text_of(world.call(who, "GET", f"{PM}/tasks/team-task", {})))


@pytest.mark.parametrize("who", VIEWERS)
def test_search(world: World, who: str) -> None:
    for q in (SECRET, f"{SECRET} or", "plans", "notes"):
        body = text_of(world.call(who, "GET", f"{PM}/search", {"q": q}))
        assert SECRET not in body and "ana-task" not in body and world.ana_store not in body
    shows_team_only(text_of(world.call(who, "GET", f"{PM}/search", {"q": "plans"})))


@pytest.mark.parametrize("who", VIEWERS)
def test_digest_and_its_head(world: World, who: str) -> None:
    shows_team_only(text_of(world.call(who, "GET", f"{PM}/project.md", {})))
    shows_team_only(text_of(world.call(who, "GET", f"{PM}/project.md", {"limit": "5"})))


@pytest.mark.parametrize("who", VIEWERS)
def test_context_and_recall(world: World, who: str) -> None:
    shows_team_only(text_of(world.call(who, "GET", f"{PM}/context", {"task_id": "x"})))
    body = {"prompt": f"what are the plans {SECRET} {TEAM}", "task_id": "x"}
    r = world.call(who, "POST", f"{PM}/recall", {}, json=body)
    hits = json.dumps([r.json["hits"], r.json["context"]])
    assert "ana-task" not in hits and world.ana_store not in hits and SECRET not in hits
    assert "team-task" in hits


@pytest.mark.parametrize("who", VIEWERS)
def test_ledger(world: World, who: str) -> None:
    ledger = world.call(who, "GET", f"{PM}/ledger", {"group_by": "task", "since": "2025-12-01"})
    body = text_of(ledger)
    shows_team_only(body)
    assert ledger.json["totals"]["turns"] == 1


@pytest.mark.parametrize("who", VIEWERS)
def test_timeline(world: World, who: str) -> None:
    timeline = world.call(who, "GET", f"{PM}/timeline", {"since": "2025-12-01"})
    shows_team_only(text_of(timeline))
    assert [t["task_id"] for t in timeline.json["turns"]] == ["team-task"]


@pytest.mark.parametrize("who", VIEWERS)
def test_memory_stores(world: World, who: str) -> None:
    shows_team_only(text_of(world.call(who, "GET", STORES, {})).replace("store", "team-task"))
    assert world.ana_store not in text_of(world.call(who, "GET", STORES, {}))
    for tail in ("", "/memories", f"/memories/{world.ana_memory}", "/memory_versions"):
        answers_as_missing(
            world, who, f"{STORES}/{world.ana_store}{tail}", f"{STORES}/{MISSING_STORE}{tail}"
        )


@pytest.mark.parametrize("who", VIEWERS)
def test_memory_tool(world: World, who: str) -> None:
    view = {"command": "view", "path": "/memories"}
    answers_as_missing(
        world,
        who,
        f"{STORES}/{world.ana_store}/memory_tool",
        f"{STORES}/{MISSING_STORE}/memory_tool",
        method="POST",
        json=view,
    )
    r = world.call(who, "POST", f"{STORES}/{world.team_store}/memory_tool", {}, json=view)
    assert "notes.md" in text_of(r)


@pytest.mark.parametrize("who", VIEWERS)
def test_mcp_tools(world: World, who: str) -> None:
    mcp = ScopedMcp(world.client, world.tokens, who)
    for name, arguments in (
        ("list_tasks", {}),
        ("search", {"query": "plans"}),
        ("read_digest", {}),
        ("read_timeline", {}),
        ("read_task", {"task_id": "team-task"}),
    ):
        text, is_error = mcp.call(name, **arguments)
        assert not is_error, text
        shows_team_only(text)
    for name, arguments in (
        ("read_task", {"task_id": "ana-task"}),
        ("read_turn", {"task_id": "ana-task", "turn": 0}),
        ("read_artifact", {"task_id": "ana-task", "turn": 0, "name": "notes.txt"}),
        ("memory", {"store": world.ana_store, "command": "view", "path": "/memories"}),
    ):
        text, is_error = mcp.call(name, **arguments)
        assert is_error and SECRET not in text, text
        missing = {k: (MISSING_TASK if v == "ana-task" else v) for k, v in arguments.items()}
        if "store" in missing:
            missing["store"] = MISSING_STORE
        never, _ = mcp.call(name, **missing)
        assert (
            text.replace("ana-task", MISSING_TASK).replace(world.ana_store, MISSING_STORE) == never
        )


@pytest.mark.parametrize("who", VIEWERS)
def test_console(app: Flask, world: World, who: str) -> None:
    browser = sign_in(app, world.tokens.secrets[who])
    base = "/console/p/acme/web"
    for page in ("/tasks", "/search?q=plans", "/project.md", "/ledger", "/timeline", "/stores"):
        body = text_of(browser.get(base + page))
        assert SECRET not in body and "ana-task" not in body and world.ana_store not in body
    assert "team-task" in text_of(browser.get(base + "/tasks"))
    for page in ("/tasks/ana-task", f"/stores/{world.ana_store}"):
        assert browser.get(base + page).status_code == 404
    # Her private space is no project of theirs: not listed, and not found by its name.
    projects = text_of(browser.get("/console/projects"))
    assert ANA not in projects
    assert browser.get(f"/console/p/acme/web..{ANA}/tasks").status_code == 404


@pytest.mark.parametrize("who", VIEWERS)
def test_mount_sync(app: Flask, world: World, tmp_path: Path, who: str) -> None:
    """The mount's own client, over the app: Ana's store cannot be synced by anyone else."""

    def sync(store_id: str) -> tuple[bool, list[str]]:
        project = HEADERS.get(who, {}).get("X-Sandbox-Project-Id")
        client = StoreClient("http://localhost", world.tokens.secrets[who], project=project)
        client.session = httpx.Client(
            transport=httpx.WSGITransport(app=app),
            base_url="http://localhost",
            headers=dict(client.session.headers),
        )
        folder = tmp_path / store_id
        folder.mkdir()
        (folder / MARKER).write_text(marker_text(store_id))
        report = StoreSync(
            client, store_id, folder, state_file=tmp_path / f"{store_id}.json"
        ).sync_once()
        return report.ok, sorted(p.name for p in folder.iterdir())

    ok, files = sync(world.ana_store)
    assert not ok and "notes.md" not in files
    ok, files = sync(world.team_store)
    assert ok and "notes.md" in files


def test_export_of_the_project(app: Flask, world: World, tmp_path: Path) -> None:
    """A project's export (flask export --project) holds the team's, none of a private space."""
    storage = app.extensions["storage"]
    out = tmp_path / "web.tar"
    storage.export(out, tenant="acme", project="web")
    with tarfile.open(out) as tar:
        names = tar.getnames()
        blob = b"".join(
            f.read() for m in tar.getmembers() if m.isfile() and (f := tar.extractfile(m))
        )
    assert any("team-task" in n for n in names)
    assert not any("ana-task" in n or ANA in n for n in names)
    assert SECRET.encode() not in blob and TEAM.encode() in blob


# -- the owner, and what is refused ----------------------------------------------------------
def test_the_owner_sees_hers_with_the_same_paths(world: World) -> None:
    def get(url: str, **query: str) -> str:
        return text_of(world.call("ana", "GET", url, {**PRIVATE, **query}))

    assert [t["task_id"] for t in json.loads(get(f"{PM}/tasks"))["tasks"]] == ["ana-task"]
    assert SECRET in get(f"{PM}/tasks/ana-task/turns/0")
    assert get(f"{PM}/tasks/ana-task/turns/0/artifacts/notes.txt") == f"{SECRET} notes"
    assert "ana-task" in get(f"{PM}/search", q=SECRET)
    assert SECRET in get(f"{PM}/project.md")
    assert "ana-task" in get(f"{PM}/timeline", since="2025-12-01")
    # Her console lists her space, and its pages show hers.
    browser = sign_in(world.app, world.tokens.secrets["ana"])
    assert 'web <span class="muted">(your private space)' in text_of(
        browser.get("/console/projects")
    )
    assert "ana-task" in text_of(browser.get(f"/console/p/acme/web..{ANA}/tasks"))
    assert [s["id"] for s in json.loads(get(STORES))["data"]] == [world.ana_store]
    # Without asking for her space she is a member of the team like any other.
    shows_team_only(text_of(world.call("ana", "GET", f"{PM}/tasks", {})))
    # The header says the same as the query.
    r = world.client.get(
        f"{PM}/tasks", headers={**world.tokens.headers("ana"), "X-Sandbox-Visibility": "private"}
    )
    assert [t["task_id"] for t in r.json["tasks"]] == ["ana-task"]
    # Through MCP, with the same switch on its address.
    r = world.client.post(
        "/mcp?visibility=private",
        json={
            "jsonrpc": "2.0",
            "id": 1,
            "method": "tools/call",
            "params": {"name": "list_tasks", "arguments": {}},
        },  # fmt: skip
        headers={**world.tokens.headers("ana"), "Accept": "application/json, text/event-stream"},
    )
    assert "ana-task" in r.get_data(as_text=True)


@pytest.mark.parametrize("who", ("writer", "project_admin", "tenant_admin"))
def test_a_token_of_no_user_has_no_private_space(world: World, who: str) -> None:
    for method, url in (("GET", f"{PM}/tasks"), ("PUT", f"{PM}/tasks/t/turns/0"), ("POST", STORES)):
        body = {"meta": {}, "summary_md": "x"} if method == "PUT" else {"name": "x"}
        r = world.call(who, method, url, PRIVATE, json=body)
        assert r.status_code == 403, r.json
        assert "belongs to a user" in json.dumps(r.json)


def test_a_private_space_is_never_named(world: World) -> None:
    """Not by a header, not by a query of another's, not with a visibility of another name."""
    for who in ("tenant_admin", "bob", "ana"):
        r = world.call(
            who, "GET", f"{PM}/tasks", {}, headers={"X-Sandbox-Project-Id": f"web..{ANA}"}
        )
        assert r.status_code in (403, 422), r.json
    for who in VIEWERS:
        r = world.call(who, "GET", f"{PM}/tasks", {**PRIVATE, "private_to": ANA})
        assert r.status_code == 403, r.json
    r = world.call("ana", "GET", f"{PM}/tasks", {"visibility": "secret"})
    assert r.status_code == 422
    with pytest.raises(ValueError, match="private space"):
        world.tokens.add("sneak", role="writer", tenant="acme", project=f"web..{ANA}")


# -- a tenant_admin's compliance delete ------------------------------------------------------
def test_a_tenant_admin_deletes_a_private_task_and_store_and_it_is_audited(
    app: Flask, world: World
) -> None:
    compliance = {**PRIVATE, "private_to": ANA}
    for who in ("project_admin", "writer", "bob"):
        r = world.call(who, "DELETE", f"{PM}/tasks/ana-task", compliance)
        assert r.status_code == 403, r.json
    r = world.call("tenant_admin", "DELETE", f"{PM}/tasks/ana-task", compliance)
    assert r.status_code == 204, r.get_data(as_text=True)
    r = world.call("tenant_admin", "DELETE", f"{STORES}/{world.ana_store}", compliance)
    assert r.status_code == 200, r.json
    assert world.call("ana", "GET", f"{PM}/tasks/ana-task", PRIVATE).status_code == 404
    assert world.call("ana", "GET", f"{STORES}/{world.ana_store}", PRIVATE).status_code == 404
    storage = app.extensions["storage"]
    events = storage.audit_log.page(Scope("acme", "web"), limit=100).events
    done = [e for e in events if (e.detail or {}).get("compliance")]
    assert {(e.kind, e.action, e.subject) for e in done} >= {("task", "deleted", "ana-task")}
    assert all(e.detail["private_to"] == ANA for e in done)
    assert all(e.actor == world.tokens.ids["tenant_admin"] for e in done)
    # A compliance delete reads nothing: a GET of the same is refused.
    r = world.call("tenant_admin", "GET", f"{PM}/tasks", compliance)
    assert r.status_code == 403


def test_the_private_space_is_kept_apart_in_storage(app: Flask, world: World) -> None:
    """The space is a project of its own in the storage: the team project's rows and files
    hold nothing of it (what makes every read path above hold)."""
    storage = app.extensions["storage"]
    team = Scope("acme", "web")
    space = Scope("acme", f"web..{ANA}")
    assert space.owner == ANA and space.team == team
    assert [t.task_id for t in storage.tasks.list_tasks(team).tasks] == ["team-task"]
    assert [t.task_id for t in storage.tasks.list_tasks(space).tasks] == ["ana-task"]
    digest, _ = storage.tasks.open_digest(team)
    with digest:
        assert SECRET.encode() not in digest.read()


def test_a_private_space_works_under_its_projects_secret_policy(world: World) -> None:
    """The project's policy holds in its private spaces: a key the team's writes refuse,
    a private write refuses too (no one can set a policy of a private space's own)."""
    r = world.call("project_admin", "PUT", f"{PM}/secrets/policy", {}, json={"policy": "reject"})
    assert r.status_code == 200, r.json
    key = "ghp_" + "Ab3dE6gH9jK2mN5pQ8sT1vW4yZ7bC0eF3hJ6"
    body = {"meta": {}, "summary_md": f"the token is {key}"}
    team = world.call("writer", "PUT", f"{PM}/tasks/leak/turns/0", {}, json=body)
    private = world.call("ana", "PUT", f"{PM}/tasks/leak/turns/0", PRIVATE, json=body)
    assert team.status_code == private.status_code == 422, (team.json, private.json)
    r = world.call("ana", "GET", f"{PM}/secrets/policy", PRIVATE)
    assert r.json["policy"] == "reject"


def test_in_her_space_any_of_her_tokens_changes_what_another_made(world: World) -> None:
    """Owners of a private space's tasks and stores are its user, not one token of hers."""
    world.tokens.add("ana2", role="writer", tenant="acme", project="web", user=ANA)
    r = world.call("ana2", "DELETE", f"{PM}/tasks/ana-task", PRIVATE)
    assert r.status_code == 204, r.get_data(as_text=True)
    r = world.call("ana2", "DELETE", f"{STORES}/{world.ana_store}", PRIVATE)
    assert r.status_code == 200, r.json
    # In the team's project her tokens are tokens like any other's.
    r = world.call("ana2", "DELETE", f"{PM}/tasks/team-task", {})
    assert r.status_code == 403


def test_a_demoted_users_tokens_act_in_the_role_they_have_now(app: Flask, world: World) -> None:
    """A token minted while its user was a writer reads only once the rules make them a
    reader, at its next use; and none acts once they have no role here."""
    add_user(app, ANA, "ana", role="reader")
    r = world.call(
        "ana", "PUT", f"{PM}/tasks/t/turns/0", PRIVATE, json={"meta": {}, "summary_md": "x"}
    )
    assert r.status_code == 403, r.json
    assert world.call("ana", "GET", f"{PM}/tasks", PRIVATE).status_code == 200
    assert world.call("ana", "GET", f"{PM}/whoami", {}).json["role"] == "reader"
    app.extensions["storage"].users.change(
        ANA, lambda u: replace(u, role=None, tenant=None, project=None)
    )
    assert world.call("ana", "GET", f"{PM}/tasks", {}).status_code == 401


def test_her_usage_is_her_spaces_named_by_its_project(world: World) -> None:
    """GET /usage in her space: what the space stores, under the project's name and quota;
    the project's own usage counts none of it."""
    mine = world.call("ana", "GET", f"{PM}/usage", PRIVATE).json
    team = world.call("writer", "GET", f"{PM}/usage", {}).json
    assert mine["project"] == team["project"] == "web"
    assert mine["usage"]["tasks"] == 1 and team["usage"]["tasks"] == 1
    assert mine["tenant_usage"] == team["tenant_usage"]
    assert team["tenant_usage"]["tasks"] == 2


@pytest.mark.tree_only
def test_a_private_spaces_derived_files_are_rebuilt_from_its_own_records(
    app: Flask, world: World
) -> None:
    """A private space's derived files are its own, made again from its own records: with
    its ledger gone, her timeline comes back whole, and the team's holds none of it."""
    storage = app.extensions["storage"]
    assert storage.fsck().clean
    space = Path(app.config["STORAGE_ROOT"]) / "acme" / f"web..{ANA}"
    gone = [p for p in space.glob("_ledger.sqlite3*") if p.is_file()]
    assert gone
    for path in gone:
        path.unlink()
    mine = world.call("ana", "GET", f"{PM}/timeline", {**PRIVATE, "since": "2025-12-01"}).json
    assert [t["task_id"] for t in mine["turns"]] == ["ana-task"]
    shows_team_only(text_of(world.call("writer", "GET", f"{PM}/timeline", {"since": "2025-12-01"})))
    assert storage.fsck().clean


def test_a_private_space_is_emptied_whole_by_its_owner_or_for_compliance(
    app: Flask, world: World
) -> None:
    """DELETE /space: every task and store of a private space, by its owner or (another
    user's) a tenant_admin, each audited; never the team's project, never by anyone else."""
    world.put_turn("ana", "ana-task-2", PRIVATE, "more", {})
    # The team's project is never emptied; another user's space only for compliance.
    for who, query in (
        ("project_admin", {}),
        ("tenant_admin", {}),
        ("writer", {}),
        ("bob", {**PRIVATE, "private_to": ANA}),
        ("project_admin", {**PRIVATE, "private_to": ANA}),
    ):
        assert world.call(who, "DELETE", f"{PM}/space", query).status_code == 403, who
    assert [t["task_id"] for t in world.call("writer", "GET", f"{PM}/tasks", {}).json["tasks"]] == [
        "team-task"
    ]
    r = world.call("tenant_admin", "DELETE", f"{PM}/space", {**PRIVATE, "private_to": ANA})
    assert r.status_code == 200, r.json
    assert r.json == {"deleted_tasks": 2, "deleted_stores": 1}
    assert world.call("ana", "GET", f"{PM}/tasks", PRIVATE).json["tasks"] == []
    assert world.call("ana", "GET", STORES, PRIVATE).json["data"] == []
    # The team's things stay; the log says what went, and whose it was.
    assert world.call("writer", "GET", f"{PM}/tasks/team-task", {}).status_code == 200
    events = app.extensions["storage"].audit_log.page(Scope("acme", "web"), limit=100).events
    done = {(e.kind, e.subject) for e in events if (e.detail or {}).get("private_to") == ANA}
    assert done == {("task", "ana-task"), ("task", "ana-task-2"), ("store", world.ana_store)}
    # Her own space, by her.
    world.put_turn("ana", "again", PRIVATE, "x", {})
    r = world.call("ana", "DELETE", f"{PM}/space", PRIVATE)
    assert r.status_code == 200 and r.json == {"deleted_tasks": 1, "deleted_stores": 0}
