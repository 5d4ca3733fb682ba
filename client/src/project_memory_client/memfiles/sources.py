"""Find the memory files of a repository (and of the agents' folders) and read them safely.

Rules:

* No link is followed: a file is opened one folder at a time from its root with
  ``O_NOFOLLOW``, so a symbolic link anywhere below the root (a file, or a folder on the way)
  is reported and skipped, never read, even when it points back inside.
* A file that cannot be a memory is reported and skipped, and the rest go on: not a regular
  file, over the store's limit, not UTF-8, a path the store refuses.
* An ``@import`` outside the repository is followed only into the home's agent folders
  (``~/.claude``, ``~/.codex``); any other is reported (see claude.py for what counts as one).
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
from collections.abc import Iterator
from dataclasses import dataclass, field

from ..rules import MAX_MEMORY_CONTENT_BYTES, memory_path_fault
from . import (
    CLAUDE_MEMORY_PREFIX,
    CODEX_MEMORIES_PREFIX,
    HOME_AGENT_DIRS,
    HOME_PREFIX,
    MCP_MEMORY_PREFIX,
    PREFIXES,
)
from .claude import MAX_IMPORT_DEPTH, import_targets, is_text_file, resolve_import
from .graph import memories as graph_memories, parse_file, serialize

# Folders never searched: version control, dependencies and caches hold other projects' files.
SKIP_DIRS = frozenset(
    {".git", ".hg", ".svn", "node_modules", ".venv", "venv", "__pycache__", ".tox"}
    | {".mypy_cache", ".pytest_cache", ".ruff_cache"}
)
MCP_MEMORY_FILES = ("memory.json", "memory.jsonl")
RESERVED = "the store keeps files from outside the repository under this folder's name"  # the reference server's old and new default


@dataclass(frozen=True)
class Found:
    """A memory to write: its store path, its content, what it came from."""

    path: str
    content: str
    kind: str
    source: str


@dataclass(frozen=True)
class Skipped:
    source: str
    kind: str
    reason: str
    message: str


class Unreadable(Exception):
    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason
        self.message = message


@dataclass(frozen=True)
class Root:
    """A folder files are read under: ``path`` (links resolved once, here), the store path
    prefix of its files, and how its files are named in reports."""

    path: str
    prefix: str
    shown: str  # "" for the repository (relative paths), "~/" for the home, "~/x/" or "/x/"

    def show(self, rel: str) -> str:
        return self.shown + rel


def _open_flags() -> int:
    return os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0)


def read_under(root: str, rel: str, limit: int = MAX_MEMORY_CONTENT_BYTES) -> str:
    """The text of ``root/rel``, never through a link; Unreadable says why not."""
    parts = rel.split("/")
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY)
    try:
        for i, part in enumerate(parts):
            last = i == len(parts) - 1
            flags = _open_flags() | (0 if last else os.O_DIRECTORY)
            try:
                child = os.open(part, flags, dir_fd=fd)
            except OSError as exc:
                if exc.errno == errno.ENOENT:
                    raise Unreadable("missing", "no such file") from None
                with contextlib.suppress(OSError):
                    if stat.S_ISLNK(os.stat(part, dir_fd=fd, follow_symlinks=False).st_mode):
                        where = "it is" if last else f"{'/'.join(parts[: i + 1])} is"
                        raise Unreadable(
                            "symlink", f"{where} a symbolic link: not followed"
                        ) from None
                if exc.errno == errno.ENOTDIR:
                    raise Unreadable("not-a-file", "a folder on its path is a file") from None
                raise Unreadable("unreadable", exc.strerror or str(exc)) from None
            os.close(fd)
            fd = child
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise Unreadable("not-a-file", "not a regular file")
        if info.st_size > limit:
            raise Unreadable("too-big", f"{info.st_size} bytes, over the store's {limit}")
        data = b""
        while len(data) <= limit:
            block = os.read(fd, limit + 1 - len(data))
            if not block:
                break
            data += block
    finally:
        os.close(fd)
    if len(data) > limit:
        raise Unreadable("too-big", f"over the store's {limit} bytes")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise Unreadable("not-utf8", f"not UTF-8 (byte {exc.start})") from None


def repository_kind(parts: tuple[str, ...]) -> str | None:
    """What a file of the repository at ``parts`` is, or None if it is no memory file."""
    name, folders = parts[-1], parts[:-1]
    pairs = set(zip(folders, folders[1:], strict=False))
    if name in ("CLAUDE.md", "CLAUDE.local.md"):
        return "claude-md"
    if name in ("AGENTS.md", "AGENTS.override.md"):
        return "agents-md"
    if (".claude", "rules") in pairs and name.endswith(".md"):
        return "claude-rule"
    if (".cursor", "rules") in pairs and name.endswith((".mdc", ".md")):
        return "cursor-rule"
    if parts == (".cursorrules",):
        return "cursor-rule"
    if len(parts) == 1 and name in MCP_MEMORY_FILES:
        return "mcp-memory"
    return None


def _walk(
    root: str, rel: tuple[str, ...] = ()
) -> Iterator[tuple[tuple[str, ...], os.DirEntry[str]]]:
    """Every entry below ``root``, links not followed, SKIP_DIRS not entered; sorted."""
    try:
        with os.scandir(os.path.join(root, *rel)) as it:
            entries = sorted(it, key=lambda e: e.name)
    except OSError:
        return
    for entry in entries:
        parts = (*rel, entry.name)
        yield parts, entry
        if entry.is_dir(follow_symlinks=False) and entry.name not in SKIP_DIRS:
            yield from _walk(root, parts)


def _wanted_link(parts: tuple[str, ...]) -> bool:
    """A link worth a report: it stands where a memory file or its folder would be."""
    return repository_kind(parts) is not None or parts[-1] in (".claude", ".cursor", "rules")


def _join(prefix: str, rel: str) -> str:
    return f"{prefix}/{rel}"


@dataclass
class Collector:
    """Everything found, in the order found; the first source of a store path wins."""

    repo: Root
    home: Root
    memories: dict[str, Found] = field(default_factory=dict)
    skipped: list[Skipped] = field(default_factory=list)
    notes: list[dict[str, str]] = field(default_factory=list)
    _seen: set[str] = field(default_factory=set)  # files read, by absolute path
    _folders: dict[str, str] = field(default_factory=dict)  # graph folder -> its file

    def skip(self, source: str, kind: str, reason: str, message: str) -> None:
        self.skipped.append(Skipped(source, kind, reason, message))

    def add(self, path: str, content: str, kind: str, source: str) -> None:
        fault = memory_path_fault(path)
        if fault is not None:
            self.skip(source, kind, "bad-path", f"the store refuses the path {path!r}: {fault}")
            return
        if len(content.encode("utf-8")) > MAX_MEMORY_CONTENT_BYTES:
            self.skip(source, kind, "too-big", f"over the store's {MAX_MEMORY_CONTENT_BYTES} bytes")
            return
        earlier = self.memories.get(path)
        if earlier is not None:
            if earlier.content != content:
                self.skip(source, kind, "duplicate", f"{path} already comes from {earlier.source}")
            return
        self.memories[path] = Found(path, content, kind, source)

    def read(self, root: Root, rel: str, kind: str) -> str | None:
        try:
            return read_under(root.path, rel)
        except Unreadable as exc:
            self.skip(root.show(rel), kind, exc.reason, exc.message)
            return None

    # -- folders of the agents ---------------------------------------------------------------
    def folder(self, folder: Root, kind: str) -> None:
        """Every ``*.md`` below an agent's memory folder (dot-folders left out), verbatim."""
        for parts, entry in _walk(folder.path):
            if any(p.startswith(".") for p in parts):
                continue
            rel = "/".join(parts)
            if entry.is_symlink():
                if entry.name.endswith(".md"):
                    self.skip(folder.show(rel), kind, "symlink", "a symbolic link: not followed")
                continue
            if not entry.name.endswith(".md") or entry.is_dir(follow_symlinks=False):
                continue
            text = self.read(folder, rel, kind)
            if text is not None:
                self.add(_join(folder.prefix, rel), text, kind, folder.show(rel))

    # -- the repository ----------------------------------------------------------------------
    def repository(self) -> list[str]:
        """Every memory file of the repository (their imports followed); the MCP memory files
        found, to be read as graphs."""
        graphs = []
        for parts, entry in _walk(self.repo.path):
            rel = "/".join(parts)
            kind = repository_kind(parts)
            if entry.is_symlink():
                if _wanted_link(parts):
                    self.skip(rel, kind or "folder", "symlink", "a symbolic link: not followed")
                continue
            if kind is None or entry.is_dir(follow_symlinks=False):
                continue
            if "/" + parts[0] in PREFIXES:
                self.skip(rel, kind, "reserved", RESERVED)
                continue
            if kind == "mcp-memory":
                graphs.append(rel)
                continue
            self.file(self.repo, rel, kind, depth=0, chain=())
        return graphs

    def file(self, root: Root, rel: str, kind: str, *, depth: int, chain: tuple[str, ...]) -> None:
        """Read one file and add it, then the files it imports (a Claude Code memory file)."""
        absolute = os.path.join(root.path, rel)
        if absolute in self._seen:
            return
        text = self.read(root, rel, kind)
        if text is None:
            return
        self._seen.add(absolute)
        self.add(_join(root.prefix, rel), text, kind, root.show(rel))
        if kind in ("claude-md", "claude-rule", "agents-md", "import") and "@" in text:
            for target in import_targets(text):
                self.imported(target, absolute, depth + 1, (*chain, absolute))

    def imported(self, target: str, importer: str, depth: int, chain: tuple[str, ...]) -> None:
        where = resolve_import(target, os.path.dirname(importer), self.home.path)
        shown = self._shown(where)
        via = f"@{target} in {self._shown(importer)}"
        if where in chain:
            cycle = " → ".join(self._shown(p) for p in (*chain[chain.index(where) :], where))
            self.skip(shown, "import", "cycle", f"{via}: a cycle ({cycle})")
            return
        if where in self._seen:
            return
        if depth >= MAX_IMPORT_DEPTH:
            self.skip(shown, "import", "depth", f"{via}: deeper than {MAX_IMPORT_DEPTH} imports")
            return
        if not is_text_file(os.path.basename(where)):
            self.skip(shown, "import", "not-text", f"{via}: not a text file (Claude Code skips it)")
            return
        placed = self._place(where)
        if placed == "reserved":
            self.skip(shown, "import", "reserved", f"{via}: {RESERVED}")
            return
        if isinstance(placed, str):
            self.skip(
                shown,
                "import",
                "outside",
                f"{via}: outside the repository (only ~/.claude and ~/.codex are followed)",
            )
            return
        root, rel = placed
        # A memory file of the repository keeps its kind, whichever way it is reached first.
        kind = repository_kind(tuple(rel.split("/"))) if root is self.repo else None
        self.file(root, rel, kind or "import", depth=depth, chain=chain)

    def _place(self, path: str) -> tuple[Root, str] | str:
        """The root ``path`` is read under and its path there; else why it is not read."""
        for root in (self.repo, self.home):
            rel = os.path.relpath(path, root.path)
            if rel in (".", "..") or rel.startswith(".." + os.sep):
                continue
            first = rel.split(os.sep)[0]
            if root is self.home and first not in HOME_AGENT_DIRS:
                continue
            if root is self.repo and "/" + first in PREFIXES:
                return "reserved"
            return root, rel.replace(os.sep, "/")
        return "outside"

    def _shown(self, path: str) -> str:
        for root in (self.repo, self.home):
            rel = os.path.relpath(path, root.path)
            if not (rel == ".." or rel.startswith(".." + os.sep)):
                return root.show(rel)
        return path

    # -- MCP memory files --------------------------------------------------------------------
    def graph(self, root: Root, rel: str) -> None:
        """An MCP memory file as a folder of entity memories (graph.py)."""
        text = self.read(root, rel, "mcp-memory")
        if text is None:
            return
        shown = root.show(rel)
        folder = _join(root.prefix, rel)
        if folder in self._folders:
            if self._folders[folder] != shown:
                self.skip(
                    shown,
                    "mcp-memory",
                    "duplicate",
                    f"{folder}/ comes from {self._folders[folder]}",
                )
            return
        self._folders[folder] = shown
        entities, relations, problems = parse_file(text)
        for problem in problems:
            self.skip(f"{shown}:{problem.line}", "mcp-memory", "malformed", problem.message)
        if serialize(entities, relations) != text:
            self.notes.append(
                {
                    "source": shown,
                    "message": "export writes it as the MCP memory server does, which is not"
                    " byte for byte this file (a final newline, spacing, extra fields or a"
                    " line left out)",
                }
            )
        for name, content in graph_memories(entities, relations).items():
            self.add(f"{folder}/{name}", content, "mcp-entity", shown)


