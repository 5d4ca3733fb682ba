"""``agent install`` / ``agent uninstall``: merged into what a repository has, removed exactly.

The real CLIs reading these files: tests/agents/test_claude_code.py and test_codex.py.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
from project_memory_client.agents import install as installer
from project_memory_client.agents.install import (
    READ_TOOLS,
    InstallError,
    install,
    installed,
    uninstall,
)

from tests.agents.conftest import git_repo

CLI = str(Path(sys.executable).parent / "project-memory")
URL = "http://127.0.0.1:8123"

USER_SETTINGS = {
    "model": "opus",
    "hooks": {
        "Stop": [{"hooks": [{"type": "command", "command": "notify-send done"}]}],
        "PreToolUse": [{"matcher": "Bash", "hooks": [{"type": "command", "command": "audit"}]}],
    },
    "permissions": {"allow": ["Bash(ls:*)"], "deny": ["Read(.env)"]},
}
USER_LOCAL = {"permissions": {"allow": ["Bash(make:*)"]}, "enabledMcpjsonServers": ["other"]}
USER_MCP = {"mcpServers": {"other": {"command": "other-mcp"}}}


def files(root: Path) -> dict[str, str]:
    return {
        str(p.relative_to(root)): p.read_text()
        for p in sorted(root.rglob("*"))
        if p.is_file() and ".git" not in p.relative_to(root).parts
    }


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


def test_claude_code_into_a_repository_that_has_settings(repo: Path) -> None:
    (repo / ".claude").mkdir()
    (repo / ".claude" / "settings.json").write_text(json.dumps(USER_SETTINGS, indent=2))
    (repo / ".claude" / "settings.local.json").write_text(json.dumps(USER_LOCAL))
    (repo / ".mcp.json").write_text(json.dumps(USER_MCP))
    before = files(repo)
    change = install("claude-code", repo, url=URL)
    assert sorted(change.written) == [
        "(git) info/exclude: /.claude/settings.local.json",
        ".claude/settings.json",
        ".claude/settings.local.json",
        ".mcp.json",
    ]
    settings = json.loads((repo / ".claude" / "settings.json").read_text())
    assert settings["model"] == "opus" and settings["permissions"] == USER_SETTINGS["permissions"]
    stop = settings["hooks"]["Stop"]
    assert stop[0] == USER_SETTINGS["hooks"]["Stop"][0]
    assert stop[1]["hooks"][0]["command"].endswith("agent hook stop")
    assert settings["hooks"]["PreToolUse"] == USER_SETTINGS["hooks"]["PreToolUse"]
    for event, name in (
        ("SessionStart", "session-start"),
        ("PreCompact", "pre-compact"),
        ("UserPromptSubmit", "user-prompt-submit"),
    ):
        assert settings["hooks"][event][0]["hooks"][0]["command"].endswith(f"agent hook {name}")
    local = json.loads((repo / ".claude" / "settings.local.json").read_text())
    assert local["permissions"]["allow"] == [
        "Bash(make:*)",
        *(f"mcp__project-memory__{tool}" for tool in READ_TOOLS),
    ]
    assert local["enabledMcpjsonServers"] == ["other", "project-memory"]
    server = json.loads((repo / ".mcp.json").read_text())["mcpServers"]
    assert server["other"] == USER_MCP["mcpServers"]["other"]
    assert server["project-memory"] == {
        "type": "http",
        "url": "http://127.0.0.1:8123/mcp",
        "headers": {"Authorization": "Bearer ${PROJECT_MEMORY_TOKEN}"},
    }
    ignored = subprocess.run(
        ["git", "check-ignore", "-q", ".claude/settings.local.json"], cwd=repo, check=False
    )
    assert ignored.returncode == 0  # untracked: where Claude Code honours its permissions
    assert "pm_" not in json.dumps(files(repo))
    assert installed("claude-code", repo) == {"hooks": True, "mcp": True, "permission": True}
    once = files(repo)
    assert install("claude-code", repo, url=URL).written == []
    assert files(repo) == once
    uninstall("claude-code", repo)
    after = files(repo)
    assert {k: json.loads(v) for k, v in after.items()} == {
        k: json.loads(v) for k, v in before.items()
    }
    exclude = (repo / ".git" / "info" / "exclude").read_text()
    assert "settings.local.json" not in exclude


def test_claude_code_into_an_empty_repository_and_out_leaves_nothing(repo: Path) -> None:
    exclude = (repo / ".git" / "info" / "exclude").read_text()
    with pytest.raises(InstallError, match="needs the server's URL"):
        install("claude-code", repo, url=None)
    install("claude-code", repo, url=URL)
    server = json.loads((repo / ".mcp.json").read_text())["mcpServers"]["project-memory"]
    assert server["url"] == f"{URL}/mcp"
    change = uninstall("claude-code", repo)
    assert sorted(change.removed) == [
        "(git) info/exclude: /.claude/settings.local.json",
        ".claude/settings.json",
        ".claude/settings.local.json",
        ".mcp.json",
    ]
    assert files(repo) == {} and not (repo / ".claude").exists()
    assert (repo / ".git" / "info" / "exclude").read_text() == exclude


def test_stdio_transport_names_this_cli(repo: Path) -> None:
    install("claude-code", repo, url=URL, transport="stdio")
    server = json.loads((repo / ".mcp.json").read_text())["mcpServers"]["project-memory"]
    assert server["type"] == "stdio" and server["args"][-1] == "mcp"


def test_codex_keeps_the_projects_config_toml(repo: Path) -> None:
    (repo / ".codex").mkdir()
    user = 'model = "o5"\n\n[mcp_servers.other]\ncommand = "other"\n'
    (repo / ".codex" / "config.toml").write_text(user)
    install("codex", repo, url=URL + "/")
    config = tomllib.loads((repo / ".codex" / "config.toml").read_text())
    assert config["model"] == "o5" and config["mcp_servers"]["other"] == {"command": "other"}
    assert config["mcp_servers"]["project-memory"] == {
        "url": "http://127.0.0.1:8123/mcp",
        "bearer_token_env_var": "PROJECT_MEMORY_TOKEN",
    }
    hooks = json.loads((repo / ".codex" / "hooks.json").read_text())["hooks"]
    assert hooks["Stop"][0]["hooks"][0]["command"].endswith("agent hook stop --agent codex")
    prompt = hooks["UserPromptSubmit"][0]["hooks"][0]
    assert prompt["command"].endswith("agent hook user-prompt-submit --agent codex")
    assert prompt["timeout"] == 10 and "matcher" not in hooks["UserPromptSubmit"][0]
    assert installed("codex", repo) == {"hooks": True, "mcp": True}
    once = files(repo)
    install("codex", repo, url=URL)
    assert files(repo) == once
    uninstall("codex", repo)
    assert (repo / ".codex" / "config.toml").read_text() == user
    assert not (repo / ".codex" / "hooks.json").exists()


@pytest.mark.parametrize(
    ("agent", "rel"), [("claude-code", ".claude/settings.json"), ("codex", ".codex/hooks.json")]
)
def test_installing_over_an_older_install_adds_the_prompt_hook(
    repo: Path, agent: str, rel: str
) -> None:
    """An install from before the prompt hook (SessionStart, Stop, PreCompact): status and
    the doctor see it as partial; installing again adds the prompt hook and changes
    nothing else; uninstall takes all four out."""
    install(agent, repo, url=URL)
    path = repo / rel
    full = json.loads(path.read_text())
    older = json.loads(path.read_text())
    del older["hooks"]["UserPromptSubmit"]
    path.write_text(json.dumps(older, indent=2) + "\n")
    assert installed(agent, repo)["hooks"] is False
    change = install(agent, repo, url=URL)
    assert rel in change.written
    assert json.loads(path.read_text()) == full
    assert installed(agent, repo)["hooks"] is True
    assert install(agent, repo, url=URL).written == []  # and again: nothing to add
    uninstall(agent, repo)
    assert not path.exists()


def test_cursor(repo: Path) -> None:
    install("cursor", repo, url=URL)
    server = json.loads((repo / ".cursor" / "mcp.json").read_text())["mcpServers"]["project-memory"]
    assert server == {
        "url": "http://127.0.0.1:8123/mcp",
        "headers": {"Authorization": "Bearer ${env:PROJECT_MEMORY_TOKEN}"},
    }
    uninstall("cursor", repo)
    assert files(repo) == {}


def test_what_cannot_be_merged_is_left_alone(repo: Path) -> None:
    (repo / ".mcp.json").write_text("{not json")
    with pytest.raises(InstallError, match="not valid JSON"):
        install("claude-code", repo, url=URL)
    assert (repo / ".mcp.json").read_text() == "{not json"
    (repo / ".codex").mkdir()
    (repo / ".codex" / "config.toml").write_text('[mcp_servers.project-memory]\nurl = "x"\n')
    with pytest.raises(InstallError, match="already defines"):
        install("codex", repo, url=URL)
    (repo / ".codex" / "config.toml").write_text("= broken")
    with pytest.raises(InstallError, match="not valid TOML"):
        install("codex", repo, url=URL)
    with pytest.raises(InstallError, match="needs the server's URL"):
        install("cursor", repo, url=None)


def test_the_cli_installs_in_the_current_repository(repo: Path, tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PROJECT_MEMORY_")}
    env.update(HOME=str(tmp_path), XDG_CONFIG_HOME=str(tmp_path / "cfg"), PROJECT_MEMORY_URL=URL)
    (repo / "sub").mkdir()
    done = subprocess.run(
        [CLI, "agent", "install", "claude-code", "--json"],
        cwd=repo / "sub",
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout)
    assert out["ok"] and out["command"] == "agent install" and out["data"]["root"] == str(repo)
    status = json.loads(
        subprocess.run(
            [CLI, "agent", "status", "--json"],
            cwd=repo,
            env=env,
            capture_output=True,
            text=True,
            check=False,
        ).stdout
    )
    assert status["data"]["agents"]["claude-code"] == {
        "hooks": True,
        "mcp": True,
        "permission": True,
    }
    assert status["data"]["server"]["answers"] is False  # no token: nothing to ask with
    assert status["data"]["spool"]["queued"] == 0
    (repo / ".mcp.json").write_text("[]")
    bad = subprocess.run(
        [CLI, "agent", "install", "claude-code"],
        cwd=repo,
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    assert bad.returncode == 2 and "does not hold a JSON object" in bad.stderr


# -- what install writes is what will run -------------------------------------------------
@pytest.mark.parametrize(
    "given",
    [
        URL,
        URL + "/",
        URL + "/sandbox/memory/v1",
        URL + "/sandbox/memory/v1/",
        "  http://127.0.0.1:8123/sandbox/memory/v1?x=1#y ",
    ],
)
def test_the_url_written_is_the_base_url_normalised(repo: Path, given: str) -> None:
    for agent in ("claude-code", "codex", "cursor"):
        install(agent, repo, url=given)
    assert (
        json.loads((repo / ".mcp.json").read_text())["mcpServers"]["project-memory"]["url"]
        == f"{URL}/mcp"
    )
    assert (
        json.loads((repo / ".cursor" / "mcp.json").read_text())["mcpServers"]["project-memory"][
            "url"
        ]
        == f"{URL}/mcp"
    )
    toml = tomllib.loads((repo / ".codex" / "config.toml").read_text())
    assert toml["mcp_servers"]["project-memory"]["url"] == f"{URL}/mcp"


def test_hook_commands_name_the_client_by_its_full_path(repo: Path, tmp_path: Path) -> None:
    """The venv the client is in is on this shell's PATH, not necessarily on the agent's:
    the hooks name the client by its absolute path, and run from a plain login shell."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PROJECT_MEMORY_")}
    env.update(
        HOME=str(tmp_path),
        XDG_CONFIG_HOME=str(tmp_path / "cfg"),
        PROJECT_MEMORY_URL=URL,
        PROJECT_MEMORY_STATE_DIR=str(tmp_path / "state"),
        PATH=f"{Path(CLI).parent}{os.pathsep}{os.environ['PATH']}",
    )
    for agent, rel in (("claude-code", ".claude/settings.json"), ("codex", ".codex/hooks.json")):
        done = subprocess.run(
            [CLI, "agent", "install", agent, "--json"],
            cwd=repo,
            env=env,
            capture_output=True,
            text=True,
            check=False,
        )
        assert done.returncode == 0, done.stderr
        assert json.loads(done.stdout)["data"]["warnings"] == []
        hooks = json.loads((repo / rel).read_text())["hooks"]
        for event in ("SessionStart", "Stop", "PreCompact", "UserPromptSubmit"):
            command = hooks[event][0]["hooks"][0]["command"]
            assert command.startswith(CLI + " agent hook "), command
        # As an agent started without this shell's environment runs it: no PATH at all.
        run = subprocess.run(
            ["/bin/sh", "-c", hooks["Stop"][0]["hooks"][0]["command"]],
            input="{}",
            env={"HOME": str(tmp_path), "PROJECT_MEMORY_HOOKS": "off"},
            capture_output=True,
            text=True,
            check=False,
        )
        assert (run.returncode, run.stderr) == (0, ""), run.stderr


