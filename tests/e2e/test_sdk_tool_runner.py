"""The SDK's tool runner drives ProjectMemoryTool against a real gunicorn.

The model is scripted: an httpx MockTransport answers the Messages API with tool_use
blocks, then end_turn, and records the tool results the runner sends back. No network but
127.0.0.1; the memory calls are real HTTP to our server.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from typing import Any

import anthropic
import httpx2 as httpx  # the HTTP client the anthropic SDK (2.14) is built on
import pytest
from project_memory_client.sdk_tool import (
    AsyncProjectMemoryTool,
    MemoryServerError,
    ProjectMemoryTool,
)

from tests.client.mount.helpers import Remote, sha
from tests.e2e.conftest import Server, serving

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    yield from serving(tmp_path_factory, "sdk-tool", workers=1)


def tool_use(n: int, **tool_input: Any) -> dict[str, Any]:
    return {"type": "tool_use", "id": f"toolu_{n:02d}", "name": "memory", "input": tool_input}


SCRIPT: list[list[dict[str, Any]]] = [
    [tool_use(1, command="view", path="/memories")],
    [tool_use(2, command="create", path="/memories/prefs.md", file_text="coffee: black\n")],
    [
        tool_use(
            3,
            command="str_replace",
            path="/memories/prefs.md",
            old_str="black",
            new_str="black, no sugar",
        ),
        tool_use(4, command="view", path="/memories/../../etc/passwd"),
    ],
    [
        tool_use(
            5,
            command="insert",
            path="/memories/prefs.md",
            insert_line=0,
            insert_text="# Preferences\n",
        )
    ],
    [tool_use(6, command="view", path="/memories/prefs.md")],
    [{"type": "text", "text": "Noted: black coffee, no sugar."}],
]


class FakeModel:
    """A Messages endpoint that plays SCRIPT and keeps every request body."""

    def __init__(self) -> None:
        self.requests: list[dict[str, Any]] = []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        assert request.url.host == "api.test" and request.url.path == "/v1/messages"
        body = json.loads(request.content)
        self.requests.append(body)
        turn = len(self.requests) - 1
        content = SCRIPT[turn]
        last = turn == len(SCRIPT) - 1
        return httpx.Response(
            200,
            json={
                "id": f"msg_{turn}",
                "type": "message",
                "role": "assistant",
                "model": body["model"],
                "content": content,
                "stop_reason": "end_turn" if last else "tool_use",
                "stop_sequence": None,
                "usage": {"input_tokens": 10, "output_tokens": 10},
            },
        )

    def results(self, turn: int) -> dict[str, dict[str, Any]]:
        """The tool results sent with request ``turn`` (1-based: after the first reply)."""
        message = self.requests[turn]["messages"][-1]
        assert message["role"] == "user"
        return {block["tool_use_id"]: block for block in message["content"]}


def test_tool_runner_keeps_memory_in_a_store(server: Server) -> None:
    token = server.token("writer")
    remote = Remote(server, token)
    store_id = remote.store("Claude App")
    model = FakeModel()
    memory = ProjectMemoryTool(server=server.url, token=token, store_id=store_id)
    client = anthropic.Anthropic(
        api_key="test-key",
        base_url="http://api.test",
        max_retries=0,
        http_client=httpx.Client(transport=httpx.MockTransport(model)),
    )
    with client, memory:
        runner = client.beta.messages.tool_runner(
            model="claude-sonnet-5-5",
            max_tokens=1024,
            tools=[memory],
            messages=[{"role": "user", "content": "I take my coffee black, no sugar."}],
        )
        final = runner.until_done()
    assert final.stop_reason == "end_turn"
    assert final.content[0].type == "text"
    assert len(model.requests) == len(SCRIPT)
    assert model.requests[0]["tools"] == [{"type": "memory_20250818", "name": "memory"}]

    first = model.results(1)["toolu_01"]
    assert first["content"] == (
        "Here're the files and directories up to 2 levels deep in /memories, excluding"
        " hidden items and node_modules:\n0B\t/memories"
    )
    assert not first.get("is_error")
    assert model.results(2)["toolu_02"]["content"] == (
        "File created successfully at: /memories/prefs.md"
    )
    third = model.results(3)
    assert third["toolu_03"]["content"].startswith("The memory file has been edited.")
    traversal = third["toolu_04"]
    assert traversal["is_error"] is True
    assert "would escape /memories" in json.dumps(traversal["content"])
    assert model.results(5)["toolu_06"]["content"] == (
        "Here's the content of /memories/prefs.md with line numbers:\n"
        "     1\t# Preferences\n     2\tcoffee: black, no sugar"
    )

    assert remote.tree(store_id) == {"/prefs.md": "# Preferences\ncoffee: black, no sugar\n"}
    versions = remote.versions(store_id)
    assert [v["operation"] for v in versions] == ["modified", "modified", "created"]
    assert [v["content_sha256"] for v in versions] == [
        sha("# Preferences\ncoffee: black, no sugar\n"),
        sha("coffee: black, no sugar\n"),
        sha("coffee: black\n"),
    ]
    assert {v["created_by"]["type"] for v in versions} == {"api_actor"}
    remote.close()


def test_server_errors_become_error_results(server: Server) -> None:
    token = server.token("reader")
    writer = Remote(server, server.token("writer"))
    store_id = writer.store("Read Only For Readers")
    cases = [
        (server.url, token, "answered 403"),  # a reader may not run the tool
        (server.url, "wrong", "answered 401"),
        ("http://127.0.0.1:9", token, "unreachable"),  # the discard port: nothing listens
    ]
    for url, secret, expected in cases:
        memory = ProjectMemoryTool(server=url, token=secret, store_id=store_id, timeout=2)
        with memory, pytest.raises(MemoryServerError, match=expected):
            memory.call({"command": "view", "path": "/memories"})
    assert writer.tree(store_id) == {}
    writer.close()


def test_async_tool_runner_keeps_memory_in_a_store(server: Server) -> None:
    token = server.token("writer")
    remote = Remote(server, token)
    store_id = remote.store("Async App")
    model = FakeModel()

    async def converse() -> anthropic.types.beta.BetaMessage:
        memory = AsyncProjectMemoryTool(server=server.url, token=token, store_id=store_id)
        client = anthropic.AsyncAnthropic(
            api_key="test-key",
            base_url="http://api.test",
            max_retries=0,
            http_client=httpx.AsyncClient(transport=httpx.MockTransport(model)),
        )
        async with client, memory:
            runner = client.beta.messages.tool_runner(
                model="claude-sonnet-5-5",
                max_tokens=1024,
                tools=[memory],
                messages=[{"role": "user", "content": "I take my coffee black, no sugar."}],
            )
            return await runner.until_done()

    final = asyncio.run(converse())
    assert final.stop_reason == "end_turn"
    assert model.results(3)["toolu_04"]["is_error"] is True
    assert remote.tree(store_id) == {"/prefs.md": "# Preferences\ncoffee: black, no sugar\n"}
    assert [v["operation"] for v in remote.versions(store_id)] == [
        "modified",
        "modified",
        "created",
    ]
    remote.close()
