"""Rebuild the secret rules (app/storage/core/secret_rules.json) from gitleaks' rule set, and
copy the scanner and its rules into the client distribution.

    python -m tools.secret_rules path/to/gitleaks.toml <gitleaks commit>
    python -m tools.secret_rules --copy-only

gitleaks (https://github.com/gitleaks/gitleaks, MIT, Copyright (c) 2019 Zachary Rice) keeps
its rules in config/gitleaks.toml. Each rule is translated from Go's RE2 syntax to Python's
`re` (a flag group in mid-pattern becomes a scoped group, `\\z` becomes `\\Z`, POSIX classes
are spelled out) and given our kind (the marker's word) where several of its rules name one
kind. The rules of our own (``"source": "project-memory"``) are kept as they are in the file.
Rules left out are listed in ``LEFT_OUT`` with the reason.
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import sys
import tomllib
import warnings
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
RULES = REPO / "app" / "storage" / "core" / "secret_rules.json"
SCANNER = REPO / "app" / "storage" / "core" / "secret_scan.py"
CLIENT = REPO / "client" / "src" / "project_memory_client"

# gitleaks' id -> our kind, where one kind has several rules (or a name the docs already use).
KINDS = {
    "github-pat": "github-token",
    "github-oauth": "github-token",
    "github-app-token": "github-token",
    "github-refresh-token": "github-token",
    "github-fine-grained-pat": "github-token",
    "aws-access-token": "aws-access-key",
    "gcp-api-key": "google-api-key",
    "openai-api-key": "openai-key",
    "anthropic-api-key": "anthropic-key",
    "anthropic-admin-api-key": "anthropic-key",
    "stripe-access-token": "stripe-key",
    "npm-access-token": "npm-token",
    "pypi-upload-token": "pypi-token",
    "huggingface-access-token": "huggingface-token",
    "huggingface-organization-api-token": "huggingface-token",
    "slack-webhook-url": "slack-webhook",
    "jwt-base64": "jwt",
}
for _id in ("pat", "pat-routable", "ptt", "rrt", "deploy-token", "feed-token", "scim-token"):
    KINDS[f"gitlab-{_id}"] = "gitlab-token"
for _id in ("app", "bot", "user", "legacy", "legacy-bot", "legacy-workspace"):
    KINDS[f"slack-{_id}-token"] = "slack-token"
KINDS["slack-config-access-token"] = KINDS["slack-config-refresh-token"] = "slack-token"

LEFT_OUT = {
    # Any word like key/token/auth next to a value of 10+ characters: most of its hits in code
    # are names and calls. Our secret-assignment rule takes its place, with a stricter value.
    "generic-api-key": "replaced by secret-assignment",
    # A quoted value after any name with `password` in it (the whole of it, quotes too).
    "hashicorp-tf-password": "replaced by secret-assignment",
    # Lazy `[\s\S-]{64,}?` up to END: each BEGIN without an END reads to the text's end, so
    # many BEGINs cost quadratic time. Our private-key rule stops at the body's end (and
    # also finds a block cut before its END).
    "private-key": "replaced by private-key (ours)",
    # `.*` between `curl` and the option: quadratic on long lines; ours is bounded.
    "curl-auth-header": "replaced by bearer-token and basic-auth",
    "curl-auth-user": "replaced by curl-user",
    # Up to 300 characters of any kind across lines around `kind: Secret`: a YAML manifest's
    # values are masked by the rules of their own shape and by secret-assignment.
    "kubernetes-secret-yaml": "multi-line window, not bounded by a line",
    "pkcs12-file": "a file name rule, no text to match",
}

# Rules whose every match starts where one of their keywords does (checked by reading each
# regex) and whose keywords are common words or fragments: the scanner tries them only there.
ANCHORED = {"vault-service-token", "jwt", "twilio-api-key", "authress-service-client-access-key"}

_FLAG_MID = "(?i)"
_POSIX = {"[:alnum:]": "a-zA-Z0-9", "[:alpha:]": "a-zA-Z", "[:digit:]": "0-9"}
# A leading lazy window only widens a match to the left; the secret is a group after it.
_LEFT_WINDOW = re.compile(r"\[\\w\.-\]\{0,50\}\?(?=\(\?(?:i)?:)")


def go_to_python(pattern: str) -> str:
    """``pattern`` (RE2) as Python ``re`` spells it."""
    pattern = _LEFT_WINDOW.sub("", pattern)
    out: list[str] = []
    stack = [0]  # per open group: how many scoped flag groups to close with it
    i, in_class, class_start = 0, False, 0
    while i < len(pattern):
        ch = pattern[i]
        if ch == "\\":
            nxt = pattern[i + 1]
            out.append("\\Z" if nxt == "z" and not in_class else ch + nxt)
            i += 2
            continue
        if in_class:
            posix = next((p for p in _POSIX if pattern.startswith(p, i)), None)
            if posix:
                out.append(_POSIX[posix])
                i += len(posix)
                continue
            if ch == "]" and i > class_start:
                in_class = False
                out.append(ch)
            elif ch in "[&|~":
                out.append("\\" + ch)  # literal in RE2; Python warns of set operations
            elif ch == "-" and pattern[i - 1] == "-":
                out.append("\\-")
            else:
                out.append(ch)
            i += 1
            continue
        if ch == "[":
            in_class = True
            class_start = i + 1 + (pattern[i + 1] == "^")
            if pattern[class_start] == "]":
                class_start += 1
            out.append(pattern[i:class_start])
            i = class_start
            continue
        if pattern.startswith(_FLAG_MID, i) and i > 0:
            out.append("(?i:")  # RE2: the flag holds to the end of the enclosing group
            stack[-1] += 1
            i += len(_FLAG_MID)
            continue
        if ch == "(":
            stack.append(0)
        elif ch == ")":
            out.append(")" * stack.pop())
        elif ch == "|" and stack[-1]:
            out.append(")" * stack[-1] + "|" + "(?i:" * stack[-1])
            i += 1
            continue
        out.append(ch)
        i += 1
    out.append(")" * stack[0])
    return "".join(out)


def convert(gitleaks: dict[str, Any]) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """gitleaks' rules and global allowlist in our file's shape."""
    rules = []
    for rule in gitleaks["rules"]:
        if rule["id"] in LEFT_OUT:
            continue
        out: dict[str, Any] = {
            "id": rule["id"],
            "kind": KINDS.get(rule["id"], rule["id"]),
            "source": "gitleaks",
            "regex": go_to_python(rule["regex"]),
            "keywords": [k.lower() for k in rule.get("keywords", [])],
        }
        if rule["id"] in ANCHORED:
            out["anchor"] = True
        if "entropy" in rule:
            out["entropy"] = rule["entropy"]
        if "secretGroup" in rule:
            out["group"] = rule["secretGroup"]
        allows = []
        for allow in rule.get("allowlists", []):
            if "paths" in allow:
                continue  # we scan text, not files
            entry = {"target": allow.get("regexTarget", "secret")}
            entry["regexes"] = [go_to_python(r) for r in allow.get("regexes", [])]
            if allow.get("stopwords"):
                entry["stopwords"] = [s.lower() for s in allow["stopwords"]]
            allows.append(entry)
        if allows:
            out["allow"] = allows
        rules.append(out)
    top = gitleaks["allowlist"]
    glob = {
        "target": "secret",
        "regexes": [go_to_python(r) for r in top.get("regexes", [])],
        "stopwords": [s.lower() for s in top.get("stopwords", [])],
    }
    return rules, glob


def check(data: dict[str, Any]) -> None:
    """Every regex compiles under Python without a warning."""
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for rule in data["rules"]:
            re.compile(rule["regex"])
            for allow in rule.get("allow", []):
                for r in allow["regexes"]:
                    re.compile(r)
        for r in data["allow"]["regexes"]:
            re.compile(r)


def write(data: dict[str, Any]) -> None:
    check(data)
    RULES.write_text(json.dumps(data, indent=1, ensure_ascii=True) + "\n", encoding="utf-8")


def copy_to_client() -> None:
    """The client's copies: byte-equal (tests/test_secret_scan.py checks them)."""
    shutil.copyfile(SCANNER, CLIENT / "secret_scan.py")
    shutil.copyfile(RULES, CLIENT / "secret_rules.json")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("gitleaks_toml", nargs="?", type=Path)
    parser.add_argument("commit", nargs="?", default="")
    parser.add_argument("--copy-only", action="store_true")
    args = parser.parse_args(argv)
    if not args.copy_only:
        if args.gitleaks_toml is None:
            parser.error("gitleaks_toml is needed unless --copy-only")
        current = json.loads(RULES.read_text(encoding="utf-8"))
        ours = [r for r in current["rules"] if r["source"] != "gitleaks"]
        theirs, glob = convert(tomllib.loads(args.gitleaks_toml.read_text(encoding="utf-8")))
        current["gitleaks"]["commit"] = args.commit
        current["allow"] = glob
        current["rules"] = ours + theirs
        write(current)
    copy_to_client()
    return 0


if __name__ == "__main__":
    sys.exit(main())
