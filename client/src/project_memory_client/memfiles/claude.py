"""What Claude Code does with its memory files, restated: ``@imports`` and its project folders.

Read from Claude Code 2.1.332 (the binary's own code):

* An import is ``@path`` at the start of a text or after whitespace
  (``/(?:^|\\s)@((?:[^\\s\\\\]|\\\\ )+)/g``), in the Markdown's text only: never in a code
  block or code span, and never in an HTML comment. ``#...`` after the path is cut,
  ``\\ `` is a space. A path starting ``./``, ``~/``, ``/`` (not ``/`` alone) or one of
  ``[A-Za-z0-9._-]`` counts; it is relative to the importing file's folder, ``~/`` to the home.
* Only text files are imported (an extension from :data:`TEXT_EXTENSIONS`, or none).
* A file five imports deep is not loaded (:data:`MAX_IMPORT_DEPTH`); a file already loaded is
  not loaded again, which is what ends a cycle.
* The auto-memory folder is ``<config dir>/projects/<key>/memory/``, the config dir being
  ``$CLAUDE_CONFIG_DIR`` or ``~/.claude``, unless the user's settings name another
  (``autoMemoryDirectory``). ``<key>`` is the path of the repository's main working copy
  (the git root; the main one for a worktree) with every character but an ASCII letter or
  digit replaced by ``-`` (:func:`project_key`).
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterator
from pathlib import Path

MAX_IMPORT_DEPTH = 5
MAX_KEY_CHARS = 200

TEXT_EXTENSIONS = frozenset(
    [
        ".md", ".txt", ".text", ".json", ".yaml", ".yml", ".toml", ".xml", ".csv", ".html", ".htm",
        ".css", ".scss", ".sass", ".less", ".js", ".ts", ".tsx", ".jsx", ".mjs", ".cjs", ".mts",
        ".cts", ".py", ".pyi", ".pyw", ".rb", ".erb", ".rake", ".go", ".rs", ".java", ".kt", ".kts",
        ".scala", ".c", ".cpp", ".cc", ".cxx", ".h", ".hpp", ".hxx", ".cs", ".swift", ".sh", ".bash",
        ".zsh", ".fish", ".ps1", ".bat", ".cmd", ".env", ".ini", ".cfg", ".conf", ".config",
        ".properties", ".sql", ".graphql", ".gql", ".proto", ".vue", ".svelte", ".astro", ".ejs",
        ".hbs", ".pug", ".jade", ".php", ".pl", ".pm", ".lua", ".r", ".dart", ".ex", ".exs", ".erl",
        ".hrl", ".clj", ".cljs", ".cljc", ".edn", ".hs", ".lhs", ".elm", ".ml", ".mli", ".f", ".f90",
        ".f95", ".for", ".cmake", ".make", ".makefile", ".gradle", ".sbt", ".rst", ".adoc",
        ".asciidoc", ".org", ".tex", ".latex", ".lock", ".log", ".diff", ".patch",
    ]
)  # fmt: skip

_IMPORT = re.compile(r"(?:^|\s)@((?:[^\s\\]|\\ )+)")
_PLAIN_START = re.compile(r"[a-zA-Z0-9._-]")
_FENCE = re.compile(r" {0,3}(`{3,}|~{3,})")
_COMMENT = re.compile(r"<!--.*?-->", re.S)
_TICKS = re.compile(r"`+")


def is_text_file(name: str) -> bool:
    """Whether Claude Code imports a file of this name (by its extension)."""
    dot = name.rfind(".")
    return dot <= 0 or name[dot:].lower() in TEXT_EXTENSIONS


def _without_code_spans(text: str) -> str:
    """``text`` with each code span (a run of backticks up to the next run of as many) blanked."""
    out: list[str] = []
    pos = 0
    while True:
        opening = _TICKS.search(text, pos)
        if opening is None:
            out.append(text[pos:])
            return "".join(out)
        width = len(opening.group())
        closing = next(
            (m for m in _TICKS.finditer(text, opening.end()) if len(m.group()) == width), None
        )
        if closing is None:
            # An unmatched run is literal backticks: the text after it is still text.
            out.append(text[pos : opening.end()])
            pos = opening.end()
            continue
        out.append(text[pos : opening.start()] + " ")
        pos = closing.end()


def _text_blocks(markdown: str) -> Iterator[str]:
    """The paragraphs of ``markdown`` that are text: fenced and indented code left out."""
    fence: str | None = None
    paragraph: list[str] = []
    for line in markdown.splitlines():
        if fence is not None:
            if line.strip().startswith(fence) and set(line.strip()) == {fence[0]}:
                fence = None
            continue
        opened = _FENCE.match(line)
        if opened and not (opened.group(1)[0] == "`" and "`" in line[opened.end() :]):
            yield "\n".join(paragraph)
            paragraph = []
            fence = opened.group(1)
            continue
        if not line.strip():
            yield "\n".join(paragraph)
            paragraph = []
            continue
        # An indented line is code unless it continues a paragraph.
        if not paragraph and (line.startswith("    ") or line.startswith("\t")):
            continue
        paragraph.append(line)
    yield "\n".join(paragraph)


def import_targets(markdown: str) -> list[str]:
    """The paths ``markdown`` imports, as written (``~/`` not expanded), first seen first."""
    found: dict[str, None] = {}
    text = _COMMENT.sub(" ", markdown)
    for block in _text_blocks(text):
        for match in _IMPORT.finditer(_without_code_spans(block)):
            target = match.group(1).split("#", 1)[0].replace("\\ ", " ")
            if not target:
                continue
            if (
                target.startswith(("./", "~/"))
                or (target.startswith("/") and target != "/")
                or _PLAIN_START.match(target)
            ):
                found[target] = None
    return list(found)


def resolve_import(target: str, importer_dir: str, home: str) -> str:
    """The absolute, normalised path of an import (lexically: no link is looked at)."""
    if target.startswith("~/"):
        joined = os.path.join(home, target[2:])
    else:
        joined = os.path.join(importer_dir, target)
    return os.path.normpath(joined)


# -- the auto-memory folder ------------------------------------------------------------------
def _java_hash(units: list[int]) -> int:
    """JavaScript's ``(h << 5) - h + unit | 0`` over UTF-16 code units: a signed 32-bit hash."""
    h = 0
    for unit in units:
        h = (h * 31 + unit) & 0xFFFFFFFF
    return h - (1 << 32) if h >= 1 << 31 else h


