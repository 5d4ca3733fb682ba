"""The one small interface every embedder speaks.

An embedder turns texts into unit-length float32 rows. Its :class:`ModelId` (a name and the
number of dimensions) is stored with every vector it makes: vectors of two models are never
ranked together, and a changed model means the stored vectors are re-embedded.

A query and a document may be embedded differently (instruction-tuned models prefix them),
so each call says which it embeds.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal, Protocol

if TYPE_CHECKING:
    import numpy as np
    import numpy.typing as npt

Kind = Literal["query", "document"]


@dataclass(frozen=True)
class ModelId:
    """Which vector space a vector lives in: ``bundled:wordllama-256`` and 256, say."""

    name: str
    dims: int

    def key(self) -> str:
        """The identity as one string, stored beside each vector."""
        return f"{self.name}/{self.dims}"


class EmbedderUnavailable(Exception):
    """The embedder cannot answer now (down, timed out, its breaker open); search falls back to keywords."""


class Embedder(Protocol):
    model: ModelId

    def embed(self, texts: Sequence[str], *, kind: Kind) -> npt.NDArray[np.float32]:
        """Embed ``texts``: a ``(len(texts), model.dims)`` array of unit-length rows.

        Raises :class:`EmbedderUnavailable` when it cannot answer; never returns a partial batch.
        """
        ...
