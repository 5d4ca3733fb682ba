"""Finding and masking secrets in text: API keys, tokens, private keys, passwords in URLs and
assignments, the same secrets base64- or hex-encoded, in plain or JSON-escaped text.

One module and one rule file (secret_rules.json, beside this file) serve the server and the
client: app/storage/core/ holds the originals, project_memory_client/ byte-equal copies
(tools/secret_rules.py makes them; a test compares them). So this module imports nothing
but the standard library and runs on the client's oldest Python.

A finding is a kind and a span, never the value: reprs and logs cannot leak what they
found. Masking replaces each span by ``[secret:<kind>]``; for an assignment, a URL, a bearer
or basic header only the value is a span, so the name, scheme and user stay readable.

Cost is linear in the text: a rule runs only when one of its keywords is in the text
(lower-cased); an anchored rule is tried only where its keywords start, never inside its
last match; each repeat in a pattern is bounded or ends with one run of characters (no
repeat inside a repeat that can split a run two ways); an encoded run is decoded once, up
to ``ENCODED_MAX`` characters.
"""

from __future__ import annotations

import base64
import binascii
import bisect
import hashlib
import json
import math
import re
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any

RULES_FILE = Path(__file__).with_name("secret_rules.json")
LITERAL_KIND = "project-memory-token"
LITERAL_MIN = 8  # a shorter literal would mask ordinary words
ENCODED_MIN = 24  # base64 of a 16-character token and more
ENCODED_MAX = 16384  # longer runs are blobs (images, archives), not a pasted token
MARKER = "[secret:{kind}]"

# A JSON escape in text taken from a JSON file (a transcript) is read as blanks of the same
# length: `\ntoken` then starts a word as it does in the decoded text, and spans still
# point into the text as given.
_JSON_ESCAPE = re.compile(r"\\[^u]")  # left to right, so an escaped backslash is one pair
_JSON_UNICODE = re.compile(r"\\u[0-9A-Fa-f]{4}")
# A run of base64 (standard or URL-safe) or hex characters, taken whole from its first one.
_ENCODED_RUN = re.compile(rf"(?<![A-Za-z0-9+/_-])[A-Za-z0-9+/_-]{{{ENCODED_MIN},}}={{0,2}}")
_HEX = re.compile(r"[0-9A-Fa-f]+")
_MARKER = re.compile(r"\[secret:[a-z0-9-]+\]")


@dataclass(frozen=True, slots=True)
class Finding:
    """A secret's kind, the rule that found it, and where it is: never its value."""

    kind: str
    start: int
    end: int
    rule: str = ""


