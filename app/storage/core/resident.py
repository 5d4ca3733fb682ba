"""Stored vectors kept in memory between queries: one float32 matrix per search index and
model, in each process, refreshed from a change log the index keeps beside its vectors.

Decoding every stored vector for every query costs more than ranking them: a semantic query
reads only what changed since the last one. A backend gives each index a :class:`Changes`:

- ``version()``: the index's epoch (new whenever the index is recreated: a rebuilt file, a
  cleared table) and its change counter, which every write that stores or drops a row's
  vectors moves, in the same transaction;
- ``changed(since)``: the rows whose vectors changed after counter ``since``, or None when
  the log no longer reaches back that far (it is pruned): the matrix is then loaded again;
- ``rows(model, docs)``: the current vectors of ``model`` of those rows (of every row for
  None).

**Never a removed row's vector.** A query reads the counter in its own read of the index,
and drops the rows that changed before it ranks, so a delete that answered before the query
began is never ranked; a hit still passes its owner's check when the page is built.

**Bounded.** The matrices of a process hold at most ``max_bytes`` together; past that, the
least recently searched projects' matrices are dropped (a project's indexes go together). A
project whose matrices alone exceed the bound is ranked from a matrix built for that query
and not kept.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Hashable, Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

import numpy as np

if TYPE_CHECKING:
    import numpy.typing as npt

# Rows a matrix grows by at least when rows arrive; dead rows (changed, removed) are
# compacted away once they are as many as the live ones.
_GROW = 1024


class Changes(Protocol):
    def version(self) -> tuple[str, int]: ...

    def changed(self, since: int) -> list[int] | None: ...

    def rows(self, model: str, docs: Sequence[int] | None) -> Iterable[tuple[int, bytes]]: ...


@dataclass(frozen=True, slots=True)
class Snapshot:
    """One index's vectors as a query ranks them: ``docs[i]`` owns ``matrix[i]``, a row that
    changed since it was loaded has ``alive[i]`` False."""

    docs: npt.NDArray[np.int64]
    matrix: npt.NDArray[np.float32]
    alive: npt.NDArray[np.bool_]

    def __len__(self) -> int:
        return int(self.alive.sum())


class _Matrix:
    """One index's rows of one model, grown in place; dead rows masked until compacted."""

    def __init__(self, epoch: str, seq: int, dims: int) -> None:
        self.epoch = epoch
        self.seq = seq
        self.dims = dims
        self.docs = np.zeros(0, dtype=np.int64)
        self.mat = np.zeros((0, dims), dtype=np.float32)
        self.alive = np.zeros(0, dtype=bool)
        self.n = 0
        self.dead = 0
        self.lock = threading.Lock()

    @property
    def nbytes(self) -> int:
        return int(self.docs.nbytes + self.mat.nbytes + self.alive.nbytes)

    def drop(self, docs: Sequence[int]) -> None:
        if not docs or not self.n:
            return
        gone = np.isin(self.docs[: self.n], np.asarray(docs, dtype=np.int64)) & self.alive[: self.n]
        self.alive[: self.n][gone] = False
        self.dead += int(gone.sum())

    def add(self, rows: Iterable[tuple[int, bytes]]) -> None:
        found = list(rows)
        if not found:
            return
        need = self.n + len(found)
        if need > len(self.docs):
            self._resize(max(need, self.n * 2, _GROW))
        docs = np.fromiter((d for d, _ in found), dtype=np.int64, count=len(found))
        joined = b"".join(blob for _, blob in found)
        block = np.frombuffer(joined, dtype="<f4").reshape(len(found), self.dims)
        self.docs[self.n : need] = docs
        self.mat[self.n : need] = block
        self.alive[self.n : need] = True
        self.n = need

    def compact(self) -> None:
        if self.dead < max(_GROW, self.n - self.dead):
            return
        keep = self.alive[: self.n]
        self.docs, self.mat = self.docs[: self.n][keep].copy(), self.mat[: self.n][keep].copy()
        self.n = len(self.docs)
        self.alive = np.ones(self.n, dtype=bool)
        self.dead = 0

    def _resize(self, cap: int) -> None:
        docs = np.zeros(cap, dtype=np.int64)
        mat = np.zeros((cap, self.dims), dtype=np.float32)
        alive = np.zeros(cap, dtype=bool)
        docs[: self.n], mat[: self.n], alive[: self.n] = (
            self.docs[: self.n],
            self.mat[: self.n],
            self.alive[: self.n],
        )
        self.docs, self.mat, self.alive = docs, mat, alive

    def snapshot(self) -> Snapshot:
        # Views of the rows loaded so far (rows added later land past them, a compaction or
        # a growth makes new arrays); the mask is copied, it is changed in place.
        return Snapshot(self.docs[: self.n], self.mat[: self.n], self.alive[: self.n].copy())


