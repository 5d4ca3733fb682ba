"""The search query syntax, as the OpenAPI document states it (core/query.py query_pattern),
accepts exactly what the parser does: the same text, refused or taken, by either."""

from __future__ import annotations

import re
from typing import Any

import pytest
from hypothesis import example, given, settings, strategies as st

from app.storage.core.errors import InvalidName
from app.storage.core.query import MAX_QUERY_CHARS, parse_query, query_pattern

# Text made of the query syntax's own pieces and of any character at all.
_PIECES = st.sampled_from(
    [
        " ",
        "  ",
        "\t",
        "\n",
        "\u00a0",
        "\u3000",
        '"',
        "*",
        "-",
        "&",
        "!",
        ":",
        "a",
        "Z",
        "9",
        "é",
        "²",
        "🚀",
        "«",
        "\u0301",
        "\ufeff",
        "AND",
        "OR",
        "NOT",
        "NEAR",
        "and",
        "x",
        "\x00",
        "\x7f",
        "\x1f",
        "\x85",
    ]
)
QUERIES = st.one_of(
    st.lists(_PIECES, max_size=14).map("".join),
    st.text(max_size=20),
    st.lists(st.sampled_from(["w", "-", '"a b"', "x*", "ab*", "«»*"]), max_size=18).map(" ".join),
)


def _parser_takes(text: str) -> bool:
    try:
        parse_query(text)
    except InvalidName:
        return False
    return True


def _agree(text: str) -> None:
    by_pattern = re.fullmatch(query_pattern(), text) is not None and len(text) <= MAX_QUERY_CHARS
    assert by_pattern == _parser_takes(text)


EDGES = [
    "",
    "a " * 16,
    "a " * 17,
    "- " * 40 + "a",
    '"🚀"',
    "🚀*",
    "a«*",
    "x" * (MAX_QUERY_CHARS + 1),
]


def _with_edges(test: Any) -> Any:
    for text in reversed(EDGES):
        test = example(text)(test)
    return test


@settings(max_examples=300, deadline=None)
@given(QUERIES)
@_with_edges
def test_the_pattern_and_the_parser_agree(text: str) -> None:
    _agree(text)


@pytest.mark.slow  # 3,000 texts: ten times the case above, in `make slow`
@settings(max_examples=3000, deadline=None)
@given(QUERIES)
@_with_edges
def test_the_pattern_and_the_parser_agree_on_3000_texts(text: str) -> None:
    _agree(text)


def test_terms_without_a_letter_or_digit_are_left_out() -> None:
    assert parse_query("🚀 login").terms == parse_query("login").terms
    assert parse_query('"«»"').terms == ()
    (term,) = parse_query("a«*").terms  # a one-letter prefix is searched as the word
    assert (term.text, term.prefix) == ("a«", False)
    assert parse_query("ab«*").terms[0].prefix
