"""``project-memory search --mode``: the mode reaches the server, the answer's modes are in
the --json envelope, and a fall back to keywords is printed (a real server each)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.client.conftest import Cli, cli_env
from tests.e2e.conftest import Server, serving


def _cli(server: Server, tmp_path: Path) -> Cli:
    work = tmp_path / "work"
    work.mkdir()
    return Cli(cli_env(server.url, server.token("writer", project="modes"), tmp_path / "cfg"), work)


@pytest.fixture(scope="module")
def keyword_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    yield from serving(tmp_path_factory, "no-embedder", env_extra={"MEMORY_EMBEDDER": "off"})


def test_search_mode_reaches_the_server(pm_server: Server, tmp_path: Path) -> None:
    cli = _cli(pm_server, tmp_path)
    put = cli("turn", "put", "auth", "0", "--summary", "The session TTL expired the login cookie.")
    assert put.code == 0, put.stderr
    deadline = time.monotonic() + 60
    while True:  # the server embeds after the answer
        ran = cli("search", "authentication", "--mode", "semantic", "--json")
        assert ran.code == 0, ran.stderr
        data = ran.json()["data"]
        if data["hits"] or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert data["modes"] == ["semantic"] and data["hits"][0]["task_id"] == "auth"
    keyword = cli("search", "authentication", "--mode", "keyword", "--json").json()["data"]
    assert keyword["modes"] == ["keyword"] and keyword["hits"] == []
    assert cli("search", "x", "--mode", "fuzzy").code == 2


def test_search_prints_a_fallback_to_keywords(keyword_server: Server, tmp_path: Path) -> None:
    cli = _cli(keyword_server, tmp_path)
    assert cli("turn", "put", "t", "0", "--summary", "npm cache").code == 0
    ran = cli("search", "npm", "--mode", "hybrid")
    assert ran.code == 0 and "t #0" in ran.stdout
    assert "keyword results only: no embedder is configured" in ran.stdout
    data = cli("search", "npm", "--mode", "hybrid", "--all", "--json").json()["data"]
    assert data["modes"] == ["keyword"] and "no embedder" in data["fallback"]
