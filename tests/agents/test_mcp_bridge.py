"""``project-memory mcp``: the official SDK's stdio client through the relay to /mcp.

The relay opens no storage: it runs here with no storage root in its environment at all,
and the tools it offers are the server's, for the token it was given.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import socket
import ssl
import subprocess
import sys
import threading
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest
from project_memory_client.mcp.bridge import MAX_LINE

from tests.agents.conftest import CLI, Memory
from tests.agents.harness import self_signed

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


# What the relay's first answers do not need, and once cost its start-up: httpx and what it
# loads (the email package, ssl and certifi even for an http URL), concurrent.futures and
# logging, and the CLI's parser with every command's options.
HEAVY = {"httpx", "httpcore", "h11", "anyio", "certifi", "ssl", "email", "http", "socket"}
HEAVY |= {"urllib.request", "concurrent", "logging", "argparse", "dataclasses"}
HEAVY |= {f"project_memory_client.{m}" for m in ("command_line", "client", "models", "commands")}

# Run as the agents run it (``project-memory mcp``); at each answer the modules loaded since
# the process started, of HEAVY, go to stderr as one JSON line.
WATCH_STARTUP = """
import json, sys
HEAVY = set(json.loads(sys.argv[1]))
at_start = set(sys.modules)

class Watched:
    def __init__(self, out):
        self.out = out

    def write(self, text):
        new = set(sys.modules) - at_start
        heavy = sorted(m for m in new if m in HEAVY or m.split(".")[0] in HEAVY)
        sys.stderr.write(json.dumps(heavy) + "\\n")
        return self.out.write(text)

    def flush(self):
        self.out.flush()