@dataclass(frozen=True)
class Allowlist:
    """What is not a secret: values matching one of ``regexes`` (searched in the value), or
    whose SHA-256 (:func:`fingerprint`) is one of ``fingerprints``."""

    regexes: tuple[str, ...] = ()
    fingerprints: frozenset[str] = frozenset()
    _compiled: tuple[re.Pattern[str], ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_compiled", tuple(re.compile(r) for r in self.regexes))

    def allows(self, value: str) -> bool:
        if self.fingerprints and fingerprint(value) in self.fingerprints:
            return True
        return any(r.search(value) for r in self._compiled)


NO_ALLOWLIST = Allowlist()


def fingerprint(value: str) -> str:
    """The SHA-256 (hex) of a value: how an allowlist names a value without holding it."""
    return hashlib.sha256(value.encode("utf-8")).hexdigest()


def entropy(value: str) -> float:
    """Shannon entropy of ``value``, in bits per character."""
    if not value:
        return 0.0
    n = len(value)
    return -sum(c / n * math.log2(c / n) for c in Counter(value).values())


class _Allow:
    """One allowlist of a rule file: regexes on the secret, the whole match or its line, and
    stop words (a value containing one is not a secret)."""

    def __init__(self, spec: dict[str, Any]) -> None:
        self.target: str = spec.get("target", "secret")
        self.regexes = tuple(re.compile(r) for r in spec.get("regexes", ()))
        self.stopwords: tuple[str, ...] = tuple(spec.get("stopwords", ()))

    def allows(self, secret: str, match: re.Match[str]) -> bool:
        if self.stopwords:
            low = secret.lower()
            if any(s in low for s in self.stopwords):
                return True
        if not self.regexes:
            return False
        if self.target == "match":
            subject = match.group(0)
        elif self.target == "line":
            text = match.string
            start = text.rfind("\n", 0, match.start()) + 1
            end = text.find("\n", match.end())
            subject = text[start : end if end >= 0 else len(text)]
        else:
            subject = secret
        return any(r.search(subject) for r in self.regexes)


class _Rule:
    def __init__(self, index: int, spec: dict[str, Any]) -> None:
        self.index = index
        self.id: str = spec["id"]
        self.kind: str = spec.get("kind", spec["id"])
        self.generic: bool = bool(spec.get("generic", False))
        # Anchored: every match starts where one of the keywords does, so the regex is only
        # tried there (a rule with common keywords then costs nothing between them).
        self.anchor: bool = bool(spec.get("anchor", False))
        self.source: str = spec["regex"]
        self.keywords: tuple[str, ...] = tuple(spec.get("keywords", ()))
        self.entropy: float = float(spec.get("entropy", 0.0))
        self.group: int | None = spec.get("group")
        self.check: str | None = spec.get("check")
        self.allow = tuple(_Allow(a) for a in spec.get("allow", ()))
        self._regex: re.Pattern[str] | None = None

    @property
    def regex(self) -> re.Pattern[str]:
        # Compiled on first use: a hook's process compiles only the rules its text calls for.
        if self._regex is None:
            self._regex = re.compile(self.source, re.ASCII)
        return self._regex

    def secret_span(self, match: re.Match[str]) -> tuple[int, int]:
        if self.group is not None:
            return match.span(self.group)
        for n in range(1, (match.re.groups or 0) + 1):
            if match.group(n) is not None:
                return match.span(n)
        return match.span()


def _check_basic_auth(view: str, start: int, end: int) -> bool:
    """A Basic header's value is base64 of ``user:password``."""
    secret = view[start:end]
    try:
        return b":" in base64.b64decode(secret + "=" * (-len(secret) % 4), validate=True)
    except (binascii.Error, ValueError):
        return False


def _check_not_a_call(view: str, start: int, end: int) -> bool:
    """A value that a call, an index or a block follows is code (``token = make(...)``)."""
    return view[end : end + 1] not in ("(", "[", "{")


_CHECKS: dict[str, Callable[[str, int, int], bool]] = {
    "basic-auth": _check_basic_auth,
    "not-a-call": _check_not_a_call,
}


class RuleSet:
    """The rules of one rule file, with the keyword index that picks the rules to run."""

    def __init__(self, data: dict[str, Any]) -> None:
        self.rules = tuple(_Rule(n, spec) for n, spec in enumerate(data["rules"]))
        self.allow = _Allow(data.get("allow", {}))
        self.always = tuple(r for r in self.rules if not r.keywords)
        self.generic = frozenset(r.id for r in self.rules if r.generic) | {"encoded"}
        self.order = {r.id: r.index for r in self.rules}
        by_keyword: dict[str, set[int]] = {}
        for rule in self.rules:
            for keyword in rule.keywords:
                by_keyword.setdefault(keyword, set()).add(rule.index)
        self.by_keyword = {k: frozenset(v) for k, v in by_keyword.items()}
        # Keywords by first character, one search per character: a search that starts with a
        # literal skips in C to where it occurs, and the rest of the keywords starting with
        # it are a trie tried there (longest first; the keywords that are prefixes of the
        # one found start there too).
        words = sorted(by_keyword)
        known = set(words)
        self.prefixes = {
            k: tuple(k[:n] for n in range(1, len(k) + 1) if k[:n] in known) for k in words
        }
        by_first: dict[str, list[str]] = {}
        for word in words:
            by_first.setdefault(word[0], []).append(word[1:])
        self._keywords = tuple(
            (first, re.compile(re.escape(first) + "(?=(" + _trie(rests) + "))"))
            for first, rests in sorted(by_first.items())
        )
        self.kinds = tuple(sorted({r.kind for r in self.rules}))

    def candidates(self, lowered: str) -> tuple[list[_Rule], dict[int, list[int]]]:
        """The rules whose keywords occur in ``lowered``, in file order, and for each
        anchored one the positions where its keywords start (in order)."""
        chosen = {r.index for r in self.always}
        at: dict[int, list[int]] = {}
        for first, regex in self._keywords:
            for match in regex.finditer(lowered):
                start = match.start()
                for keyword in self.prefixes[first + match.group(1)]:
                    for index in self.by_keyword[keyword]:
                        chosen.add(index)
                        if self.rules[index].anchor:
                            at.setdefault(index, []).append(start)
        for spots in at.values():
            spots.sort()
        return [self.rules[i] for i in sorted(chosen)], at


def _trie(words: list[str]) -> str:
    """A regex matching the longest of ``words`` at a position: the words as a trie, so
    that each position costs one branch per character instead of one per word."""
    root: dict[str, Any] = {}
    for word in words:
        node = root
        for ch in word:
            node = node.setdefault(ch, {})
        node[""] = {}

    def emit(node: dict[str, Any]) -> str:
        alts = [re.escape(ch) + emit(node[ch]) for ch in sorted(node) if ch]
        if not alts:
            return ""
        if "" in node:  # a word ends here: a longer one is tried first
            return "(?:" + "|".join(alts) + ")?"
        return alts[0] if len(alts) == 1 else "(?:" + "|".join(alts) + ")"

    return emit(root)


@lru_cache(maxsize=1)
def default_rules() -> RuleSet:
    """The rule file beside this module."""
    return RuleSet(json.loads(RULES_FILE.read_text(encoding="utf-8")))


def _view(text: str) -> str:
    if "\\" not in text:
        return text
    return _JSON_UNICODE.sub("      ", _JSON_ESCAPE.sub("  ", text))


def _scan_plain(text: str, rules: RuleSet, allowlist: Allowlist) -> list[Finding]:
    view = _view(text)
    lowered = view.lower()
    chosen, at = rules.candidates(lowered)
    # Lower-casing keeps positions unless a non-ASCII letter changes length.
    positions_hold = len(lowered) == len(view)
    found: list[Finding] = []
    for rule in chosen:
        if rule.anchor and positions_hold:
            regex = rule.regex
            matches: Iterable[re.Match[str] | None] = _anchored(regex, view, at[rule.index])
        else:
            matches = rule.regex.finditer(view)
        for match in matches:
            if match is None:
                continue
            start, end = rule.secret_span(match)
            # Blanks at either end are no part of a secret, and in JSON text they may be an
            # escape (a closing `\"`): a span starts and ends on a character of its own.
            while start < end and view[end - 1].isspace():
                end -= 1
            while start < end and view[start].isspace():
                start += 1
            if start == end:
                continue
            secret = view[start:end]
            if rule.entropy and entropy(secret) < rule.entropy:
                continue
            if rule.check and not _CHECKS[rule.check](view, start, end):
                continue
            if any(a.allows(secret, match) for a in rule.allow):
                continue
            if rules.allow.allows(secret, match) or allowlist.allows(secret):
                continue
            found.append(Finding(rule.kind, start, end, rule.id))
    return found


def _anchored(regex: re.Pattern[str], view: str, spots: list[int]) -> Iterable[re.Match[str]]:
    """``regex``'s matches starting at ``spots``, none inside the one before (as ``finditer``
    gives them): a keyword repeated inside one long match is not matched again."""
    reached = 0
    for spot in spots:
        if spot < reached:
            continue
        match = regex.match(view, spot)
        if match is not None:
            reached = match.end()
            yield match


def _decoded(run: str) -> str | None:
    """``run`` decoded from hex or base64 when that gives text, else None."""
    body = run.rstrip("=")
    raw: bytes | None = None
    if len(body) % 2 == 0 and _HEX.fullmatch(body):
        raw = bytes.fromhex(body)
    else:
        if len(body) % 4 == 1:  # one character past a whole quantum decodes to nothing
            body = body[:-1]
        padded = body + "=" * (-len(body) % 4)
        try:
            raw = base64.urlsafe_b64decode(padded.replace("+", "-").replace("/", "_"))
        except (binascii.Error, ValueError):
            return None
    try:
        decoded = raw.decode("utf-8")
    except UnicodeDecodeError:
        return None
    if sum(ch.isprintable() or ch in "\n\r\t" for ch in decoded) < 0.95 * len(decoded):
        return None
    return decoded


def _scan_encoded(view: str, rules: RuleSet, allowlist: Allowlist) -> list[Finding]:
    found = []
    for match in _ENCODED_RUN.finditer(view):
        run = match.group()
        if len(run) > ENCODED_MAX:
            continue
        decoded = _decoded(run)
        if decoded is None:
            continue
        inner = _scan_plain(decoded, rules, allowlist)
        if inner:
            found.append(Finding(inner[0].kind, match.start(), match.end(), "encoded"))
    return found


def _in_marker(f: Finding, marks: list[tuple[int, int]], starts: list[int]) -> bool:
    """Whether ``f`` overlaps one of ``marks`` (sorted, apart): the last one starting before
    ``f`` ends is the only one that can."""
    i = bisect.bisect_left(starts, f.end) - 1
    return i >= 0 and marks[i][1] > f.start


def _merged(findings: list[Finding], rules: RuleSet) -> list[Finding]:
    """Overlapping findings as one, under the kind of the one starting first (the longest,
    then a specific rule before a generic one, then the file's order)."""
    findings.sort(
        key=lambda f: (f.start, -f.end, f.rule in rules.generic, rules.order.get(f.rule, -1))
    )
    out: list[Finding] = []
    for f in findings:
        if out and f.start < out[-1].end:
            last = out[-1]
            if f.end > last.end:
                out[-1] = Finding(last.kind, last.start, f.end, last.rule)
            continue
        out.append(f)
    return out


def scan(
    text: str,
    *,
    literals: Iterable[str] = (),
    literal_kind: str = LITERAL_KIND,
    allowlist: Allowlist = NO_ALLOWLIST,
    rules: RuleSet | None = None,
) -> list[Finding]:
    """The secrets in ``text``, in order, overlapping ones merged; every one of ``literals``
    (8 characters or more) is a secret of ``literal_kind`` wherever it appears."""
    rules = rules or default_rules()
    findings = _scan_plain(text, rules, allowlist)
    findings += _scan_encoded(_view(text), rules, allowlist)
    for literal in literals:
        if len(literal) < LITERAL_MIN:
            continue
        at = text.find(literal)
        while at >= 0:
            findings.append(Finding(literal_kind, at, at + len(literal), "literal"))
            at = text.find(literal, at + len(literal))
    if "[secret:" in text:
        # Text masked before is scanned again (a stored record): a marker is no value.
        marks = [m.span() for m in _MARKER.finditer(text)]
        starts = [a for a, _ in marks]
        findings = [f for f in findings if not _in_marker(f, marks, starts)]
    return _merged(findings, rules)


def mask(
    text: str,
    *,
    literals: Iterable[str] = (),
    literal_kind: str = LITERAL_KIND,
    allowlist: Allowlist = NO_ALLOWLIST,
    rules: RuleSet | None = None,
) -> tuple[str, Counter[str]]:
    """``text`` with each secret replaced by ``[secret:<kind>]``, and how many of each kind."""
    findings = scan(
        text, literals=literals, literal_kind=literal_kind, allowlist=allowlist, rules=rules
    )
    if not findings:
        return text, Counter()
    return masked(text, findings), Counter(f.kind for f in findings)


def masked(text: str, findings: Iterable[Finding]) -> str:
    """``text`` with each of ``findings`` (in order, not overlapping: what :func:`scan` gives)
    replaced by its marker."""
    parts, at = [], 0
    for f in findings:
        parts += [text[at : f.start], MARKER.format(kind=f.kind)]
        at = f.end
    parts.append(text[at:])
    return "".join(parts)
