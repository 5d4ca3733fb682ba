"""A 50 MiB artifact (the server's limit) up and down in constant memory.

The client runs in a subprocess that reports its own peak RSS (VmHWM, the high-water mark
of the process's own memory: getrusage's maxrss would start at the parent's) after a small
warm-up transfer and after the 50 MiB went up and came back down: the growth must stay a
small fraction of the artifact, so neither direction holds the body in memory.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.e2e.conftest import Server

pytestmark = pytest.mark.e2e

SIZE = 50 * 1024 * 1024
MAX_GROWTH_KIB = 12 * 1024  # a quarter of the artifact; buffering it would need 50 MiB

SCRIPT = """
import json, sys
from project_memory_client import Client

url, token, warm, src, dst = sys.argv[1:6]

def peak_kib():
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmHWM:"):
                return int(line.split()[1])

with Client(url, token) as pm:
    pm.put_turn("big", 0)
    pm.put_artifact("big", 0, "warm.bin", warm)
    pm.get_artifact("big", 0, "warm.bin", dst)
    base = peak_kib()
    record = pm.put_artifact("big", 0, "big.bin", src)
    up = peak_kib()
    info = pm.get_artifact("big", 0, "big.bin", dst)
    down = peak_kib()
print(json.dumps({"base": base, "up": up, "down": down, "size": record.size,
                  "etag": record.etag, "got": info.size}))
"""


def _write(path: Path, size: int) -> str:
    digest = hashlib.sha256()
    with open(path, "wb") as fh:
        left = size
        while left:
            block = os.urandom(min(left, 1024 * 1024))
            fh.write(block)
            digest.update(block)
            left -= len(block)
    return digest.hexdigest()


def _round_trip(script: str, label: str, server: Server, token: str, tmp_path: Path) -> None:
    """Run ``script`` (argv: url, token, warm, src, dst) on a 2 MiB warm-up file and a 50 MiB
    source; check what it reports came back whole, and its peak RSS growth."""
    warm, src, dst = tmp_path / "warm.bin", tmp_path / "src.bin", tmp_path / "dst.bin"
    _write(warm, 2 * 1024 * 1024)
    sha = _write(src, SIZE)
    env = {k: v for k, v in os.environ.items() if not k.startswith("PROJECT_MEMORY_")}
    env["XDG_CONFIG_HOME"] = str(tmp_path / "config")  # no config file of the person running
    run = subprocess.run(
        [sys.executable, "-c", script, server.url, token, str(warm), str(src), str(dst)],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
        check=False,
    )
    assert run.returncode == 0, run.stderr
    got = json.loads(run.stdout)
    assert got["size"] == got["got"] == SIZE and got["etag"] == f'"{sha}"'
    assert hashlib.sha256(dst.read_bytes()).hexdigest() == sha
    print(
        f"{label} peak RSS: {got['base']} KiB after warm-up, {got['up']} after 50 MiB up,"
        f" {got['down']} after down"
    )
    assert got["down"] - got["base"] < MAX_GROWTH_KIB, got


def test_fifty_mib_up_and_down_in_constant_memory(
    pm_server: Server, writer: str, tmp_path: Path
) -> None:
    _round_trip(SCRIPT, "client", pm_server, writer, tmp_path)


CLI_SCRIPT = """
import contextlib, io, json, os, sys
from project_memory_client.cli import main

url, token, warm, src, dst = sys.argv[1:6]
os.environ.update(PROJECT_MEMORY_URL=url, PROJECT_MEMORY_TOKEN=token)

def peak_kib():
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmHWM:"):
                return int(line.split()[1])

def cli(*args):
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = main([*args, "--json"])
    assert code == 0, out.getvalue()
    return json.loads(out.getvalue())["data"]

cli("turn", "put", "big-cli", "0", "--artifact", warm + ":warm.bin")
cli("artifact", "get", "big-cli", "0", "warm.bin", "-o", dst)
base = peak_kib()
turn = cli("turn", "put", "big-cli", "next", "--artifact", src + ":big.bin")
up = peak_kib()
info = cli("artifact", "get", "big-cli", str(turn["turn"]), "big.bin", "-o", dst)
down = peak_kib()
[stored] = [a for a in turn["artifacts"] if a["name"] == "big.bin"]
print(json.dumps({"base": base, "up": up, "down": down, "size": stored["size"],
                  "etag": info["etag"], "got": info["size"]}))
"""


def test_fifty_mib_through_the_cli_in_constant_memory(
    pm_server: Server, writer: str, tmp_path: Path
) -> None:
    """``turn put --artifact`` streams the file from disk, as ``artifact get`` streams it back."""
    _round_trip(CLI_SCRIPT, "CLI", pm_server, writer, tmp_path)
