"""One text from two versions of a memory that both changed since they last agreed.

The rule is git's union merge (``git merge-file --union``), line by line, against the base
(the version both sides last had) when it is known:

* a part only one side changed takes that side's change (an edit, an addition, a removal);
* a part both sides changed alike is taken once; so is a part where one side changed the
  base's lines and the other only added lines before or after them (both changes are kept);
* a part both changed differently keeps both: this machine's lines, then the other side's
  (a non-blank line it already holds is not repeated). Nothing either side wrote is lost,
  and no marker is added: the file stays what it was, Markdown an agent reads.

Without a base (a first sync, or a base no longer kept) the two texts are compared directly:
their common lines once, and wherever they differ, this machine's lines then the other's.
A line one side removed then comes back; remove it again.

A file that starts with a frontmatter block (``---`` ... ``---``, as Claude Code's memories
do) is merged in two parts: the block by the same rule, except that where both sides changed
the same lines this machine's are kept (two ``modified:`` keys would make the block
invalid YAML), and the body by the union rule. The other side's block is whole in its own
version, in the store's history.

Every text is compared as lines that each end with a newline: the result ends with one.
"""

from __future__ import annotations

from difflib import SequenceMatcher

FENCE = "---\n"


def merge_texts(base: str | None, ours: str, theirs: str) -> str:
    """``ours`` and ``theirs`` made into one text by the union rule (module docstring)."""
    if ours == theirs:
        return ours
    ours_head, ours_body = split_frontmatter(ours)
    theirs_head, theirs_body = split_frontmatter(theirs)
    if ours_head is None or theirs_head is None:
        return "".join(_merge(_lines(base), _lines(ours), _lines(theirs), union=True))
    base_head, base_body = split_frontmatter(base) if base is not None else (None, None)
    head = _merge(_lines(base_head), _lines(ours_head), _lines(theirs_head), union=False)
    body = _merge(_lines(base_body), _lines(ours_body), _lines(theirs_body), union=True)
    return "".join(head + body)


def split_frontmatter(text: str) -> tuple[str | None, str]:
    """``(block, body)``: the leading ``---`` ... ``---`` lines of ``text`` and the rest;
    ``(None, text)`` when it does not start with a whole block."""
    if not text.startswith(FENCE):
        return None, text
    end = text.find("\n---\n", len(FENCE) - 1)
    if end < 0:
        if text.endswith("\n---"):
            return text + "\n", ""
        return None, text
    cut = end + len("\n---\n")
    return text[:cut], text[cut:]


def _lines(text: str | None) -> list[str] | None:
    if text is None:
        return None
    lines = text.splitlines(keepends=True)
    if lines and not lines[-1].endswith(("\n", "\r")):
        lines[-1] += "\n"
    return lines


def _both(ours: list[str], theirs: list[str], union: bool) -> list[str]:
    """A part both sides changed differently."""
    if not union:
        return ours
    held = {line for line in ours if line.strip()}
    return ours + [line for line in theirs if not (line.strip() and line in held)]


def _changed_on_both(base: list[str], ours: list[str], theirs: list[str], union: bool) -> list[str]:
    """A part both sides changed. When one side only added lines before or after the base's
    (a line appended to an index while the other side edited or removed its last line, the
    common case), both changes are taken; else :func:`_both`."""
    n = len(base)
    if n:
        if theirs[:n] == base:
            return ours + theirs[n:]
        if theirs[-n:] == base:
            return theirs[:-n] + ours
        if ours[:n] == base:
            return theirs + ours[n:]
        if ours[-n:] == base:
            return ours[:-n] + theirs
    return _both(ours, theirs, union)


def _merge(
    base: list[str] | None, ours: list[str] | None, theirs: list[str] | None, *, union: bool
) -> list[str]:
    ours, theirs = ours or [], theirs or []
    if base is None:
        out: list[str] = []
        matcher = SequenceMatcher(None, ours, theirs, autojunk=False)
        for tag, o1, o2, t1, t2 in matcher.get_opcodes():
            out += ours[o1:o2] if tag == "equal" else _both(ours[o1:o2], theirs[t1:t2], union)
        return out
    out = []
    b0 = o0 = t0 = 0
    for b1, b2, o1, o2, t1, t2 in _stable(base, ours, theirs):
        # The part before this stable run: changed on one side, on both, or on neither.
        b_part, o_part, t_part = base[b0:b1], ours[o0:o1], theirs[t0:t1]
        if o_part == b_part:
            out += t_part
        elif t_part == b_part or o_part == t_part:
            out += o_part
        else:
            out += _changed_on_both(b_part, o_part, t_part, union)
        out += base[b1:b2]
        b0, o0, t0 = b2, o2, t2
    return out


def _stable(
    base: list[str], ours: list[str], theirs: list[str]
) -> list[tuple[int, int, int, int, int, int]]:
    """The runs of base lines that both sides kept unchanged, as ``(base start, base end,
    ours start, ours end, theirs start, theirs end)``, in order, ending with an empty run
    at the three ends (the diff3 "sync regions")."""
    ours_runs = SequenceMatcher(None, base, ours, autojunk=False).get_matching_blocks()
    theirs_runs = SequenceMatcher(None, base, theirs, autojunk=False).get_matching_blocks()
    found = []
    i = j = 0
    while i < len(ours_runs) and j < len(theirs_runs):
        ob, oo, on = ours_runs[i]
        tb, tt, tn = theirs_runs[j]
        start, end = max(ob, tb), min(ob + on, tb + tn)
        if start < end:
            found.append(
                (start, end, oo + start - ob, oo + end - ob, tt + start - tb, tt + end - tb)
            )
        if ob + on < tb + tn:
            i += 1
        else:
            j += 1
    found.append((len(base), len(base), len(ours), len(ours), len(theirs), len(theirs)))
    return found
