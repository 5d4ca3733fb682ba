"""The real coding-agent CLIs, offline: pinned npm installs and local stubs of their model APIs.

* ``agent_cli("claude")`` / ``agent_cli("codex")``: the binary of the version pinned in
  tests/agents/npm/package-lock.json, installed once with ``npm ci`` into
  ``.cache/agents-npm/`` (``MEMORY_TEST_NPM_CACHE`` elsewhere) and reused by every later
  run while the lock file is unchanged. No npm, or a failed install, fails the test;
  ``MEMORY_ALLOW_NO_AGENT_CLI=1`` makes it skip instead (for a machine without node; never
  in CI, which installs node first).
* :class:`AnthropicStub`: ``POST /v1/messages`` (SSE) answered from a script, the way the
  reference harness (shared/reference/claude-code-harness) does: one scripted tool call per
  model turn, a ``ToolSearch`` first when Claude Code deferred the tool, then a final text.
* :class:`ResponsesStub`: OpenAI's ``POST /v1/responses`` (SSE) for Codex, the same way.
* :class:`EgressProbe`: a proxy that refuses and records every attempt to reach outside.
* :func:`self_signed`: a certificate for localhost and 127.0.0.1, for a test's own https.

Every stub runs on 127.0.0.1 in a thread of the test process and records what it was sent.
"""

from __future__ import annotations

import datetime
import hashlib
import ipaddress
import json
import os
import shutil
import socket
import socketserver
import subprocess
import threading
import uuid
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID
from filelock import FileLock

REPO = Path(__file__).resolve().parents[2]
NPM_PINS = Path(__file__).resolve().parent / "npm"
ALLOW_MISSING = "MEMORY_ALLOW_NO_AGENT_CLI"
BINARIES = {
    "claude": "node_modules/@anthropic-ai/claude-code/bin/claude.exe",
    "codex": "node_modules/@openai/codex/bin/codex.js",
}


def missing(reason: str) -> None:
    if os.environ.get(ALLOW_MISSING) == "1":
        pytest.skip(reason)
    pytest.fail(f"{reason} (set {ALLOW_MISSING}=1 to skip instead; .ci/run installs node)")


def npm_cache() -> Path:
    return Path(os.environ.get("MEMORY_TEST_NPM_CACHE") or REPO / ".cache" / "agents-npm")


def agent_cli(name: str) -> Path:
    """The pinned ``claude`` or ``codex``, installed on first use."""
    binary = npm_installed() / BINARIES[name]
    if not binary.exists():
        missing(f"{binary} is missing after npm ci")
    return binary


def npm_installed() -> Path:
    """The directory the pinned npm packages are installed in (on first use)."""
    root = npm_cache()
    npm_ci(NPM_PINS, root, "the pinned agent CLIs", missing)
    return root


def npm_ci(pins: Path, root: Path, what: str, fail: Callable[[str], None]) -> None:
    """Install ``pins``' package.json and lock file into ``root`` with ``npm ci``, once per
    lock file (a stamp of its hash), under a file lock; ``fail`` says why it could not."""
    npm = shutil.which("npm")
    if npm is None or shutil.which("node") is None:
        fail(f"node and npm are needed to install {what}")
    root.mkdir(parents=True, exist_ok=True)
    stamp = root / ".installed"
    wanted = hashlib.sha256((pins / "package-lock.json").read_bytes()).hexdigest()
    with FileLock(str(root / ".install.lock"), timeout=600):
        if not stamp.exists() or stamp.read_text() != wanted:
            for pin in ("package.json", "package-lock.json"):
                shutil.copyfile(pins / pin, root / pin)
            done = subprocess.run(
                [str(npm), "ci", "--no-audit", "--no-fund", "--loglevel=error"],
                cwd=root,
                capture_output=True,
                text=True,
                timeout=600,
                check=False,
            )
            if done.returncode != 0:
                fail(f"npm ci of {what} failed:\n{done.stderr[-2000:]}")
            stamp.write_text(wanted)


