"""Agents' memory files in and out of a memory store: ``project-memory import`` and ``export``.

Where each file goes in the store (docs/client.md has the table):

* a file of the repository keeps its path: ``CLAUDE.md`` is ``/CLAUDE.md``,
  ``api/AGENTS.md`` is ``/api/AGENTS.md``, ``.cursor/rules/style.mdc`` is
  ``/.cursor/rules/style.mdc``;
* a file from outside it goes under a prefix that names its source: Claude Code's auto-memory
  folder under ``/~claude-memory/``, Codex's memories under ``/~codex-memories/``, a file an
  ``@import`` reaches in the home's agent folders under ``/~home/`` (``~/.claude/x.md`` is
  ``/~home/.claude/x.md``), an MCP memory file named with ``--mcp-memory`` from elsewhere
  under ``/~mcp-memory/``;
* an MCP memory file (``memory.json``, JSON lines) becomes a folder of the same name: one
  Markdown memory per entity (graph.py), which export turns back into the file.

A repository file under one of the prefixes is refused, so that no two sources share a path.
"""

from __future__ import annotations

CLAUDE_MEMORY_PREFIX = "/~claude-memory"
CODEX_MEMORIES_PREFIX = "/~codex-memories"
HOME_PREFIX = "/~home"
MCP_MEMORY_PREFIX = "/~mcp-memory"
PREFIXES = (CLAUDE_MEMORY_PREFIX, CODEX_MEMORIES_PREFIX, HOME_PREFIX, MCP_MEMORY_PREFIX)

# The folders of the home an @import may reach: the agents' own, where people keep the
# instructions they share between projects. Any other file outside the repository is left out.
HOME_AGENT_DIRS = (".claude", ".codex")
