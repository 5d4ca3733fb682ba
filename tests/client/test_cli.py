"""The CLI as a person or a script runs it: exit codes, the --json envelope, tables, secrets.

``test_json_envelope_of_every_command`` compares the ``--json`` output of every command
(and of each kind of failure), with the values that change from run to run masked, against
tests/client/golden/cli-json.json: the envelope is an interface scripts depend on. After a
deliberate change, rewrite the file with PROJECT_MEMORY_UPDATE_GOLDEN=1 and review the diff.
"""

from __future__ import annotations

import json
import os
import pty
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest

from tests.client.conftest import CLI, Cli, cli_env
from tests.client.mount.helpers import Remote
from tests.e2e.conftest import Server

pytestmark = pytest.mark.e2e

GOLDEN = Path(__file__).parent / "golden" / "cli-json.json"
_TIME = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:\.\d+)?Z")
_ULID = re.compile(r"[0-9A-HJKMNP-TV-Z]{26}")
_SHA = re.compile(r"[0-9a-f]{64}")
_TURN_ETAG = re.compile(r'"t\d+"')
TRAFFIC_KEYS = ["bytes_in", "bytes_out", "hour", "project", "requests", "token_id"]


def normalise(value: Any, replace: dict[str, str]) -> Any:
    """``value`` with what differs between runs masked: times, ids, ETags, paths, ports."""
    if isinstance(value, dict):
        out = {}
        for key, item in value.items():
            if key == "traffic" and isinstance(item, list):
                same = all(isinstance(r, dict) and sorted(r) == TRAFFIC_KEYS for r in item)
                out[key] = "<traffic rows>" if same else item
            elif key == "score" and isinstance(item, float):
                out[key] = "<score>"
            else:
                out[key] = normalise(item, replace)
        return out
    if isinstance(value, list):
        return [normalise(v, replace) for v in value]
    if isinstance(value, str):
        for old, new in replace.items():
            value = value.replace(old, new)
        value = _TIME.sub("<time>", value)
        value = _ULID.sub("<ulid>", value)
        value = _SHA.sub("<sha256>", value)
        return _TURN_ETAG.sub('"<etag>"', value)
    return value


@pytest.fixture
def golden_cli(pm_server: Server, tmp_path: Path) -> Cli:
    """The CLI with a token of a project of its own (acme/golden)."""
    token = pm_server.token("writer", project="golden")
    work = tmp_path / "work"
    work.mkdir()
    return Cli(cli_env(pm_server.url, token, tmp_path / "config"), work)


