"""What both backends share of the semantic half of search: search modes, the vector bytes
stored beside the text, the checks on what an embedder answers, and the ranking.

A vector is stored as little-endian float32 bytes beside the model key it was made with
(``ModelId.key()``). Only vectors of the embedder's current key are ever ranked together;
vectors of another key (a changed model) are re-embedded in the background and ignored until
then. A search ranks at most :data:`MAX_RANKED_CHUNKS` chunks of a project (the newest
rows first): its cost is bounded whatever the project's size.
"""

from __future__ import annotations

from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor, TimeoutError as FutureTimeout
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal, TypeVar

import numpy as np

from app.embeddings.base import Embedder, EmbedderUnavailable
from app.embeddings.chunks import split

if TYPE_CHECKING:
    import numpy.typing as npt

K = TypeVar("K")
Mode = Literal["hybrid", "keyword", "semantic"]
MODES: tuple[Mode, ...] = ("hybrid", "keyword", "semantic")
# Chunks a search ranks by cosine at most, per project: numpy over 100,000 x 256 float32
# rows is tens of milliseconds; the newest rows are kept when a project has more.
MAX_RANKED_CHUNKS = 100_000
# Results each half of a hybrid search contributes to the fusion, and how deep a hybrid or
# semantic search pages: its cursor is an offset into the fused list.
FUSE_DEPTH = 200
# Texts embedded per call of the background worker.
EMBED_BATCH = 64
# Seconds a drain waits after the first write that asks for it (background.Later's settle):
# the writes of a busy moment are embedded in one drain, whose lock, reads and write
# transaction then cost once for all of them rather than once per write. A text is searchable
# by its words at once; by its meaning this much later.
EMBED_SETTLE = 0.25


@dataclass(frozen=True, slots=True)
class Fallback:
    """Why a search that asked for vectors answered with keywords only."""

    reason: str


def default_mode(embedder: Embedder | None) -> Mode:
    return "keyword" if embedder is None else "hybrid"


def resolve_mode(mode: str | None, embedder: Embedder | None) -> Mode:
    """The mode a search runs in: the asked one, else hybrid with an embedder, keyword
    without. ValueError for a mode that is not one of :data:`MODES`."""
    if mode is None:
        return default_mode(embedder)
    if mode not in MODES:
        raise ValueError(f"mode must be one of {', '.join(MODES)}")
    return mode


def model_key(embedder: Embedder) -> str:
    """The key of the embedder's model. A model's width is part of it, and a remote
    embedder learns its width from its first answer: one that has not answered yet is asked
    once here, so rows are never queued or checked against a key with no width
    (EmbedderUnavailable when it cannot answer)."""
    if embedder.model.dims == 0:
        embedder.embed(["the width of this model"], kind="document")
    return embedder.model.key()


def embed_text(values: Sequence[str]) -> str:
    """The text embedded for a row: its searchable values but the owner's id, one a line."""
    return "\n".join(v for v in values if v)


def to_blob(row: npt.NDArray[np.float32]) -> bytes:
    return np.asarray(row, dtype="<f4").tobytes()


def from_blobs(blobs: Sequence[bytes], dims: int) -> npt.NDArray[np.float32]:
    """Stack stored vectors into one ``(n, dims)`` matrix (a blob of another size is skipped
    by the caller's model key filter; here it is an error)."""
    if not blobs:
        return np.zeros((0, dims), dtype=np.float32)
    joined = b"".join(blobs)
    return np.frombuffer(joined, dtype="<f4").reshape(len(blobs), dims).astype(np.float32)


def checked(rows: object, count: int, dims: int) -> npt.NDArray[np.float32]:
    """What an embedder answered, as ``(count, dims)`` unit rows; EmbedderUnavailable when it
    is anything else (a wrong shape, NaN, a zero row): nothing is stored from garbage."""
    try:
        matrix = np.asarray(rows, dtype=np.float32)
    except (TypeError, ValueError) as exc:
        raise EmbedderUnavailable(f"the embedder answered no vectors: {exc}") from None
    if matrix.shape != (count, dims):
        raise EmbedderUnavailable(
            f"the embedder answered shape {matrix.shape}, not {(count, dims)}"
        )
    if not np.isfinite(matrix).all():
        raise EmbedderUnavailable("the embedder answered a vector that is not finite")
    norms = np.linalg.norm(matrix, axis=1)
    if count and (norms < 1e-6).any():
        raise EmbedderUnavailable("the embedder answered a zero vector")
    unit: npt.NDArray[np.float32] = (matrix / norms[:, None]).astype(np.float32)
    return unit


def embed_documents(embedder: Embedder, texts: Sequence[str]) -> list[list[tuple[int, bytes]]]:
    """Chunk each text and embed every chunk in one call: per text, its (ordinal, vector
    bytes). A text with no chunk gets none. EmbedderUnavailable when the embedder cannot
    answer (nothing is returned for any text)."""
    chunked = [split(text) for text in texts]
    flat = [c.text for chunks in chunked for c in chunks]
    matrix = (
        checked(embedder.embed(flat, kind="document"), len(flat), embedder.model.dims)
        if flat
        else np.zeros((0, embedder.model.dims), dtype=np.float32)
    )
    out: list[list[tuple[int, bytes]]] = []
    at = 0
    for chunks in chunked:
        out.append([(c.ordinal, to_blob(matrix[at + i])) for i, c in enumerate(chunks)])
        at += len(chunks)
    return out


def embed_query(embedder: Embedder, query: str) -> npt.NDArray[np.float32]:
    """The query's unit vector (EmbedderUnavailable when the embedder cannot answer)."""
    matrix = checked(embedder.embed([query], kind="query"), 1, embedder.model.dims)
    row: npt.NDArray[np.float32] = matrix[0]
    return row


class QueryEmbedding:
    """Embeds a search's query within a share of its time budget: an embedder slower than
    that (a remote server that hangs) makes the search answer keyword results in time, not a
    503. At most ``workers`` queries are embedded at once per process; a call still running
    past its share finishes in its thread (bounded by the embedder's own timeout) and the
    next query waits behind it, falling back in turn, so a hung server never takes more than
    ``workers`` threads."""

    def __init__(self, workers: int) -> None:
        self.pool = ThreadPoolExecutor(max_workers=max(1, workers), thread_name_prefix="query")

    def embed(self, embedder: Embedder, query: str, seconds: float) -> npt.NDArray[np.float32]:
        """The query's unit vector; EmbedderUnavailable when the embedder cannot answer or
        did not within ``seconds``."""
        future = self.pool.submit(embed_query, embedder, query)
        try:
            return future.result(timeout=max(0.0, seconds))
        except FutureTimeout:
            future.cancel()
            raise EmbedderUnavailable(
                f"it did not answer within {seconds:.2g} s, its share of the search's budget"
            ) from None


# The share of a search's time budget its query's embedding may take; the keyword half and
# the ranking have the rest.
QUERY_SHARE = 0.5


def best_docs(
    query: npt.NDArray[np.float32],
    keys: Sequence[K],
    matrix: npt.NDArray[np.float32],
    want: int,
) -> list[tuple[K, float]]:
    """The ``want`` best distinct keys by cosine (a key's best chunk), best first; ``keys[i]``
    owns row ``i`` of ``matrix``."""
    if not len(keys):
        return []
    scores = matrix @ query
    order = np.argsort(-scores, kind="stable")
    out: list[tuple[K, float]] = []
    seen: set[K] = set()
    for i in order:
        key = keys[int(i)]
        if key in seen:
            continue
        seen.add(key)
        out.append((key, float(scores[int(i)])))
        if len(out) >= want:
            break
    return out
