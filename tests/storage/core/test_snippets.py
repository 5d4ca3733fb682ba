"""Snippets cut from a bounded window of the text (app/storage/core/snippets.py): the same
fragment whatever is around it, however big the text, and the words a query matched marked."""

from __future__ import annotations

import pytest
from hypothesis import given, settings, strategies as st

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


# -- only the words near a match are split -----------------------------------------------------
FILLER = "Rewrote the idle parser in `app/api/x.py` — so the error names the field. "


def whole_split(query: str, text: str) -> str | None:
    """The snippet by the rule itself, for a text inside the window: every word split and
    folded, the first SNIPPET_TOKENS-word stretch with the most terms (then occurrences)."""
    terms = snippets.terms_of(parse_query(query).terms)
    spans = [m.span() for m in snippets._WORD.finditer(text)]
    words = [snippets.fold(text[a:b]) for a, b in spans]
    found = sorted(
        (i, i + len(term.words) - 1, t)
        for t, term in enumerate(terms)
        for i in range(len(words))
        if term.words and term.at(words, i)
    )
    if not found:
        return None
    size = snippets.SNIPPET_TOKENS

    def inside(start: int) -> list[tuple[int, int, int]]:
        return [f for f in found if f[0] >= start and f[1] < start + size]

    def score(f: tuple[int, int, int]) -> tuple[int, int]:
        return len({t for _, _, t in inside(f[0])}), len(inside(f[0]))

    best = max(found, key=score)  # the first of the best
    members = inside(best[0]) or [best]
    chosen = members[0][0], max(f[1] for f in members)
    return snippets._fragment(text, spans, found, chosen)


def test_a_match_deep_in_a_long_text_is_found_and_centred() -> None:
    text = FILLER * 100 + "then the login bug was fixed " + FILLER * 80
    assert len(text) < snippets.SCAN_CHARS
    found = cut("login bug", text)
    assert marked(found) == ["login", "bug"]
    assert found.startswith("…") and found.endswith("…")
    assert found == whole_split("login bug", text)


def test_a_match_only_in_folded_form_is_found_deep_in_the_window() -> None:
    """The query spells cafe; the text writes it with an accent, precomposed or decomposed,
    in capitals, between words in ASCII."""
    for written in ["CAFÉ", "Cafe\u0301", "café"]:
        text = FILLER * 60 + f"the {written} locale " + FILLER * 60
        found = cut("cafe", text)
        assert marked(found) == [written], written
        assert found == whole_split("cafe", text)
    # And the other way round: the query has the accent, the text not.
    assert marked(cut("Café", FILLER * 60 + "a CAFE here")) == ["CAFE"]


def test_a_prefix_marks_whole_words_and_never_the_inside_of_one() -> None:
    text = FILLER * 40 + "upstream then Streaming and streams, re-stream " + FILLER * 40
    found = cut("stream*", text)
    assert marked(found) == ["Streaming", "streams", "stream"]
    assert found == whole_split("stream*", text)
    # Inside a word after a combining mark is inside the word, not a start of one.
    assert marked(cut("tude", "e\u0301tude and tude")) == ["tude"]


def test_a_phrase_is_found_only_whole_and_in_order() -> None:
    text = FILLER * 30 + "session was slow; the timeout then session timeout hit " + FILLER * 30
    found = cut('"session timeout"', text)
    assert marked(found) == ["session timeout"]
    assert found == whole_split('"session timeout"', text)
    assert marked(cut('"timeout session"', text)) == []


def test_a_phrase_across_the_edge_of_the_window_is_found() -> None:
    """The scan past the window starts at the window's last words, so a phrase that starts
    in it and ends past it is found and marked whole."""
    head = "x " * (snippets.SCAN_CHARS // 2 - 3)
    text = head + "the session timeout was raised " + "y " * 100
    assert text.index("session") < snippets.SCAN_CHARS < text.index("timeout")
    assert marked(cut('"session timeout"', text)) == ["session timeout"]


def test_the_fragment_is_the_best_one_wherever_the_matches_are() -> None:
    """Far apart, close together, at the text's start and at its end: the fragment is the
    one a split of the whole text gives."""
    parts = ["login", "bug", "the login bug", "bug login", "LOGIN-bug"]
    for k in range(len(parts)):
        for at in [0, 1, 3, 9, 15, 40]:
            text = " ".join(["w"] * at + [parts[k]] + ["v"] * 20 + parts[:k] + ["z"] * at)
            for query in ["login bug", "login", "bug*", '"login bug"']:
                assert cut(query, text) == whole_split(query, text) or (
                    whole_split(query, text) is None and not marked(cut(query, text))
                ), (query, text)


def test_a_phrase_longer_than_the_fragment_shows_its_start() -> None:
    size = snippets.SNIPPET_TOKENS
    words = [f"w{i}" for i in range(size + 3)]
    found = cut(f'"{" ".join(words)}"', f"intro {' '.join(words)} outro")
    assert found == "…" + " ".join(words[:size]) + "…"


def test_general_punctuation_holds_no_letter() -> None:
    """The scan for non-ASCII letters skips U+2000-U+206F (dashes, quotes, ellipsis)."""
    assert not [hex(c) for c in range(0x2000, 0x2070) if snippets._WORD.match(chr(c))]


WORDS = ["login", "LOGIN", "lögin", "bug", "bugs", "debug", "café", "CAFE", "cafe\u0301", "x"]
WORDS += ["session", "timeout", "Straße", "strasse", "e\u0301tude", "tude", "the", "ﬁx", "fix"]
SEPARATORS = [" ", " ", " ", "-", ", ", "\n", "’", "_", "—", "\u0301 ", "/"]
QUERIES = ["login bug", '"session timeout"', "log*", "caf*", "café", "strasse", "tude"]
QUERIES += ['"fix login"', "bug*", '"login bug*"', "x bug timeout", '"the login"', "fix"]


@settings(max_examples=400, deadline=None)
@given(
    st.lists(st.tuples(st.sampled_from(WORDS), st.sampled_from(SEPARATORS)), max_size=120),
    st.sampled_from(QUERIES),
)
def test_the_fragment_is_the_one_a_split_of_every_word_gives(
    parts: list[tuple[str, str]], query: str
) -> None:
    text = "".join(word + gap for word, gap in parts)
    expected = whole_split(query, text)
    found = cut(query, text)
    if expected is None:
        assert not marked(found)
    else:
        assert found == expected
