"""Persistent memory for a Claude app: the SDK's memory tool, backed by a memory store here.

Needs the optional ``anthropic`` SDK (``pip install 'project-memory-client[sdk]'``)::

    from anthropic import Anthropic
    from project_memory_client.sdk_tool import ProjectMemoryTool

    memory = ProjectMemoryTool(store_id="memstore_...")  # PROJECT_MEMORY_URL, _TOKEN, ...
    runner = Anthropic().beta.messages.tool_runner(
        model="claude-sonnet-5-5", max_tokens=2048, tools=[memory],
        messages=[{"role": "user", "content": "Remember that I take my coffee black."}],
    )
    final = runner.until_done()

Each command Claude sends is forwarded as it is to ``POST /v1/memory_stores/{id}/memory_tool``;
the server checks paths and parameters and answers with the tool result text. Every change
is a store write, with its version, like any other.
"""

from __future__ import annotations

from typing import Any

import httpx
from anthropic.lib.tools import BetaAbstractMemoryTool, BetaAsyncAbstractMemoryTool, ToolError
from anthropic.types.beta import (
    BetaCacheControlEphemeralParam,
    BetaMemoryTool20250818CreateCommand,
    BetaMemoryTool20250818DeleteCommand,
    BetaMemoryTool20250818InsertCommand,
    BetaMemoryTool20250818RenameCommand,
    BetaMemoryTool20250818StrReplaceCommand,
    BetaMemoryTool20250818ViewCommand,
)

from .settings import Settings, load_settings

__all__ = ["AsyncProjectMemoryTool", "MemoryServerError", "ProjectMemoryTool"]


class MemoryServerError(ToolError):
    """The memory server could not run the command (unreachable, credential, unknown store).

    A ToolError, so the tool runner hands Claude an error result instead of crashing the
    conversation; the message says what went wrong.
    """


def _result(response: httpx.Response) -> str:
    """The tool result text of an endpoint answer; raise for an error result or answer."""
    try:
        body: Any = response.json()
    except ValueError:
        body = None
    if response.status_code != 200 or not isinstance(body, dict):
        error = body.get("error") if isinstance(body, dict) else None
        message = error.get("message") if isinstance(error, dict) else response.reason_phrase
        raise MemoryServerError(
            f"Error: the memory server answered {response.status_code}: {message}"
        )
    content = str(body.get("content", ""))
    if body.get("is_error"):
        raise ToolError(content)
    return content


def _settings(
    server: str | None, token: str | None, tenant: str | None, project: str | None
) -> Settings:
    """The arguments, else the settings (PROJECT_MEMORY_URL, PROJECT_MEMORY_TOKEN, ..., the
    config file)."""
    return load_settings(url=server, token=token, tenant=tenant, project=project).require()


def _endpoint(settings: Settings, store_id: str) -> str:
    return f"{settings.url}/v1/memory_stores/{store_id}/memory_tool"


class ProjectMemoryTool(BetaAbstractMemoryTool):
    """A ``memory_20250818`` tool whose ``/memories`` is one memory store of a server.

    ``server`` and ``token`` (and ``tenant``, ``project``) default to the client's settings.
    """

    def __init__(
        self,
        *,
        store_id: str,
        server: str | None = None,
        token: str | None = None,
        tenant: str | None = None,
        project: str | None = None,
        timeout: float = 30.0,
        cache_control: BetaCacheControlEphemeralParam | None = None,
        http_client: httpx.Client | None = None,
    ) -> None:
        super().__init__(cache_control=cache_control)
        settings = _settings(server, token, tenant, project)
        self.url = _endpoint(settings, store_id)
        # On each request too: a client given in ``http_client`` has none of them.
        self._headers = settings.headers()
        self._owns_client = http_client is None
        self._http = http_client or settings.http(timeout=timeout)

    def close(self) -> None:
        if self._owns_client:
            self._http.close()

    def __enter__(self) -> ProjectMemoryTool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- forwarding --------------------------------------------------------------------
    def call(self, input: object) -> str:  # noqa: A002 - the SDK's parameter name
        # Forward what Claude sent, untouched: the server validates it and answers with
        # the reference's error strings (an unknown command included).
        return self._send(input)

    def _send(self, tool_input: object) -> str:
        try:
            response = self._http.post(self.url, json=tool_input, headers=self._headers)
        except httpx.HTTPError as exc:
            raise MemoryServerError(f"Error: the memory server is unreachable ({exc})") from None
        return _result(response)

    def _forward(self, command: Any) -> str:
        return self._send(command.to_dict())

    def view(self, command: BetaMemoryTool20250818ViewCommand) -> str:
        return self._forward(command)

    def create(self, command: BetaMemoryTool20250818CreateCommand) -> str:
        return self._forward(command)

    def str_replace(self, command: BetaMemoryTool20250818StrReplaceCommand) -> str:
        return self._forward(command)

    def insert(self, command: BetaMemoryTool20250818InsertCommand) -> str:
        return self._forward(command)

    def delete(self, command: BetaMemoryTool20250818DeleteCommand) -> str:
        return self._forward(command)

    def rename(self, command: BetaMemoryTool20250818RenameCommand) -> str:
        return self._forward(command)


class AsyncProjectMemoryTool(BetaAsyncAbstractMemoryTool):
    """The same tool for ``AsyncAnthropic``'s tool runner."""

    def __init__(
        self,
        *,
        store_id: str,
        server: str | None = None,
        token: str | None = None,
        tenant: str | None = None,
        project: str | None = None,
        timeout: float = 30.0,
        cache_control: BetaCacheControlEphemeralParam | None = None,
        http_client: httpx.AsyncClient | None = None,
    ) -> None:
        super().__init__(cache_control=cache_control)
        settings = _settings(server, token, tenant, project)
        self.url = _endpoint(settings, store_id)
        self._headers = settings.headers()
        self._owns_client = http_client is None
        self._http = http_client or settings.http(timeout=timeout, asynchronous=True)

    async def aclose(self) -> None:
        if self._owns_client:
            await self._http.aclose()

    async def __aenter__(self) -> AsyncProjectMemoryTool:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def call(self, input: object) -> str:  # noqa: A002 - the SDK's parameter name
        return await self._send(input)

    async def _send(self, tool_input: object) -> str:
        try:
            response = await self._http.post(self.url, json=tool_input, headers=self._headers)
        except httpx.HTTPError as exc:
            raise MemoryServerError(f"Error: the memory server is unreachable ({exc})") from None
        return _result(response)

    async def _forward(self, command: Any) -> str:
        return await self._send(command.to_dict())

    async def view(self, command: BetaMemoryTool20250818ViewCommand) -> str:
        return await self._forward(command)

    async def create(self, command: BetaMemoryTool20250818CreateCommand) -> str:
        return await self._forward(command)

    async def str_replace(self, command: BetaMemoryTool20250818StrReplaceCommand) -> str:
        return await self._forward(command)

    async def insert(self, command: BetaMemoryTool20250818InsertCommand) -> str:
        return await self._forward(command)

    async def delete(self, command: BetaMemoryTool20250818DeleteCommand) -> str:
        return await self._forward(command)

    async def rename(self, command: BetaMemoryTool20250818RenameCommand) -> str:
        return await self._forward(command)
