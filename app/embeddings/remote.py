"""An embedder that asks a team's own server: any OpenAI-compatible ``POST /v1/embeddings``.

Ollama, llama.cpp's server, Hugging Face TEI, vLLM, LiteLLM and OpenAI itself answer
``{"model": ..., "input": [texts]}`` with ``{"data": [{"index": i, "embedding": [...]}]}``.

A server that is down, slow or wrong must cost search a bounded time and never an error: every
request has a timeout, a failed request is retried with back-off only while a total time
budget lasts, and a circuit breaker stops asking after consecutive failures (callers get
:class:`EmbedderUnavailable` at once and search answers keywords). An answer that is not a
well-formed list of finite vectors of the expected width is a failure too: nothing from it is
returned, so nothing from it is stored.

The API key is sent in the ``Authorization`` header and nowhere else: not in a repr, a log
line or an error message (a server's error body may echo it, so bodies are never quoted).
"""

from __future__ import annotations

import json
import logging
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from app.embeddings.base import EmbedderUnavailable, Kind, ModelId
from app.embeddings.breaker import CircuitBreaker

if TYPE_CHECKING:
    import numpy as np
    import numpy.typing as npt

log = logging.getLogger(__name__)

# Statuses worth asking again: the server is overloaded or restarting. Any other 4xx (a bad
# key, an unknown model) will answer the same way a second time.
_RETRY_STATUS = frozenset({408, 425, 429, 500, 502, 503, 504})
# Bytes of an answer read at most: 64 texts of 4,096 floats as JSON fit with room to spare.
MAX_ANSWER_BYTES = 64 * 2**20
_PIECE = 2**16


class BadAnswer(EmbedderUnavailable):
    """The server answered, but not with what was asked for (garbage, or another width)."""


class _Transient(Exception):
    """A failure worth retrying (timeout, refused connection, 5xx, 429)."""


def embeddings_url(url: str) -> str:
    """The ``.../embeddings`` address for a base URL (``http://host:11434/v1``) or the full one."""
    parts = urllib.parse.urlsplit(url.strip())
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError("the embeddings URL must be http:// or https:// with a host")
    if parts.username or parts.password:
        raise ValueError("the embeddings URL must not carry credentials; give the key apart")
    path = parts.path.rstrip("/")
    if not path.endswith("/embeddings"):
        path += "/embeddings"
    return urllib.parse.urlunsplit((parts.scheme, parts.netloc, path, parts.query, ""))


