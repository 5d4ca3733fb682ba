"""``agent install`` and ``agent uninstall`` in a checkout someone else prepared.

A repository's content is whoever committed it: its ``.claude/`` may be a link to the
user's own settings, its JSON may be of the wrong shape, and the URL the user has may carry
a password. Install writes inside the repository only, writes every file or none, keeps
each file's mode, and writes no secret into a file that may be committed.
"""

from __future__ import annotations

import json
import os
import re
import stat
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from project_memory_client.agents import install as installer
from project_memory_client.agents.install import InstallError, install, installed, uninstall

from app.services.mcp.tools import TOOLS
from tests.agents.conftest import git_repo

CLI = str(Path(sys.executable).parent / "project-memory")
URL = "http://127.0.0.1:8123"
SECRET_FILES = (
    ".claude/settings.local.json",
    ".mcp.json",
    ".cursor/mcp.json",
    ".codex/config.toml",
)


def written(root: Path) -> str:
    """The text of every file under ``root`` outside .git."""
    return "\n".join(
        p.read_text()
        for p in sorted(root.rglob("*"))
        if p.is_file() and not p.is_symlink() and ".git" not in p.relative_to(root).parts
    )


def snapshot(*roots: Path) -> dict[str, tuple[bytes, int]]:
    """Every file under ``roots`` (the repository's .git included): bytes and mode."""
    out = {}
    for root in roots:
        for p in sorted(root.rglob("*")):
            if p.is_file() and not p.is_symlink():
                out[str(p)] = (p.read_bytes(), stat.S_IMODE(p.stat().st_mode))
    return out


@pytest.fixture(autouse=True)
def state_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Install keeps what it found in each file in the state directory: the test's own."""
    state = tmp_path / "state"
    monkeypatch.setenv("PROJECT_MEMORY_STATE_DIR", str(state))
    return state


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    root = tmp_path / "repo"
    git_repo(root)
    return root


@pytest.fixture
def umask_077() -> Iterator[None]:
    old = os.umask(0o077)
    try:
        yield
    finally:
        os.umask(old)


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


# -- modes ----------------------------------------------------------------------------------
def test_each_files_mode_is_kept_and_new_files_are_private(repo: Path, umask_077: None) -> None:
    (repo / ".claude").mkdir()
    local = repo / ".claude" / "settings.local.json"
    local.write_text(json.dumps({"env": {"API_KEY": "kept-private"}}))
    local.chmod(0o600)
    mcp = repo / ".mcp.json"
    mcp.write_text(json.dumps({"mcpServers": {"other": {"command": "x"}}}))
    mcp.chmod(0o640)
    install("claude-code", repo, url=URL)
    assert _mode(local) == 0o600 and _mode(mcp) == 0o640
    assert _mode(repo / ".claude" / "settings.json") == 0o600  # new: private
    install("codex", repo, url=URL)
    install("cursor", repo, url=URL)
    for rel in (".codex/config.toml", ".codex/hooks.json", ".cursor/mcp.json"):
        assert _mode(repo / rel) == 0o600, rel
    (repo / ".codex" / "config.toml").chmod(0o600)
    (repo / ".codex" / "config.toml").write_text(
        (repo / ".codex" / "config.toml").read_text() + '\nmodel = "o5"\n'
    )
    (repo / ".cursor" / "mcp.json").write_text(
        json.dumps({"mcpServers": {"other": {"url": "x"}, "project-memory": {"url": "y"}}})
    )
    for agent in ("claude-code", "codex", "cursor"):
        uninstall(agent, repo)
    assert _mode(local) == 0o600 and _mode(mcp) == 0o640
    assert _mode(repo / ".codex" / "config.toml") == 0o600
    assert _mode(repo / ".cursor" / "mcp.json") == 0o600


def test_a_file_others_may_read_stays_so(repo: Path) -> None:
    settings = repo / ".claude" / "settings.json"
    settings.parent.mkdir()
    settings.write_text("{}")
    settings.chmod(0o664)
    install("claude-code", repo, url=URL)
    assert _mode(settings) == 0o664


