"""What the CLI prints on a terminal: text others wrote is shown, never obeyed.

Stored summaries, meta values, snippets, project.md and a server's own error messages reach
a person's terminal. Each command runs here on a real pseudo-terminal (raw, so the bytes read
are the bytes written) against the real server, or against a hostile one that answers with
escape sequences; the same commands piped, and with ``--json``, keep the text as it is.
"""

from __future__ import annotations

import json
import os
import pty
import re
import subprocess
import threading
import tty
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from project_memory_client.terminal import visible

from tests.client.conftest import CLI, Cli, cli_env
from tests.client.mount.helpers import Remote
from tests.e2e.conftest import Server

# Set the clipboard (OSC 52), clear the screen and home the cursor, ring the bell, the
# 8-bit CSI (a C1 control), a right-to-left override, DEL, and a carriage return that
# would draw over the start of its line.
CLIPBOARD = "\x1b]52;c;cm0gLXJmIH4=\x07"
HOSTILE = CLIPBOARD + "\x1b[2J\x1b[H\x9b31m\u202etxt.exe\u202c\x7f" + "safe\rrm -rf ~"
SHOWN = "^[]52;c;cm0gLXJmIH4=^G^[[2J^[[H<U+009B>31m<U+202E>txt.exe<U+202C>^?safe^Mrm -rf ~"
# No byte of a control the rule makes visible, in UTF-8 (a kept tab, newline or CRLF aside).
_OBEYED = re.compile(
    rb"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f]|\r(?!\n)|\xc2[\x80-\x9f]"
    rb"|\xd8\x9c|\xe2\x80[\x8e\x8f\xaa-\xae]|\xe2\x81[\xa6-\xa9]"
)

pytestmark = pytest.mark.e2e


@pytest.mark.parametrize(
    ("text", "shown"),
    [
        ("plain text, é and 漢字 🙂", "plain text, é and 漢字 🙂"),
        ("a\tb\nc\r\nd", "a\tb\nc\r\nd"),  # tab, newline and a CRLF line end are kept
        ("\x00\x01\x07\x08\x0b\x0c\x0e\x1b\x1f", "^@^A^G^H^K^L^N^[^_"),
        ("over\rwritten", "over^Mwritten"),
        ("ends\r", "ends^M"),
        ("\x7f", "^?"),
        ("\x80\x85\x9b\x9f", "<U+0080><U+0085><U+009B><U+009F>"),
        ("\u061c\u200e\u200f", "<U+061C><U+200E><U+200F>"),
        ("\u202a\u202b\u202c\u202d\u202e", "<U+202A><U+202B><U+202C><U+202D><U+202E>"),
        ("\u2066\u2067\u2068\u2069", "<U+2066><U+2067><U+2068><U+2069>"),
        ("lone \ud800 and \udfff", "lone <U+D800> and <U+DFFF>"),
        (HOSTILE, SHOWN),
    ],
)
def test_the_rule(text: str, shown: str) -> None:
    assert visible(text) == shown
    assert _OBEYED.search(visible(text).encode("utf-8", "surrogatepass")) is None


def on_terminal(cli: Cli, *args: str, env: dict[str, str] | None = None) -> tuple[int, bytes]:
    """Run the CLI with stdout and stderr on one raw pseudo-terminal: its exit status and
    every byte it wrote there."""
    leader, follower = pty.openpty()
    tty.setraw(follower)  # no "\n" -> "\r\n": what is read is what the CLI wrote
    try:
        proc = subprocess.Popen(
            [CLI, *args],
            env=env or cli.env,
            cwd=cli.cwd,
            stdin=subprocess.DEVNULL,
            stdout=follower,
            stderr=follower,
        )
        os.close(follower)
        follower = -1
        written = b""
        while True:
            try:
                block = os.read(leader, 65536)
            except OSError:  # EIO: the CLI closed its end
                break
            if not block:
                break
            written += block
        return proc.wait(timeout=60), written
    finally:
        os.close(leader)
        if follower >= 0:
            os.close(follower)


def piped(cli: Cli, *args: str) -> bytes:
    """What the CLI writes on stdout to a pipe, byte for byte."""
    ran = subprocess.run([CLI, *args], env=cli.env, cwd=cli.cwd, capture_output=True, check=True)
    return ran.stdout


@pytest.fixture
def own_cli(pm_server: Server, tmp_path: Path) -> Cli:
    """The CLI with a tenant of its own (term/escapes): its digest and search hold only what
    this module writes, and the other modules' counts of tenant acme are theirs."""
    work = tmp_path / "work"
    work.mkdir()
    token = pm_server.token("writer", tenant="term", project="escapes")
    return Cli(cli_env(pm_server.url, token, tmp_path / "config"), work)


