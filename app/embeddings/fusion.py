"""Reciprocal-rank fusion: one ranking from several, by rank alone.

Keyword scores (FTS5's bm25, PostgreSQL's ts_rank) and cosine similarities are not comparable,
so only ranks are fused: a result at rank r (from 1) in a list adds ``1 / (k + r)``; the fused
order is by the sum, higher first, ties broken by the best single rank, then by first sight.
``k = 60`` is the constant of Cormack, Clarke and Büttcher (2009) that the peers use.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from typing import TypeVar

K = TypeVar("K", bound=Hashable)
RRF_K = 60


def rrf(rankings: Sequence[Sequence[K]], *, k: int = RRF_K) -> list[tuple[K, float]]:
    """Fuse ``rankings`` (each best first, no repeats within one): ``(key, score)`` best first."""
    score: dict[K, float] = {}
    best: dict[K, int] = {}
    for ranking in rankings:
        for rank, key in enumerate(ranking, start=1):
            score[key] = score.get(key, 0.0) + 1.0 / (k + rank)
            best[key] = min(best.get(key, rank), rank)
    order = {key: n for n, key in enumerate(score)}
    fused = sorted(score, key=lambda key: (-score[key], best[key], order[key]))
    return [(key, score[key]) for key in fused]
