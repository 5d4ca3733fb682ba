"""The tools of the MCP endpoint (``/mcp``): reads over the storage interface, changes through
the use cases (app/services/tasks.py, stores.py), as every door makes them.

Each tool takes the arguments a model produced, checks them by the REST API's rules (the
same task-id, turn, query and cursor rules, the turn body's schema), reads or calls one use
case and returns text written for the model to read. No result is longer than ``OUTPUT_CHARS``
characters; when something is cut, the result says what and how to get the rest. A tool that
returns records (hits, tasks, a turn, an artifact's part, the digest, a turn written) returns
them as ``structuredContent`` too, in the shape its ``outputSchema`` declares (a result
schema of app/schemas/mcp.py) and cut where its text is cut.

Stored text (summaries, meta, snippets, the digest, artifacts' text, memories) is framed
(app/services/framing.py): a teammate's summary cannot forge a line of the tool's own.

A bad argument, or a write asked for by a reader, is a :class:`ToolFailure`: its message is
the model's to read. A reader is refused before the call, in words that say what its role
lacks; the use case checks the role again all the same. Storage errors (not found, a busy
lock, a full disk, a Conflict of the use case) propagate; the caller words them with the one
storage-error mapping (app/web/errors.py).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

from marshmallow import Schema, ValidationError

from app.schemas import mcp as shapes
from app.schemas.mcp import BASE64, OUTPUT_CHARS, TEXT
from app.schemas.project_memory import PutTurnRequest
from app.services import access, ledger, stores, tasks
from app.services.access import Principal
from app.services.framing import frame, frame_room, neutral
from app.services.mcp.arguments import Arguments, ToolFailure, messages
from app.services.mcp.artifacts import ArtifactFault, decode_artifacts, read_part, size_of, uploads
from app.services.mcp.schemas import input_schema, output_schema
from app.services.mcp.text import (
    clip,
    compact,
    fit_lines,
    fit_object,
    joined,
    joined_count,
    read_digest_head,
    search_snippet,
)
from app.services.memory_tool import AUDITED as CHANGES_A_STORE
from app.services.secrets import Screen
from app.storage.core.errors import InvalidName, NotFound
from app.storage.core.ledger import TimelineQuery
from app.storage.core.names import STORE_ID_RE, validate_artifact_name
from app.storage.core.store_models import MemoryStore
from app.storage.core.vectors import MODES as SEARCH_MODES
from app.storage.interface import StorageBackend

META_CHARS = 4_000  # a turn's meta as read_turn shows it
# A turn's artifact list as read_turn shows it. With the meta's bound and the head's own
# lines it leaves more than half of OUTPUT_CHARS to the summary, however many artifacts the
# turn holds.
ARTIFACT_LIST_CHARS = 4_000
INDEX_META_CHARS = 300  # one turn's meta in read_task's list
INDEX_ARTIFACT_CHARS = 600  # one turn's artifact names in read_task's list
STORES_SCANNED = 1_000  # a store named by name is looked for among this many
# What one read_artifact result holds: bytes of text, or bytes sent as base64 (4 characters
# for 3), leaving room for the lines around them.
READ_TEXT_BYTES = OUTPUT_CHARS - 1_000
READ_BINARY_BYTES = READ_TEXT_BYTES // 4 * 3

_TURN_BODY = PutTurnRequest()  # the REST API's PUT turn body: the same meta and size rules


class UnknownTool(Exception):
    """No tool has the name called: the request is wrong, not the tool's run, so the caller
    answers it as invalid params rather than as a result."""


@dataclass(frozen=True, slots=True)
class ToolOutput:
    text: str
    is_error: bool = False
    # The records the text shows, for a tool with a result schema (dumped by it in call()).
    structured: dict[str, Any] | None = None


@dataclass(frozen=True, slots=True)
class ToolSpec:
    """A tool as ``tools/list`` describes it. ``writes``: needs the writer role or above."""

    name: str
    title: str
    description: str
    arguments: type[Schema]  # app/schemas/mcp.py
    results: type[Schema] | None = None  # app/schemas/mcp.py; None: text only
    writes: bool = False
    read_only: bool = True
    destructive: bool = False
    # Generated from ``arguments`` and ``results`` as the table is built, at import: once
    # per process.
    input_schema: dict[str, Any] = field(init=False)
    output_schema: dict[str, Any] | None = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "input_schema", input_schema(self.arguments))
        made = None if self.results is None else output_schema(self.results)
        object.__setattr__(self, "output_schema", made)

    def listing(self) -> dict[str, Any]:
        listed: dict[str, Any] = {
            "name": self.name,
            "title": self.title,
            "description": self.description,
            "inputSchema": self.input_schema,
        }
        if self.output_schema is not None:
            listed["outputSchema"] = self.output_schema
        listed["annotations"] = {
            "title": self.title,
            "readOnlyHint": self.read_only,
            "destructiveHint": self.destructive,
            "idempotentHint": self.read_only,
            "openWorldHint": False,
        }
        return listed


TOOLS: tuple[ToolSpec, ...] = (
    ToolSpec(
        "search",
        "Search project memory",
        "Search this project's memory by keywords and meaning: the turns every agent recorded"
        " (task id, meta values, summary) and the project's memory stores (path, content)."
        " Use it before starting work to find earlier decisions, fixes and notes. mode"
        " hybrid (the default when the server has an embedder) also finds text that says"
        " the same in other words; keyword: every word must match;"
        ' "a quoted phrase" matches as a phrase; prefix* matches word starts (2+'
        " letters). Case and accents are ignored; OR/NOT are not supported. Hits come best"
        " first with a snippet in which matches are **bold**; read_turn or the memory tool"
        " reads a hit in full.",
        shapes.Search,
        shapes.SearchResult,
    ),
    ToolSpec(
        "read_digest",
        "Read the project digest",
        "Read project.md, the project's digest: one section per task with its latest"
        " summary, the most recently updated tasks first. Shows the newest sections that fit"
        " in max_chars characters; use it for an overview of what the team worked on lately.",
        shapes.ReadDigest,
        shapes.DigestResult,
    ),
    ToolSpec(
        "list_tasks",
        "List tasks",
        "List the project's tasks, most recently updated first: id, latest turn number,"
        " number of turns and when each was last updated. Pass the cursor a result gives to"
        " see the next page.",
        shapes.ListTasks,
        shapes.TaskListResult,
    ),
    ToolSpec(
        "read_timeline",
        "Read the project's timeline",
        "What the team did, newest first, across every task: each turn with when it"
        " happened, which agent and model, its branch and commit, its tokens, cost, wall"
        " time and exit code, and the start of its summary. Filter by since / until (an"
        " RFC 3339 time, 7d, 12h, yesterday), agent, model and branch: 'what happened on"
        " this branch since yesterday 09:00' is one call. Pass the cursor a result gives for"
        " older turns; read_turn reads a turn whole.",
        shapes.ReadTimeline,
        shapes.TimelineResult,
    ),
    ToolSpec(
        "read_task",
        "Read a task's index",
        "Read one task's index: its turns, newest first, with each turn's meta (agent,"
        " model, commit, tokens, times) and artifact names. read_turn gives a turn's summary.",
        shapes.ReadTask,
        shapes.TaskResult,
    ),
    ToolSpec(
        "read_turn",
        "Read a turn",
        "Read one turn of a task: its meta, its artifact list and its Markdown summary. A"
        " long summary is cut; the result then says which offset reads the rest.",
        shapes.ReadTurn,
        shapes.TurnResult,
    ),
    ToolSpec(
        "read_artifact",
        "Read an artifact",
        "Read one artifact of a turn (read_turn lists a turn's artifacts): text as it is,"
        " any other bytes in base64. A large artifact comes a part at a time; the result"
        " then gives the offset that reads on.",
        shapes.ReadArtifact,
        shapes.ArtifactResult,
    ),
    ToolSpec(
        "record_turn",
        "Record a turn",
        "Record a turn in a task's history so that later sessions and teammates find it:"
        " summary_md says in Markdown what was done, decided or learnt; meta holds run facts"
        " (agent_id, model, commit, exit_code, tokens, started_at, ended_at, or any other"
        " key). Without turn, it takes the task's next free turn number and never overwrites"
        " one; with turn, it replaces that turn. artifacts stores small files with the turn"
        " (a log, a diff, a report): all of them or none, the turn's other artifacts kept."
        " read_turn lists a turn's artifacts and read_artifact reads one. Needs the writer"
        " role.",
        shapes.RecordTurn,
        shapes.RecordedTurn,
        writes=True,
        read_only=False,
    ),
    ToolSpec(
        "memory",
        "Memory store files",
        "Read and edit the files of one of the project's memory stores, with the commands"
        " of Anthropic's memory tool: view (a directory listing or a file with line"
        " numbers), create, str_replace, insert, delete, rename. Paths start with"
        " /memories (view /memories lists the store). store is the store's id (memstore_...)"
        " or its name. Every change is kept as a version. Commands other than view need the"
        " writer role.",
        shapes.Memory,
        read_only=False,
        destructive=True,
    ),
    ToolSpec(
        "delete_turn",
        "Delete a turn",
        "Delete one turn of a task, with its artifacts, for good: its text leaves project.md,"
        " search and the stored files. Use it only to remove what must not be kept (a"
        " secret or personal data pasted into a summary, a turn recorded under the wrong"
        " task); record_turn with the same turn number corrects a summary instead. Deleting"
        " a task's last turn deletes the task. Only the task's owner (the token that created"
        " it) or a project_admin may delete.",
        shapes.DeleteTurn,
        writes=True,
        read_only=False,
        destructive=True,
    ),
    ToolSpec(
        "delete_artifact",
        "Delete an artifact",
        "Delete one artifact of a turn for good (read_turn lists a turn's artifacts), e.g. a"
        " log that holds a secret; the turn itself stays. Only the task's owner or a"
        " project_admin may delete.",
        shapes.DeleteArtifact,
        writes=True,
        read_only=False,
        destructive=True,
    ),
)
TOOLS_BY_NAME = {tool.name: tool for tool in TOOLS}


class McpTools:
    """The tools as one principal sees them: its scope, and whether it may write."""

    def __init__(self, storage: StorageBackend, principal: Principal):
        self.storage = storage
        self.principal = principal
        self.scope = principal.scope
        self.may_write = access.may_write(principal)

    def offered(self) -> list[ToolSpec]:
        """The tools this principal is offered: a reader not those only writers may call."""
        return [t for t in TOOLS if self.may_write or not t.writes]

    def listed(self) -> list[dict[str, Any]]:
        """``tools/list``."""
        return [t.listing() for t in self.offered()]

    def call(self, name: object, arguments: object) -> ToolOutput:
        """Run tool ``name``; UnknownTool when no tool has that name, ToolFailure for what the
        model must change, StorageError as is."""
        spec = TOOLS_BY_NAME.get(name) if isinstance(name, str) else None
        if spec is None:
            raise UnknownTool(name)
        if spec.writes and not self.may_write:
            raise ToolFailure(self._refusal(f"{spec.name} writes to project memory"))
        args = Arguments(spec.name, spec.input_schema, arguments)
        handler: Callable[[Arguments], ToolOutput] = getattr(self, "_" + spec.name)
        output = handler(args)
        if spec.results is None or output.is_error:
            return output
        if output.structured is None:
            # A declared outputSchema obliges every successful result to carry its records.
            raise RuntimeError(f"{spec.name} returned no structured result")
        return replace(output, structured=spec.results().dump(output.structured))

    def _refusal(self, what: str) -> str:
        return (
            f"{what} and needs the {access.WRITER} role or above; this token's role is"
            f" {self.principal.token.role}."
            " Ask for a writer token, or use the read tools."
        )

    # -- the tools -----------------------------------------------------------------------
    def _search(self, args: Arguments) -> ToolOutput:
        query = args.text("query")
        limit = args.integer("limit")
        cursor = args.optional_text("cursor")
        mode = args.optional_text("mode")
        if mode is not None and mode not in SEARCH_MODES:
            raise ToolFailure(f"mode must be one of {', '.join(SEARCH_MODES)}.")
        try:
            page = self.storage.search(self.scope, query, limit=limit, cursor=cursor, mode=mode)
        except InvalidName as exc:
            argument = "query" if exc.field == "q" else exc.field
            raise ToolFailure(f"{argument}: {exc.message}") from None
        found = {
            "hits": [],
            "hits_left_out": 0,
            "next_cursor": page.next_cursor,
            "stores_searched": page.stores_searched,
            "stores_skipped": page.stores_skipped,
            "modes": list(page.modes),
            "fallback": page.fallback,
        }
        ran = f"Ranked by {' and '.join(page.modes)}."
        if page.fallback:
            ran += f" Keyword results only: {page.fallback}."
        if not page.hits:
            return ToolOutput(
                f"No hits for {query!r}. {ran} Every word must match a keyword search: try"
                " fewer or other words, or a prefix* (read_digest gives an overview of"
                " recent work).",
                structured=found,
            )
        items = []
        for i, hit in enumerate(page.hits, 1):
            if hit.kind == "turn":
                source = f"turn {hit.turn} of task {hit.task_id}"
                where = f"{source} (read_turn reads it)"
            else:
                source = f"memory /memories{hit.path}"
                where = neutral(
                    f"{source} in store {hit.store_name!r}"
                    f" ({hit.memory_store_id}; the memory tool's view reads it)"
                )
            items.append(f"{i}. {where}\n   {frame(search_snippet(hit), source, inline=True)}")
        more = (
            [f"More hits: search again with the same query and cursor {page.next_cursor!r}."]
            if page.next_cursor
            else []
        )
        if page.stores_skipped:
            more.append(
                f"{page.stores_skipped} memory store(s) were not searched (beyond the"
                " per-search bound; the newest are searched)."
            )
        head = [f"{len(page.hits)} hit(s) for {query!r}, best first. {ran}"]
        text, shown = fit_lines(
            head,
            items,
            lambda shown: (
                f"… hits {shown + 1}-{len(items)} left out to keep this result under"
                f" {OUTPUT_CHARS} characters: search with limit={max(1, shown)}."
            ),
        )
        found["hits"] = [replace(h, snippet=search_snippet(h)) for h in page.hits[:shown]]
        found["hits_left_out"] = len(items) - shown
        return ToolOutput("\n".join([text, *more]), structured=found)

    def _read_digest(self, args: Arguments) -> ToolOutput:
        budget = args.integer("max_chars")
        digest, more = read_digest_head(self.storage, self.scope, budget)
        text = frame(digest, "project.md")
        if more:
            text += (
                f"\n(shown: the newest sections of project.md, up to {budget} characters;"
                " list_tasks, read_task and read_turn read any task.)"
            )
        return ToolOutput(text, structured={"digest": digest, "more": more})

    def _list_tasks(self, args: Arguments) -> ToolOutput:
        limit = args.integer("limit")
        cursor = args.optional_text("cursor")
        try:
            page = self.storage.tasks.list_tasks(self.scope, limit=limit, cursor=cursor)
        except InvalidName as exc:
            raise ToolFailure(f"{exc.field}: {exc.message}") from None
        listed = {"tasks": page.tasks, "total": page.total, "next_cursor": page.next_cursor}
        if not page.tasks:
            text = "This project has no tasks yet." if cursor is None else "No more."
            return ToolOutput(text, structured=listed)
        head = [f"{page.total} task(s) in this project, most recently updated first:"]
        items = [
            f"- {t.task_id}: latest turn {t.latest_turn}, {t.turn_count} turn(s),"
            f" updated {t.updated_at}"
            for t in page.tasks
        ]
        if page.next_cursor:
            items.append(f"More: call list_tasks with cursor {page.next_cursor!r}.")
        return ToolOutput("\n".join(head + items), structured=listed)

    def _read_timeline(self, args: Arguments) -> ToolOutput:
        try:
            filters = ledger.filters(
                self.storage,
                since=args.optional_text("since"),
                until=args.optional_text("until"),
                agent=args.optional_text("agent"),
                model=args.optional_text("model"),
                branch=args.optional_text("branch"),
            )
            query = TimelineQuery(filters, args.integer("limit"), args.optional_text("cursor"))
            page = ledger.timeline(self.storage, self.principal, query)
        except ValueError as exc:
            raise ToolFailure(
                f"{exc}: not a time; give an RFC 3339 time (2026-01-31T09:00:00Z), a count"
                " before now (30m, 12h, 7d, 2w), today or yesterday."
            ) from None
        except InvalidName as exc:
            raise ToolFailure(f"{exc.field}: {exc.message}") from None
        turns = []
        items = []
        for entry in page.entries:
            found = entry.to_json()
            found["summary"] = self._summary_start(entry.turn.task_id, entry.turn.turn)
            turns.append(found)
            items.append(_timeline_line(found))
        listed = {"turns": turns, "next_cursor": page.next_cursor}
        if not turns:
            text = "No turn matches." if query.cursor is None else "No older turns."
            return ToolOutput(text, structured=listed)
        head = [f"{len(turns)} turn(s), newest first (read_turn reads one whole):"]
        if page.next_cursor:
            items.append(f"Older: call read_timeline with cursor {page.next_cursor!r}.")
        text, shown = fit_lines(
            head,
            items,
            lambda shown: (
                f"… {len(turns) - shown} more turn(s) not shown; ask for a smaller limit."
            ),
        )
        if shown < len(turns):
            listed = {"turns": turns[:shown], "next_cursor": page.next_cursor}
        return ToolOutput(text, structured=listed)

    def _summary_start(self, task_id: str, turn: int) -> str | None:
        """The first lines of a turn's summary, up to TIMELINE_SUMMARY_CHARS (None: gone)."""
        try:
            record = self.storage.tasks.get_turn(self.scope, task_id, turn)
        except NotFound:
            return None
        text = " ".join(
            line.strip().lstrip("#").strip() for line in record.summary_md.splitlines()
        ).strip()
        return text[: shapes.TIMELINE_SUMMARY_CHARS]

    def _read_task(self, args: Arguments) -> ToolOutput:
        task_id = args.task_id()
        index = self.storage.tasks.get_task(self.scope, task_id)
        head = [
            f"Task {task_id}: {index.turn_count} turn(s), created {index.created_at},"
            f" updated {index.updated_at}, kept until {index.retain_until}.",
            "Turns, newest first (read_turn gives a turn's summary):",
        ]
        turns = list(reversed(index.turns))
        items = []
        for entry in turns:
            line = f"- turn {entry.turn} (updated {entry.updated_at}): meta "
            line += frame(compact(entry.meta, INDEX_META_CHARS), inline=True)
            if entry.artifacts:
                line += f"; artifacts: {joined(list(entry.artifacts), INDEX_ARTIFACT_CHARS)}"
            items.append(line)
        text, shown = fit_lines(
            head,
            items,
            lambda shown: (
                f"… {len(items) - shown} older turn(s) not shown (turns"
                f" {turns[-1].turn}-{turns[shown].turn}); read_turn reads any of them."
            ),
        )
        listed = []
        for entry in turns[:shown]:
            meta, meta_left = fit_object(entry.meta, INDEX_META_CHARS)
            names = list(entry.artifacts)
            named = joined_count(names, INDEX_ARTIFACT_CHARS)
            listed.append(
                {
                    "turn": entry.turn,
                    "updated_at": entry.updated_at,
                    "meta": meta,
                    "meta_keys_left_out": meta_left,
                    "artifacts": names[:named],
                    "artifacts_left_out": len(names) - named,
                }
            )
        task = {
            "task_id": task_id,
            "created_at": index.created_at,
            "updated_at": index.updated_at,
            "retain_until": index.retain_until,
            "turn_count": index.turn_count,
            "turns": listed,
            "turns_left_out": len(turns) - shown,
        }
        return ToolOutput(text, structured=task)

    def _read_turn(self, args: Arguments) -> ToolOutput:
        task_id, turn = self._turn_of(args)
        offset = args.integer("offset")
        record = self.storage.tasks.get_turn(self.scope, task_id, turn)
        described = [f"{a.name} ({a.content_type}, {a.size} bytes)" for a in record.artifacts]
        artifacts = joined(described, ARTIFACT_LIST_CHARS)
        if artifacts:
            artifacts += " (read_artifact reads one)"
        source = f"turn {turn} of task {task_id}"
        head = (
            f"Turn {turn} of task {task_id}: created {record.created_at}, updated"
            f" {record.updated_at}, kept until {record.retain_until}.\n"
            f"meta: {frame(compact(record.meta, META_CHARS), inline=True)}\n"
            f"artifacts: {artifacts or 'none'}\n"
            "summary_md:\n"
        )
        summary = record.summary_md
        total = len(summary)
        if offset:
            summary = summary[offset:]
            head += f"(from character {offset} of {total})\n"
        room = OUTPUT_CHARS - len(head) - frame_room(source) - 200
        shown = summary[:room]
        # A tag made inert grows by three characters: the part shown shrinks to match.
        while len(neutral(shown)) > room:
            shown = shown[: room - (len(neutral(shown)) - len(shown))]
        out = head + frame(shown, source)
        end: int | None = None
        if len(shown) < len(summary):
            end = offset + len(shown)
            out += (
                f"\n… summary cut at character {end} of {total}: read_turn with"
                f" offset={end} reads on."
            )
        meta, meta_left = fit_object(record.meta, META_CHARS)
        listed = joined_count(described, ARTIFACT_LIST_CHARS)
        found = {
            "task_id": task_id,
            "turn": turn,
            "created_at": record.created_at,
            "updated_at": record.updated_at,
            "retain_until": record.retain_until,
            "meta": meta,
            "meta_keys_left_out": meta_left,
            "artifacts": record.artifacts[:listed],
            "artifacts_left_out": len(described) - listed,
            "summary_md": shown,
            "summary_offset": offset,
            "summary_chars": total,
            "next_offset": end,
        }
        return ToolOutput(out, structured=found)

    def _record_turn(self, args: Arguments) -> ToolOutput:
        task_id = args.task_id()
        turn = args.optional_integer("turn")
        args.text("summary_md")
        try:
            body = _TURN_BODY.load(
                {"meta": args.values.get("meta"), "summary_md": args.values.get("summary_md")}
            )
        except ValidationError as exc:
            raise ToolFailure("; ".join(messages(exc.messages))) from None
        try:
            files = decode_artifacts(args.values.get("artifacts"))
        except ArtifactFault as exc:
            raise ToolFailure(str(exc)) from None
        screen = Screen.of(self.storage, self.principal)
        if turn is None:
            record = tasks.append_turn(
                self.storage,
                self.principal,
                task_id,
                meta=body["meta"],
                summary_md=body["summary_md"],
                artifacts=lambda: uploads(files),  # a lost race has read the last streams
                size=size_of(files),
                screen=screen,
            )
        else:
            record = tasks.record_turn(
                self.storage,
                self.principal,
                task_id,
                turn,
                meta=body["meta"],
                summary_md=body["summary_md"],
                artifacts=uploads(files),
                size=size_of(files),
                screen=screen,
            )
        text = (
            f"Recorded turn {record.turn} of task {task_id} (updated {record.updated_at},"
            f" kept until {record.retain_until})."
        )
        stored = {a.name: a for a in record.artifacts}
        if files:
            text += " With " + ", ".join(
                f"{f.name} ({stored[f.name].content_type}, {stored[f.name].size} bytes)"
                for f in files
            )
            text += "."
        if screen.masked:
            kinds = ", ".join(f"{kind} {n}" for kind, n in screen.summary().items())
            text += (
                f" Masked {screen.masked.total()} secret(s) before storing ({kinds}):"
                " they are stored as [secret:<kind>]."
            )
        recorded = {
            "task_id": task_id,
            "turn": record.turn,
            "updated_at": record.updated_at,
            "retain_until": record.retain_until,
            "artifacts": [stored[f.name] for f in files],
        }
        return ToolOutput(text, structured=recorded)

    def _read_artifact(self, args: Arguments) -> ToolOutput:
        task_id, turn = self._turn_of(args)
        name = self._artifact_name(args)
        offset = args.integer("offset")
        opened = self.storage.tasks.open_artifact(self.scope, task_id, turn, name)
        try:
            info, size = opened.info, opened.size
            if offset and offset >= size:
                raise ToolFailure(
                    f"offset {offset} is past the end: {name} holds {size} bytes"
                    " (offset 0 reads it from the start)."
                )
            part = read_part(opened.file, offset, size, READ_TEXT_BYTES, READ_BINARY_BYTES)
        finally:
            opened.file.close()
        head = (
            f"Artifact {name} of turn {turn} of task {task_id}: {info.content_type},"
            f" {size} bytes, updated {info.updated_at}, sha256 {info.sha256}.\n"
        )
        end = offset + part.size
        found = {
            "task_id": task_id,
            "turn": turn,
            "name": name,
            "content_type": info.content_type,
            "size": size,
            "updated_at": info.updated_at,
            "sha256": info.sha256,
            "offset": offset,
            "encoding": TEXT if part.is_text else BASE64,
            "content": part.shown,
            "next_offset": end if end < size else None,
        }
        if not size:
            return ToolOutput(head + "It is empty.", structured=found)
        form = "as UTF-8 text" if part.is_text else "in base64"
        # Base64 holds no tag and no line of its own; text is stored text like any other.
        shown = frame(part.shown, f"artifact {name}", exact=True) if part.is_text else part.shown
        out = head + f"Bytes {offset}-{end - 1} of {size}, {form}:\n{shown}"
        if end < size:
            out += (
                f"\n… cut at byte {end} of {size} to keep this result under {OUTPUT_CHARS}"
                f" characters: read_artifact with offset={end} reads on."
            )
        return ToolOutput(out, structured=found)

    def _artifact_name(self, args: Arguments) -> str:
        name = args.text("name")
        try:
            return validate_artifact_name(name)
        except InvalidName as exc:
            raise ToolFailure(f"name: {exc.message} (got {name[:200]!r}).") from None

    def _memory(self, args: Arguments) -> ToolOutput:
        ref = args.text("store")
        command = args.text("command")
        if command in CHANGES_A_STORE and not self.may_write:
            raise ToolFailure(
                self._refusal(f"The memory command {command!r} changes the store")
                + " view needs no more than a reader."
            )
        store_id = self._store_id(ref)
        command_input = {k: v for k, v in args.values.items() if k != "store"}
        result = stores.run_memory_tool(self.storage, self.principal, store_id, command_input)
        note = (
            f"… cut to keep this result under {OUTPUT_CHARS} characters: view a subdirectory,"
            " or a file with view_range."
        )
        if command_input.get("command") != "view" or result.is_error:
            return ToolOutput(clip(result.content, OUTPUT_CHARS, note), is_error=result.is_error)
        # What a view shows (a file's lines, a directory's names) is stored text: framed,
        # and the note that it was cut outside the frame.
        source = f"memory store {store_id}"
        shown = neutral(result.content)
        room = OUTPUT_CHARS - frame_room(source) - len(note) - 1
        if len(shown) <= room:
            return ToolOutput(frame(shown, source))
        return ToolOutput(frame(clip(shown, room, ""), source) + "\n" + note)

    def _turn_of(self, args: Arguments) -> tuple[str, int]:
        return args.task_id(), args.integer("turn")

    def _delete_turn(self, args: Arguments) -> ToolOutput:
        task_id, turn = self._turn_of(args)
        tasks.delete_turn(self.storage, self.principal, task_id, turn)
        return ToolOutput(f"Deleted turn {turn} of task {task_id}, with its artifacts.")

    def _delete_artifact(self, args: Arguments) -> ToolOutput:
        task_id, turn = self._turn_of(args)
        name = self._artifact_name(args)
        tasks.delete_artifact(self.storage, self.principal, task_id, turn, name)
        return ToolOutput(f"Deleted artifact {name} of turn {turn} of task {task_id}.")

    def _store_id(self, ref: str) -> str:
        """The id of the store ``ref`` names: its id, or its name among the project's stores."""
        if STORE_ID_RE.fullmatch(ref):
            return ref
        found: list[MemoryStore] = []
        names: list[str] = []
        page: str | None = None
        scanned = 0
        while scanned < STORES_SCANNED:
            result = self.storage.stores.list_stores(
                self.scope, limit=100, page=page, include_archived=True
            )
            for store in result.data:
                scanned += 1
                names.append(store.name)
                if store.name == ref:
                    found.append(store)
            page = result.next_page
            if page is None:
                break
        if len(found) == 1:
            return found[0].id
        if found:
            ids = ", ".join(s.id for s in found)
            raise ToolFailure(f"{len(found)} memory stores are named {ref!r}: pass one id ({ids}).")
        listed = ", ".join(repr(n) for n in names[:20]) or "none"
        raise ToolFailure(
            f"No memory store named {ref!r} in this project. Its stores: {listed}"
            + (" …" if len(names) > 20 else "")
            + "."
        )


def _timeline_line(turn: dict[str, Any]) -> str:
    """One turn of read_timeline's text: its facts, then the start of its summary framed."""
    facts = [turn["agent"] or "an unnamed agent", turn["model"] or "no model named"]
    if turn["branch"]:
        facts.append(f"branch {turn['branch']}")
    if turn["commit"]:
        facts.append(f"commit {turn['commit'][:12]}")
    facts.append(f"{turn['input_tokens']:,} in / {turn['output_tokens']:,} out tokens")
    if turn["cost_usd"] is not None:
        facts.append(f"${turn['cost_usd']:.4f}")
    if turn["wall_seconds"]:
        facts.append(f"{turn['wall_seconds']:.0f} s")
    if turn["exit_code"] is not None:
        facts.append(f"exit {turn['exit_code']}")
    source = f"turn {turn['turn']} of task {turn['task_id']}"
    line = f"- {turn['at']} {source}: " + neutral(", ".join(facts))
    if turn["summary"]:
        line += "\n  " + frame(turn["summary"], source, inline=True)
    return line
