"""``project-memory mcp``: the official SDK's stdio client through the relay to /mcp.

The relay opens no storage: it runs here with no storage root in its environment at all,
and the tools it offers are the server's, for the token it was given.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import warnings
from pathlib import Path
from typing import Any

import anyio
import pytest
from project_memory_client.mcp.bridge import MAX_LINE

from tests.agents.conftest import CLI, Memory

pytestmark = pytest.mark.e2e

with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    from mcp import Client, StdioServerParameters
    from mcp.shared.exceptions import MCPError


def bridge_env(memory: Memory, token: str, home: Path) -> dict[str, str]:
    keep = {k: v for k, v in os.environ.items() if not k.startswith(("PROJECT_MEMORY_", "MEMORY_"))}
    return {
        **keep,
        "HOME": str(home),
        "PROJECT_MEMORY_URL": memory.url,
        "PROJECT_MEMORY_TOKEN": token,
    }


def session(env: dict[str, str], mode: str, body: Any) -> Any:
    async def main() -> Any:
        params = StdioServerParameters(command=CLI, args=["mcp"], env=env)
        async with Client(params, mode=mode) as client:
            return client.protocol_version, await body(client)

    return anyio.run(main)


@pytest.mark.parametrize(("mode", "version"), [("auto", "2026-07-28"), ("legacy", "2025-11-25")])
def test_the_sdks_stdio_client_through_the_relay(
    memory_up: Memory, tmp_path: Path, mode: str, version: str
) -> None:
    env = bridge_env(memory_up, memory_up.writer, tmp_path)

    async def body(client: Client) -> tuple[list[str], Any, Any]:
        names = [t.name for t in (await client.list_tools()).tools]
        recorded = await client.call_tool(
            "record_turn", {"task_id": f"stdio-{mode}", "summary_md": "through stdio"}
        )
        hits = await client.call_tool("search", {"query": "through stdio"})
        return names, recorded, hits

    got, (names, recorded, hits) = session(env, mode, body)
    assert got == version
    assert "record_turn" in names and "search" in names
    assert not recorded.is_error and f"task stdio-{mode}" in recorded.content[0].text
    assert f"task stdio-{mode}" in hits.content[0].text


def test_a_reader_through_the_relay_gets_the_read_tools(memory_up: Memory, tmp_path: Path) -> None:
    env = bridge_env(memory_up, memory_up.reader, tmp_path)

    async def body(client: Client) -> tuple[list[str], Any]:
        names = [t.name for t in (await client.list_tools()).tools]
        return names, await client.call_tool("record_turn", {"task_id": "x", "summary_md": "no"})

    _, (names, refused) = session(env, "auto", body)
    assert "record_turn" not in names and "list_tasks" in names
    assert refused.is_error and "role is reader" in refused.content[0].text


def lines(env: dict[str, str], *messages: dict[str, Any]) -> list[dict[str, Any]]:
    text = "".join(json.dumps(m) + "\n" for m in messages)
    done = subprocess.run(
        [CLI, "mcp"], input=text, capture_output=True, text=True, env=env, timeout=60, check=False
    )
    assert done.returncode == 0, done.stderr
    return [json.loads(line) for line in done.stdout.splitlines()]


def test_the_server_down_or_refusing_is_an_error_to_each_request(
    memory_up: Memory, tmp_path: Path
) -> None:
    ping = {"jsonrpc": "2.0", "id": 1, "method": "ping"}
    note = {"jsonrpc": "2.0", "method": "notifications/initialized"}
    wrong = bridge_env(memory_up, "pm_not-a-token", tmp_path)
    [refused] = lines(wrong, ping, note)
    assert refused["id"] == 1 and "HTTP 401" in refused["error"]["message"]
    memory_up.switch.set("down")
    [down] = lines(bridge_env(memory_up, memory_up.writer, tmp_path), ping, note)
    assert down["id"] == 1 and "cannot reach" in down["error"]["message"]
    memory_up.switch.set("up")
    [ok, bad] = sorted(
        lines(bridge_env(memory_up, memory_up.writer, tmp_path), ping, {"x": 1}),
        key=lambda m: str(m.get("id")),
    )
    assert ok == {"jsonrpc": "2.0", "id": 1, "result": {}}
    assert bad["error"]["code"] == -32600  # the server's answer, relayed as is


def test_the_relay_imports_neither_the_server_nor_an_sdk() -> None:
    code = "import sys, project_memory_client.mcp.bridge as b; print(sorted(m for m in ('app', 'flask', 'mcp') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_artifacts_through_the_relay(memory_up: Memory, tmp_path: Path) -> None:
    env = bridge_env(memory_up, memory_up.writer, tmp_path)
    png = "iVBORw0KGgo="  # the PNG signature

    async def body(client: Client) -> tuple[Any, Any, str]:
        recorded = await client.call_tool(
            "record_turn",
            {
                "task_id": "stdio-files",
                "summary_md": "with files",
                "artifacts": [
                    {"name": "out.txt", "content": "through stdio ✓\n"},
                    {"name": "sig.png", "content": png, "encoding": "base64"},
                ],
            },
        )
        read = await client.call_tool(
            "read_artifact", {"task_id": "stdio-files", "turn": 0, "name": "sig.png"}
        )
        try:
            with anyio.fail_after(30):  # an error the client cannot match leaves it waiting
                await client.call_tool(
                    "record_turn",
                    {
                        "task_id": "stdio-files",
                        "summary_md": "",
                        "artifacts": [{"name": "huge.txt", "content": "x" * (4 << 20)}],
                    },
                )
        except MCPError as exc:
            return recorded, read, str(exc)
        raise AssertionError("an over-size message was accepted")

    _, (recorded, read, refused) = session(env, "auto", body)
    assert not recorded.is_error, recorded.content[0].text
    assert "sig.png (image/png, 8 bytes)" in recorded.content[0].text
    assert read.content[0].text.endswith(f"in base64:\n{png}")
    # The server refused it unread (id null); the relay gave the error to this call's id.
    assert "larger than the 4194304 bytes this endpoint takes" in refused


def test_a_line_over_the_relays_bound_is_an_error_to_its_id(
    memory_up: Memory, tmp_path: Path
) -> None:
    env = bridge_env(memory_up, memory_up.writer, tmp_path)
    huge = {
        "jsonrpc": "2.0",
        "id": 41,
        "method": "tools/call",
        "params": {"name": "record_turn", "arguments": {"summary_md": "x" * MAX_LINE}},
    }
    ping = {"jsonrpc": "2.0", "id": 42, "method": "ping"}
    answers = sorted(lines(env, huge, ping), key=lambda m: m["id"])
    assert [a["id"] for a in answers] == [41, 42]
    assert f"larger than the {MAX_LINE} bytes" in answers[0]["error"]["message"]
    assert answers[1]["result"] == {}
