"""The typed client of the project-memory API (``/sandbox/memory/v1``), over httpx.

Every call has a timeout (``Settings.timeout``, 30 s by default). A 429 or 503 is retried
up to ``max_retries`` times, each after the answer's ``Retry-After`` (plus a little jitter,
so that clients refused together do not come back together); one asking for longer than
``max_retry_wait`` is not waited for. Both statuses mean nothing was done, so any request
may be sent again; a streamed upload is sent again only if its source can be re-read.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import re
import secrets
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any, BinaryIO, Literal, overload
from urllib.parse import quote

import httpx

from . import __version__
from ._files import atomic_file
from .errors import (
    ApiError,
    ClientError,
    InvalidArgument,
    ServerUnreachable,
    api_error,
    turn_form_unknown,
)
from .models import (
    ArtifactInfo,
    ArtifactRecord,
    SearchHit,
    SearchResults,
    Source,
    TaskIndex,
    TaskList,
    TaskSummary,
    TurnRecord,
    Upload,
    UsageReport,
    WhoAmI,
)
from .next_turn import put_next_turn
from .rules import guess_content_type
from .settings import API_PREFIX, Settings, load_settings

__all__ = ["Client", "Progress", "Source", "Upload"]

CORRELATION_HEADER = "x-correlation-id"
RETRY_STATUSES = frozenset({429, 503})
CHUNK = 256 * 1024
_SHA256_ETAG = re.compile(r'"?([0-9a-f]{64})"?')

Progress = Callable[[int, int | None], None]
"""Called as ``progress(bytes_done, bytes_total_or_None)`` after each chunk."""


def _retry_after(response: httpx.Response) -> float | None:
    raw = response.headers.get("Retry-After")
    if raw is None:
        return None
    try:
        return max(0.0, float(raw))
    except ValueError:
        pass
    from email.utils import parsedate_to_datetime  # an HTTP date: rare, so imported here

    try:
        when = parsedate_to_datetime(raw)
    except (TypeError, ValueError):
        return None
    return max(0.0, when.timestamp() - time.time())


def _segment(value: object) -> str:
    """One path segment of the URL, percent-encoded.

    An id with a ``/`` is refused rather than encoded: the server decodes ``%2F`` before it
    routes, so ``t/turns/0/artifacts/x`` as a task id would address an artifact. ``.`` and
    ``..`` would be resolved away by the URL itself.
    """
    text = str(value)
    if text in ("", ".", "..") or "/" in text:
        raise InvalidArgument(f"{text!r} cannot be a task id, turn or artifact name")
    return quote(text, safe="")


class _Chunked:
    """A request body sent chunk by chunk: ``size`` when known, ``progress`` told of each."""

    progress: Progress | None
    size: int | None
    replayable: bool

    def chunks(self) -> Iterator[bytes]:
        """The body from its start, chunk by chunk, with the progress reported."""
        done = 0
        for block in self._blocks():
            done += len(block)
            if self.progress is not None:
                self.progress(done, self.size)
            yield block

    def _blocks(self) -> Iterator[bytes]:
        raise NotImplementedError

    def close(self) -> None:
        """Let go of what the body holds open."""


class _Body(_Chunked):
    """An upload body that can be sent again (a path, bytes, a seekable file) or only once."""

    def __init__(self, source: Source, progress: Progress | None) -> None:
        self.progress = progress
        self.size: int | None = None
        self._owned: BinaryIO | None = None
        self._file: IO[bytes] | None = None
        self._bytes: memoryview | None = None
        self._iterable: Iterable[bytes] | None = None
        self._start = 0
        self.replayable = True
        if isinstance(source, (str, os.PathLike)):
            self._owned = open(source, "rb")  # noqa: SIM115 - closed by close()
            self._file = self._owned
            self.size = os.fstat(self._owned.fileno()).st_size
        elif isinstance(source, (bytes, bytearray, memoryview)):
            self._bytes = memoryview(source).cast("B")
            self.size = len(self._bytes)
        elif hasattr(source, "read"):
            self._file = source  # type: ignore[assignment]
            assert self._file is not None
            if self._file.seekable():
                self._start = self._file.tell()
                self.size = self._file.seek(0, os.SEEK_END) - self._start
                self._file.seek(self._start)
            else:
                self.replayable = False
        else:
            self._iterable = source
            self.replayable = False

    def close(self) -> None:
        if self._owned is not None:
            self._owned.close()

    def _blocks(self) -> Iterator[bytes]:
        if self._bytes is not None:
            for start in range(0, len(self._bytes), CHUNK):
                yield bytes(self._bytes[start : start + CHUNK])
        elif self._file is not None:
            yield from self._file_blocks(self._file)
        else:
            assert self._iterable is not None
            yield from (bytes(b) for b in self._iterable if b)

    def _file_blocks(self, file: IO[bytes]) -> Iterator[bytes]:
        """Exactly ``size`` bytes when it is known: a file that shrinks meanwhile raises
        rather than send a torn body (one that grows is cut at the size announced)."""
        if self.size is None:
            while block := file.read(CHUNK):
                yield block
            return
        file.seek(self._start)
        done = 0
        while done < self.size:
            block = file.read(min(CHUNK, self.size - done))
            if not block:
                raise ClientError(
                    f"the file ended after {done} of its {self.size} bytes while uploading;"
                    " nothing was stored"
                )
            done += len(block)
            yield block


def _content_type(name: str, content_type: str | None) -> str:
    return content_type or guess_content_type(name)


def _header_value(what: str, value: str) -> str:
    """``value`` as it goes into a part's header; what would end or bend the header (a
    quote, a backslash, a line break, a non-ASCII character) is refused before sending."""
    if not value.isascii() or any(c in value for c in '"\\\r\n'):
        raise InvalidArgument(f"{value!r} cannot be an artifact's {what} in a form")
    return value


class _Form(_Chunked):
    """A turn and its artifacts as one multipart/form-data body (the server's PUT turn with
    a form, beyond the seed): the turn's JSON first, then one part per artifact, its name
    as the part's filename. Its size is known when every artifact's is; it can be sent
    again when every artifact can."""

    def __init__(self, turn: bytes, uploads: Sequence[Upload], progress: Progress | None) -> None:
        self.progress = progress
        self.boundary = secrets.token_hex(16)
        self.content_type = f"multipart/form-data; boundary={self.boundary}"
        self._parts: list[tuple[bytes, _Body]] = []
        self._uploads: list[tuple[str, str, _Body]] = []
        head = self._head('name="turn"', "application/json")
        self._turn = head + turn + b"\r\n"
        self._end = f"--{self.boundary}--\r\n".encode("ascii")
        try:
            for upload in uploads:
                name = _header_value("name", upload.name)
                kind = _header_value("type", _content_type(name, upload.content_type))
                body = _Body(upload.source, None)
                self._uploads.append((name, kind, body))
                disposition = f'name="artifact"; filename="{name}"'
                self._parts.append((self._head(disposition, kind), body))
        except BaseException:
            self.close()
            raise
        sizes = [body.size for _, body in self._parts]
        self.size: int | None = None
        if all(size is not None for size in sizes):
            heads = sum(len(head) + 2 for head, _ in self._parts)  # each part ends in CRLF
            self.size = len(self._turn) + heads + sum(sizes) + len(self._end)  # type: ignore[arg-type]
        self.replayable = all(body.replayable for _, body in self._parts)

    def _head(self, disposition: str, content_type: str) -> bytes:
        return (
            f"--{self.boundary}\r\nContent-Disposition: form-data; {disposition}\r\n"
            f"Content-Type: {content_type}\r\n\r\n"
        ).encode("ascii")

    def uploads(self) -> list[tuple[str, str, _Body]]:
        """Each artifact's name, Content-Type and body, to send them one by one instead."""
        return list(self._uploads)

    def close(self) -> None:
        for _, body in self._parts:
            body.close()

    def _blocks(self) -> Iterator[bytes]:
        yield self._turn
        for head, body in self._parts:
            yield head
            yield from body.chunks()
            yield b"\r\n"
        yield self._end