def test_stored_text_is_shown_not_obeyed_on_a_terminal(own_cli: Cli, pm_server: Server) -> None:
    cli = own_cli
    summary = f"## Escapes\n\nzebra {HOSTILE}\tend\r\nlast line\n"
    put = cli("turn", "put", "esc-task", "0", "--summary", summary, "--meta", f"model={HOSTILE}")
    assert put.code == 0, put.stderr
    remote = Remote(pm_server, cli.env["PROJECT_MEMORY_TOKEN"])
    store = remote.store("Escapes")
    remote.put(store, "/notes.md", f"zebra notes {HOSTILE}\n")
    remote.close()
    for args in (
        ["turn", "get", "esc-task", "0"],
        ["task", "show", "esc-task"],
        ["search", "zebra"],
        ["digest"],
        ["digest", "--max-bytes", "100000"],
    ):
        code, written = on_terminal(cli, *args)
        assert code == 0, (args, written)
        assert _OBEYED.search(written) is None, (args, written)
        assert "^[]52;c;" in written.decode("utf-8"), (args, written)
    code, written = on_terminal(cli, "turn", "get", "esc-task", "0")
    text = written.decode("utf-8")
    assert f"## Escapes\n\nzebra {SHOWN}\tend\r\nlast line\n" in text  # tab and CRLF kept
    assert re.search(r"^model\s+\^\[\]52;c;", text, re.M)
    # Not a terminal: the text as it was stored, for a file or the next program.
    assert piped(cli, "turn", "get", "esc-task", "0").endswith(summary.encode())
    assert summary.rstrip("\n").encode() in piped(cli, "digest")
    # --json is the same bytes on a terminal as in a pipe, and holds the text unchanged.
    for args in (["turn", "get", "esc-task", "0"], ["search", "zebra"], ["digest"]):
        code, written = on_terminal(cli, *args, "--json")
        assert code == 0 and written == piped(cli, *args, "--json"), args
    data = json.loads(on_terminal(cli, "turn", "get", "esc-task", "0", "--json")[1])["data"]
    assert data["summary_md"] == summary and data["meta"]["model"] == HOSTILE


class Hostile(BaseHTTPRequestHandler):
    """A server that answers every request with ``answer`` (status, body)."""

    answer: tuple[int, bytes] = (404, b"{}")

    def _reply(self) -> None:
        status, body = self.answer
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    do_GET = do_PUT = do_POST = do_DELETE = _reply

    def log_message(self, format: str, *args: Any) -> None:
        pass


@pytest.fixture
def hostile(tmp_path: Path) -> Iterator[tuple[Cli, type[Hostile]]]:
    handler = type("Answer", (Hostile,), {})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    work = tmp_path / "work"
    work.mkdir()
    url = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        yield Cli(cli_env(url, "pm_anything", tmp_path / "config"), work), handler
    finally:
        server.shutdown()
        server.server_close()


def test_a_hostile_servers_messages_are_shown_not_obeyed(
    hostile: tuple[Cli, type[Hostile]],
) -> None:
    cli, server = hostile
    server.answer = (404, json.dumps({"detail": f"not found {HOSTILE}"}).encode())
    code, written = on_terminal(cli, "turn", "get", "t", "0")
    assert code == 1 and _OBEYED.search(written) is None, written
    # One line, as every API error is: the carriage return was whitespace to that rule.
    one_line = SHOWN.replace("^M", " ")
    assert written.decode("utf-8") == f"project-memory: 404 not found {one_line}\n"
    who = {"token_id": "tok_1", "name": HOSTILE, "role": "writer", "tenant": "a", "project": "b"}
    server.answer = (200, json.dumps(who).encode())
    code, written = on_terminal(cli, "whoami")
    assert code == 0 and _OBEYED.search(written) is None, written
    assert SHOWN in written.decode("utf-8")


def test_a_lone_surrogate_from_a_server_is_json_not_a_traceback(
    hostile: tuple[Cli, type[Hostile]],
) -> None:
    """JSON may carry "\\ud800", which no UTF-8 can: --json sends it on as that escape."""
    cli, server = hostile
    server.answer = (404, b'{"detail": "bad \\ud800 path"}')
    ran = cli("turn", "get", "t", "0", "--json")
    assert ran.code == 1 and ran.stderr == "", ran.stderr
    assert '"detail": "bad \\ud800 path"' in ran.stdout
    assert ran.json()["error"]["detail"] == "bad \ud800 path"
    shown = cli("turn", "get", "t", "0")
    assert shown.code == 1 and shown.stderr == "project-memory: 404 bad <U+D800> path\n"


def test_the_mounts_log_lines_are_shown_not_obeyed(own_cli: Cli, pm_server: Server) -> None:
    """A file someone named with an escape sequence is named in the mount's log lines."""
    cli = own_cli
    remote = Remote(pm_server, cli.env["PROJECT_MEMORY_TOKEN"])
    store = remote.store("Mounted")
    remote.close()
    first = cli("mount", "--once", "--store", store, "mnt")
    assert first.code == 0, first.stderr
    folder = cli.cwd / "mnt" / "mounted"  # the store's name as a slug
    (folder / f"odd{CLIPBOARD}\x1b[2J.md").write_text("text\n")
    code, written = on_terminal(cli, "mount", "--once", "--store", store, "mnt")
    assert _OBEYED.search(written) is None, written
    assert "odd^[]52;c;cm0gLXJmIH4=^G^[[2J.md" in written.decode("utf-8"), written
