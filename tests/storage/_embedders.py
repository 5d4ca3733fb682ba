"""Embedders for the tests: deterministic vectors from each word's hash, one that is down,
one that answers garbage. No model is loaded."""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

import numpy as np
import numpy.typing as npt

from app.embeddings.base import EmbedderUnavailable, Kind, ModelId


class HashEmbedder:
    """Deterministic vectors from each word's hash: texts sharing words are close."""

    def __init__(self, name: str = "test:hash", dims: int = 32) -> None:
        self.model = ModelId(name, dims)
        self.calls = 0

    def embed(self, texts: Sequence[str], *, kind: Kind) -> npt.NDArray[np.float32]:
        self.calls += 1
        out = np.zeros((len(texts), self.model.dims), dtype=np.float32)
        for i, text in enumerate(texts):
            for word in text.lower().split():
                h = int.from_bytes(hashlib.sha256(word.encode()).digest()[:4], "little")
                out[i, h % self.model.dims] += 1.0
            out[i, 0] += 1e-3
        return out / np.linalg.norm(out, axis=1, keepdims=True)


class DownEmbedder(HashEmbedder):
    def embed(self, texts: Sequence[str], *, kind: Kind) -> npt.NDArray[np.float32]:
        raise EmbedderUnavailable("connection refused")


class GarbageEmbedder(HashEmbedder):
    def embed(self, texts: Sequence[str], *, kind: Kind) -> npt.NDArray[np.float32]:
        return np.full((len(texts), 3), np.nan, dtype=np.float32)