def test_a_command_that_would_not_run_is_named(tmp_path: Path) -> None:
    assert installer.login_shell_problem(CLI) is None
    problem = installer.login_shell_problem(str(tmp_path / "gone" / "project-memory"))
    assert problem is not None and "not found" in problem


# Layouts people keep their files in: four spaces with lists on one line (Prettier's), tabs,
# one line, minified; keys in their own order.
LAYOUTS = {
    ".claude/settings.json": (
        '{\n    "model": "opus",\n    "permissions": {"allow": ["Bash(ls:*)"], "deny": []},\n'
        '    "hooks": {\n        "Stop": [{"hooks": [{"type": "command", "command": "notify"}]}]'
        "\n    }\n}\n"
    ),
    ".claude/settings.local.json": '{\n\t"permissions": {\n\t\t"allow": ["Bash(make:*)"]\n\t}\n}',
    ".mcp.json": '{"mcpServers": {"other": {"command": "other-mcp", "args": ["--x"]}}}\n',
    ".cursor/mcp.json": '{"zeta":1,"mcpServers":{"other":{"url":"http://o/mcp"}},"alpha":[]}',
    ".codex/hooks.json": '{\n  "hooks": {"Stop": []},\n  "note": "caf\\u00e9"\n}\n',
    ".codex/config.toml": 'model = "o5"   # mine\n\n\n[mcp_servers.other]\ncommand = "x"',
}


