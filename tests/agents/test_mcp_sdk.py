"""The official MCP SDK's client (PyPI ``mcp``) against /mcp on a real gunicorn of 3 workers.

Every call is its own POST, so consecutive calls land on different workers: the endpoint
keeps nothing between requests. Both connect modes of the SDK are used: ``auto`` (the
2026-07-28 ``server/discover`` probe) and ``legacy`` (the initialize handshake).
"""

from __future__ import annotations

import warnings
from collections.abc import Iterator
from typing import Any

import anyio
import pytest
import requests

from app.services.mcp_tools import OUTPUT_CHARS, TOOLS
from app.storage.tree.tokens import TokenRegistry
from tests.e2e.conftest import Server, start_server

pytestmark = pytest.mark.e2e

with warnings.catch_warnings():
    # pydantic and opentelemetry warn at import time on some versions: not ours to fix
    warnings.simplefilter("ignore")
    import httpx2
    from mcp import Client
    from mcp.client.streamable_http import streamable_http_client
    from mcp.shared.exceptions import MCPError


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Server, dict[str, str]]]:
    base = tmp_path_factory.mktemp("mcp-sdk")
    registry = TokenRegistry(base / "tokens.json")
    secrets = {}
    for role in ("reader", "writer"):
        secrets[role] = registry.create(role=role, tenant="acme", project="web")[1]
    server = start_server(base, workers=3, threads=2)
    try:
        yield server, secrets
    finally:
        server.stop()


def run(url: str, token: str, mode: str, body: Any) -> Any:
    """Connect the SDK's client with ``token`` and run ``body(client)``."""

    async def main() -> Any:
        async with httpx2.AsyncClient(headers={"Authorization": f"Bearer {token}"}) as http:
            transport = streamable_http_client(f"{url}/mcp", http_client=http)
            async with Client(transport, mode=mode) as client:
                return client.protocol_version, await body(client)

    return anyio.run(main)


def text(result: Any) -> str:
    assert [c.type for c in result.content] == ["text"]
    return str(result.content[0].text)


def test_a_writer_calls_every_tool(served: tuple[Server, dict[str, str]]) -> None:
    server, secrets = served

    async def session(client: Client) -> dict[str, Any]:
        out: dict[str, Any] = {"tools": [t.name for t in (await client.list_tools()).tools]}
        calls = [
            (
                "record_turn",
                {
                    "task_id": "sdk-task",
                    "summary_md": "Kept the cache warm.",
                    "meta": {"model": "m"},
                },
            ),
            ("record_turn", {"task_id": "sdk-task", "summary_md": "Second turn."}),
            ("search", {"query": "cache warm"}),
            ("read_digest", {"max_chars": 2000}),
            ("list_tasks", {"limit": 5}),
            ("read_task", {"task_id": "sdk-task"}),
            ("read_turn", {"task_id": "sdk-task", "turn": 0}),
            (
                "memory",
                {
                    "store": "sdk-notes",
                    "command": "create",
                    "path": "/memories/a.md",
                    "file_text": "alpha\n",
                },
            ),
            ("memory", {"store": "sdk-notes", "command": "view", "path": "/memories/a.md"}),
        ]
        for name, arguments in calls:
            result = await client.call_tool(name, arguments)
            out.setdefault(name, []).append((result.is_error, text(result)))
        return out

    store = requests.post(
        f"{server.url}/v1/memory_stores",
        json={"name": "sdk-notes"},
        headers={"Authorization": f"Bearer {secrets['writer']}"},
        timeout=10,
    )
    assert store.status_code == 200, store.text
    version, out = run(server.url, secrets["writer"], "auto", session)
    assert version == "2026-07-28"
    assert out["tools"] == [t.name for t in TOOLS]
    assert [ok for name in out if name != "tools" for ok, _ in out[name]] == [False] * 9
    assert out["record_turn"][0][1].startswith("Recorded turn 0 of task sdk-task")
    assert out["record_turn"][1][1].startswith("Recorded turn 1 of task sdk-task")
    assert "turn 0 of task sdk-task" in out["search"][0][1]
    assert "## sdk-task" in out["read_digest"][0][1]
    assert "sdk-task: latest turn 1, 2 turn(s)" in out["list_tasks"][0][1]
    assert "Kept the cache warm." in out["read_turn"][0][1]
    assert "alpha" in out["memory"][1][1]


def test_a_reader_gets_the_read_tools_and_is_told_its_role(
    served: tuple[Server, dict[str, str]],
) -> None:
    server, secrets = served

    async def session(client: Client) -> tuple[list[str], Any, Any, Any]:
        names = [t.name for t in (await client.list_tools()).tools]
        write = await client.call_tool("record_turn", {"task_id": "x", "summary_md": "no"})
        memory = await client.call_tool(
            "memory", {"store": "sdk-notes", "command": "delete", "path": "/memories/a.md"}
        )
        read = await client.call_tool("list_tasks", {})
        return names, write, memory, read

    for mode, expected in (("legacy", "2025-11-25"), ("auto", "2026-07-28")):
        version, (names, write, memory, read) = run(server.url, secrets["reader"], mode, session)
        assert version == expected
        assert names == [t.name for t in TOOLS if not t.writes]
        assert write.is_error and "this token's role is reader" in text(write)
        assert memory.is_error and "this token's role is reader" in text(memory)
        assert not read.is_error


def test_bad_arguments_and_an_output_cut_to_its_bound(
    served: tuple[Server, dict[str, str]],
) -> None:
    server, secrets = served
    summary = "".join(f"row {i:07d} of a long summary\n" for i in range(30_000))

    async def session(client: Client) -> list[Any]:
        results = [
            await client.call_tool("search", {"query": "x", "limit": 1000}),
            await client.call_tool("read_turn", {"task_id": "../../etc", "turn": 0}),
            await client.call_tool(
                "record_turn", {"task_id": "t", "summary_md": "", "meta": {"model": 5}}
            ),
            await client.call_tool("record_turn", {"task_id": "long", "summary_md": summary}),
            await client.call_tool("read_turn", {"task_id": "long", "turn": 0}),
        ]
        return results

    _, results = run(server.url, secrets["writer"], "legacy", session)
    limit, task_id, meta, recorded, long = results
    assert limit.is_error and "limit must be between 1 and 100" in text(limit)
    assert task_id.is_error and "task_id: must match" in text(task_id)
    assert meta.is_error and "meta.model: Not a valid string" in text(meta)
    assert not recorded.is_error
    assert not long.is_error and len(text(long)) <= OUTPUT_CHARS < len(summary)
    assert "summary cut at character" in text(long)


def test_a_wrong_token_cannot_connect(served: tuple[Server, dict[str, str]]) -> None:
    server, _ = served
    raw = requests.post(
        f"{server.url}/mcp", json={}, headers={"Authorization": "Bearer pm_no"}, timeout=10
    )
    assert raw.status_code == 401 and raw.headers["WWW-Authenticate"].startswith("Bearer")

    async def session(client: Client) -> None:
        await client.list_tools()

    with pytest.raises(ExceptionGroup) as refused:  # the SDK's task groups wrap its MCPError
        run(server.url, "pm_wrong", "auto", session)
    assert refused.group_contains(MCPError, depth=None)
