"""The resident matrices' ranking: a doc's best chunk, dead rows never, the newest chunks
when a project has more than a search ranks, and the memory bound."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from app.storage.core.resident import ResidentVectors, Snapshot, best


def unit(*values: float) -> np.ndarray:
    row = np.asarray(values, dtype=np.float32)
    return row / np.linalg.norm(row)


def snap(rows: list[tuple[int, np.ndarray]], alive: list[bool] | None = None) -> Snapshot:
    return Snapshot(
        np.asarray([d for d, _ in rows], dtype=np.int64),
        np.stack([r for _, r in rows]).astype(np.float32),
        np.asarray(alive if alive is not None else [True] * len(rows), dtype=bool),
    )


def test_a_doc_ranks_by_its_best_chunk_and_appears_once() -> None:
    s = snap([(1, unit(1, 0)), (1, unit(0.9, 0.1)), (2, unit(0.5, 0.5)), (3, unit(0, 1))])
    assert [d for d, _ in best(unit(1, 0), s, 10, 100)] == [1, 2, 3]


def test_a_dead_row_is_never_ranked_even_when_fewer_live_rows_than_wanted() -> None:
    s = snap([(1, unit(1, 0)), (2, unit(0, 1))], alive=[False, True])
    assert [d for d, _ in best(unit(1, 0), s, 10, 100)] == [2]


def test_past_its_room_a_search_ranks_the_newest_docs_chunks() -> None:
    rows = [(doc, unit(1, doc / 100)) for doc in range(1, 50)]
    found = best(unit(1, 0), snap(rows), 100, 10)
    assert sorted(d for d, _ in found) == list(range(40, 50))


class Changes:
    def __init__(self, epoch: str, rows: dict[int, bytes]) -> None:
        self.epoch, self.seq, self.data = epoch, 1, rows

    def version(self) -> tuple[str, int]:
        return self.epoch, self.seq

    def changed(self, since: int) -> list[int] | None:
        return None

    def rows(self, model: str, docs: Sequence[int] | None) -> list[tuple[int, bytes]]:
        return [(d, v) for d, v in sorted(self.data.items()) if docs is None or d in docs]


def test_the_least_recently_searched_project_is_dropped_past_the_bound() -> None:
    vec = unit(1, 0).astype("<f4").tobytes()
    one = {d: vec for d in range(100)}
    # Room for one project's matrix (grown to 1,024 rows of 2 float32) and not two.
    cache = ResidentVectors(max_bytes=30_000)
    cache.snapshot("a", "i", "m", 2, Changes("e", one))
    cache.snapshot("b", "i", "m", 2, Changes("e", one))
    assert cache.held() == ["b"] and 0 < cache.nbytes() <= 30_000
    # A project past the bound alone is ranked from a matrix that is not kept.
    small = ResidentVectors(max_bytes=100)
    assert len(small.snapshot("a", "i", "m", 2, Changes("e", one))) == 100
    assert small.held() == [] and small.nbytes() == 0


def test_a_new_epoch_loads_the_index_again() -> None:
    cache = ResidentVectors(max_bytes=1 << 20)
    vec = unit(1, 0).astype("<f4").tobytes()
    cache.snapshot("a", "i", "m", 2, Changes("e1", {1: vec, 2: vec}))
    again = cache.snapshot("a", "i", "m", 2, Changes("e2", {3: vec}))
    assert again.docs[again.alive].tolist() == [3]
