"""The union rule that merges two versions of a memory changed on both sides (mount/merge.py)."""

from __future__ import annotations

from hypothesis import given, strategies as st
from project_memory_client.mount.merge import merge_texts, split_frontmatter

# Few distinct lines, so that the sides share, move and repeat lines as real edits do.
LINE = st.sampled_from(["- [a](a.md) — A\n", "- [b](b.md)\n", "port 8000\n", "\n", "x\n", "y\n"])
TEXT = st.lists(LINE, max_size=12).map("".join)


def _added(text: str, base: str) -> set[str]:
    before = set(base.splitlines())
    return {line for line in text.splitlines() if line.strip() and line not in before}


@given(TEXT, TEXT)
def test_with_no_base_every_line_of_both_sides_is_kept(ours: str, theirs: str) -> None:
    merged = merge_texts(None, ours, theirs).splitlines()
    for line in ours.splitlines() + theirs.splitlines():
        assert line in merged


@given(TEXT, TEXT, TEXT)
def test_what_either_side_added_is_kept(base: str, ours: str, theirs: str) -> None:
    merged = set(merge_texts(base, ours, theirs).splitlines())
    assert _added(ours, base) <= merged and _added(theirs, base) <= merged


@given(TEXT, TEXT)
def test_a_side_that_did_not_change_takes_the_others_change(base: str, other: str) -> None:
    assert merge_texts(base, base, other) == other
    assert merge_texts(base, other, base) == other
    assert merge_texts(base, other, other) == other


def test_lines_appended_on_both_sides_are_both_kept_this_machines_first() -> None:
    base = "- [a](a.md) — A\n"
    assert merge_texts(base, base + "- [mine](m.md)\n", base + "- [theirs](t.md)\n") == (
        "- [a](a.md) — A\n- [mine](m.md)\n- [theirs](t.md)\n"
    )


def test_a_removal_on_one_side_and_an_addition_on_the_other_both_hold() -> None:
    base = "- [a](a.md)\n- [wrong](w.md)\n"
    assert merge_texts(base, "- [a](a.md)\n", base + "- [new](n.md)\n") == (
        "- [a](a.md)\n- [new](n.md)\n"
    )


def test_a_line_changed_differently_on_both_sides_keeps_both() -> None:
    merged = merge_texts("The API listens on port 8000.\n", "port 9000\n", "port 8080\n")
    assert merged == "port 9000\nport 8080\n"


def test_a_frontmatter_block_keeps_this_machines_lines_and_the_bodies_are_united() -> None:
    def memory(modified: str, body: str) -> str:
        return f"---\nname: ports\nmetadata:\n  modified: {modified}\n---\n\n{body}"

    base = memory("T0", "port 8000\n")
    merged = merge_texts(base, memory("T1", "port 9000\n"), memory("T2", "port 8080\n"))
    assert merged == memory("T1", "port 9000\nport 8080\n")
    head, body = split_frontmatter(merged)
    assert head is not None and head.count("modified:") == 1


def test_a_text_without_a_final_newline_is_never_glued_to_the_next_line() -> None:
    assert merge_texts(None, "mine", "theirs") == "mine\ntheirs\n"