def test_uninstall_gives_the_users_files_back_byte_for_byte(repo: Path) -> None:
    for rel, text in LAYOUTS.items():
        (repo / rel).parent.mkdir(exist_ok=True)
        (repo / rel).write_text(text)
    before = files(repo)
    for agent in ("claude-code", "codex", "cursor"):
        install(agent, repo, url=URL)
    assert files(repo) != before
    assert files(repo)[".mcp.json"].startswith('{"mcpServers": {"other": {"command"')  # one line
    assert "\n\t\t" in files(repo)[".claude/settings.local.json"]  # its tabs
    for agent in ("claude-code", "codex", "cursor"):
        uninstall(agent, repo)
    assert files(repo) == before


def test_a_file_changed_since_install_keeps_its_layout_and_the_change(repo: Path) -> None:
    settings = repo / ".claude" / "settings.json"
    settings.parent.mkdir()
    settings.write_text('{\n    "model": "opus"\n}\n')
    install("claude-code", repo, url=URL)
    value = json.loads(settings.read_text())
    value["env"] = {"A": "1"}  # the person edits it after install, in its own layout
    settings.write_text(json.dumps(value, indent=4) + "\n")
    uninstall("claude-code", repo)
    assert (
        settings.read_text()
        == '{\n    "model": "opus",\n    "env": {\n        "A": "1"\n    }\n}\n'
    )