def test_json_envelope_of_every_command(golden_cli: Cli, pm_server: Server, tmp_path: Path) -> None:
    cli = golden_cli
    (cli.cwd / "run.log").write_text("collected 12 items\n12 passed in 0.4s\n")
    remote = Remote(pm_server, cli.env["PROJECT_MEMORY_TOKEN"])
    store = remote.store("Golden Notes")
    remote.put(store, "/notes.md", "the golden memory\n")
    remote.close()
    cases: dict[str, tuple[list[str], str | None, int]] = {
        "whoami": (["whoami"], None, 0),
        "turn put": (
            ["turn", "put", "g-task", "0", "--summary", "## First\n\nthe golden turn"]
            + ["--meta", "model=claude", "--meta", "exit_code=0", "--meta", 'tokens:={"in": 3}'],
            None,
            0,
        ),
        "turn put next": (["turn", "put", "g-task", "next", "--summary-file", "-"], "second", 0),
        "turn get": (["turn", "get", "g-task", "0"], None, 0),
        "artifact put": (
            ["artifact", "put", "g-task", "0", "run.log", "--content-type", "text/plain"],
            None,
            0,
        ),
        "artifact get": (["artifact", "get", "g-task", "0", "run.log", "-o", "out.log"], None, 0),
        "tasks": (["tasks"], None, 0),
        "tasks --all": (["tasks", "--all", "--limit", "1"], None, 0),
        "task show": (["task", "show", "g-task"], None, 0),
        "digest": (["digest"], None, 0),
        "search": (["search", "golden", "--mode", "keyword"], None, 0),
        "usage": (["usage"], None, 0),
        "mount": (["mount", "--once", "--store", store, "mnt"], None, 0),
        "artifact delete": (["artifact", "delete", "g-task", "0", "run.log"], None, 0),
        "turn delete": (["turn", "delete", "g-task", "1"], None, 0),
        "task delete": (["task", "delete", "g-task"], None, 0),
        "turn put --artifact": (
            ["turn", "put", "g-files", "next", "--summary", "with a file"]
            + ["--artifact", "run.log:run2.log;type=text/plain"],
            None,
            0,
        ),
        "error: a bad --artifact": (["turn", "put", "g-files", "0", "--artifact", "x"], None, 2),
        "error: the API refused": (["turn", "get", "g-task", "9"], None, 1),
        "error: bad usage": (["turn", "get", "g-task"], None, 2),
        "error: settings": (["whoami", "--token", ""], None, 2),
        "error: unreachable": (["whoami", "--url", "http://127.0.0.1:9"], None, 3),
    }
    replace = {pm_server.url: "<url>", str(tmp_path): "<tmp>", store: "<store>"}
    got = {}
    env_without_token = {k: v for k, v in cli.env.items() if k != "PROJECT_MEMORY_TOKEN"}
    for name, (args, stdin, code) in cases.items():
        if name == "error: settings":
            ran = Cli(env_without_token, cli.cwd)(*args[:1], "--json")
        else:
            ran = cli(*args, "--json", input=stdin)
        assert ran.code == code, (name, ran.stdout, ran.stderr)
        envelope = ran.json()
        assert set(envelope) >= {"ok", "command"} and envelope["ok"] is (code == 0), name
        got[name] = normalise(envelope, replace)
    assert (cli.cwd / "out.log").read_text() == (cli.cwd / "run.log").read_text()
    if os.environ.get("PROJECT_MEMORY_UPDATE_GOLDEN"):
        GOLDEN.parent.mkdir(exist_ok=True)
        GOLDEN.write_text(json.dumps(got, indent=2, ensure_ascii=False) + "\n")
    assert got == json.loads(GOLDEN.read_text())


def test_exit_codes(cli: Cli) -> None:
    assert cli("turn", "put", "x-codes", "0", "--summary", "ok").code == 0
    ok = cli("turn", "get", "x-codes", "0")
    assert ok.code == 0 and ok.stderr == ""
    refused = cli("turn", "get", "x-codes", "5")
    assert refused.code == 1 and refused.stdout == ""
    # The API's message, on one line, with the request's correlation id.
    assert re.fullmatch(
        r"project-memory: 404 turn 5 of task x-codes not found \(correlation id [0-9A-Z]{26}\)\n",
        refused.stderr,
    )
    invalid = cli("turn", "put", "x-codes", "1", "--meta", 'exit_code:="zero"')
    assert invalid.code == 1 and invalid.stderr.count("\n") == 1
    assert "422 body.meta.exit_code: " in invalid.stderr
    for bad in (["turn", "get", "x-codes"], ["turn", "get", "x-codes", "-1"], ["nope"]):
        usage = cli(*bad)
        assert usage.code == 2 and "usage: project-memory" in usage.stderr, bad
    assert cli("artifact", "put", "x-codes", "0", "missing.bin").code == 2
    down = cli("tasks", "--url", "http://127.0.0.1:9")
    assert down.code == 3 and "cannot reach the server" in down.stderr
    # Settings that cannot work are bad usage too: a config file others may read.
    config = Path(cli.env["XDG_CONFIG_HOME"]) / "project-memory" / "config.toml"
    config.parent.mkdir(parents=True)
    config.write_text(f'token = "{cli.env["PROJECT_MEMORY_TOKEN"]}"\n')
    config.chmod(0o644)
    exposed = cli("tasks")
    assert exposed.code == 2 and "chmod 600" in exposed.stderr
    config.chmod(0o600)
    env = {k: v for k, v in cli.env.items() if k != "PROJECT_MEMORY_TOKEN"}
    from_file = Cli(env, cli.cwd)("turn", "get", "x-codes", "0")
    assert from_file.code == 0, from_file.stderr