class Client:
    """A client of one server, with one token, in one tenant/project.

    ``Client()`` takes its settings from the environment and the config file
    (:func:`~project_memory_client.settings.load_settings`); arguments override them, and
    ``settings=`` gives them whole. Use it as a context manager, or call :meth:`close`.
    """

    def __init__(
        self,
        url: str | None = None,
        token: str | None = None,
        *,
        tenant: str | None = None,
        project: str | None = None,
        timeout: float | None = None,
        settings: Settings | None = None,
        max_retries: int = 3,
        max_retry_wait: float = 30.0,
        correlation_id: str | None = None,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        if settings is None:
            settings = load_settings(
                url=url, token=token, tenant=tenant, project=project, timeout=timeout
            )
        else:
            settings = settings.with_overrides(
                url=url, token=token, tenant=tenant, project=project, timeout=timeout
            )
        self.settings = settings.require()
        assert self.settings.url is not None and self.settings.token is not None
        self.url = self.settings.url
        self.max_retries = max(0, max_retries)
        self.max_retry_wait = max_retry_wait
        headers = {"Accept": "application/json"}
        if correlation_id:
            headers[CORRELATION_HEADER] = correlation_id
        self._http = self.settings.http(
            f"project-memory-client/{__version__}",
            base_url=self.url + API_PREFIX,
            headers=headers,
            transport=transport,
        )

    def __repr__(self) -> str:
        return f"Client(url={self.url!r}, tenant={self.settings.tenant!r}, project={self.settings.project!r})"

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- the transport -------------------------------------------------------------------
    def _send(
        self,
        method: str,
        path: str,
        *,
        params: dict[str, Any] | None = None,
        json: Any = None,
        body: _Chunked | None = None,
        headers: dict[str, str] | None = None,
        stream: bool = False,
        ok: tuple[int, ...] = (200,),
    ) -> httpx.Response:
        """Send one request, retrying 429/503; the answer if its status is in ``ok``, else
        ApiError (ServerUnreachable when there is no answer)."""
        attempts = 1 + (self.max_retries if body is None or body.replayable else 0)
        for attempt in range(attempts):
            request_headers = dict(headers or {})
            content: Iterable[bytes] | None = None
            if body is not None:
                content = body.chunks()
                if body.size is not None:
                    request_headers["Content-Length"] = str(body.size)
            request = self._http.build_request(
                method, path, params=params, json=json, content=content, headers=request_headers
            )
            try:
                response = self._http.send(request, stream=True)
            except httpx.TimeoutException as exc:
                raise ServerUnreachable(
                    f"{method} {self.url}{API_PREFIX}{path}: no answer within"
                    f" {self.settings.timeout:g} s ({type(exc).__name__})"
                ) from None
            except httpx.TransportError as exc:
                raise ServerUnreachable(
                    f"{method} {self.url}{API_PREFIX}{path}: {exc or type(exc).__name__}"
                ) from None
            if response.status_code in ok:
                if not stream:
                    self._read(response, method, path)
                return response
            wait = _retry_after(response)
            retry = response.status_code in RETRY_STATUSES and attempt + 1 < attempts
            if retry and wait is None:
                wait = 0.5 * 2**attempt
            if retry and wait is not None and wait <= self.max_retry_wait:
                response.close()
                time.sleep(wait + random.uniform(0, 0.1 + wait / 10))  # noqa: S311 - jitter
                continue
            self._read(response, method, path)
            raise self._error(response, method, path, wait)
        raise AssertionError("unreachable")  # pragma: no cover

    def _read(self, response: httpx.Response, method: str, path: str) -> None:
        try:
            response.read()
        except httpx.TransportError as exc:
            raise ServerUnreachable(f"{method} {path}: the answer was cut off ({exc})") from None
        finally:
            response.close()

    @staticmethod
    def _error(
        response: httpx.Response, method: str, path: str, retry_after: float | None
    ) -> ApiError:
        try:
            body = response.json()
        except ValueError:
            body = None
        if isinstance(body, dict) and "detail" in body:
            detail = body["detail"]
        elif isinstance(body, dict) and isinstance(body.get("error"), dict):
            detail = body["error"].get("message")  # the memory-stores envelope
        else:
            detail = response.reason_phrase or f"HTTP {response.status_code}"
        return api_error(
            response.status_code,
            detail,
            correlation_id=response.headers.get(CORRELATION_HEADER),
            method=method,
            path=path,
            retry_after=retry_after,
        )

    def _json(self, method: str, path: str, **kwargs: Any) -> Any:
        response = self._send(method, path, **kwargs)
        try:
            return response.json()
        except ValueError:
            raise ServerUnreachable(f"{method} {path}: the answer is not JSON") from None

    # -- turns ---------------------------------------------------------------------------
    @overload
    def get_turn(self, task_id: str, turn: int) -> TurnRecord: ...
    @overload
    def get_turn(self, task_id: str, turn: int, *, if_none_match: str) -> TurnRecord | None: ...

    def get_turn(
        self, task_id: str, turn: int, *, if_none_match: str | None = None
    ) -> TurnRecord | None:
        """One turn: meta, summary, artifact list, and its ETag.

        With ``if_none_match`` (an ETag from before), None when the turn has not changed.
        """
        headers = {"If-None-Match": if_none_match} if if_none_match else None
        response = self._send(
            "GET",
            f"/tasks/{_segment(task_id)}/turns/{_segment(turn)}",
            headers=headers,
            ok=(200, 304),
        )
        if response.status_code == 304:
            return None
        return TurnRecord.from_json(response.json(), response.headers.get("ETag"))

    def put_turn(
        self,
        task_id: str,
        turn: int | Literal["next"],
        *,
        meta: dict[str, Any] | None = None,
        summary_md: str = "",
        if_match: str | None = None,
        if_none_match: Literal["*"] | None = None,
        artifacts: Iterable[Upload] = (),
        progress: Progress | None = None,
    ) -> TurnRecord:
        """Upsert one turn's meta and summary; the record as stored, with its new ETag.

        ``turn="next"`` takes the next free number after the task's latest turn (0 for a new
        task) and writes it only if it is still free (``If-None-Match: *``); a writer that
        loses that race to another tries the number after. So several writers of one task
        each get a turn of their own, and none overwrites another's.

        ``if_match`` (an ETag) writes only over that version; ``if_none_match="*"`` only a
        turn that does not exist yet. Either raises PreconditionFailed when it does not hold.

        ``artifacts`` are stored with the turn in the same request (a multipart/form-data
        PUT, beyond the seed): the turn and all of them, or none; the turn's other artifacts
        stay. ``progress`` is called over that whole body. A server that takes a turn only as
        JSON gets the seed's requests instead: the turn, then each artifact.
        """
        body = {"meta": meta or {}, "summary_md": summary_md}
        if turn == "next" and if_match is not None:
            raise ValueError("if_match names one version of one turn; it cannot go with 'next'")
        uploads = list(artifacts)
        form = None
        if uploads:
            form = _Form(json.dumps(body, ensure_ascii=False).encode("utf-8"), uploads, progress)
        try:
            if turn != "next":
                return self._put_turn(task_id, turn, body, if_match, if_none_match, form)
            return put_next_turn(
                task_id,
                lambda: self._task_or_none(task_id),
                lambda _, number: self._put_turn(task_id, number, body, None, "*", form),
                # Artifacts read once from their source cannot be sent for another number.
                resend=form is None or form.replayable,
            )
        finally:
            if form is not None:
                form.close()

    def _put_turn(
        self,
        task_id: str,
        turn: int | str,
        body: dict[str, Any],
        if_match: str | None,
        if_none_match: str | None,
        form: _Form | None = None,
    ) -> TurnRecord:
        headers = {}
        if if_match is not None:
            headers["If-Match"] = if_match
        if if_none_match is not None:
            headers["If-None-Match"] = if_none_match
        path = f"/tasks/{_segment(task_id)}/turns/{_segment(turn)}"
        if form is None:
            response = self._send("PUT", path, json=body, headers=headers)
        else:
            try:
                response = self._send(
                    "PUT", path, body=form, headers={**headers, "Content-Type": form.content_type}
                )
            except ApiError as exc:
                if not (turn_form_unknown(exc) and form.replayable):
                    raise
                return self._put_turn_and_artifacts(task_id, turn, body, headers, form)
        return TurnRecord.from_json(response.json(), response.headers.get("ETag"))

    def _put_turn_and_artifacts(
        self,
        task_id: str,
        turn: int | str,
        body: dict[str, Any],
        headers: dict[str, str],
        form: _Form,
    ) -> TurnRecord:
        """The seed's way to the same end: the turn, then each artifact of ``form``; the
        turn as it is after the last."""
        path = f"/tasks/{_segment(task_id)}/turns/{_segment(turn)}"
        self._send("PUT", path, json=body, headers=headers)
        for name, kind, upload in form.uploads():
            self._send(
                "PUT",
                f"{path}/artifacts/{_segment(name)}",
                body=upload,
                headers={"Content-Type": kind},
            )
        return self.get_turn(task_id, int(turn))

    def _task_or_none(self, task_id: str) -> TaskIndex | None:
        try:
            return self.get_task(task_id)
        except ApiError as exc:
            if exc.status == 404:
                return None
            raise

    # -- artifacts -----------------------------------------------------------------------
    def put_artifact(
        self,
        task_id: str,
        turn: int,
        name: str,
        source: Source,
        *,
        content_type: str | None = None,
        if_match: str | None = None,
        if_none_match: Literal["*"] | None = None,
        progress: Progress | None = None,
    ) -> ArtifactRecord:
        """Store an artifact of a turn, streamed from ``source`` in constant memory.

        ``source``: a path (str or PathLike), bytes, a binary file object, or an iterable of
        byte chunks. ``content_type`` defaults to the one the name suggests (a text type for
        .log, .txt, .md, .diff, .patch and .json), else ``application/octet-stream``. The size is sent ahead when it is known (everything but
        an iterable or an unseekable stream), so the server can refuse an artifact over its
        limit or quota before any byte is sent.
        """
        headers = {"Content-Type": _content_type(name, content_type)}
        if if_match is not None:
            headers["If-Match"] = if_match
        if if_none_match is not None:
            headers["If-None-Match"] = if_none_match
        upload = _Body(source, progress)
        try:
            response = self._send(
                "PUT",
                f"/tasks/{_segment(task_id)}/turns/{_segment(turn)}/artifacts/{_segment(name)}",
                body=upload,
                headers=headers,
            )
        finally:
            upload.close()
        return ArtifactRecord.from_json(response.json(), response.headers.get("ETag"))

    def get_artifact(
        self,
        task_id: str,
        turn: int,
        name: str,
        dest: str | os.PathLike[str] | IO[bytes],
        *,
        progress: Progress | None = None,
    ) -> ArtifactInfo:
        """Download an artifact into ``dest`` (a path or a binary file object), streamed.

        A path is written atomically: the file appears whole, or not at all. The bytes are
        checked against the artifact's SHA-256 (its ETag) on the way; a mismatch raises and
        leaves the path untouched.
        """
        with self._artifact_stream(task_id, turn, name) as (response, info):
            digest = hashlib.sha256()
            done = 0
            total = info.size if "Content-Length" in response.headers else None

            def copy(out: IO[bytes]) -> None:
                nonlocal done
                try:
                    for block in response.iter_bytes(CHUNK):
                        out.write(block)
                        digest.update(block)
                        done += len(block)
                        if progress is not None:
                            progress(done, total)
                except httpx.TransportError as exc:
                    raise ServerUnreachable(
                        f"the download of {name} was cut off after {done} bytes ({exc})"
                    ) from None
                self._check_download(info, digest.hexdigest(), done, name)

            if isinstance(dest, (str, os.PathLike)):
                target = Path(dest)
                with atomic_file(target) as fh:
                    copy(fh)
                return ArtifactInfo(**{**info.to_dict(), "size": done, "path": str(target)})
            copy(dest)
            return ArtifactInfo(**{**info.to_dict(), "size": done})

    @contextmanager
    def _artifact_stream(
        self, task_id: str, turn: int, name: str
    ) -> Iterator[tuple[httpx.Response, ArtifactInfo]]:
        path = f"/tasks/{_segment(task_id)}/turns/{_segment(turn)}/artifacts/{_segment(name)}"
        response = self._send("GET", path, stream=True, headers={"Accept": "*/*"})
        try:
            info = ArtifactInfo(
                task_id=task_id,
                turn=int(turn),
                name=name,
                content_type=response.headers.get("Content-Type", "application/octet-stream"),
                size=int(response.headers.get("Content-Length") or 0),
                etag=response.headers.get("ETag"),
            )
            yield response, info
        finally:
            response.close()

    @staticmethod
    def _check_download(info: ArtifactInfo, sha256: str, size: int, name: str) -> None:
        match = _SHA256_ETAG.fullmatch(info.etag or "")
        if match and match.group(1) != sha256:
            raise ClientError(f"{name}: the bytes received do not match the artifact's SHA-256")
        if info.size and size != info.size:
            raise ClientError(f"{name}: received {size} of {info.size} bytes")

    # -- tasks ---------------------------------------------------------------------------
    def list_tasks(self, *, limit: int = 50, cursor: str | None = None) -> TaskList:
        """One page of tasks, most recently updated first (``limit`` 1..1000)."""
        params: dict[str, Any] = {"limit": limit}
        if cursor:
            params["cursor"] = cursor
        return TaskList.from_json(self._json("GET", "/tasks", params=params))

    def iter_tasks(self, *, page_size: int = 100) -> Iterator[TaskSummary]:
        """Every task, most recently updated first, fetched a page at a time."""
        cursor: str | None = None
        while True:
            page = self.list_tasks(limit=page_size, cursor=cursor)
            yield from page.tasks
            if not page.next_cursor:
                return
            cursor = page.next_cursor

    def get_task(self, task_id: str) -> TaskIndex:
        """The task index: its turns with their meta and artifact names, and its owner."""
        return TaskIndex.from_json(self._json("GET", f"/tasks/{_segment(task_id)}"))

    def delete_task(self, task_id: str) -> None:
        """Delete a task and everything in it (its owner, or project_admin and above)."""
        self._send("DELETE", f"/tasks/{_segment(task_id)}", ok=(204,))

    def delete_turn(self, task_id: str, turn: int, *, if_match: str | None = None) -> None:
        """Delete one turn with its artifacts (its task's owner, or project_admin and above);
        the task goes with its last turn. ``if_match``: only this version of the turn (412
        else). Its text leaves the server's files too, not only its answers."""
        headers = {"If-Match": if_match} if if_match is not None else None
        self._send("DELETE", f"/tasks/{_segment(task_id)}/turns/{turn}", headers=headers, ok=(204,))

    def delete_artifact(
        self, task_id: str, turn: int, name: str, *, if_match: str | None = None
    ) -> None:
        """Delete one artifact of a turn (as :meth:`delete_turn`); a write of that turn, whose
        ETag changes. ``if_match``: only this version of the artifact (its ETag)."""
        headers = {"If-Match": if_match} if if_match is not None else None
        self._send(
            "DELETE",
            f"/tasks/{_segment(task_id)}/turns/{turn}/artifacts/{_segment(name)}",
            headers=headers,
            ok=(204,),
        )

    # -- project.md ----------------------------------------------------------------------
    def iter_digest(self, chunk_size: int = CHUNK, *, limit: int | None = None) -> Iterator[bytes]:
        """``project.md`` as it streams in: closing the iterator early ends the download.
        ``limit``: only its newest ``limit`` sections (``?limit=``, 1..1000; a server that
        predates it sends them all)."""
        params = {"limit": limit} if limit is not None else None
        response = self._send(
            "GET", "/project.md", params=params, stream=True, headers={"Accept": "*/*"}
        )
        try:
            yield from response.iter_bytes(chunk_size)
        except httpx.TransportError as exc:
            raise ServerUnreachable(f"project.md was cut off ({exc})") from None
        finally:
            response.close()

    def get_digest(self, *, max_bytes: int | None = None, limit: int | None = None) -> str:
        """``project.md``: one section per task, newest first.

        ``max_bytes`` reads no more than that many bytes and stops the download there (a
        digest of many tasks is large); the text then ends at the last whole line read.
        ``limit`` asks for the newest ``limit`` sections only (see ``iter_digest``).
        """
        parts: list[bytes] = []
        size = 0
        chunk = CHUNK if max_bytes is None else min(CHUNK, max_bytes + 1)
        chunks = self.iter_digest(chunk, limit=limit)
        try:
            for block in chunks:
                parts.append(block)
                size += len(block)
                if max_bytes is not None and size > max_bytes:
                    break
        finally:
            chunks.close()  # type: ignore[attr-defined]
        data = b"".join(parts)
        if max_bytes is not None and len(data) > max_bytes:
            data = data[:max_bytes]
            cut = data.rfind(b"\n")
            data = data[: cut + 1] if cut >= 0 else b""
        return data.decode("utf-8", "replace")

    # -- search, usage, who am I ---------------------------------------------------------
    def search_page(
        self,
        query: str,
        *,
        limit: int = 20,
        cursor: str | None = None,
        mode: str | None = None,
    ) -> SearchResults:
        """One page of hits for ``query``, best first (``limit`` 1..100). ``mode``: hybrid,
        keyword or semantic (None: the server's default); the page says which ran
        (``modes``) and why it fell back to keywords (``fallback``)."""
        params: dict[str, Any] = {"q": query, "limit": limit}
        if cursor:
            params["cursor"] = cursor
        if mode:
            params["mode"] = mode
        return SearchResults.from_json(self._json("GET", "/search", params=params))

    def search(
        self, query: str, *, page_size: int = 20, mode: str | None = None
    ) -> Iterator[SearchHit]:
        """Every hit for ``query``, best first, fetched a page at a time.

        Keywords: every word must match; ``"a phrase"``; ``prefix*``. Turns and memories both.
        """
        cursor: str | None = None
        while True:
            page = self.search_page(query, limit=page_size, cursor=cursor, mode=mode)
            yield from page.hits
            if not page.next_cursor:
                return
            cursor = page.next_cursor

    def usage(self, *, hours: int | None = None) -> UsageReport:
        """What the project (and its tenant) stores, its quotas, and the traffic by hour."""
        params = {"hours": hours} if hours is not None else None
        return UsageReport.from_json(self._json("GET", "/usage", params=params))

    def ledger(
        self,
        *,
        group_by: Sequence[str] = ("day",),
        since: str | None = None,
        until: str | None = None,
        agent: str | None = None,
        model: str | None = None,
        branch: str | None = None,
        limit: int | None = None,
        cursor: str | None = None,
    ) -> dict[str, Any]:
        """What the project's turns add up to (GET /ledger): ``totals`` and ``rows`` grouped
        by ``group_by`` (day, agent, model, branch, task, session), each figure named with
        its unit; ``since`` / ``until`` an RFC 3339 time, ``7d``, ``12h``, ``yesterday``."""
        params = _present(
            group_by=",".join(group_by),
            since=since,
            until=until,
            agent=agent,
            model=model,
            branch=branch,
            limit=limit,
            cursor=cursor,
        )
        found: dict[str, Any] = self._json("GET", "/ledger", params=params)
        return found

    def timeline(
        self,
        *,
        since: str | None = None,
        until: str | None = None,
        agent: str | None = None,
        model: str | None = None,
        branch: str | None = None,
        limit: int | None = None,
        cursor: str | None = None,
    ) -> dict[str, Any]:
        """The project's turns across tasks, newest first (GET /timeline): ``turns`` and
        ``next_cursor``; the filters as :meth:`ledger` takes them."""
        params = _present(
            since=since,
            until=until,
            agent=agent,
            model=model,
            branch=branch,
            limit=limit,
            cursor=cursor,
        )
        found: dict[str, Any] = self._json("GET", "/timeline", params=params)
        return found

    def whoami(self) -> WhoAmI:
        """The token's id, name, role and expiry, and the tenant/project it acts in."""
        return WhoAmI.from_json(self._json("GET", "/whoami"))


def _present(**params: Any) -> dict[str, Any]:
    """The query parameters that were given (None: left out)."""
    return {k: v for k, v in params.items() if v is not None}
