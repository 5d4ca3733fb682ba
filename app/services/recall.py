"""What a project's memory holds about a prompt: the best hits of one search for its words,
framed, within a character budget (POST /recall; the coding agents' prompt hook).

A prompt is natural language, where a search wants every one of its terms: "when does the
deploy key rotate?" would find only a text holding "when" and "does" too. So a prompt
becomes terms (:func:`prompt_terms`): its words of letters and digits, lower case, without
stop words and words of fewer than MIN_WORD characters, each of four characters or more a
prefix of itself less one English ending (``rotates`` → ``rotat*``: both backends index
words as written, without stemming), at most MAX_TERMS of them, the longest first; and the
search needs any one of them (``any_term``), ranked as usual (bm25 on the tree, ts_rank on
PostgreSQL), so a text with more of them ranks higher.

The answer puts the current task's own hits first, newest turn first (at most OWN_LIMIT
ahead of the others), then the others, best first: at most HIT_LIMIT, each an excerpt of its
text around the first word found, framed (app/services/framing.py), the whole at most
``max_chars`` characters. When nothing matches, the context is empty: no header, nothing.

The cost is bounded whatever the prompt: MAX_PROMPT_CHARS read, MAX_TERMS terms, one search
of SEARCH_LIMIT hits (the search's own time budget and slots), and at most HIT_LIMIT records
read, each scanned over SCAN_CHARS. Same rules as a search: any token of the project, the
project's own text only, nothing deleted or expired. The prompt is neither stored nor
logged.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from app.services.framing import NOTE, frame, neutral
from app.storage.core.errors import NotFound
from app.storage.core.models import SearchHit
from app.storage.core.names import Scope
from app.storage.core.query import MAX_QUERY_CHARS
from app.storage.interface import StorageBackend

MAX_PROMPT_CHARS = 16_000  # of a prompt, what the hook sends and the API reads at most
DEFAULT_CHARS = 1_500
MIN_CHARS = 500  # the header and one short excerpt
MAX_CHARS = 10_000  # what Codex passes whole as a hook's context
MAX_TERMS = 12
MIN_WORD = 3
MAX_WORD = 40  # longer: a hash, a blob of base64, not a word a text is found by
MIN_STEM = 4  # a prefix shorter than this matches too much of the index
ENDINGS = ("ing", "ed", "es", "s", "e")
SEARCH_LIMIT = 20
HIT_LIMIT = 5
OWN_LIMIT = 2
EXCERPT_MAX = 600
EXCERPT_MIN = 80
ENTRY_MIN = 300  # characters of a hit's line, its source and framing included
SCAN_CHARS = 64 * 1024  # of a text, where an excerpt's first word is looked for
TITLE = "# Project memory on this prompt"
# A run of letters and digits, with the apostrophes inside it (don't, it's, the user's).
_WORD = re.compile(r"[^\W_]+(?:['’][^\W_]+)*")

# English function words and the words a request to a coding agent is made of: they are in
# every text, so they would rank everything alike.
_STOP_WORDS = """
    about above after again against all also always and another any are aren't around ask
    because been before being below between both but can can't cannot could couldn't did
    didn't does doesn't doing don't done down during each either else even ever every few
    for from further get gets getting give given goes going got had hasn't has have haven't
    having her here hers herself him himself his how however into isn't it's its itself just
    know let let's like look made make makes many may maybe might mine more most much must
    need needs never not now off once one only other our ours ourselves out over own please
    put quite rather really said same say see seem seems shall she should shouldn't show
    since some something still such sure take tell than thank thanks that that's the their
    theirs them themselves then there these they thing things think this those though
    through too try under until upon use used using very want wants was wasn't way we'll
    well were weren't what what's when where whether which while who whom whose why will
    with within without won't would wouldn't yes yet you you'd you'll you're you've your
    yours yourself yourselves help helps