def test_the_token_is_never_printed(cli: Cli, writer: str) -> None:
    outputs = []
    for args in (
        ["whoami", "--json"],
        ["whoami"],
        ["whoami", "--token", writer, "--json"],
        ["turn", "get", "x-secret", "0", "--token", writer],
        ["turn", "get", "x-secret", "0", "--token", writer, "--json"],
        ["tasks", "--url", "http://127.0.0.1:9", "--token", writer, "--json"],
        ["turn", "get", "--token", writer],
    ):
        ran = cli(*args)
        outputs.append(ran.stdout + ran.stderr)
    assert all(writer not in text for text in outputs)
    assert "tok_" in outputs[1]  # whoami names the token by its id


def test_tables_and_the_progress_bar_on_a_terminal(cli: Cli) -> None:
    cli("turn", "put", "x-table", "0", "--meta", "model=claude", "--summary", "## Table\n\ntext")
    shown = cli("task", "show", "x-table")
    assert shown.code == 0
    assert re.search(r"^TURN\s+UPDATED\s+MODEL\s+EXIT\s+ARTIFACTS$", shown.stdout, re.M)
    assert re.search(r"^0\s+\S+Z\s+claude\s+-\s+-$", shown.stdout, re.M)
    turn = cli("turn", "get", "x-table", "0").stdout
    assert re.search(r"^model\s+claude$", turn, re.M) and turn.endswith("## Table\n\ntext\n")
    big = cli.cwd / "big.bin"
    big.write_bytes(os.urandom(3 * 1024 * 1024))
    # stderr on a pseudo-terminal: the bar is drawn there; piped (as above), never.
    leader, follower = pty.openpty()
    try:
        run = subprocess.run(
            [CLI, "artifact", "put", "x-table", "0", str(big)],
            env=cli.env,
            stdout=subprocess.PIPE,
            stderr=follower,
            timeout=60,
            check=False,
        )
        os.close(follower)
        follower = -1
        drawn = b""
        while True:
            try:
                block = os.read(leader, 65536)
            except OSError:
                break
            if not block:
                break
            drawn += block
    finally:
        os.close(leader)
        if follower >= 0:
            os.close(follower)
    assert run.returncode == 0
    assert b"big.bin  3.0 MiB / 3.0 MiB  100% [########################]" in drawn
    quiet = cli("artifact", "get", "x-table", "0", "big.bin", "-o", "copy.bin")
    assert quiet.code == 0 and "MiB" not in quiet.stderr
    assert (cli.cwd / "copy.bin").read_bytes() == big.read_bytes()


def test_turn_delete_and_artifact_delete(cli: Cli) -> None:
    (cli.cwd / "env.txt").write_text("TOKEN=x\n")
    assert cli("turn", "put", "x-del", "0", "--summary", "kept").code == 0
    assert cli("turn", "put", "x-del", "1", "--summary", "a secret").code == 0
    assert cli("artifact", "put", "x-del", "0", "env.txt").code == 0
    stale = cli("artifact", "delete", "x-del", "0", "env.txt", "--if-match", '"0000"')
    assert stale.code == 1 and "412" in stale.stderr
    gone = cli("artifact", "delete", "x-del", "0", "env.txt", "--json")
    assert gone.code == 0 and gone.json()["data"]["deleted"] is True, gone.stdout
    assert cli("turn", "delete", "x-del", "1").code == 0
    shown = cli("task", "show", "x-del", "--json").json()["data"]
    assert [t["turn"] for t in shown["turns"]] == [0] and shown["turns"][0]["artifacts"] == []
    assert cli("turn", "delete", "x-del", "1").code == 1  # 404