def shown_dir(path: str, home: str) -> str:
    """How a folder is named in reports: under the home as ``~/...``, with a final ``/``."""
    rel = os.path.relpath(path, home)
    if rel == "." or rel == ".." or rel.startswith(".." + os.sep):
        return path.rstrip("/") + "/"
    return "~/" + rel + "/"


def collect(
    repo: str,
    *,
    home: str,
    auto_memory: str | None,
    codex_memories: str | None,
    mcp_files: list[str],
) -> Collector:
    """What an import of ``repo`` would write: the agents' folders first, then the
    repository's files (imports followed), then the MCP memory files."""
    repo_root = Root(os.path.realpath(repo), "", "")
    home_root = Root(os.path.realpath(home), HOME_PREFIX, "~/")
    found = Collector(repo_root, home_root)
    for folder, prefix, kind in (
        (auto_memory, CLAUDE_MEMORY_PREFIX, "claude-memory"),
        (codex_memories, CODEX_MEMORIES_PREFIX, "codex-memory"),
    ):
        if folder is not None and os.path.isdir(folder):
            real = os.path.realpath(folder)
            found.folder(Root(real, prefix, shown_dir(real, home_root.path)), kind)
    for rel in found.repository():
        found.graph(repo_root, rel)
    for given in mcp_files:
        # The folder it is in is the user's to name: its links are resolved; the file's not.
        folder = os.path.realpath(os.path.dirname(os.path.abspath(given)))
        name = os.path.basename(given)
        rel = os.path.relpath(os.path.join(folder, name), repo_root.path)
        if rel.startswith(".." + os.sep):
            found.graph(Root(folder, MCP_MEMORY_PREFIX, shown_dir(folder, home_root.path)), name)
        else:
            found.graph(repo_root, rel.replace(os.sep, "/"))
    return found