"""
STOP_WORDS = frozenset(_STOP_WORDS.split())


@dataclass(frozen=True, slots=True)
class RecallHit:
    kind: str  # "turn" | "memory"
    score: float
    task_id: str | None = None
    turn: int | None = None
    memory_store_id: str | None = None
    memory_id: str | None = None
    path: str | None = None
    this_task: bool = False


@dataclass(frozen=True, slots=True)
class Recall:
    context: str  # "" when nothing matched
    chars: int
    terms: list[str]
    hits: list[RecallHit]
    # The rankings the search ran, and why vectors were not used (SearchPage's).
    modes: tuple[str, ...] = ("keyword",)
    fallback: str | None = None


@dataclass(frozen=True, slots=True)
class _Term:
    word: str
    prefix: bool

    @property
    def query(self) -> str:
        return self.word + ("*" if self.prefix else "")


def _term(word: str) -> _Term | None:
    word = word.replace("’", "'")
    if word in STOP_WORDS:
        return None
    word = word.split("'", 1)[0]  # the user's: user
    if len(word) < MIN_WORD or len(word) > MAX_WORD or word in STOP_WORDS:
        return None
    if word.isdigit():
        return _Term(word, prefix=False)
    stem = word
    if word.isascii():
        for ending in ENDINGS:
            if word.endswith(ending) and len(word) - len(ending) >= MIN_STEM:
                stem = word[: -len(ending)]
                break
    return _Term(stem, prefix=len(stem) >= MIN_STEM)


def _terms(prompt: str) -> list[_Term]:
    found: dict[str, _Term] = {}
    order: dict[str, int] = {}
    for n, word in enumerate(_WORD.findall(prompt[:MAX_PROMPT_CHARS].lower())):
        term = _term(word)
        if term is not None and term.query not in found:
            found[term.query] = term
            order[term.query] = n
    # The longest words first (the rarer, as a rule), then as the prompt has them.
    ranked = sorted(found.values(), key=lambda t: (-len(t.word), order[t.query]))
    chosen: list[_Term] = []
    length = 0
    for term in ranked:
        if len(chosen) == MAX_TERMS:
            break
        if length + len(term.query) + 1 > MAX_QUERY_CHARS:
            continue
        chosen.append(term)
        length += len(term.query) + 1
    return sorted(chosen, key=lambda t: order[t.query])


def prompt_terms(prompt: str) -> list[str]:
    """The search terms a prompt makes (``word`` or ``prefix*``), in the prompt's order."""
    return [t.query for t in _terms(prompt)]


