"""Snippets cut from a bounded window of the text (app/storage/core/snippets.py): the same
fragment whatever is around it, however big the text, and the words a query matched marked."""

from __future__ import annotations

import pytest

from app.storage.core import snippets
from app.storage.core.query import MARK_END, MARK_START, parse_query


def cut(query: str, *sources: str) -> str:
    return snippets.snippet(sources, snippets.terms_of(parse_query(query).terms))


def marked(text: str) -> list[str]:
    return [part.split(MARK_END)[0] for part in text.split(MARK_START)[1:]]


def test_the_fragment_is_the_words_around_the_most_terms() -> None:
    text = "alpha " * 30 + "login then a bug in the login page " + "omega " * 30
    found = cut("login bug", text)
    assert found.startswith("…") and found.endswith("…")
    assert marked(found) == ["login", "bug", "login"]
    assert len(found.strip("…").split()) == snippets.SNIPPET_TOKENS


def test_a_phrase_is_marked_whole_and_a_prefix_marks_what_it_matched() -> None:
    assert marked(cut('"login page"', "The login page was fine.")) == ["login page"]
    assert marked(cut("stream*", "Streaming the upload.")) == ["Streaming"]


def test_case_diacritics_and_punctuation_are_compared_as_the_indexes_do() -> None:
    assert cut("cafe", "Le CAFÉ est fermé.") == f"Le {MARK_START}CAFÉ{MARK_END} est fermé."
    assert marked(cut("login", "see fix-login.")) == ["login"]


def test_the_first_source_with_a_match_is_cut_else_the_last_one() -> None:
    assert marked(cut("web", "no match here", "ticket WEB-17", "task")) == ["WEB"]
    assert cut("zzz", "no match", "", "the-task") == "the-task"


@pytest.mark.parametrize("where", [0, 200_000, 900_000])
def test_a_megabyte_of_text_gives_the_same_fragment_as_a_line_of_it(where: int) -> None:
    filler = ("lorem ipsum dolor " * 60_000)[:where]
    text = filler + " the passed test here " + "dolor " * 20
    found = cut("passed test", text)
    assert marked(found) == ["passed", "test"]
    assert "the" in found and "here" in found


def test_a_megabyte_of_matches_is_cut_from_its_start() -> None:
    text = ("passed test " * 90_000)[: 1 << 20]
    found = cut("passed test", text)
    assert found.endswith("…") and not found.startswith("…")
    assert marked(found) == ["passed", "test"] * 8


def test_beyond_the_window_only_what_the_query_spells_is_looked_for() -> None:
    """Past the scanned window a match is found by the query's own letters (case aside);
    one that differs by diacritics only shows the start of the text, unmarked."""
    far = "x " * (snippets.SCAN_CHARS // 2 + 10)
    assert marked(cut("cafe", far + "CAFE ouvert")) == ["CAFE"]
    assert marked(cut("cafe", far + "café ouvert")) == []
    assert marked(cut("cafe", "café ouvert " + far)) == ["café"]
