"""The secret scanner both sides share: every kind of the corpus found wherever it is pasted,
masked to its marker, ordinary material left alone, and bounded time on hostile input."""

from __future__ import annotations

import base64
import json
import random
import time
from collections import Counter, defaultdict
from pathlib import Path

import pytest

from app.storage.core.secret_scan import (
    Allowlist,
    default_rules,
    fingerprint,
    mask,
    scan,
)
from tests.secrets_corpus import (
    MAKERS,
    TOKEN_KINDS,
    Planted,
    corpus,
    encoded,
    generated_log,
    json_escaped,
    ordinary_material,
    ulid_of,
)

REPO = Path(__file__).resolve().parents[3]
CLIENT = REPO / "client" / "src" / "project_memory_client"
CORE = REPO / "app" / "storage" / "core"


def _masked(planted: Planted, text: str, value: str) -> bool:
    out, counts = mask(text)
    return value not in out and f"[secret:{planted.kind}]" in out and counts[planted.kind] >= 1


def test_the_corpus_has_300_secrets_of_20_kinds() -> None:
    planted = corpus()
    assert len(planted) >= 300
    assert len({p.kind for p in planted}) >= 20


@pytest.mark.parametrize("form", ["plain", "json", "base64", "hex"])
def test_every_kind_is_found_in_every_form(form: str) -> None:
    rng = random.Random(5)
    rate: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    for planted in corpus():
        if form in ("base64", "hex") and planted.kind not in TOKEN_KINDS:
            continue
        if form == "plain":
            text, value = f"see {planted.text} here", planted.value
        elif form == "json":
            text, value = json_escaped(planted, rng), json.dumps(planted.value)[1:-1]
        else:
            text = encoded(planted, form)
            value = text.removeprefix("value: ")
        rate[planted.kind][0] += _masked(planted, text, value)
        rate[planted.kind][1] += 1
    print(f"\n{form}: " + ", ".join(f"{k} {a}/{n}" for k, (a, n) in sorted(rate.items())))
    assert {k: a for k, (a, n) in rate.items()} == {k: n for k, (a, n) in rate.items()}


def test_a_name_scheme_and_user_stay_and_only_the_value_goes() -> None:
    text = (
        "DB_PASSWORD=Zq8vN3kLp0wXr7tY\n"
        "redis://:s3cr3tPassw0rd@cache:6379/0\n"
        "postgres://app:hunter2hunter2@db/main\n"
        "curl -u deploy:Pr1vateP4ss https://ci\n"
        "Authorization: Bearer c2VjcmV0LXRva2VuLXZhbHVl9"
    )
    out, counts = mask(text)
    assert out == (
        "DB_PASSWORD=[secret:secret-assignment]\n"
        "redis://:[secret:url-password]@cache:6379/0\n"
        "postgres://app:[secret:url-password]@db/main\n"
        "curl -u deploy:[secret:url-password] https://ci\n"
        "Authorization: Bearer [secret:bearer-token]"
    )
    assert counts == Counter({"url-password": 3, "secret-assignment": 1, "bearer-token": 1})


def test_a_masked_json_line_is_still_json() -> None:
    key = corpus(per_kind=1)[[m.__name__ for m in MAKERS].index("private_key")].text
    token = "ghp_" + "Ab1" * 12
    cut = "\n".join(key.splitlines()[:3])  # a key cut before its END, then a quote
    line = json.dumps({"text": f'run:\n{token}\tthen key="{cut}" end'})
    out, counts = mask(line)
    masked = 'run:\n[secret:github-token]\tthen key="[secret:private-key]" end'
    assert json.loads(out) == {"text": masked}
    assert counts == Counter({"github-token": 1, "private-key": 1})


def test_findings_hold_spans_never_values() -> None:
    token = "ghp_" + "Ab1" * 12
    (finding,) = scan(f"x {token} y")
    assert (finding.kind, finding.start, finding.end) == ("github-token", 2, 2 + len(token))
    assert token not in repr(finding) and token not in str(mask(f"x {token}"))