def test_turn_put_with_artifacts_and_back(cli: Cli) -> None:
    work = cli.cwd
    (work / "run.log").write_text("collected 3 items\n3 passed\n")
    (work / "out").mkdir()
    (work / "out" / "report.html").write_text("<p>green</p>\n")
    (work / "a:b.bin").write_bytes(bytes(range(256)) * 64)
    (work / "notes.md").write_text("# notes\n")
    ran = cli(
        "turn", "put", "x-art", "next", "--summary", "## With files", "--meta", "model=m",
        "--artifact", "run.log",
        "--artifact", "out/report.html:report.html",
        "--artifact", "a:b.bin:ab.bin;type=application/vnd.test+json; charset=utf-8",
        "--artifact", str(work / "notes.md"),
        "--json",
    )  # fmt: skip
    assert ran.code == 0, ran.stdout + ran.stderr
    stored = {a["name"]: (a["content_type"], a["size"]) for a in ran.json()["data"]["artifacts"]}
    assert stored == {
        "run.log": ("text/plain; charset=utf-8", 27),  # what agents upload most
        "report.html": ("text/html", 13),
        "ab.bin": ("application/vnd.test+json; charset=utf-8", 16384),
        "notes.md": ("text/markdown; charset=utf-8", 8),
    }
    turn = cli("turn", "get", "x-art", "0")
    assert turn.code == 0 and re.search(r"^report\.html\s+text/html\s+13\s", turn.stdout, re.M)
    for name, source in (
        ("run.log", "run.log"),
        ("report.html", "out/report.html"),
        ("ab.bin", "a:b.bin"),
        ("notes.md", "notes.md"),
    ):
        got = cli("artifact", "get", "x-art", "0", name, "-o", f"copy-{name}")
        assert got.code == 0, got.stderr
        assert (work / f"copy-{name}").read_bytes() == (work / source).read_bytes()
    # A second write replaces one artifact and keeps the others; the human output names them.
    (work / "run.log").write_text("4 passed\n")
    again = cli("turn", "put", "x-art", "0", "--summary", "redone", "--artifact", "run.log")
    assert again.code == 0, again.stderr
    assert again.stdout.endswith("\nwith run.log (9 bytes, text/plain; charset=utf-8)\n")
    names = [
        a["name"] for a in cli("turn", "get", "x-art", "0", "--json").json()["data"]["artifacts"]
    ]
    assert sorted(names) == ["ab.bin", "notes.md", "report.html", "run.log"]


def test_turn_put_refuses_bad_artifacts_before_sending(cli: Cli) -> None:
    work = cli.cwd
    (work / "ok.txt").write_text("ok\n")
    (work / "my file.txt").write_text("spaces\n")
    (work / "dir").mkdir()
    os.mkfifo(work / "pipe")
    with open(work / "huge.bin", "wb") as fh:  # sparse: one byte over the limit
        fh.truncate(50 * 1024 * 1024 + 1)
    many = [arg for i in range(33) for arg in ("--artifact", f"ok.txt:n{i}.txt")]
    cases = [
        (["--artifact", "missing.bin"], "--artifact missing.bin: No such file or directory"),
        (["--artifact", "ok.txt/inner"], "--artifact ok.txt/inner: Not a directory"),
        (["--artifact", "dir"], "--artifact dir: a directory"),
        (["--artifact", "pipe"], "--artifact pipe: not a regular file"),
        (["--artifact", "huge.bin"], "52428801 bytes, over the 52428800 bytes (50 MiB)"),
        (["--artifact", "my file.txt"], "'my file.txt' must match [A-Za-z0-9._-]{1,128} (give"),
        (["--artifact", "ok.txt:../x"], "the artifact name '../x' must match"),
        (["--artifact", "ok.txt:.."], "'.' and '..' are not artifact names"),
        (["--artifact", "ok.txt:"], "no NAME after ':'"),
        (["--artifact", ":x.txt"], "no PATH"),
        (["--artifact", "ok.txt;type=text"], "'text' is not a media type"),
        (["--artifact", "ok.txt", "--artifact", "dir/../ok.txt"], "are both named 'ok.txt'"),
        (many, "33 --artifact options: a turn takes at most 32"),
    ]
    for extra, message in cases:
        # An unreachable server: exit 2, not 3, shows nothing was sent.
        ran = cli("turn", "put", "x-bad-art", "0", "--url", "http://127.0.0.1:9", *extra)
        assert ran.code == 2 and message in ran.stderr, (extra, ran.stderr)
        assert (
            ran.stderr.startswith("project-memory: --artifact")
            or "--artifact options" in ran.stderr
        )
    envelope = cli("turn", "put", "x-bad-art", "0", "--artifact", "missing.bin", "--json")
    assert envelope.code == 2 and envelope.json()["error"]["kind"] == "usage"
    assert cli("task", "show", "x-bad-art").code == 1  # 404: nothing was written