# -- links ----------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("agent", "linked", "inside"),
    [
        ("claude-code", ".claude", "settings.json"),
        ("cursor", ".cursor", "mcp.json"),
        ("codex", ".codex", "config.toml"),
        ("codex", ".codex", "hooks.json"),
    ],
)
def test_a_linked_agent_directory_is_refused(
    repo: Path, tmp_path: Path, agent: str, linked: str, inside: str
) -> None:
    """A checkout whose .claude/ is a link to the user's own ~/.claude would have install
    rewrite the user's global settings."""
    outside = tmp_path / "home" / linked
    outside.mkdir(parents=True)
    (outside / inside).write_text('{"hooks": {}}\n' if inside.endswith(".json") else 'a = "b"\n')
    (repo / linked).symlink_to(outside)
    before = snapshot(outside, repo)
    with pytest.raises(InstallError, match="symbolic link"):
        install(agent, repo, url=URL)
    with pytest.raises(InstallError, match="symbolic link"):
        uninstall(agent, repo)
    assert snapshot(outside, repo) == before


def test_a_dangling_link_and_a_linked_file_are_refused(repo: Path, tmp_path: Path) -> None:
    (repo / ".claude").symlink_to(tmp_path / "nowhere")
    with pytest.raises(InstallError, match="symbolic link"):
        install("claude-code", repo, url=URL)
    assert not (tmp_path / "nowhere").exists()
    (repo / ".claude").unlink()
    secret = tmp_path / "global-codex.toml"
    secret.write_text('token = "pm_private_value_of_the_user"\n')
    (repo / ".codex").mkdir()
    (repo / ".codex" / "config.toml").symlink_to(secret)
    before = snapshot(repo, tmp_path / "global-codex.toml")
    with pytest.raises(InstallError, match="symbolic link"):
        install("codex", repo, url=URL)
    assert snapshot(repo, tmp_path / "global-codex.toml") == before
    assert "pm_private" not in written(repo)


def test_status_does_not_follow_links(repo: Path, tmp_path: Path) -> None:
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    install("claude-code", outside, url=URL)
    (repo / ".claude").symlink_to(outside / ".claude")
    (repo / ".mcp.json").symlink_to(outside / ".mcp.json")
    assert installed("claude-code", repo) == {"hooks": False, "mcp": False, "permission": False}


# -- wrong shapes: all or nothing -----------------------------------------------------------
DEEP = "[" * 100_000 + "]" * 100_000
WRONG = [
    ("claude-code", ".claude/settings.json", '{"hooks": []}', "hooks"),
    ("claude-code", ".claude/settings.json", '{"hooks": {"Stop": {}}}', "hooks.Stop"),
    ("claude-code", ".claude/settings.json", '{"hooks": {"Stop": [{"hooks": 5}]}}', "hooks"),
    ("claude-code", ".claude/settings.json", '{"hooks": {"Stop": ["x"]}}', "hooks.Stop[0]"),
    ("claude-code", ".claude/settings.local.json", '{"permissions": []}', "permissions"),
    (
        "claude-code",
        ".claude/settings.local.json",
        '{"permissions": {"allow": "x"}}',
        "permissions.allow",
    ),
    ("claude-code", ".claude/settings.local.json", '{"enabledMcpjsonServers": {}}', "enabled"),
    ("claude-code", ".mcp.json", '{"mcpServers": []}', "mcpServers"),
    ("claude-code", ".mcp.json", '{"mcpServers": {"project-memory": 3}}', "mcpServers"),
    ("claude-code", ".mcp.json", DEEP, "nested"),
    ("cursor", ".cursor/mcp.json", '{"mcpServers": "x"}', "mcpServers"),
    ("codex", ".codex/hooks.json", '{"hooks": [1]}', "hooks"),
    ("codex", ".codex/config.toml", "mcp_servers = 5\n", "mcp_servers"),
]


