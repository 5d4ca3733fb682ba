"""The client-side memory tool (``memory_20250818``) served from one memory store.

``/memories/<rel>`` maps onto the store's ``/<rel>``; directories are the path prefixes of
memories (the store refuses a memory that is also another's ancestor, as a filesystem
would). Result and error strings are the ones the memory tool's documentation recommends,
word for word, since models are trained on them. Every change is an engine write, so it
makes versions like any other write. Plain Python: the HTTP view in
``app/api/memory_tool.py`` only parses the body and returns the result.
"""

from __future__ import annotations

import re
import urllib.parse
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from app.storage.core.errors import InvalidName, NotFound
from app.storage.core.names import Scope
from app.storage.core.store_models import (
    ContentPreconditionFailed,
    Memory,
    PathConflict,
    StoreArchived,
    StoreFull,
)
from app.storage.core.store_rules import validate_memory_path
from app.storage.interface import StoreBackend

ROOT = "/memories"
COMMANDS = ("view", "create", "str_replace", "insert", "delete", "rename")
# The commands that change a store, with the action the audit log names each by.
AUDITED = {
    "create": "written",
    "str_replace": "modified",
    "insert": "modified",
    "delete": "deleted",
    "rename": "renamed",
}
MAX_LINES = 999_999
LINE_NUMBER_WIDTH = 6
MAX_VIEW_CHARS = 16_000  # Claude's tool description: longer files are truncated in view
MAX_VIEW_ENTRIES = 1_000
EDIT_ATTEMPTS = 3  # read-modify-write retries when a concurrent write moved the content
_ESCAPE = re.compile(r"%[0-9A-Fa-f]{2}")

T = TypeVar("T")


class ToolError(Exception):
    """A command failed; the message goes back to the model as an error tool result."""


def audit_of(command_input: object, result: ToolResult) -> tuple[str, dict[str, Any]] | None:
    """The audit log's action and detail for a tool input that changed the store (None: a
    view, or a command that failed and changed nothing)."""
    if result.is_error or not isinstance(command_input, dict):
        return None
    command = command_input.get("command")
    if not isinstance(command, str) or command not in AUDITED:
        return None
    path = command_input.get("path") or command_input.get("old_path")
    detail = {"command": command, "path": path} if isinstance(path, str) else {"command": command}
    return AUDITED[command], detail


@dataclass(frozen=True, slots=True)
class ToolResult:
    content: str
    is_error: bool = False