class OpenAICompatibleEmbedder:
    """Embed through an OpenAI-compatible server; its model is ``openai:<model>``.

    ``dims`` is learned from the first answer when not given (``model.dims`` is 0 until
    then); an answer of another width afterwards is a :class:`BadAnswer`. ``timeout`` bounds
    each socket operation of a request; ``deadline`` (default: three timeouts) bounds one
    ``embed`` call, retries and back-off included (it may overrun by one read, at most
    ``timeout``); a query's call, the shorter of it and ``query_deadline``. ``batch`` texts go in one request; ``retries`` more tries follow a failure
    worth retrying, after ``backoff`` seconds, then twice that, and so on.
    """

    def __init__(
        self,
        url: str,
        model: str,
        *,
        api_key: str | None = None,
        dims: int | None = None,
        timeout: float = 10.0,
        batch: int = 64,
        retries: int = 2,
        backoff: float = 0.25,
        deadline: float | None = None,
        query_deadline: float = 2.0,
        breaker: CircuitBreaker | None = None,
    ) -> None:
        if not model or not model.strip():
            raise ValueError("an embeddings model name is required")
        if dims is not None and dims < 1:
            raise ValueError("dims must be positive")
        if timeout <= 0 or batch < 1 or retries < 0 or backoff < 0 or query_deadline <= 0:
            raise ValueError("timeout and batch must be positive, retries and backoff not negative")
        self.url = embeddings_url(url)
        self.model_name = model
        self._key = api_key or None
        self._dims = dims or 0
        self.model = ModelId(f"openai:{model}", self._dims)
        self.timeout = timeout
        self.batch = batch
        self.retries = retries
        self.backoff = backoff
        self.deadline = deadline if deadline is not None else 3 * timeout
        self.query_deadline = query_deadline
        self.breaker = breaker or CircuitBreaker()
        self._lock = threading.Lock()
        # No proxy from the environment: the server is named by its URL, and a proxy would
        # see the key.
        self._opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))

    def __repr__(self) -> str:
        key = "set" if self._key else "none"
        return f"OpenAICompatibleEmbedder(url={self.url!r}, model={self.model_name!r}, key={key})"

    def embed(self, texts: Sequence[str], *, kind: Kind) -> npt.NDArray[np.float32]:
        """Embed ``texts`` in batches; all of them, or :class:`EmbedderUnavailable`."""
        import numpy as np

        if not texts:
            return np.zeros((0, self._dims), dtype=np.float32)
        if not self.breaker.allow():
            raise EmbedderUnavailable(
                f"embeddings server {self.url} is failing; next try in"
                f" {self.breaker.retry_after():.0f} s"
            )
        # A query is embedded while a search waits: it gets the shorter deadline, and a search
        # whose embedder is slow answers keyword results instead. Documents are embedded in the
        # background and may wait the whole deadline.
        deadline = min(self.deadline, self.query_deadline) if kind == "query" else self.deadline
        end = time.monotonic() + deadline
        try:
            parts = [
                self._batch(list(texts[at : at + self.batch]), end)
                for at in range(0, len(texts), self.batch)
            ]
        except EmbedderUnavailable as e:
            self.breaker.failure()
            log.warning("embeddings server unavailable: %s", e)
            raise
        except BaseException:
            self.breaker.failure()
            raise
        self.breaker.success()
        return np.concatenate(parts)

    def _batch(self, texts: list[str], end: float) -> npt.NDArray[np.float32]:
        """One batch, retried with back-off while the deadline lasts."""
        attempt = 0
        while True:
            left = end - time.monotonic()
            if left <= 0:
                raise EmbedderUnavailable(f"embeddings server {self.url} took too long")
            try:
                return self._parse(self._post(texts, end), len(texts))
            except _Transient as e:
                pause = self.backoff * 2**attempt
                attempt += 1
                if attempt > self.retries or time.monotonic() + pause >= end:
                    raise EmbedderUnavailable(
                        f"embeddings server {self.url}: {e} (after {attempt} tries)"
                    ) from None
                time.sleep(pause)

    def _post(self, texts: list[str], end: float) -> bytes:
        body = json.dumps({"model": self.model_name, "input": texts}).encode()
        headers = {"Content-Type": "application/json", "Accept": "application/json"}
        if self._key:
            headers["Authorization"] = f"Bearer {self._key}"
        # The scheme was checked to be http(s) when the embedder was made.
        request = urllib.request.Request(self.url, data=body, headers=headers, method="POST")  # noqa: S310
        try:
            with self._opener.open(request, timeout=self._left(end)) as answer:
                data = self._read(answer, end)
        except urllib.error.HTTPError as e:
            e.close()
            if e.code in _RETRY_STATUS:
                raise _Transient(f"HTTP {e.code}") from None
            raise BadAnswer(f"embeddings server {self.url} answered HTTP {e.code}") from None
        except (urllib.error.URLError, OSError) as e:
            reason = getattr(e, "reason", e)
            raise _Transient(f"{type(reason).__name__}: {reason}") from None
        return data

    def _left(self, end: float) -> float:
        left = min(self.timeout, end - time.monotonic())
        if left <= 0:
            raise _Transient("the deadline passed")
        return left

    def _read(self, answer: Any, end: float) -> bytes:
        """The body, as it comes: a server trickling bytes is stopped within one timeout of the
        deadline (the socket timeout alone bounds each read, not their sum)."""
        pieces: list[bytes] = []
        size = 0
        while True:
            piece = answer.read1(_PIECE)
            if not piece:
                return b"".join(pieces)
            size += len(piece)
            if size > MAX_ANSWER_BYTES:
                raise BadAnswer(f"embeddings server {self.url} answered more than allowed")
            pieces.append(piece)
            if time.monotonic() >= end:
                raise _Transient("the answer was still coming at the deadline")

    def _parse(self, data: bytes, n: int) -> npt.NDArray[np.float32]:
        import numpy as np

        try:
            doc = json.loads(data)
            items = doc["data"]
            if not isinstance(items, list) or len(items) != n:
                raise ValueError(f"{n} vectors asked, {len(items)} answered")
            rows: list[list[float] | None] = [None] * n
            for position, item in enumerate(items):
                index = item.get("index", position)
                vector = item["embedding"]
                if not isinstance(index, int) or not 0 <= index < n or rows[index] is not None:
                    raise ValueError("vector indices are not 0..n-1 once each")
                if not isinstance(vector, list) or not vector:
                    raise ValueError("a vector is not a list of numbers")
                rows[index] = vector
            matrix = np.array(rows, dtype=np.float64)
        except (ValueError, TypeError, KeyError, AttributeError) as e:
            raise BadAnswer(f"embeddings server {self.url} answered garbage: {e}") from None
        if matrix.ndim != 2 or not np.isfinite(matrix).all():
            raise BadAnswer(f"embeddings server {self.url} answered vectors of mixed or bad values")
        norms = np.linalg.norm(matrix, axis=1, keepdims=True)
        if not (norms > 0).all():
            raise BadAnswer(f"embeddings server {self.url} answered a zero vector")
        width = matrix.shape[1]
        with self._lock:
            if self._dims == 0:
                self._dims = width
                self.model = ModelId(self.model.name, width)
            elif width != self._dims:
                raise BadAnswer(
                    f"embeddings server {self.url} answered {width} dimensions,"
                    f" {self._dims} expected: has its model changed?"
                )
        unit: npt.NDArray[np.float32] = (matrix / norms).astype(np.float32)
        return unit
