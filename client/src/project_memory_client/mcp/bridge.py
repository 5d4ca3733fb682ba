"""A stdio ↔ HTTP relay to the server's ``/mcp`` endpoint (docs/agents.md, "MCP over stdio").

Each line on stdin is one JSON-RPC message; it is POSTed to ``<url>/mcp`` with the user's
token, and the answer, if there is one, is written to stdout as one line. The tools exist
once, on the server: this process never opens the storage root, and keeps no state but the
protocol revision a handshake agreed on.

HTTP needs what stdio does not carry, and the relay adds it: ``MCP-Protocol-Version`` (the
revision of a 2026-07-28 request's ``_meta``, or the one ``initialize`` agreed on), and for
a 2026-07-28 request ``Mcp-Method`` and ``Mcp-Name``. An answer that is not JSON-RPC (the
server down, a 401, a 429) becomes a JSON-RPC error to the request that caused it. Requests
are relayed concurrently (a slow search does not hold back the next call); answers may
leave in another order, as JSON-RPC allows.
"""

from __future__ import annotations

import json
import sys
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import IO, Any

import httpx

from .. import __version__
from ..settings import Settings

META_VERSION = "io.modelcontextprotocol/protocolVersion"
RELAY_ERROR = -32000  # JSON-RPC's "server error" range: the relay could not get an answer
MAX_LINE = 8 * 1024 * 1024
WORKERS = 4


class Bridge:
    def __init__(
        self, settings: Settings, out: IO[str], *, transport: httpx.BaseTransport | None = None
    ):
        settings.require()
        self.url = f"{(settings.url or '').rstrip('/')}/mcp"
        self.http = settings.http(
            f"project-memory-mcp/{__version__}",
            headers={"Accept": "application/json", "Content-Type": "application/json"},
            transport=transport,
        )
        self.out = out
        self.lock = threading.Lock()
        self.version: str | None = None  # what initialize agreed on

    def close(self) -> None:
        self.http.close()

    def emit(self, message: dict[str, Any]) -> None:
        line = json.dumps(message, ensure_ascii=False, separators=(",", ":"))
        with self.lock:
            self.out.write(line + "\n")
            self.out.flush()

    def headers_for(self, message: Any) -> dict[str, str]:
        if not isinstance(message, dict):
            return {}
        params = message.get("params")
        meta = params.get("_meta") if isinstance(params, dict) else None
        version = meta.get(META_VERSION) if isinstance(meta, dict) else None
        if isinstance(version, str):
            headers = {"MCP-Protocol-Version": version}
            method = message.get("method")
            if isinstance(method, str):
                headers["Mcp-Method"] = method
                name = params.get("name") if isinstance(params, dict) else None
                if method == "tools/call" and isinstance(name, str):
                    headers["Mcp-Name"] = name
            return headers
        if self.version is not None and message.get("method") != "initialize":
            return {"MCP-Protocol-Version": self.version}
        return {}

    def relay(self, line: str) -> None:
        try:
            message = json.loads(line)
        except ValueError:
            self.emit(
                {"jsonrpc": "2.0", "id": None, "error": {"code": -32700, "message": "Parse error"}}
            )
            return
        mid = message.get("id") if isinstance(message, dict) else None
        wants_answer = isinstance(message, dict) and "id" in message and "method" in message
        try:
            response = self.http.post(
                self.url, content=line.encode("utf-8"), headers=self.headers_for(message)
            )
        except httpx.HTTPError as exc:
            if wants_answer:
                self._fail(mid, f"cannot reach the project-memory server at {self.url}: {exc}")
            return
        if response.status_code == 202 or not response.content:
            return
        try:
            answer = response.json()
        except ValueError:
            answer = None
        if isinstance(answer, dict) and answer.get("jsonrpc") == "2.0":
            if wants_answer and "error" in answer and answer.get("id") is None:
                # Refused before the server read the id (a message too large): the error is
                # this request's, and a client waits for that id.
                answer = {**answer, "id": mid}
            result = answer.get("result")
            if (
                isinstance(message, dict)
                and message.get("method") == "initialize"
                and isinstance(result, dict)
            ):
                agreed = result.get("protocolVersion")
                self.version = agreed if isinstance(agreed, str) else None
            self.emit(answer)
        elif wants_answer:
            detail = answer.get("detail") if isinstance(answer, dict) else None
            self._fail(
                mid,
                f"the server answered HTTP {response.status_code}: {detail or response.reason_phrase}",
            )

    def refuse_too_large(self, line: str) -> None:
        """Answer a message over MAX_LINE with an error to its id (when it has one)."""
        try:
            message = json.loads(line)
        except ValueError:
            message = None
        mid = message.get("id") if isinstance(message, dict) else None
        if isinstance(message, dict) and "id" not in message:
            return  # a notification: nobody waits for an answer
        text = f"the message is larger than the {MAX_LINE} bytes this relay sends on"
        self.emit({"jsonrpc": "2.0", "id": mid, "error": {"code": -32600, "message": text}})

    def _fail(self, mid: Any, text: str) -> None:
        self.emit({"jsonrpc": "2.0", "id": mid, "error": {"code": RELAY_ERROR, "message": text}})


def serve(settings: Settings, stdin: IO[str] | None = None, stdout: IO[str] | None = None) -> int:
    """Relay until stdin ends; the exit status."""
    source = stdin or sys.stdin
    bridge = Bridge(settings, stdout or sys.stdout)
    with ThreadPoolExecutor(max_workers=WORKERS) as pool:
        try:
            for line in iter(source.readline, ""):
                line = line.strip()
                if not line:
                    continue
                if len(line) > MAX_LINE:
                    bridge.refuse_too_large(line)
                    continue
                pool.submit(bridge.relay, line)
        except KeyboardInterrupt:
            pass
    bridge.close()
    return 0
