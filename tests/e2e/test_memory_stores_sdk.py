"""The official ``anthropic`` SDK against a real gunicorn: memory stores just work."""

from __future__ import annotations

import hashlib
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime, timedelta

import anthropic
import pytest
import requests

from tests.e2e.conftest import Server, serving

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    yield from serving(tmp_path_factory, "memstores")


@pytest.fixture(scope="module")
def client(server: Server) -> Iterator[anthropic.Anthropic]:
    with anthropic.Anthropic(
        base_url=server.url, api_key=server.token("writer"), max_retries=0
    ) as sdk:
        yield sdk


def sha(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def live_tree(server: Server, store_id: str) -> dict[str, bytes]:
    tree = server.root / "acme" / "web" / "_stores" / store_id / "memories"
    return {
        "/" + p.relative_to(tree).as_posix(): p.read_bytes() for p in tree.rglob("*") if p.is_file()
    }


def test_sdk_session(client: anthropic.Anthropic, server: Server) -> None:
    ms = client.beta.memory_stores
    store = ms.create(name="User Preferences", description="Per-user prefs", metadata={"u": "1"})
    assert store.id.startswith("memstore_") and store.type == "memory_store"
    assert store.archived_at is None and store.metadata == {"u": "1"}
    assert ms.retrieve(store.id).name == "User Preferences"
    updated = ms.update(store.id, metadata={"u": None, "team": "core"})  # type: ignore[dict-item]
    assert updated.metadata == {"team": "core"}
    since = datetime.now(UTC) - timedelta(minutes=5)
    assert store.id in [s.id for s in ms.list(created_at_gte=since)]

    fmt = ms.memories.create(store.id, path="/prefs/format.md", content="Use tabs.")
    assert fmt.content is None and fmt.content_sha256 == sha("Use tabs.")
    lang = ms.memories.create(store.id, path="/prefs/lang.md", content="Python")
    notes = ms.memories.create(store.id, path="/projects/foo/notes.md", content="todo")
    got = ms.memories.retrieve(fmt.id, memory_store_id=store.id)
    assert got.content == "Use tabs."

    fmt2 = ms.memories.update(
        fmt.id,
        memory_store_id=store.id,
        content="Use spaces.",
        precondition={"type": "content_sha256", "content_sha256": sha("Use tabs.")},
    )
    assert fmt2.content_sha256 == sha("Use spaces.") and fmt2.id == fmt.id
    with pytest.raises(anthropic.ConflictError) as stale:
        ms.memories.update(
            fmt.id,
            memory_store_id=store.id,
            content="lost update",
            precondition={"type": "content_sha256", "content_sha256": sha("Use tabs.")},
        )
    assert stale.value.status_code == 409
    assert stale.value.body["error"]["type"] == "memory_precondition_failed_error"  # type: ignore[index]
    # The SDK reads the request-id header: the body's request_id, for a support ticket.
    assert stale.value.request_id == stale.value.body["request_id"]  # type: ignore[index]
    assert stale.value.request_id.startswith("req_")
    with pytest.raises(anthropic.ConflictError) as taken:
        ms.memories.create(store.id, path="/prefs", content="x")
    assert taken.value.body["error"]["conflicting_memory_id"] in (fmt.id, lang.id)  # type: ignore[index]
    renamed = ms.memories.update(lang.id, memory_store_id=store.id, path="/archive/lang.md")
    assert renamed.path == "/archive/lang.md" and renamed.id == lang.id

    # Auto-pagination over small pages, full and basic, depth 0 and 1.
    paths = [m.path for m in ms.memories.list(store.id, limit=1)]
    assert paths == ["/archive/lang.md", "/prefs/format.md", "/projects/foo/notes.md"]
    top = [(i.type, i.path) for i in ms.memories.list(store.id, depth=1, limit=1)]
    assert top == [
        ("memory_prefix", "/archive/"),
        ("memory_prefix", "/prefs/"),
        ("memory_prefix", "/projects/"),
    ]
    full = list(ms.memories.list(store.id, view="full", path_prefix="/prefs/"))
    assert [m.content for m in full] == ["Use spaces."]  # type: ignore[union-attr]

    deleted = ms.memories.delete(
        notes.id, memory_store_id=store.id, expected_content_sha256=sha("todo")
    )
    assert deleted.id == notes.id and deleted.type == "memory_deleted"
    with pytest.raises(anthropic.NotFoundError):
        ms.memories.retrieve(notes.id, memory_store_id=store.id)

    versions = list(ms.memory_versions.list(store.id, limit=2))
    assert [v.operation for v in versions] == [
        "deleted",
        "modified",
        "modified",
        "created",
        "created",
        "created",
    ]
    fmt_versions = list(ms.memory_versions.list(store.id, memory_id=fmt.id, view="full"))
    assert [v.content for v in fmt_versions] == ["Use spaces.", "Use tabs."]
    old = fmt_versions[1]
    with pytest.raises(anthropic.PermissionDeniedError):
        ms.memory_versions.redact(old.id, memory_store_id=store.id)  # a writer may not
    admin = anthropic.Anthropic(
        base_url=server.url, api_key=server.token("project_admin"), max_retries=0
    ).beta.memory_stores
    with pytest.raises(anthropic.ConflictError):
        admin.memory_versions.redact(fmt_versions[0].id, memory_store_id=store.id)  # the head
    redacted = admin.memory_versions.redact(old.id, memory_store_id=store.id)
    assert redacted.redacted_at is not None and redacted.content is None and redacted.path is None
    assert redacted.created_by is not None and redacted.created_by.type == "api_actor"
    again = ms.memory_versions.retrieve(old.id, memory_store_id=store.id)
    assert again.redacted_at == redacted.redacted_at and again.content_sha256 is None

    # The tree on disk is the store, byte for byte.
    listed = list(ms.memories.list(store.id, view="full"))
    assert live_tree(server, store.id) == {
        m.path: m.content.encode("utf-8")  # type: ignore[union-attr]
        for m in listed
    }

    archived = ms.archive(store.id)
    assert archived.archived_at is not None
    with pytest.raises(anthropic.ConflictError):
        ms.memories.create(store.id, path="/late", content="x")
    assert store.id not in [s.id for s in ms.list()]
    assert store.id in [s.id for s in ms.list(include_archived=True)]
    assert ms.delete(store.id).type == "memory_store_deleted"
    with pytest.raises(anthropic.NotFoundError):
        ms.retrieve(store.id)


def test_reader_token_and_other_workspace(client: anthropic.Anthropic, server: Server) -> None:
    store = client.beta.memory_stores.create(name="scoped")
    with anthropic.Anthropic(
        base_url=server.url, api_key=server.token("reader"), max_retries=0
    ) as reader:
        assert reader.beta.memory_stores.retrieve(store.id).id == store.id
        with pytest.raises(anthropic.PermissionDeniedError):
            reader.beta.memory_stores.memories.create(store.id, path="/a", content="x")
    with (
        anthropic.Anthropic(
            base_url=server.url, api_key=server.token("writer", "acme", "mobile"), max_retries=0
        ) as outsider,
        pytest.raises(anthropic.NotFoundError),
    ):
        outsider.beta.memory_stores.retrieve(store.id)


def test_contended_updates_over_http(server: Server) -> None:
    """Six clients race on one memory through two gunicorn worker processes."""
    token = server.token("writer")
    base = f"{server.url}/v1/memory_stores"
    headers = {"x-api-key": token}
    sid = requests.post(base, json={"name": "race"}, headers=headers, timeout=10).json()["id"]
    mem = requests.post(
        f"{base}/{sid}/memories",
        json={"path": "/x", "content": "seed"},
        headers=headers,
        timeout=10,
    ).json()
    clients, rounds = 6, 5
    barrier = threading.Barrier(clients)

    def contend(worker: int) -> list[tuple[int, int]]:
        seen = []
        with requests.Session() as session:
            session.headers.update(headers)
            for round_no in range(rounds):
                barrier.wait(30)
                head = session.get(f"{base}/{sid}/memories/{mem['id']}", timeout=10).json()
                barrier.wait(30)
                r = session.post(
                    f"{base}/{sid}/memories/{mem['id']}",
                    json={
                        "content": f"r{round_no} w{worker}",
                        "precondition": {
                            "type": "content_sha256",
                            "content_sha256": head["content_sha256"],
                        },
                    },
                    timeout=30,
                )
                if r.status_code == 409:
                    assert r.json()["error"]["type"] == "memory_precondition_failed_error"
                seen.append((round_no, r.status_code))
        return seen

    with ThreadPoolExecutor(clients) as pool:
        results = [s for seen in pool.map(contend, range(clients)) for s in seen]
    for round_no in range(rounds):
        statuses = sorted(status for r, status in results if r == round_no)
        assert statuses == [200] + [409] * (clients - 1), (round_no, statuses)
    versions = requests.get(
        f"{base}/{sid}/memory_versions",
        params={"memory_id": mem["id"], "limit": 100},
        headers=headers,
        timeout=10,
    ).json()["data"]
    assert [v["operation"] for v in versions] == ["modified"] * rounds + ["created"]


def test_bad_input_never_500_over_http(server: Server) -> None:
    headers = {"x-api-key": server.token("writer"), "Content-Type": "application/json"}
    base = f"{server.url}/v1/memory_stores"
    sid = requests.post(base, json={"name": "fuzz"}, headers=headers, timeout=10).json()["id"]
    bodies: list[bytes] = [
        b"\xff\xfe\x00",
        b'{"path": "/a\\u0000b", "content": "x"}',
        b'{"path": "/a/../b", "content": "x"}',
        b'{"path": "/ok", "content": "\\ud800"}',
        b'{"path": ["/a"], "content": {"x": 1}}',
        b'{"path": "/ok", "content": "' + b"a" * 102_401 + b'"}',
        b"[" * 5000,
        b'{"path": "/' + b"a" * 300 + b'", "content": ""}',
    ]
    for body in bodies:
        r = requests.post(f"{base}/{sid}/memories", data=body, headers=headers, timeout=10)
        assert 400 <= r.status_code < 500, (body[:40], r.status_code, r.text[:200])
        assert r.json()["type"] == "error"
    listing = requests.get(f"{base}/{sid}/memories", headers=headers, timeout=10).json()
    assert listing == {"data": [], "next_page": None}
    assert "Traceback" not in server.log()


def test_sdk_writes_have_their_secrets_masked_or_refused(
    client: anthropic.Anthropic, server: Server
) -> None:
    from tests.secrets_corpus import corpus

    picked = {p.kind: p for p in corpus(seed=13, per_kind=1)}
    secret, other = picked["github-token"], picked["anthropic-key"]
    ms = client.beta.memory_stores
    store = ms.create(name="creds", description=f"pasted {other.text}")
    assert other.value not in (store.description or "")
    made = ms.memories.create(store.id, path="/env.md", content=f"TOKEN={secret.text}\n")
    got = ms.memories.retrieve(made.id, memory_store_id=store.id)
    assert secret.value not in (got.content or "") and "[secret:github-token]" in (
        got.content or ""
    )
    assert all(secret.value.encode() not in data for data in live_tree(server, store.id).values())
    admin = server.token("project_admin")
    r = requests.put(
        f"{server.url}/sandbox/memory/v1/secrets/policy",
        json={"policy": "reject"},
        headers={"Authorization": f"Bearer {admin}"},
        timeout=10,
    )
    assert r.status_code == 200, r.text
    # The worker that took the PUT applies it at once; the others look within a second.
    time.sleep(1.2)
    with pytest.raises(anthropic.UnprocessableEntityError) as refused:
        ms.memories.update(made.id, memory_store_id=store.id, content=f"again {secret.text}")
    assert "github-token" in str(refused.value) and secret.value not in str(refused.value)
    assert ms.memories.retrieve(made.id, memory_store_id=store.id).content == got.content