def test_next_turn_racers_each_send_their_files_again(cli: Cli) -> None:
    """Writers that lose the race for a number resend the turn and its files (read again from
    the start) under the next one: every turn holds its own writer's file, whole."""
    racers = 6
    for i in range(racers):
        (cli.cwd / f"who-{i}.txt").write_text(f"racer {i}\n" * 5000)
    procs = [
        subprocess.Popen(
            [CLI, "turn", "put", "x-race", "next", "--summary", f"racer {i}"]
            + ["--artifact", f"who-{i}.txt:who.txt", "--json"],
            env=cli.env,
            cwd=cli.cwd,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for i in range(racers)
    ]
    turns = []
    for proc in procs:
        out, err = proc.communicate(timeout=60)
        assert proc.returncode == 0, err
        turns.append(json.loads(out)["data"]["turn"])
    assert sorted(turns) == list(range(racers))
    for turn in range(racers):
        summary = cli("turn", "get", "x-race", str(turn), "--json").json()["data"]["summary_md"]
        got = cli("artifact", "get", "x-race", str(turn), "who.txt", "-o", f"got-{turn}.txt")
        assert got.code == 0, got.stderr
        assert (cli.cwd / f"got-{turn}.txt").read_text() == f"{summary}\n" * 5000


TEXT_TYPES = {
    "run.log": "text/plain; charset=utf-8",
    "notes.txt": "text/plain; charset=utf-8",
    "README.md": "text/markdown; charset=utf-8",
    "fix.diff": "text/x-diff; charset=utf-8",
    "fix.patch": "text/x-diff; charset=utf-8",
    "data.json": "application/json",
}


def test_the_files_agents_upload_most_get_a_text_type(cli: Cli) -> None:
    """So that the console previews them, instead of offering application/octet-stream."""
    assert cli("turn", "put", "x-types", "0", "--summary", "types").code == 0
    for name, kind in TEXT_TYPES.items():
        (cli.cwd / name).write_text("{}\n" if name.endswith(".json") else "text\n")
        put = cli("artifact", "put", "x-types", "0", name, "--json")
        assert put.code == 0 and put.json()["data"]["content_type"] == kind, (name, put.stdout)
    args = [a for name in TEXT_TYPES for a in ("--artifact", name)]
    ran = cli("turn", "put", "x-types", "1", "--summary", "again", *args, "--json")
    stored = {a["name"]: a["content_type"] for a in ran.json()["data"]["artifacts"]}
    assert stored == TEXT_TYPES
    explicit = cli("artifact", "put", "x-types", "0", "run.log", "--content-type", "text/x-log")
    assert explicit.code == 0 and "text/x-log" in explicit.stdout
    helps = cli("artifact", "put", "--help").stdout + cli("turn", "put", "--help").stdout
    flat = " ".join(helps.split()).replace("- ", "-")  # as argparse wraps it
    assert flat.count(".log, .txt, .md, .diff, .patch, .json") == 2, helps
