"""The official MCP SDK's client (PyPI ``mcp``) against /mcp on a real gunicorn of 3 workers.

Every call is its own POST, so consecutive calls land on different workers: the endpoint
keeps nothing between requests. Both connect modes of the SDK are used: ``auto`` (the
2026-07-28 ``server/discover`` probe) and ``legacy`` (the initialize handshake). The client
checks each structured result against the tool's ``outputSchema`` itself, and refuses the
call when it does not validate.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterator
from typing import Any
from urllib.parse import urlsplit

import anyio
import pytest
import requests

from app.schemas.mcp import OUTPUT_CHARS
from app.services.mcp.tools import TOOLS
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


def run(url: str, token: str, mode: str, body: Any, headers: dict[str, str] | None = None) -> Any:
    """Connect the SDK's client with ``token`` (and ``headers``) and run ``body(client)``."""

    async def main() -> Any:
        sent = {"Authorization": f"Bearer {token}", **(headers or {})}
        async with httpx2.AsyncClient(headers=sent) as http:
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
            (
                "record_turn",
                {
                    "task_id": "sdk-task",
                    "summary_md": "With its log.",
                    "artifacts": [
                        {"name": "run.log", "content": "2 passed\n", "content_type": "text/plain"},
                        {"name": "core.bin", "content": "AAEC/w==", "encoding": "base64"},
                    ],
                },
            ),
            ("read_artifact", {"task_id": "sdk-task", "turn": 2, "name": "run.log"}),
            ("read_artifact", {"task_id": "sdk-task", "turn": 2, "name": "core.bin"}),
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
    assert [ok for name in out if name != "tools" for ok, _ in out[name]] == [False] * 12
    assert out["record_turn"][0][1].startswith("Recorded turn 0 of task sdk-task")
    assert out["record_turn"][1][1].startswith("Recorded turn 1 of task sdk-task")
    assert "turn 0 of task sdk-task" in out["search"][0][1]
    assert "## sdk-task" in out["read_digest"][0][1]
    assert "sdk-task: latest turn 1, 2 turn(s)" in out["list_tasks"][0][1]
    assert "Kept the cache warm." in out["read_turn"][0][1]
    assert "alpha" in out["memory"][1][1]
    assert (
        "With run.log (text/plain, 9 bytes), core.bin (application/octet-stream, 4 bytes)"
        in (out["record_turn"][2][1])
    )
    assert out["read_artifact"][0][1].endswith(
        'Bytes 0-8 of 9, as UTF-8 text:\n<stored-text from="artifact run.log">\n2 passed\n</stored-text>'
    )
    assert out["read_artifact"][1][1].endswith("Bytes 0-3 of 4, in base64:\nAAEC/w==")
    got = requests.get(
        f"{server.url}/sandbox/memory/v1/tasks/sdk-task/turns/2/artifacts/core.bin",
        headers={"Authorization": f"Bearer {secrets['writer']}"},
        timeout=10,
    )
    assert got.content == b"\x00\x01\x02\xff"


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


def test_artifacts_over_the_bounds_are_clear_errors(served: tuple[Server, dict[str, str]]) -> None:
    """Over the per-call bound: an error result. Over the endpoint's body limit: a JSON-RPC
    error the SDK hands to the call that sent it (not a hang, not a transport failure)."""
    server, secrets = served
    over_call = [{"name": "big.bin", "content": "A" * 1_500_000, "encoding": "base64"}]
    over_body = [{"name": "huge.log", "content": "x" * (4 * 1024 * 1024)}]

    async def session(client: Client) -> tuple[Any, str]:
        result = await client.call_tool(
            "record_turn", {"task_id": "sdk-big", "summary_md": "", "artifacts": over_call}
        )
        try:
            await client.call_tool(
                "record_turn", {"task_id": "sdk-big", "summary_md": "", "artifacts": over_body}
            )
        except MCPError as exc:
            return result, str(exc)
        raise AssertionError("an over-size message was accepted")

    for mode in ("auto", "legacy"):
        _, (result, refused) = run(server.url, secrets["writer"], mode, session)
        assert result.is_error and "more than 1048576 bytes (1 MiB) in one call" in text(result)
        assert "larger than the 4194304 bytes this endpoint takes" in refused, refused
    listed = requests.get(
        f"{server.url}/sandbox/memory/v1/tasks/sdk-big",
        headers={"Authorization": f"Bearer {secrets['writer']}"},
        timeout=10,
    )
    assert listed.status_code == 404  # nothing was written