def _base36(n: int) -> str:
    digits = "0123456789abcdefghijklmnopqrstuvwxyz"
    out = ""
    while True:
        n, rest = divmod(n, 36)
        out = digits[rest] + out
        if n == 0:
            return out


def project_key(path: str) -> str:
    """The name of a project's folder under ``~/.claude/projects/``.

    Every UTF-16 code unit of ``path`` that is not an ASCII letter or digit becomes ``-`` (so a
    character outside the BMP becomes two); a key over 200 characters is cut there and given
    ``-`` and the base-36 absolute value of a 32-bit hash of the whole path.
    """
    units: list[int] = []
    for ch in path:
        code = ord(ch)
        if code > 0xFFFF:  # a surrogate pair in UTF-16, as JavaScript's strings hold it
            code -= 0x10000
            units += [0xD800 + (code >> 10), 0xDC00 + (code & 0x3FF)]
        else:
            units.append(code)
    key = "".join(chr(u) if chr(u).isascii() and chr(u).isalnum() else "-" for u in units)
    if len(key) <= MAX_KEY_CHARS:
        return key
    return f"{key[:MAX_KEY_CHARS]}-{_base36(abs(_java_hash(units)))}"


def working_copy_root(start: str) -> str:
    """The main working copy of the git repository ``start`` is in (a linked worktree shares
    its main one's memory), or ``start`` itself when it is in none."""
    here = Path(start)
    for folder in (here, *here.parents):
        dot_git = folder / ".git"
        if dot_git.is_dir():
            return str(folder)
        if dot_git.is_file():
            try:
                line = dot_git.read_text(encoding="utf-8").strip()
            except (OSError, UnicodeDecodeError):
                return str(folder)
            if not line.startswith("gitdir:"):
                return str(folder)
            git_dir = (folder / line[len("gitdir:") :].strip()).resolve()
            try:
                common = (git_dir / "commondir").read_text(encoding="utf-8").strip()
            except (OSError, UnicodeDecodeError):
                return str(folder)  # a submodule: its own root
            common_dir = (git_dir / common).resolve()
            return str(common_dir.parent if common_dir.name == ".git" else folder)
    return start


def config_dir(home: str) -> str:
    return os.environ.get("CLAUDE_CONFIG_DIR") or os.path.join(home, ".claude")


def auto_memory_dir(repo_root: str, home: str) -> str:
    """Where Claude Code keeps the auto memory of the project at ``repo_root``."""
    config = config_dir(home)
    try:
        with open(os.path.join(config, "settings.json"), encoding="utf-8") as fh:
            chosen = json.load(fh).get("autoMemoryDirectory")
    except (OSError, ValueError, AttributeError):
        chosen = None
    if isinstance(chosen, str) and chosen.strip():
        chosen = chosen.strip()
        if chosen == "~" or chosen.startswith("~/"):
            chosen = home + chosen[1:]
        return os.path.normpath(chosen)
    key = project_key(working_copy_root(repo_root))
    return os.path.join(config, "projects", key, "memory")