class ResidentVectors:
    """The matrices of one process (a worker), at most ``max_bytes`` of them."""

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self._guard = threading.Lock()
        # project -> (index, model) -> matrix, least recently searched project first.
        self._groups: OrderedDict[Hashable, dict[tuple[str, str], _Matrix]] = OrderedDict()

    def snapshot(
        self, group: Hashable, index: str, model: str, dims: int, changes: Changes
    ) -> Snapshot:
        """The live vectors of ``model`` of index ``index`` of project ``group``, brought up to
        date with ``changes`` (read inside the caller's read of the index)."""
        epoch, seq = changes.version()
        with self._guard:
            matrices = self._groups.setdefault(group, {})
            self._groups.move_to_end(group)
            matrix = matrices.get((index, model))
            if matrix is None or matrix.epoch != epoch or matrix.seq > seq:
                matrix = matrices[(index, model)] = _Matrix(epoch, -1, dims)
        with matrix.lock:
            if matrix.seq < 0:
                matrix.add(changes.rows(model, None))
            elif matrix.seq < seq:
                docs = changes.changed(matrix.seq)
                if docs is None:
                    matrix.drop(matrix.docs[: matrix.n].tolist())
                    matrix.add(changes.rows(model, None))
                else:
                    matrix.drop(docs)
                    matrix.add(changes.rows(model, docs))
                matrix.compact()
            matrix.seq = seq
            snap = matrix.snapshot()
        self._bound(group)
        return snap

    def forget(self, group: Hashable) -> None:
        with self._guard:
            self._groups.pop(group, None)

    def held(self) -> list[Hashable]:
        """The projects whose matrices are kept, the least recently searched first."""
        with self._guard:
            return list(self._groups)

    def nbytes(self) -> int:
        with self._guard:
            return sum(m.nbytes for g in self._groups.values() for m in g.values())

    def _bound(self, group: Hashable) -> None:
        with self._guard:
            total = sum(m.nbytes for g in self._groups.values() for m in g.values())
            for other in list(self._groups):
                if total <= self.max_bytes:
                    return
                if other == group:
                    continue
                total -= sum(m.nbytes for m in self._groups.pop(other).values())
            if total > self.max_bytes:
                # This project alone is past the bound: its matrix served this query only.
                self._groups.pop(group, None)


def best(
    query: npt.NDArray[np.float32], snap: Snapshot, want: int, room: int
) -> list[tuple[int, float]]:
    """The ``want`` best distinct docs of ``snap`` by cosine (a doc's best chunk), best first,
    over at most ``room`` of its chunks (the newest docs' when it has more)."""
    docs, matrix, alive = snap.docs, snap.matrix, snap.alive
    live = int(alive.sum())
    if room <= 0 or not live or want <= 0:
        return []
    if live > room:
        # The newest docs' chunks (doc numbers grow with each new row).
        cut = np.partition(docs[alive], live - room)[live - room]
        alive = alive & (docs >= cut)
    scores = matrix @ query
    scores[~alive] = -np.inf
    # The best chunks first; more than ``want`` since a doc may own several of them.
    take = min(len(scores), max(want * 8, 64))
    while True:
        if take < len(scores):
            top = np.argpartition(-scores, take - 1)[:take]
            top = top[np.argsort(-scores[top], kind="stable")]
        else:
            top = np.argsort(-scores, kind="stable")
        out: list[tuple[int, float]] = []
        seen: set[int] = set()
        for i in top.tolist():
            if not alive[i]:
                return out  # every live chunk was looked at
            doc = int(docs[i])
            if doc in seen:
                continue
            seen.add(doc)
            out.append((doc, float(scores[i])))
            if len(out) >= want:
                return out
        if take >= len(scores):
            return out
        take = min(len(scores), take * 4)