def pinned(name: str, version: str) -> Path:
    """``agent_cli(name)``, checked to be ``version``."""
    binary = agent_cli(name)
    out = subprocess.run(
        [str(binary), "--version"], capture_output=True, text=True, timeout=120, check=False
    )
    assert version in out.stdout.split(), out.stdout + out.stderr
    return binary


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class _Server:
    """A ThreadingHTTPServer with ``handler`` on a free port; ``requests`` what it got."""

    def __init__(self, handler: type[BaseHTTPRequestHandler]) -> None:
        self.requests: list[dict[str, Any]] = []
        self.lock = threading.Lock()
        owner = self

        class Bound(handler):  # type: ignore[misc,valid-type]
            stub = owner

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Bound)
        self.httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    def record(self, entry: dict[str, Any]) -> None:
        with self.lock:
            self.requests.append(entry)

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


class _JsonHandler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    stub: Any

    def log_message(self, *args: Any) -> None:
        pass

    def body(self) -> Any:
        size = int(self.headers.get("content-length") or 0)
        raw = self.rfile.read(size) if size else b""
        try:
            return json.loads(raw) if raw else None
        except ValueError:
            return {"_raw": raw[:500].decode("latin-1")}

    def send(self, code: int, data: Any, kind: str = "application/json") -> None:
        payload = data if isinstance(data, bytes) else json.dumps(data).encode()
        self.send_response(code)
        self.send_header("content-type", kind)
        self.send_header("content-length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        self.stub.record({"method": "GET", "path": self.path, "body": None})
        self.send(404, {"type": "error", "error": {"type": "not_found_error", "message": "stub"}})


def _sse(event: str, data: dict[str, Any]) -> str:
    return f"event: {event}\ndata: {json.dumps(data)}\n\n"


class AnthropicStub(_Server):
    """The Messages API for Claude Code. ``script``: ``{"steps": [{"tool", "input"}],
    "final": text}``; the final answer quotes the last tool result."""

    USAGE = {
        "input_tokens": 1200,
        "output_tokens": 34,
        "cache_read_input_tokens": 500,
        "cache_creation_input_tokens": 60,
    }

    def __init__(self, script: dict[str, Any]) -> None:
        self.script = script
        super().__init__(_AnthropicHandler)

    def first_request(self) -> dict[str, Any]:
        """The first model request of the session (tools offered: not a side call)."""
        return next(r["body"] for r in self.requests if (r["body"] or {}).get("tools"))


def _blocks(messages: list[Any], role: str, kind: str) -> list[dict[str, Any]]:
    return [
        b
        for m in messages or []
        if isinstance(m, dict) and m.get("role") == role and isinstance(m.get("content"), list)
        for b in m["content"]
        if isinstance(b, dict) and b.get("type") == kind
    ]


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    return "\n".join(
        str(b.get("text", "")) if b.get("type") == "text" else _text(b.get("content"))
        for b in content or []
        if isinstance(b, dict)
    )


class _AnthropicHandler(_JsonHandler):
    def do_POST(self) -> None:  # noqa: N802
        body = self.body() or {}
        self.stub.record({"method": "POST", "path": self.path, "body": body})
        if self.path.split("?")[0] != "/v1/messages":
            return self.send(
                404, {"type": "error", "error": {"type": "not_found_error", "message": "stub"}}
            )
        blocks, stop = self.decide(body)
        self.stream(body.get("model", "stub-model"), blocks, stop)

    def decide(self, body: dict[str, Any]) -> tuple[list[dict[str, Any]], str]:
        tools = body.get("tools") or []
        if not tools:  # a side call (a title, a summary)
            return [{"type": "text", "text": "stub side-call answer"}], "end_turn"
        steps = self.stub.script.get("steps", [])
        messages = body.get("messages") or []
        uses = _blocks(messages, "assistant", "tool_use")
        done = sum(1 for u in uses if u.get("name") != "ToolSearch")
        if done < len(steps):
            step = steps[done]
            name, arguments = step["tool"], step.get("input", {})
            offered = {t.get("name") for t in tools if not t.get("defer_loading")}
            searched = any(
                u.get("name") == "ToolSearch" and name in json.dumps(u.get("input")) for u in uses
            )
            if name not in offered and not searched:
                if "ToolSearch" not in offered or name not in json.dumps(body):
                    return [{"type": "text", "text": f"TOOL_NOT_OFFERED: {name}"}], "end_turn"
                name, arguments = "ToolSearch", {"query": "select:" + step["tool"]}
            block = {
                "type": "tool_use",
                "id": "toolu_" + uuid.uuid4().hex[:16],
                "name": name,
                "input": arguments,
            }
            return [block], "tool_use"
        results = _blocks(messages, "user", "tool_result")
        final = self.stub.script.get("final", "stub final answer")
        if results:
            final += " | last tool result: " + _text(results[-1].get("content"))[:600]
        return [{"type": "text", "text": final}], "end_turn"

    def stream(self, model: str, blocks: list[dict[str, Any]], stop: str) -> None:
        mid = "msg_" + uuid.uuid4().hex[:16]
        usage = dict(AnthropicStub.USAGE)
        out = [
            _sse(
                "message_start",
                {
                    "type": "message_start",
                    "message": {
                        "id": mid,
                        "type": "message",
                        "role": "assistant",
                        "model": model,
                        "content": [],
                        "stop_reason": None,
                        "stop_sequence": None,
                        "usage": {**usage, "output_tokens": 1},
                    },
                },
            )
        ]
        for i, block in enumerate(blocks):
            if block["type"] == "text":
                out.append(
                    _sse(
                        "content_block_start",
                        {
                            "type": "content_block_start",
                            "index": i,
                            "content_block": {"type": "text", "text": ""},
                        },
                    )
                )
                out.append(
                    _sse(
                        "content_block_delta",
                        {
                            "type": "content_block_delta",
                            "index": i,
                            "delta": {"type": "text_delta", "text": block["text"]},
                        },
                    )
                )
            else:
                start = {"type": "tool_use", "id": block["id"], "name": block["name"], "input": {}}
                out.append(
                    _sse(
                        "content_block_start",
                        {"type": "content_block_start", "index": i, "content_block": start},
                    )
                )
                delta = {"type": "input_json_delta", "partial_json": json.dumps(block["input"])}
                out.append(
                    _sse(
                        "content_block_delta",
                        {"type": "content_block_delta", "index": i, "delta": delta},
                    )
                )
            out.append(_sse("content_block_stop", {"type": "content_block_stop", "index": i}))
        out.append(
            _sse(
                "message_delta",
                {
                    "type": "message_delta",
                    "delta": {"stop_reason": stop, "stop_sequence": None},
                    "usage": {"output_tokens": usage["output_tokens"]},
                },
            )
        )
        out.append(_sse("message_stop", {"type": "message_stop"}))
        self.send(200, "".join(out).encode(), "text/event-stream")


class ResponsesStub(_Server):
    """OpenAI's Responses API for Codex. ``script`` steps name a tool and, for an MCP tool,
    its ``namespace`` (``mcp__<server>``, as Codex lists it)."""

    USAGE = {
        "input_tokens": 900,
        "input_tokens_details": {"cached_tokens": 300},
        "output_tokens": 21,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": 921,
    }

    def __init__(self, script: dict[str, Any]) -> None:
        self.script = script
        super().__init__(_ResponsesHandler)


class _ResponsesHandler(_JsonHandler):
    def do_POST(self) -> None:  # noqa: N802
        body = self.body() or {}
        self.stub.record({"method": "POST", "path": self.path, "body": body})
        if not self.path.split("?")[0].endswith("/responses"):
            return self.send(404, {"error": {"message": "stub"}})
        items = [i for i in body.get("input") or [] if isinstance(i, dict)]
        calls = sum(1 for i in items if i.get("type") == "function_call")
        outputs = [i for i in items if i.get("type") == "function_call_output"]
        steps = self.stub.script.get("steps", [])
        if calls < len(steps):
            step = steps[calls]
            item: dict[str, Any] = {
                "type": "function_call",
                "id": "fc_" + uuid.uuid4().hex[:8],
                "call_id": "call_" + uuid.uuid4().hex[:8],
                "name": step["tool"],
                "arguments": json.dumps(step.get("input", {})),
                "status": "completed",
            }
            if "namespace" in step:
                item["namespace"] = step["namespace"]
        else:
            text = self.stub.script.get("final", "stub final answer")
            if outputs:
                last = outputs[-1].get("output")
                text += (
                    " | last tool output: "
                    + (last if isinstance(last, str) else json.dumps(last))[:600]
                )
            item = {
                "type": "message",
                "id": "msg_" + uuid.uuid4().hex[:8],
                "status": "completed",
                "role": "assistant",
                "content": [{"type": "output_text", "text": text, "annotations": []}],
            }
        rid = "resp_" + uuid.uuid4().hex[:8]
        out = [
            _sse(
                "response.created",
                {
                    "type": "response.created",
                    "response": {
                        "id": rid,
                        "object": "response",
                        "status": "in_progress",
                        "output": [],
                    },
                },
            )
        ]
        out.append(
            _sse(
                "response.output_item.added",
                {
                    "type": "response.output_item.added",
                    "output_index": 0,
                    "item": {**item, "status": "in_progress"},
                },
            )
        )
        out.append(
            _sse(
                "response.output_item.done",
                {"type": "response.output_item.done", "output_index": 0, "item": item},
            )
        )
        done = {
            "id": rid,
            "object": "response",
            "status": "completed",
            "output": [item],
            "usage": ResponsesStub.USAGE,
        }
        out.append(_sse("response.completed", {"type": "response.completed", "response": done}))
        self.send(200, "".join(out).encode(), "text/event-stream")


class EgressProbe:
    """``HTTPS_PROXY``/``HTTP_PROXY`` for the agents: every request line it gets is an
    attempt to reach outside 127.0.0.1; it is refused (403) and recorded."""

    def __init__(self) -> None:
        self.attempts: list[str] = []
        probe = self

        class Handler(socketserver.StreamRequestHandler):
            def handle(self) -> None:
                self.request.settimeout(5)
                try:
                    line = self.rfile.readline(8192).decode("latin-1").strip()
                except OSError:
                    return
                if line:
                    probe.attempts.append(line)
                    self.wfile.write(
                        b"HTTP/1.1 403 Forbidden\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
                    )

        self.server = socketserver.ThreadingTCPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def env(self) -> dict[str, str]:
        return {
            "HTTPS_PROXY": self.url,
            "HTTP_PROXY": self.url,
            "https_proxy": self.url,
            "http_proxy": self.url,
            "NO_PROXY": "127.0.0.1,localhost",
            "no_proxy": "127.0.0.1,localhost",
        }

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def stream_events(stdout: str) -> list[dict[str, Any]]:
    """The JSON lines an agent printed (``stream-json`` / ``--json``)."""
    out = []
    for line in stdout.splitlines():
        line = line.strip()
        if line.startswith("{"):
            try:
                out.append(json.loads(line))
            except ValueError:
                continue
    return out


if __name__ == "__main__":  # .ci/run: install the pinned CLIs before the tests need them
    for cli_name in BINARIES:
        path = agent_cli(cli_name)
        version = subprocess.run(
            [str(path), "--version"], capture_output=True, text=True, timeout=120, check=True
        )
        print(f"{cli_name}: {path} ({version.stdout.strip()})")


def self_signed(directory: Path) -> tuple[Path, Path]:
    """A certificate for localhost and 127.0.0.1, and its key."""
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "localhost")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(
            x509.SubjectAlternativeName(
                [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]
            ),
            critical=False,
        )
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    cert_path, key_path = directory / "cert.pem", directory / "key.pem"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    return cert_path, key_path