sys.stdout = Watched(sys.stdout)
from project_memory_client.cli import main
sys.exit(main(["mcp"]))
"""


def test_the_relay_answers_before_loading_what_it_does_not_need(
    memory_up: Memory, tmp_path: Path
) -> None:
    env = bridge_env(memory_up, memory_up.writer, tmp_path)
    initialize = {
        "jsonrpc": "2.0",
        "id": 0,
        "method": "initialize",
        "params": {"protocolVersion": "2025-11-25", "capabilities": {},
                   "clientInfo": {"name": "test", "version": "1"}},
    }  # fmt: skip
    listing = {"jsonrpc": "2.0", "id": 1, "method": "tools/list"}
    with subprocess.Popen(
        [sys.executable, "-c", WATCH_STARTUP, json.dumps(sorted(HEAVY))],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env=env,
    ) as proc:  # fmt: skip
        assert proc.stdin is not None and proc.stdout is not None and proc.stderr is not None
        # One message at a time: the list goes once initialize is answered, as a client's.
        proc.stdin.write(json.dumps(initialize) + "\n")
        proc.stdin.flush()
        first = json.loads(proc.stdout.readline())
        proc.stdin.write(json.dumps(listing) + "\n")
        proc.stdin.close()
        second = json.loads(proc.stdout.readline())
        assert proc.wait(timeout=60) == 0
        at_first, at_second = (json.loads(line) for line in proc.stderr.read().splitlines())
    assert first["result"]["serverInfo"]["name"] == "project-memory"
    assert "record_turn" in [t["name"] for t in second["result"]["tools"]]
    assert at_first == [] and at_second == []


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


def test_a_proxy_variable_is_honoured(memory_up: Memory, tmp_path: Path) -> None:
    """The relay speaks HTTP itself, but not past a proxy: with one set, httpx carries the
    request through it (here a proxy that is down, so the server, though up, is not asked)."""
    ping = {"jsonrpc": "2.0", "id": 1, "method": "ping"}
    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        proxy = f"http://127.0.0.1:{closed.getsockname()[1]}"
        env = {**bridge_env(memory_up, memory_up.writer, tmp_path), "http_proxy": proxy}
        env = {k: v for k, v in env.items() if k.lower() != "no_proxy"}
        [through] = lines(env, ping)
        [direct] = lines({k: v for k, v in env.items() if k != "http_proxy"}, ping)
    assert through["id"] == 1 and "cannot reach" in through["error"]["message"]
    assert direct == {"jsonrpc": "2.0", "id": 1, "result": {}}


def test_a_name_that_would_break_a_header_is_not_sent(memory_up: Memory, tmp_path: Path) -> None:
    env = bridge_env(memory_up, memory_up.writer, tmp_path)
    meta = {"io.modelcontextprotocol/protocolVersion": "2026-07-28"}
    call = {
        "jsonrpc": "2.0",
        "id": 7,
        "method": "tools/call",
        "params": {"name": "search\r\nX-Injected: 1", "arguments": {}, "_meta": meta},
    }
    [refused] = lines(env, call)
    assert (
        refused["id"] == 7 and "Mcp-Name cannot go in an HTTP header" in refused["error"]["message"]
    )


def test_missing_settings_are_said_as_the_cli_says_them(tmp_path: Path) -> None:
    keep = {k: v for k, v in os.environ.items() if not k.startswith(("PROJECT_MEMORY_", "MEMORY_"))}
    done = subprocess.run(
        [CLI, "mcp"], input="", capture_output=True, text=True, env={**keep, "HOME": str(tmp_path)},
        timeout=60, check=False,
    )  # fmt: skip
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.startswith("project-memory: missing the server's URL (--url or")


def test_options_go_through_the_cli_parser(memory_up: Memory, tmp_path: Path) -> None:
    env = bridge_env(memory_up, memory_up.writer, tmp_path)
    url = env.pop("PROJECT_MEMORY_URL")
    ping = {"jsonrpc": "2.0", "id": 3, "method": "ping"}
    done = subprocess.run(
        [CLI, "--url", url, "--timeout", "20", "mcp"], input=json.dumps(ping) + "\n",
        capture_output=True, text=True, env=env, timeout=60, check=True,
    )  # fmt: skip
    assert json.loads(done.stdout) == {"jsonrpc": "2.0", "id": 3, "result": {}}


@contextlib.contextmanager
def tls_front(upstream: str, directory: Path) -> Iterator[tuple[str, Path]]:
    """https://localhost:<port> in front of ``upstream`` (http://host:port), with a
    self-signed certificate; yields the URL and the certificate's file."""
    cert, key = self_signed(directory)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert, key)
    host, port = upstream.removeprefix("http://").split(":")
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(16)

    def pump(client: socket.socket) -> None:
        try:
            tls = context.wrap_socket(client, server_side=True)
        except (OSError, ssl.SSLError):
            client.close()  # a client that did not trust the certificate
            return
        with tls, socket.create_connection((host, int(port))) as plain:
            while True:
                ready, _, _ = select.select([tls, plain], [], [], 30)
                if not ready:
                    return
                for sock in ready:
                    data = sock.recv(65536)
                    if not data:
                        return
                    (plain if sock is tls else tls).sendall(data)

    def accept() -> None:
        while True:
            try:
                client, _ = listener.accept()
            except OSError:
                return
            threading.Thread(target=pump, args=(client,), daemon=True).start()

    threading.Thread(target=accept, daemon=True).start()
    try:
        yield f"https://localhost:{listener.getsockname()[1]}", cert
    finally:
        listener.close()


def test_an_https_server_is_checked_as_httpx_checks_it(memory_up: Memory, tmp_path: Path) -> None:
    """The relay's own connection checks the certificate against SSL_CERT_FILE when it is
    set, and against certifi's bundle when not (which does not hold a self-signed one)."""
    ping = {"jsonrpc": "2.0", "id": 5, "method": "ping"}
    env = bridge_env(memory_up, memory_up.writer, tmp_path)
    env = {
        k: v for k, v in env.items() if k.lower() not in ("http_proxy", "https_proxy", "all_proxy")
    }
    env = {k: v for k, v in env.items() if k not in ("SSL_CERT_FILE", "SSL_CERT_DIR")}
    with tls_front(memory_up.url, tmp_path) as (url, cert):
        env["PROJECT_MEMORY_URL"] = url
        [trusted] = lines({**env, "SSL_CERT_FILE": str(cert)}, ping)
        [untrusted] = lines(env, ping)
    assert trusted == {"jsonrpc": "2.0", "id": 5, "result": {}}
    assert untrusted["id"] == 5 and "certificate verify failed" in untrusted["error"]["message"]
