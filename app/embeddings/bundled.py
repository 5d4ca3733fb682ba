"""The bundled offline embedder: vectors shipped inside a wheel, loaded with no network."""

from __future__ import annotations

import threading
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from app.embeddings.base import EmbedderUnavailable, Kind, ModelId

if TYPE_CHECKING:
    import numpy as np
    import numpy.typing as npt

WORDLLAMA_DIMS = 256


class WordLlamaEmbedder:
    """wordllama's static token embeddings (``l2_supercat``, 256 dimensions), from its own wheel.

    The weights are read from the installed package directory and never downloaded: a server
    with no outbound network loads them the same way.
    """

    def __init__(self) -> None:
        self.model = ModelId(f"bundled:wordllama-l2_supercat-{WORDLLAMA_DIMS}", WORDLLAMA_DIMS)
        self._lock = threading.Lock()
        self._inference: object | None = None

    def _load(self) -> object:
        with self._lock:
            if self._inference is None:
                try:
                    import wordllama
                    from wordllama import WordLlama
                except ImportError as e:
                    raise EmbedderUnavailable(f"wordllama is not installed: {e}") from e
                package = Path(wordllama.__file__).parent
                self._inference = WordLlama.load(
                    disable_download=True, cache_dir=package, dim=WORDLLAMA_DIMS
                )
            return self._inference

    def embed(self, texts: Sequence[str], *, kind: Kind) -> npt.NDArray[np.float32]:
        """Embed ``texts`` (queries and documents alike: the model has no instructions)."""
        import numpy as np

        inference = self._load()
        rows = inference.embed(list(texts), norm=True)  # type: ignore[attr-defined]
        return np.asarray(rows, dtype=np.float32).reshape(len(texts), WORDLLAMA_DIMS)
