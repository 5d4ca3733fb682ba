from __future__ import annotations

from hypothesis import given, strategies as st

from app.embeddings.chunks import split
from app.embeddings.fusion import rrf


def test_sections_are_cut_at_headings_and_keep_them() -> None:
    text = "intro\n\n# Decision\nuse sessions\n\n## Why\nthe TTL expired the cookie\n"
    assert [c.text for c in split(text)] == [
        "intro",
        "# Decision\nuse sessions",
        "## Why\nthe TTL expired the cookie",
    ]


def test_a_long_section_is_cut_at_breaks_and_repeats_its_heading() -> None:
    text = "# Log\n" + "\n\n".join(f"paragraph {n} " + "word " * 40 for n in range(30))
    chunks = split(text, max_chars=500)
    assert len(chunks) > 5
    assert all(len(c.text) <= 500 for c in chunks)
    assert all(c.text.startswith("# Log\n") for c in chunks)
    assert all(c.text.split("\n", 1)[1].startswith("paragraph") for c in chunks[1:])


def test_a_text_without_breaks_is_cut_anyway_and_the_count_is_capped() -> None:
    chunks = split("x" * 100_000, max_chars=1000, max_chunks=8)
    assert len(chunks) == 8
    assert [c.ordinal for c in chunks] == list(range(8))
    assert all(len(c.text) == 1000 for c in chunks)


@given(st.text(max_size=3000), st.integers(min_value=20, max_value=400))
def test_no_chunk_is_empty_or_over_the_cap(text: str, cap: int) -> None:
    chunks = split(text, max_chars=cap)
    assert all(c.text.strip() and len(c.text) <= cap for c in chunks)
    assert split(text, max_chars=cap) == chunks


def test_fusion_ranks_by_reciprocal_rank_sum_then_best_rank() -> None:
    fused = rrf([["a", "b", "c"], ["c", "a", "d"]])
    assert [key for key, _ in fused] == ["a", "c", "b", "d"]
    assert fused[0][1] == 1 / 61 + 1 / 62
    assert [key for key, _ in rrf([["x", "y"], ["y", "x"]])] == ["x", "y"]
    assert rrf([]) == []