def human_size(size: int) -> str:
    """``5.5K``, ``1.2M``: the sizes ``view`` lists (same rounding as the SDK's tool)."""
    if size <= 0:
        return "0B"
    unit = min((size.bit_length() - 1) // 10, 3)
    value = size / 1024**unit
    text = f"{int(value)}" if value == int(value) else f"{value:.1f}"
    return text + "BKMG"[unit]


def _traversal(raw: str) -> ToolError:
    return ToolError(
        f"Error: The path {raw} would escape /memories: '..' and '.' segments, backslashes"
        " and percent-encoded dots or slashes are not allowed"
    )


def parse_path(raw: object, field: str = "path") -> str:
    """Map a ``/memories`` path to a store path; ``""`` is ``/memories`` itself.

    Nothing is decoded for addressing (a file may be called ``100%25.md``), but any path
    whose percent-decoding (repeated, to catch double encoding) would add a segment, a
    ``.``/``..`` segment or a backslash is refused, as are ``..`` and ``\\`` themselves.
    """
    if not isinstance(raw, str) or not raw:
        raise ToolError(f"Error: Parameter `{field}` must be a non-empty string")
    decoded = raw
    for _ in range(4):
        if not _ESCAPE.search(decoded):
            break
        decoded = urllib.parse.unquote(decoded)
    if decoded != raw and (
        decoded.count("/") != raw.count("/")
        or "\\" in decoded
        or "\x00" in decoded
        or any(part in (".", "..") for part in decoded.split("/"))
    ):
        raise _traversal(raw)
    if "\\" in raw or any(part in (".", "..") for part in raw.split("/")):
        raise _traversal(raw)
    if raw != ROOT and not raw.startswith(ROOT + "/"):
        raise ToolError(
            f"Error: The path {raw} is outside the memory directory: every path must start"
            f" with {ROOT}/"
        )
    rel = raw[len(ROOT) :]
    if rel.endswith("/"):
        rel = rel[:-1]  # "/memories/notes/" names the directory /memories/notes
    if rel:
        try:
            validate_memory_path(rel)
        except InvalidName as exc:
            raise ToolError(f"Error: Invalid path {raw}: {exc.message}") from None
    return rel


def _lines(content: str) -> list[str]:
    """Lines without the empty tail a final newline leaves."""
    if content == "":
        return []
    lines = content.split("\n")
    if content.endswith("\n"):
        lines.pop()
    return lines


def _numbered(lines: list[str], first: int) -> list[str]:
    return [f"{n:>{LINE_NUMBER_WIDTH}}\t{line}" for n, line in enumerate(lines, start=first)]


def _int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


class MemoryTool:
    """Run memory-tool commands against one store on behalf of one actor."""

    def __init__(
        self,
        engine: StoreBackend,
        scope: Scope,
        store_id: str,
        *,
        actor: dict[str, Any] | None,
        max_lines: int = MAX_LINES,
        max_view_chars: int = MAX_VIEW_CHARS,
        max_view_entries: int = MAX_VIEW_ENTRIES,
    ) -> None:
        self.engine = engine
        self.scope = scope
        self.store_id = store_id
        self.actor = actor
        self.max_lines = max_lines
        self.max_view_chars = max_view_chars
        self.max_view_entries = max_view_entries

    # -- entry point -------------------------------------------------------------------
    def run(self, tool_input: object) -> ToolResult:
        """Execute one tool input; command failures are results with ``is_error``.

        An unknown store raises NotFound, a busy lock LockTimeout: those are the
        caller's transport errors, not the model's.
        """
        self.engine.get_store(self.scope, self.store_id)
        try:
            return ToolResult(self._dispatch(tool_input))
        except ToolError as exc:
            return ToolResult(str(exc), is_error=True)

    def _dispatch(self, tool_input: object) -> str:
        if not isinstance(tool_input, dict):
            raise ToolError("Error: The tool input must be an object with a `command`")
        command = tool_input.get("command")
        handlers: dict[str, Callable[[dict[str, Any]], str]] = {
            "view": self.view,
            "create": self.create,
            "str_replace": self.str_replace,
            "insert": self.insert,
            "delete": self.delete,
            "rename": self.rename,
        }
        if not isinstance(command, str) or command not in handlers:
            raise ToolError(
                f"Error: Unknown command {command!r}. The commands are: {', '.join(COMMANDS)}"
            )
        return handlers[command](tool_input)

    @staticmethod
    def _param(args: dict[str, Any], name: str, kind: type, *, optional: bool = False) -> Any:
        value = args.get(name)
        if value is None:
            if optional:
                return None
            raise ToolError(f"Error: Missing required parameter `{name}` for `{args['command']}`")
        if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
            raise ToolError(f"Error: Parameter `{name}` must be of type {kind.__name__}")
        return value

    # -- store access ------------------------------------------------------------------
    def _file(self, rel: str) -> Memory | None:
        if not rel:
            return None
        return self.engine.find_memory(self.scope, self.store_id, rel, full=True)

    def _below(self, rel: str, limit: int | None = None) -> list[Memory]:
        """Memories under the directory ``rel`` (all of them, or the first ``limit``)."""
        found: list[Memory] = []
        page: str | None = None
        while True:
            result = self.engine.list_memories(
                self.scope,
                self.store_id,
                path_prefix=rel + "/",
                limit=100 if limit is None else min(limit, 100),
                page=page,
            )
            found.extend(m for m in result.data if isinstance(m, Memory))
            page = result.next_page
            if page is None or (limit is not None and len(found) >= limit):
                return found

    def _is_dir(self, rel: str) -> bool:
        return not rel or bool(self._below(rel, limit=1))

    def _write(self, raw: str, fn: Callable[[], T]) -> T:
        """Run one engine write, turning the store's refusals into tool errors."""
        try:
            return fn()
        except StoreArchived:
            raise ToolError(
                f"Error: The memory store is archived and read-only; {raw} was not changed"
            ) from None
        except StoreFull as exc:
            raise ToolError(
                f"Error: The memory store is full ({exc.limit} files); delete a file first"
            ) from None
        except InvalidName as exc:
            raise ToolError(f"Error: {raw} was not written: {exc.field} {exc.message}") from None

    def _edit(
        self, raw: str, rel: str, change: Callable[[str], str], missing: str
    ) -> tuple[str, str]:
        """Read, change and write back a file under a content_sha256 precondition.

        Returns (old, new) content. A concurrent write between read and write fails the
        precondition; the change is then applied again to the fresh content.
        """
        for _ in range(EDIT_ATTEMPTS):
            memory = self._file(rel)
            if memory is None or memory.content is None:
                raise ToolError(missing)
            new = change(memory.content)
            try:
                self._write(
                    raw,
                    lambda m=memory, new=new: self.engine.update_memory(  # type: ignore[misc]
                        self.scope,
                        self.store_id,
                        m.id,
                        content=new,
                        precondition_sha256=m.content_sha256,
                        actor=self.actor,
                    ),
                )
            except ContentPreconditionFailed:
                continue
            except NotFound:
                continue  # deleted or renamed meanwhile: the next read says so
            return memory.content, new
        raise ToolError(
            f"Error: {raw} kept changing while it was being edited; view it and try again"
        )

    # -- commands ----------------------------------------------------------------------
    def view(self, args: dict[str, Any]) -> str:
        raw = self._param(args, "path", str)
        rel = parse_path(raw)
        view_range = args.get("view_range")
        memory = self._file(rel)
        if memory is not None and memory.content is not None:
            return self._view_file(raw, memory.content, view_range)
        below = self._below(rel)
        if rel and not below:
            raise ToolError(f"The path {raw} does not exist. Please provide a valid path.")
        return self._view_dir(raw, rel, below)

    def _view_dir(self, raw: str, rel: str, below: list[Memory]) -> str:
        # Directories are prefixes: a directory's size is the sum of the (visible) files
        # below it, which says more than the 4.0K a real directory would show.
        sizes: dict[str, int] = {}
        total = 0
        for memory in below:
            parts = memory.path[len(rel) + 1 :].split("/")
            if any(p.startswith(".") or p == "node_modules" for p in parts):
                continue
            total += memory.content_size_bytes
            for depth in range(1, min(len(parts), 2) + 1):
                is_dir = depth < len(parts)
                key = "/".join(parts[:depth]) + ("/" if is_dir else "")
                sizes[key] = sizes.get(key, 0) + memory.content_size_bytes
        base = raw.rstrip("/") or ROOT
        lines = [f"{human_size(total)}\t{base}"]
        entries = sorted(sizes, key=lambda k: k.rstrip("/").split("/"))
        for key in entries[: self.max_view_entries]:
            lines.append(f"{human_size(sizes[key])}\t{base}/{key}")
        if len(entries) > self.max_view_entries:
            lines.append(
                f"... {len(entries) - self.max_view_entries} more entries not shown;"
                " view a subdirectory to see them"
            )
        header = (
            f"Here're the files and directories up to 2 levels deep in {raw},"
            " excluding hidden items and node_modules:"
        )
        return header + "\n" + "\n".join(lines)

    def _view_file(self, raw: str, content: str, view_range: object) -> str:
        lines = _lines(content)
        if len(lines) > self.max_lines:
            raise ToolError(f"File {raw} exceeds maximum line limit of {self.max_lines:,} lines.")
        header = f"Here's the content of {raw} with line numbers:"
        if view_range is not None:
            if not (
                isinstance(view_range, list) and len(view_range) == 2 and all(map(_int, view_range))
            ):
                raise ToolError(
                    "Error: Invalid `view_range` parameter: it should be a list of two"
                    " integers [start_line, end_line] (end_line -1 means the end of the file)"
                )
            start, end = view_range
            if not 1 <= start <= max(len(lines), 1):
                raise ToolError(
                    f"Error: Invalid `view_range` parameter: {view_range}. Its first element"
                    f" `{start}` should be within the range of lines of the file:"
                    f" [1, {len(lines)}]"
                )
            if end != -1 and end < start:
                raise ToolError(
                    f"Error: Invalid `view_range` parameter: {view_range}. Its second element"
                    f" `{end}` should be larger or equal than its first `{start}`, or -1"
                )
            stop = len(lines) if end == -1 else min(end, len(lines))
            return "\n".join([header, *_numbered(lines[start - 1 : stop], start)])
        shown: list[str] = []
        used = len(header)
        for line in _numbered(lines, 1):
            if used + 1 + len(line) > self.max_view_chars:
                shown.append(
                    f"... (truncated after line {len(shown)} of {len(lines)}; use view_range"
                    " to see the rest)"
                )
                break
            shown.append(line)
            used += 1 + len(line)
        return "\n".join([header, *shown])

    def create(self, args: dict[str, Any]) -> str:
        raw = self._param(args, "path", str)
        text = self._param(args, "file_text", str)
        rel = parse_path(raw)
        if not rel:
            raise ToolError(f"Error: File {raw} already exists")
        try:
            self._write(
                raw,
                lambda: self.engine.create_memory(
                    self.scope, self.store_id, path=rel, content=text, actor=self.actor
                ),
            )
        except PathConflict as exc:
            # Create never overwrites (the reference behaviour).
            if exc.conflicting_path == rel or exc.conflicting_path.startswith(rel + "/"):
                raise ToolError(f"Error: File {raw} already exists") from None
            raise ToolError(
                f"Error: Cannot create {raw}: {ROOT}{exc.conflicting_path} is a file,"
                " not a directory"
            ) from None
        return f"File created successfully at: {raw}"

    def str_replace(self, args: dict[str, Any]) -> str:
        raw = self._param(args, "path", str)
        old = self._param(args, "old_str", str)
        new = self._param(args, "new_str", str, optional=True) or ""
        rel = parse_path(raw)
        if old == "":
            raise ToolError("Error: Parameter `old_str` must not be empty")

        def change(content: str) -> str:
            count = content.count(old)
            if count == 0:
                raise ToolError(
                    f"No replacement was performed, old_str `{old}` did not appear verbatim"
                    f" in {raw}."
                )
            if count > 1:
                numbers, at = [], content.find(old)
                while at != -1:
                    numbers.append(content.count("\n", 0, at) + 1)
                    at = content.find(old, at + 1)
                raise ToolError(
                    f"No replacement was performed. Multiple occurrences of old_str `{old}`"
                    f" in lines: {', '.join(map(str, numbers))}. Please ensure it is unique"
                )
            return content.replace(old, new, 1)

        before, after = self._edit(
            raw,
            rel,
            change,
            f"Error: The path {raw} does not exist. Please provide a valid path.",
        )
        line = before.count("\n", 0, before.find(old))  # 0-based line of the change
        lines = _lines(after)
        first = max(0, line - 2)
        last = min(len(lines), line + new.count("\n") + 3)
        snippet = _numbered(lines[first:last], first + 1)
        return (
            "The memory file has been edited. Here is the snippet showing the change"
            " (with line numbers):\n" + "\n".join(snippet)
        )

    def insert(self, args: dict[str, Any]) -> str:
        raw = self._param(args, "path", str)
        at = self._param(args, "insert_line", int)
        text = self._param(args, "insert_text", str)
        rel = parse_path(raw)

        def change(content: str) -> str:
            lines = _lines(content)
            if not 0 <= at <= len(lines):
                raise ToolError(
                    f"Error: Invalid `insert_line` parameter: {at}. It should be within the"
                    f" range of lines of the file: [0, {len(lines)}]"
                )
            lines.insert(at, text.rstrip("\n"))
            return "\n".join(lines) + "\n"

        self._edit(raw, rel, change, f"Error: The path {raw} does not exist")
        return f"The file {raw} has been edited."

    def delete(self, args: dict[str, Any]) -> str:
        raw = self._param(args, "path", str)
        rel = parse_path(raw)
        if not rel:
            raise ToolError(f"Error: Cannot delete the {ROOT} directory itself")
        memory = self._file(rel)
        victims = [memory] if memory is not None else self._below(rel)
        if not victims:
            raise ToolError(f"Error: The path {raw} does not exist")
        for victim in victims:
            try:
                self._write(
                    raw,
                    lambda v=victim: self.engine.delete_memory(  # type: ignore[misc]
                        self.scope, self.store_id, v.id, actor=self.actor
                    ),
                )
            except NotFound:
                continue  # deleted meanwhile: the outcome is the one asked for
        return f"Successfully deleted {raw}"

    def rename(self, args: dict[str, Any]) -> str:
        old_raw = self._param(args, "old_path", str)
        new_raw = self._param(args, "new_path", str)
        src = parse_path(old_raw, "old_path")
        dst = parse_path(new_raw, "new_path")
        if not src:
            raise ToolError(f"Error: Cannot rename the {ROOT} directory itself")
        memory = self._file(src)
        moving = [memory] if memory is not None else self._below(src)
        if not moving:
            raise ToolError(f"Error: The path {old_raw} does not exist")
        if not dst or self._file(dst) is not None or self._is_dir(dst):
            raise ToolError(f"Error: The destination {new_raw} already exists")
        if memory is None and dst.startswith(src + "/"):
            raise ToolError(f"Error: Cannot move the directory {old_raw} into itself")
        for item in moving:
            target = dst + item.path[len(src) :]
            try:
                self._write(
                    old_raw,
                    lambda i=item, t=target: self.engine.update_memory(  # type: ignore[misc]
                        self.scope, self.store_id, i.id, path=t, actor=self.actor
                    ),
                )
            except PathConflict as exc:
                raise ToolError(
                    f"Error: Cannot rename {old_raw} to {new_raw}:"
                    f" {ROOT}{exc.conflicting_path} is a file, not a directory"
                ) from None
            except NotFound:
                continue  # deleted meanwhile
        return f"Successfully renamed {old_raw} to {new_raw}"