# -- --auth oauth: the agent signs in itself -------------------------------------------------
TOKEN = "pm_" + "s" * 40  # in the environment of every install below: it must reach no file


def test_oauth_writes_the_url_and_no_credential(
    repo: Path, state_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PROJECT_MEMORY_TOKEN", TOKEN)
    for agent in ("claude-code", "codex", "cursor"):
        change = install(agent, repo, url=URL, auth="oauth")
        assert not any("PROJECT_MEMORY_TOKEN must" in note for note in change.notes)
        assert installer.mcp_auth(agent, repo) == "oauth"
    servers = json.loads((repo / ".mcp.json").read_text())["mcpServers"]
    assert servers["project-memory"] == {"type": "http", "url": f"{URL}/mcp"}
    cursor = json.loads((repo / ".cursor" / "mcp.json").read_text())["mcpServers"]
    assert cursor["project-memory"] == {"url": f"{URL}/mcp"}
    toml = tomllib.loads((repo / ".codex" / "config.toml").read_text())
    assert toml["mcp_servers"]["project-memory"] == {"url": f"{URL}/mcp"}
    # The hooks and the read tools' permission are the same as with a token.
    assert installed("claude-code", repo) == {"hooks": True, "mcp": True, "permission": True}
    assert installed("codex", repo) == {"hooks": True, "mcp": True}
    everything = json.dumps(files(repo)) + (repo / ".git" / "info" / "exclude").read_text()
    everything += "".join(p.read_text() for p in state_dir.rglob("*") if p.is_file())
    for secret in (TOKEN, "PROJECT_MEMORY_TOKEN", "Authorization", "Bearer", "pm_"):
        assert secret not in everything, secret
    for agent in ("claude-code", "codex", "cursor"):
        uninstall(agent, repo)
    assert files(repo) == {}


def test_oauth_replaces_a_token_entry_and_uninstall_gives_the_file_back(
    repo: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PROJECT_MEMORY_TOKEN", TOKEN)
    (repo / ".mcp.json").write_text(LAYOUTS[".mcp.json"])
    (repo / ".codex").mkdir()
    (repo / ".codex" / "config.toml").write_text(LAYOUTS[".codex/config.toml"])
    before = files(repo)
    for agent in ("claude-code", "codex"):
        install(agent, repo, url=URL)
        assert installer.mcp_auth(agent, repo) == "token"
        install(agent, repo, url=URL, auth="oauth")
        assert installer.mcp_auth(agent, repo) == "oauth"
    servers = json.loads((repo / ".mcp.json").read_text())["mcpServers"]
    assert servers["project-memory"] == {"type": "http", "url": f"{URL}/mcp"}
    assert servers["other"] == {"command": "other-mcp", "args": ["--x"]}
    codex = (repo / ".codex" / "config.toml").read_text()
    assert "bearer_token_env_var" not in codex and codex.count("[mcp_servers.project-memory]") == 1
    once = files(repo)
    assert install("claude-code", repo, url=URL, auth="oauth").written == []
    assert files(repo) == once
    for agent in ("claude-code", "codex"):
        uninstall(agent, repo)
    assert files(repo) == before


def test_oauth_over_stdio_is_refused_and_nothing_is_written(repo: Path) -> None:
    with pytest.raises(InstallError, match="--auth oauth is for the HTTP transport"):
        install("claude-code", repo, url=URL, transport="stdio", auth="oauth")
    assert files(repo) == {}


def test_the_cli_installs_oauth_with_the_token_in_its_environment(
    repo: Path, tmp_path: Path
) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PROJECT_MEMORY_")}
    env.update(
        HOME=str(tmp_path),
        XDG_CONFIG_HOME=str(tmp_path / "cfg"),
        PROJECT_MEMORY_URL=URL,
        PROJECT_MEMORY_TOKEN=TOKEN,
        PROJECT_MEMORY_STATE_DIR=str(tmp_path / "state"),
    )
    done = subprocess.run(
        [CLI, "agent", "install", "claude-code", "--auth", "oauth", "--json"],
        cwd=repo,
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    notes = " ".join(json.loads(done.stdout)["data"]["notes"])
    assert "claude mcp login project-memory" in notes and "pm_ token" in notes
    assert TOKEN not in done.stdout + done.stderr + json.dumps(files(repo))
    del env["PROJECT_MEMORY_TOKEN"]
    status = subprocess.run(
        [CLI, "agent", "status", "--json"], cwd=repo, env=env, capture_output=True, text=True
    )
    data = json.loads(status.stdout)["data"]
    assert data["mcp_auth"] == {"claude-code": "oauth", "codex": None, "cursor": None}
    # The entry reads no token, so its absence is not the MCP entry's problem.
    assert not any("MCP entries read the token" in w for w in data["warnings"])
    bad = subprocess.run(
        [CLI, "agent", "install", "claude-code", "--auth", "oauth", "--transport", "stdio"],
        cwd=repo,
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    assert bad.returncode == 2 and len(bad.stderr.strip().splitlines()) == 1, bad.stderr
