"""The labelled retrieval set bench/recall.py measures with: generated, seeded, written here.

The corpus is agent-style text: turn summaries, Markdown decision records, log excerpts and
code with comments. Each *incident* joins a symptom ("users got logged out and the login
cookie disappeared") and a root cause ("clock skew between the two hosts"), and carries
identifiers: a commit hash, an error code, a function name, a module path. A target document
holds one (symptom, cause) pair no other document holds; hard negatives hold the same symptom
with another cause, or the same cause under another symptom; filler documents hold neither,
and some of them (decoys) use the very words the paraphrased questions use, in other topics.

Query kinds, one relevant document each:

* ``paraphrase``: a question worded with none of its target's content words. Every symptom
  and cause is written twice by hand, once as an engineer's note says it, once as someone
  asking about it would, and :func:`check_paraphrase` refuses (at generation, so the set
  cannot drift) any query whose content words (stopwords aside, compared by their first five
  letters so "expired" meets "expire") appear in its target. Keyword search can only find a
  paraphrase's target by luck; a decoy can easily outrank it.
* ``identifier``: a commit hash, an error code or a function name, unique to the target.
* ``mixed``: a module path (shared by a few dozen documents) plus the paraphrased symptom; the
  path narrows, the words pick.

``python -m bench.recall_set`` prints a few queries with their targets.
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass, field

# (how a note says it, how a question says it): no content word in common.
SYMPTOMS: list[tuple[str, str]] = [
    ("users got logged out and the login cookie disappeared", "people kicked off sign-in unexpectedly"),
    ("uploads of large files were truncated at 16 MiB", "big attachments arrive cut short"),
    ("the nightly backup job exited with status 137", "overnight snapshot task killed"),
    ("p99 latency of the listing endpoint climbed to 900 ms", "index page got sluggish under load"),
    ("the CI pipeline flaked on test_concurrent_writes", "automated build intermittently red"),
    ("duplicate rows appeared in the audit table", "repeated entries showing twice in compliance history"),
    ("memory usage of the worker grew until the OOM killer fired", "process RAM kept climbing till terminated"),
    ("webhook deliveries to Slack silently stopped", "chat notifications never arrived"),
    ("search returned stale results after a delete", "removed items still findable afterwards"),
    ("the dashboard rendered a blank page in Safari", "console screen empty on Apple browser"),
    ("disk filled up on the database volume", "storage space exhausted where Postgres keeps data"),
    ("timestamps were shifted by one hour in reports", "clock values off by sixty minutes"),
    ("the migration locked the accounts table for minutes", "schema change blocked customer records"),
    ("emails with non-ASCII subjects were garbled", "accented letters mangled in outgoing mail titles"),
    ("the cron scheduler ran every job twice", "periodic tasks executed double"),
    ("TLS handshakes failed for older clients", "legacy callers couldn't negotiate encrypted connections"),
    ("the API answered 502 during deploys", "bad gateway errors while shipping releases"),
    ("token refresh looped forever in the mobile app", "phone client renewing credentials endlessly"),
    ("the export CSV had columns in the wrong order", "spreadsheet download fields misaligned"),
    ("rate limiting blocked legitimate bursts from the importer", "throttling rejected valid spikes of bulk loading"),
]  # fmt: skip
CAUSES: list[tuple[str, str]] = [
    ("clock skew between the two hosts", "machines disagreed on time"),
    ("a missing index on created_at", "no lookup structure for when rows were inserted"),
    ("nginx client_max_body_size was left at its default", "reverse proxy payload cap"),
    ("a race between two threads writing the same file", "concurrent writers clobbering each other"),
    ("the connection pool was exhausted", "ran out of pooled db handles"),
    ("retries without jitter caused a thundering herd", "synchronized reattempts stampede"),
    ("the cache key ignored the tenant", "memoization shared across customers"),
    ("an expired certificate on the load balancer", "outdated x509 credential at traffic distributor"),
    ("UTF-8 bytes were decoded as Latin-1", "wrong character encoding assumed"),
    ("the job was registered on every worker", "each process scheduled its own copy"),
    ("a leaked file descriptor per request", "handles never closed on each call"),
    ("the feature flag defaulted to on", "toggle switched active out of the box"),
    ("unbounded growth of an in-process dictionary", "map inside the program never evicted"),
    ("the health check hit a slow endpoint", "liveness probe pointed at sluggish route"),
    ("DNS TTL cached the old address", "name resolution held onto previous IP"),
    ("the ORM issued one query per row", "N+1 lookups from the object mapper"),
    ("a daylight saving transition", "seasonal clock change"),
    ("gzip was applied twice by the proxy", "compression done double at the intermediary"),
    ("the WAL was never checkpointed", "write-ahead journal kept growing without flush"),
    ("a regex with catastrophic backtracking", "pattern matcher exponential blowup"),
]  # fmt: skip
STOPWORDS = frozenset(
    [
        "a",
        "after",
        "an",
        "and",
        "are",
        "as",
        "at",
        "be",
        "because",
        "but",
        "by",
        "did",
        "do",
        "for",
        "from",
        "in",
        "into",
        "is",
        "it",
        "its",
        "of",
        "off",
        "on",
        "or",
        "so",
        "the",
        "their",
        "then",
        "this",
        "to",
        "was",
        "were",
        "what",
        "when",
        "why",
        "with",
    ]
)
AREAS = [
    "auth",
    "sessions",
    "uploads",
    "backup",
    "listing",
    "ci",
    "audit",
    "workers",
    "webhooks",
    "search",
    "console",
    "storage",
    "reports",
    "migrations",
    "mail",
    "scheduler",
    "tls",
    "api",
    "tokens",
    "export",
    "ratelimit",
]
MODULES = [
    "store",
    "client",
    "handler",
    "views",
    "tasks",
    "models",
    "cache",
    "retry",
    "pool",
    "queue",
    "config",
    "util",
]
FILLER = [
    "Refactored the helper so the call sites read more plainly.",
    "Renamed a few variables and moved constants to the top of the module.",
    "Added type hints and ran mypy; two warnings left in vendored code.",
    "Paired on the review; the reviewer asked for a smaller diff.",
    "Bumped the pinned versions in the lock file after the weekly update.",
    "Wrote a docstring for each public function in the package.",
    "Split the long test into three focused ones.",
    "Measured the hot loop with a profiler; nothing stood out.",
    "Cleaned up the Makefile targets that nobody runs any more.",
    "Left a TODO where the edge case is not handled yet.",
    "Updated the changelog and tagged the release candidate.",
    "Reformatted the YAML files with two-space indentation.",
]
DECOY = [
    "Reviewed the copy on the {0} page and the wording of the {1} banner.",
    "Product asked whether {0} and {1} could share one settings screen.",
    "Design notes: the {0} illustration and the {1} icon need new colours.",
    "Meeting notes: roadmap items {0}, {1} and onboarding polish.",
]
WORD = re.compile(r"[a-z0-9]+")


def content_words(text: str) -> set[str]:
    """The words that carry meaning, compared by their first five letters."""
    return {w[:5] for w in WORD.findall(text.lower()) if w not in STOPWORDS}


def check_paraphrase(query: str, target: str) -> None:
    """Refuse a paraphrase that shares a content word with its target."""
    shared = content_words(query) & content_words(target)
    if shared:
        raise ValueError(f"paraphrase {query!r} shares {sorted(shared)} with its target")


@dataclass
class Doc:
    text: str
    kind: str  # "turn" | "memory"
    style: str


@dataclass
class Query:
    text: str
    kind: str  # "paraphrase" | "identifier" | "mixed"
    relevant: set[int] = field(default_factory=set)


@dataclass
class LabelledSet:
    docs: list[Doc]
    queries: list[Query]


class _Ids:
    def __init__(self, rnd: random.Random) -> None:
        self.rnd = rnd
        self.used: set[str] = set()

    def fresh(self, make: object) -> str:
        while True:
            value = make()  # type: ignore[operator]
            if value not in self.used:
                self.used.add(value)
                return str(value)

    def commit(self) -> str:
        return self.fresh(lambda: f"{self.rnd.getrandbits(40):010x}")

    def error(self) -> str:
        return self.fresh(lambda: f"PM-E{self.rnd.randrange(10000, 99999)}")

    def function(self) -> str:
        verbs = [
            "apply",
            "build",
            "check",
            "drain",
            "emit",
            "fetch",
            "flush",
            "guard",
            "merge",
            "parse",
            "queue",
            "renew",
            "scan",
            "seal",
            "sync",
            "trim",
        ]
        nouns = [
            "batch",
            "bucket",
            "cursor",
            "digest",
            "entry",
            "frame",
            "ledger",
            "lease",
            "marker",
            "packet",
            "quota",
            "shard",
            "slot",
            "span",
            "ticket",
            "window",
        ]
        return self.fresh(
            lambda: (
                f"{self.rnd.choice(verbs)}_{self.rnd.choice(nouns)}_{self.rnd.randrange(100, 999)}"
            )
        )


def _cap(text: str) -> str:
    return text[:1].upper() + text[1:]


def _render(rnd: random.Random, style: str, symptom: str, cause: str, ids: dict[str, str]) -> str:
    filler = " ".join(rnd.sample(FILLER, 2))
    c, e, f, p = ids["commit"], ids["error"], ids["function"], ids["path"]
    if style == "decision":
        return (
            f"# Decision: {f}\n\n## Context\n{_cap(symptom)}. {filler}\n\n"
            f"## Root cause\n{_cap(cause)}.\n\n## Decision\nChanged `{p}` in {c};"
            f" alerts on {e}.\n"
        )
    if style == "log":
        return (
            f"## Log excerpt\n\n```\n2026-03-0{rnd.randrange(1, 9)}T10:2{rnd.randrange(10)}:01Z ERROR"
            f" {e} in {f} ({p}:{rnd.randrange(20, 400)})\n```\n\n{_cap(symptom)}."
            f" Traced it to {cause}. Fix is {c}. {filler}\n"
        )
    if style == "code":
        return (
            f"## Patch\n\n```python\n# {p}\ndef {f}(batch):\n    # {cause}\n"
            f'    raise StorageError("{e}")\n```\n\n{_cap(symptom)}; committed as {c}.\n'
        )
    return (
        f"## Turn\n\nInvestigated why {symptom}. Found {cause}. Patched {f} in {p}"
        f" and pushed {c}; the {e} alerts stopped. {filler}\n"
    )


def generate(docs: int = 5000, queries: int = 250, seed: int = 45) -> LabelledSet:
    """A corpus of about ``docs`` documents and ``queries`` labelled queries, from ``seed``."""
    rnd = random.Random(seed)
    ids = _Ids(rnd)
    paths = [f"app/{a}/{m}.py" for a in AREAS for m in MODULES]
    rnd.shuffle(paths)
    paths = paths[: max(8, docs // 40)]  # each path in about forty documents
    for note, question in SYMPTOMS + CAUSES:
        check_paraphrase(question, note)
    pairs = [
        (s, c)
        for s in range(len(SYMPTOMS))
        for c in range(len(CAUSES))
        if not content_words(SYMPTOMS[s][1]) & content_words(CAUSES[c][0])
        and not content_words(CAUSES[c][1]) & content_words(SYMPTOMS[s][0])
    ]
    rnd.shuffle(pairs)
    targets = pairs[: min(queries, len(pairs) - 20)]
    negatives = pairs[len(targets) :]
    styles = ["turn", "decision", "log", "code"]
    out: list[Doc] = []
    labelled: list[Query] = []

    def incident(s: int, c: int) -> tuple[int, dict[str, str]]:
        made = {
            "commit": ids.commit(),
            "error": ids.error(),
            "function": ids.function(),
            "path": rnd.choice(paths),
        }
        style = rnd.choice(styles)
        text = _render(rnd, style, SYMPTOMS[s][0], CAUSES[c][0], made)
        out.append(Doc(text, "memory" if style == "decision" else "turn", style))
        return len(out) - 1, made

    for n, (s, c) in enumerate(targets):
        kind = ("paraphrase", "identifier", "mixed", "paraphrase", "identifier")[n % 5]
        words = {"paraphrase": f"{SYMPTOMS[s][1]} {CAUSES[c][1]}", "mixed": SYMPTOMS[s][1]}
        for attempt in range(50):
            at, made = incident(s, c)
            try:
                if kind in words:
                    check_paraphrase(words[kind], out[at].text)
                break
            except ValueError:
                # An incidental part (a path, a filler line) met a question word: draw again.
                out.pop()
                if attempt == 49:
                    raise
        if kind == "paraphrase":
            text = words[kind]
        elif kind == "identifier":
            text = made[("commit", "error", "function")[n % 3]]
        else:
            text = f"{made['path']} {words[kind]}"
        labelled.append(Query(text, kind, {at}))
    hard = (docs - len(out)) // 10
    for _ in range(hard):
        incident(*rnd.choice(negatives))
    asked = sorted({w for q in labelled if q.kind != "identifier" for w in q.text.split()})
    asked = [w for w in asked if w.isalpha() and w not in STOPWORDS and len(w) > 3]
    while len(out) < docs:
        lines = rnd.sample(FILLER, 3)
        if rnd.random() < 0.3:
            lines.insert(1, rnd.choice(DECOY).format(*rnd.sample(asked, 2)))
        if rnd.random() < 0.5:
            lines.append(f"Touched {rnd.choice(paths)} and {ids.function()}.")
        style = rnd.choice(["turn", "note"])
        body = (
            "## Turn\n\n" + " ".join(lines)
            if style == "turn"
            else "# Notes\n\n- " + "\n- ".join(lines)
        )
        out.append(Doc(body + "\n", "memory" if style == "note" else "turn", style))
    # Relevance of an identifier is every document holding it (none but its target, by
    # construction, checked here).
    for q in labelled:
        if q.kind == "identifier":
            assert [i for i, d in enumerate(out) if q.text in d.text] == sorted(q.relevant)
    order = list(range(len(out)))
    rnd.shuffle(order)  # targets are not all at the start of the corpus
    new_at = {old: new for new, old in enumerate(order)}
    shuffled = [out[old] for old in order]
    for q in labelled:
        q.relevant = {new_at[i] for i in q.relevant}
    return LabelledSet(shuffled, labelled)


def main() -> None:
    s = generate()
    kinds = {k: sum(q.kind == k for q in s.queries) for k in ("paraphrase", "identifier", "mixed")}
    print(f"{len(s.docs)} documents, {len(s.queries)} queries {kinds}")
    for q in s.queries[:6]:
        print(f"\n[{q.kind}] {q.text}\n---\n{s.docs[min(q.relevant)].text}")


if __name__ == "__main__":
    main()