def test_masking_twice_changes_nothing_more() -> None:
    text = "\n".join(p.text for p in corpus(per_kind=2))
    once, _ = mask(text)
    assert mask(once) == (once, Counter())


def test_the_literal_in_use_is_masked_whatever_its_shape() -> None:
    out, counts = mask("use tok-1234567890 here", literals=["tok-1234567890"])
    assert out == "use [secret:project-memory-token] here"
    assert counts == Counter({"project-memory-token": 1})
    assert mask("short abc", literals=["abc"]) == ("short abc", Counter())


def test_an_allowlist_names_values_by_regex_or_fingerprint() -> None:
    fixture, other = "ghp_" + "F1x" * 12, "ghp_" + "Xy9" * 12
    text = f"{fixture} {other}"
    assert [f.kind for f in scan(text)] == ["github-token", "github-token"]
    by_hash = Allowlist(fingerprints=frozenset({fingerprint(fixture)}))
    assert mask(text, allowlist=by_hash)[0] == f"{fixture} [secret:github-token]"
    by_regex = Allowlist(regexes=("^ghp_Xy9",))
    assert mask(text, allowlist=by_regex)[0] == f"[secret:github-token] {other}"


def test_ordinary_text_is_left_alone() -> None:
    text = (
        "The token bucket refills; set the password field in the form. See sk-learn and"
        " https://example.com/a:b. Bearer of bad news. token = get_token(request)\n"
        "password: Optional[str] = None\n"
        "if token == expected: token, secret = registry.create(name)\n"
        "Use `postgresql://user:password@host:5432/db` as the URL.\n"
        "author: jane.doe@example.com\nauth_url: https://login.example.com/authorize\n"
    )
    assert scan(text) == []


def test_no_commit_sha_uuid_or_ulid_is_ever_masked() -> None:
    log = generated_log(seed=3, size=600_000)
    rng = random.Random(9)
    ulids = " ".join(ulid_of(rng.randbytes(16)) for _ in range(2000))
    assert scan(log + "\n" + ulids) == []


def test_false_positives_on_ordinary_material_are_few() -> None:
    text = ordinary_material(REPO)
    assert len(text) >= 2_000_000
    found = scan(text)
    per_mb = len(found) / (len(text) / 1e6)
    print(
        f"\n{len(found)} findings in {len(text) / 1e6:.1f} MB: {per_mb:.1f} per MB,",
        dict(Counter(f.rule for f in found)),
    )
    assert per_mb <= 5


HOSTILE = {
    "a run of one letter": "a" * 262144,
    "base64 characters": "".join(random.Random(1).choices("AZaz09+/", k=262144)),
    "BEGIN headers": "-----BEGIN" * 26214,
    "private-key headers without END": "-----BEGIN RSA PRIVATE KEY-----\n" * 8192,
    "one assignment's keyword repeated": "password=" * 29127,
    "token prefixes": "sk-" * 87381,
    "curl options": "curl -u " * 32768,
    "JSON escapes": "\\n" * 131072,
    "URL starts": "a://b:" * 43690,
}


@pytest.mark.parametrize("name", sorted(HOSTILE))
def test_hostile_text_scans_in_bounded_time(name: str) -> None:
    start = time.process_time()
    scan(HOSTILE[name])
    # A quadratic pattern takes minutes on 256 KiB; a linear one well under a second.
    assert time.process_time() - start < 3


def test_every_rule_compiles_and_has_a_kind() -> None:
    rules = default_rules()
    for rule in rules.rules:
        assert rule.regex.pattern and rule.kind
    assert "github-token" in rules.kinds and "private-key" in rules.kinds


def test_the_client_carries_the_same_scanner_and_rules() -> None:
    for name in ("secret_scan.py", "secret_rules.json"):
        assert (CLIENT / name).read_bytes() == (CORE / name).read_bytes(), (
            f"{name} differs: run `python -m tools.secret_rules --copy-only`"
        )


def test_the_basic_header_needs_user_and_password() -> None:
    good = base64.b64encode(b"deploy:Sup3rS3cret").decode()
    assert [f.kind for f in scan(f"Authorization: Basic {good}")] == ["basic-auth"]
    assert scan("basic configuration of the system") == []