@pytest.mark.parametrize(("agent", "rel", "text", "named"), WRONG)
def test_a_wrong_shape_is_refused_and_nothing_is_written(
    repo: Path, agent: str, rel: str, text: str, named: str
) -> None:
    # Files written before the wrong one in install's order, and the exclude file, stay too.
    (repo / ".claude").mkdir()
    (repo / ".claude" / "settings.json").write_text('{"model": "opus"}\n')
    path = repo / rel
    path.parent.mkdir(exist_ok=True)
    path.write_text(text)
    before = snapshot(repo)
    with pytest.raises(InstallError, match=re.escape(named)):
        install(agent, repo, url=URL)
    assert snapshot(repo) == before
    if named != "nested":  # an uninstall of that shape has nothing of ours to take
        uninstall(agent, repo)
        assert snapshot(repo) == before


def test_the_cli_says_what_is_wrong_in_one_line(repo: Path, tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PROJECT_MEMORY_")}
    env.update(HOME=str(tmp_path), XDG_CONFIG_HOME=str(tmp_path / "cfg"), PROJECT_MEMORY_URL=URL)
    (repo / ".claude").mkdir()
    for rel, text in ((".claude/settings.json", '{"hooks": []}'), (".mcp.json", DEEP)):
        (repo / rel).write_text(text)
        done = subprocess.run(
            [CLI, "agent", "install", "claude-code"],
            cwd=repo,
            env=env,
            capture_output=True,
            text=True,
            check=False,
        )
        assert done.returncode == 2, done.stderr
        assert len(done.stderr.strip().splitlines()) == 1 and "Traceback" not in done.stderr
        (repo / rel).unlink()


# -- a URL with a password ------------------------------------------------------------------
@pytest.mark.parametrize("agent", ["claude-code", "codex", "cursor"])
def test_userinfo_never_reaches_a_file(repo: Path, agent: str) -> None:
    change = install(agent, repo, url="http://alice:s3cr3t-pw@127.0.0.1:8123/")
    text = written(repo)
    assert "s3cr3t-pw" not in text and "alice" not in text
    assert "http://127.0.0.1:8123" in text
    assert any("user name and password" in note for note in change.notes)


def test_userinfo_from_the_environment_never_reaches_a_file(repo: Path, tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PROJECT_MEMORY_")}
    env.update(
        HOME=str(tmp_path),
        XDG_CONFIG_HOME=str(tmp_path / "cfg"),
        PROJECT_MEMORY_URL="http://alice:s3cr3t-pw@127.0.0.1:8123",
    )
    for agent in ("claude-code", "codex", "cursor"):
        done = subprocess.run(
            [CLI, "agent", "install", agent], cwd=repo, env=env, capture_output=True, text=True
        )
        assert done.returncode == 0, done.stderr
        assert "s3cr3t-pw" not in done.stdout + done.stderr
    text = written(repo)
    assert "s3cr3t-pw" not in text and "alice" not in text and "127.0.0.1:8123" in text


# -- only the read tools pre-approved -------------------------------------------------------
def test_only_the_read_tools_are_pre_approved(repo: Path) -> None:
    on_server = [t.name for t in TOOLS if t.read_only and not t.writes]
    read_tools = installer.READ_TOOLS
    assert sorted(read_tools) == sorted(on_server)
    local = repo / ".claude" / "settings.local.json"
    local.parent.mkdir()
    # An older install allowed every tool of the server: replaced by the read tools.
    local.write_text(json.dumps({"permissions": {"allow": ["Bash(ls:*)", "mcp__project-memory"]}}))
    install("claude-code", repo, url=URL)
    allowed = json.loads(local.read_text())["permissions"]["allow"]
    assert allowed == ["Bash(ls:*)", *(f"mcp__project-memory__{name}" for name in read_tools)]
    for name in ("delete_turn", "delete_artifact", "memory", "record_turn"):
        assert not any(a.endswith(f"__{name}") for a in allowed)
    assert installed("claude-code", repo)["permission"] is True
    uninstall("claude-code", repo)
    assert json.loads(local.read_text())["permissions"]["allow"] == ["Bash(ls:*)"]