def recall(
    storage: StorageBackend,
    scope: Scope,
    prompt: str,
    *,
    task_id: str | None = None,
    max_chars: int = DEFAULT_CHARS,
    mode: str = "keyword",
) -> Recall:
    """What the project's memory holds about ``prompt``, at most ``max_chars`` characters;
    ``task_id``'s own turns first. ``mode``: keyword (any of its words), or hybrid or
    semantic (by meaning too; a server without an embedder answers keyword results and says
    so)."""
    terms = _terms(prompt)
    if not terms:
        return Recall("", 0, [], [])
    query = " ".join(t.query for t in terms)
    # Keyword unless asked: a ranking by meaning always has a nearest text, so every prompt
    # would get context, the unrelated ones too (no relevance floor holds for every model).
    page = storage.search(scope, query, limit=SEARCH_LIMIT, any_term=True, mode=mode)
    own = [h for h in page.hits if h.kind == "turn" and h.task_id == task_id]
    own.sort(key=lambda h: -(h.turn or 0))
    others = [h for h in page.hits if not (h.kind == "turn" and h.task_id == task_id)]
    ordered = own[:OWN_LIMIT] + others + own[OWN_LIMIT:]
    head = f"{TITLE}\n\n{NOTE}\n\n"
    body = ""
    shown: list[RecallHit] = []
    finder = _finder(terms)
    for n, hit in enumerate(ordered):
        if len(shown) == HIT_LIMIT:
            break
        # An even share of what is left for each hit still to show, but never less than
        # ENTRY_MIN: in a small budget, fewer hits, each with something to read.
        left = max_chars - len(head) - len(body)
        room = min(left, max(ENTRY_MIN, left // min(HIT_LIMIT - len(shown), len(ordered) - n)))
        found = _read(storage, scope, hit, task_id)
        if found is None:
            continue  # deleted or expired since the search
        source, text = found
        entry = _entry(source, text, finder, room)
        if entry is None:
            break
        body += entry
        shown.append(_public(hit, task_id))
    context = head + body if body else ""
    return Recall(context, len(context), [t.query for t in terms], shown, page.modes, page.fallback)


def _read(
    storage: StorageBackend, scope: Scope, hit: SearchHit, task_id: str | None
) -> tuple[str, str] | None:
    """What a hit is (the frame's source) and its text; None when it is gone."""
    try:
        if hit.kind == "turn":
            assert hit.task_id is not None and hit.turn is not None
            record = storage.tasks.get_turn(scope, hit.task_id, hit.turn)
            mine = ", this task" if hit.task_id == task_id else ""
            source = (
                f"turn {hit.turn} of task {hit.task_id}{mine}, updated {record.updated_at[:10]}"
            )
            return source, record.summary_md or _plain(hit.snippet)
        assert hit.memory_store_id is not None and hit.memory_id is not None
        memory = storage.stores.get_memory(scope, hit.memory_store_id, hit.memory_id, full=True)
    except NotFound:
        return None
    path = " ".join(neutral(memory.path).split())  # a path is stored text too
    source = f"memory /memories{path} of store {memory.memory_store_id}"
    return source, memory.content or _plain(hit.snippet)


def _plain(snippet: str) -> str:
    return snippet.replace("\x02", "").replace("\x03", "")


def _finder(terms: list[_Term]) -> re.Pattern[str]:
    words = sorted({t.word for t in terms}, key=len, reverse=True)
    return re.compile(r"(?<![^\W_])(?:" + "|".join(map(re.escape, words)) + ")", re.IGNORECASE)


def _entry(source: str, text: str, finder: re.Pattern[str], room: int) -> str | None:
    """One hit as a line of at most ``room`` characters: its source and an excerpt of its
    text, framed; None when not even EXCERPT_MIN characters of it fit."""
    wrap = len(f"- {frame('', source, inline=True)}\n")
    size = min(EXCERPT_MAX, room - wrap)
    while size >= EXCERPT_MIN:
        entry = f"- {frame(excerpt(text, finder, size), source, inline=True)}\n"
        if len(entry) <= room:
            return entry
        size -= len(entry) - room  # framing made it longer (a tag inside made inert)
    return None


def excerpt(text: str, finder: re.Pattern[str], size: int) -> str:
    """At most ``size`` characters of ``text`` on one line: from a little before the first
    word of the query in its first SCAN_CHARS (else from its start), cut at word ends."""
    found = finder.search(text, 0, min(len(text), SCAN_CHARS))
    start = 0
    if found is not None and found.start() > size // 4:
        start = found.start() - size // 4
        space = text.find(" ", start, found.start())
        start = space + 1 if space >= 0 else found.start()
    piece = " ".join(text[start : start + 2 * size].split())
    lead = "…" if start > 0 else ""
    if len(lead) + len(piece) <= size and start + 2 * size >= len(text):
        return lead + piece
    cut = piece[: size - len(lead) - 1]
    space = cut.rfind(" ")
    if space > len(cut) // 2:
        cut = cut[:space]
    return lead + cut.rstrip() + "…"


def _public(hit: SearchHit, task_id: str | None) -> RecallHit:
    return RecallHit(
        kind=hit.kind,
        score=hit.score,
        task_id=hit.task_id,
        turn=hit.turn,
        memory_store_id=hit.memory_store_id,
        memory_id=hit.memory_id,
        path=hit.path,
        this_task=hit.kind == "turn" and hit.task_id == task_id,
    )