def test_a_page_of_a_rebound_name_is_refused_and_a_loopback_page_is_served(
    served: tuple[Server, dict[str, str]],
) -> None:
    """DNS rebinding over real HTTP: the attacker's name resolves to the server, so its page's
    Origin and the request's Host agree, and the request is still refused."""
    server, secrets = served
    port = urlsplit(server.url).port

    async def session(client: Client) -> list[str]:
        return [t.name for t in (await client.list_tools()).tools]

    rebound = {"Host": f"rebind.example:{port}", "Origin": f"http://rebind.example:{port}"}
    raw = requests.post(
        f"{server.url}/mcp",
        json={"jsonrpc": "2.0", "id": 1, "method": "ping"},
        headers={**rebound, "Authorization": f"Bearer {secrets['reader']}"},
        timeout=10,
    )
    assert raw.status_code == 403 and "rebind.example" in raw.json()["detail"]
    for mode in ("auto", "legacy"):
        with pytest.raises(ExceptionGroup) as refused:
            run(server.url, secrets["reader"], mode, session, rebound)
        assert refused.group_contains(MCPError, depth=None)
        local = {"Origin": f"http://localhost:{port}"}
        _, names = run(server.url, secrets["reader"], mode, session, local)
        assert names == [t.name for t in TOOLS if not t.writes]


def test_structured_results_validate_against_their_output_schemas(
    served: tuple[Server, dict[str, str]],
) -> None:
    server, secrets = served
    records = {t.name for t in TOOLS if t.output_schema is not None}
    calls = [
        (
            "record_turn",
            {
                "task_id": "sdk-records",
                "summary_md": "Pinned the resolver.",
                "meta": {"model": "m", "tokens": {"input": 3}},
                "artifacts": [{"name": "a.log", "content": "ok\n"}],
            },
        ),
        ("search", {"query": "resolver"}),
        ("read_digest", {"max_chars": 2000}),
        ("list_tasks", {"limit": 1}),
        ("read_timeline", {"since": "1d", "limit": 5}),
        ("read_task", {"task_id": "sdk-records"}),
        ("read_turn", {"task_id": "sdk-records", "turn": 0, "offset": 4}),
        ("read_artifact", {"task_id": "sdk-records", "turn": 0, "name": "a.log"}),
    ]

    async def session(client: Client) -> tuple[dict[str, Any], dict[str, Any]]:
        schemas = {t.name: t.output_schema for t in (await client.list_tools()).tools}
        out = {}
        for name, arguments in calls:
            result = await client.call_tool(name, arguments)  # validated by the client
            assert not result.is_error, text(result)
            out[name] = (text(result), result.structured_content)
        return schemas, out

    for mode in ("auto", "legacy"):
        _, (schemas, out) = run(server.url, secrets["writer"], mode, session)
        assert {name for name, schema in schemas.items() if schema is not None} == records
        assert sorted(out) == sorted(records)
        written = out["record_turn"][1]
        assert written["task_id"] == "sdk-records" and written["artifacts"][0]["name"] == "a.log"
        turn = written["turn"]
        assert out["record_turn"][0].startswith(f"Recorded turn {turn} of task sdk-records")
        assert any(h["task_id"] == "sdk-records" for h in out["search"][1]["hits"])
        assert "## sdk-records" in out["read_digest"][1]["digest"]
        assert len(out["list_tasks"][1]["tasks"]) == 1
        assert out["read_timeline"][1]["turns"][0]["task_id"] == "sdk-records"
        assert out["read_task"][1]["turns"][0]["meta"]["tokens"] == {"input": 3}
        assert out["read_turn"][1]["summary_md"] == "ed the resolver."
        assert out["read_artifact"][1]["content"] == "ok\n"


def test_an_unknown_tool_and_a_tools_list_cursor_are_invalid_params(
    served: tuple[Server, dict[str, str]],
) -> None:
    server, secrets = served

    async def session(client: Client) -> list[MCPError]:
        refused = []
        for attempt in (
            client.call_tool("drop_everything", {}),
            client.list_tools(cursor="page-2", cache_mode="bypass"),
        ):
            try:
                await attempt
            except MCPError as exc:
                refused.append(exc)
        return refused

    for mode in ("auto", "legacy"):
        _, refused = run(server.url, secrets["reader"], mode, session)
        assert [exc.code for exc in refused] == [-32602, -32602], refused
        assert refused[0].message.startswith("Unknown tool: drop_everything. The tools are:")
