"""What the secret scanner (app/storage/core/secret_scan.py) costs and what it finds.

    python -m bench.secrets_scan [--mib 2] [--reps 3] [--turns 500] [--worst-kib 1024]

CPU time (``time.process_time``) per MiB on ordinary material (this repository's history,
docs, sources and a generated log of hashes and ids: tests/secrets_corpus.py) and on
secret-dense material (the corpus's secrets between ordinary lines, one per ~300 bytes);
per 2 KB turn, in µs (plain, and JSON-escaped as a transcript holds it); the hostile inputs
at ``--worst-kib``; false positives per MB; detection per kind. Medians over ``--reps``.
Writes bench/results/secrets_scan-<UTC time>.json and secrets_scan-latest.json.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import time
from collections import Counter
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path

from app.storage.core.secret_scan import default_rules, mask, scan
from tests.secrets_corpus import TOKEN_KINDS, corpus, encoded, json_escaped, ordinary_material

REPO = Path(__file__).resolve().parent.parent
RESULTS = REPO / "bench" / "results"
MIB = 1 << 20


def cpu(fn: Callable[[], object], reps: int) -> float:
    """Median CPU seconds of ``fn()`` over ``reps`` runs."""
    times = []
    for _ in range(reps):
        start = time.process_time()
        fn()
        times.append(time.process_time() - start)
    return statistics.median(times)


def dense_material(ordinary: str, size: int) -> str:
    """Ordinary lines with a planted secret every ~300 bytes."""
    planted = corpus(seed=2, per_kind=40)
    lines = ordinary.splitlines()
    rng = random.Random(4)
    out: list[str] = []
    total = 0
    while total < size:
        piece = rng.choice(lines)[:200] + "\n" + rng.choice(planted).text
        out.append(piece)
        total += len(piece) + 1
    return "\n".join(out)[:size]


def hostile(size: int) -> dict[str, str]:
    def rep(unit: str) -> str:
        return (unit * (size // len(unit) + 1))[:size]

    rng = random.Random(1)
    return {
        "one letter": "a" * size,
        "base64 characters": "".join(rng.choices("ABYZabyz0189+/", k=size)),
        "hex characters": "".join(rng.choices("0123456789abcdef", k=size)),
        "-----BEGIN": rep("-----BEGIN"),
        "BEGIN PRIVATE KEY lines": rep("-----BEGIN RSA PRIVATE KEY-----\n"),
        "password=": rep("password="),
        "api_key=": rep("api_key="),
        "sk-": rep("sk-"),
        "ghp_": rep("ghp_"),
        "curl -u": rep("curl -u "),
        "JSON \\n": rep("\\n"),
        "a://b:": rep("a://b:"),
        "eyJa.": rep("eyJa."),
        "Bearer": rep("Bearer "),
    }


def detection() -> dict[str, dict[str, str]]:
    rng = random.Random(5)
    rates: dict[str, dict[str, list[int]]] = {}
    for planted in corpus():
        forms = {
            "plain": (f"see {planted.text} here", planted.value),
            "json": (json_escaped(planted, rng), json.dumps(planted.value)[1:-1]),
        }
        if planted.kind in TOKEN_KINDS:
            for how in ("base64", "hex"):
                text = encoded(planted, how)
                forms[how] = (text, text.removeprefix("value: "))
        for form, (text, value) in forms.items():
            out, counts = mask(text)
            hit = value not in out and counts[planted.kind] >= 1
            rate = rates.setdefault(planted.kind, {}).setdefault(form, [0, 0])
            rate[0] += hit
            rate[1] += 1
    return {k: {f: f"{a}/{n}" for f, (a, n) in v.items()} for k, v in sorted(rates.items())}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mib", type=float, default=2.0, help="ordinary and dense material")
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--turns", type=int, default=500, help="2 KB turns timed")
    parser.add_argument("--worst-kib", type=int, default=1024, help="size of each hostile input")
    args = parser.parse_args()
    load = os.getloadavg()
    size = int(args.mib * MIB)
    default_rules()  # the rule file read and indexed once, as a worker does
    ordinary = ordinary_material(REPO, size=size)
    dense = dense_material(ordinary, size)
    scan(ordinary[:4096])  # the regexes compiled once, as a worker's first write does

    result: dict[str, object] = {"load_before": load, "mib": args.mib, "reps": args.reps}
    for name, text in (("ordinary", ordinary), ("dense", dense)):
        seconds = cpu(lambda t=text: scan(t), args.reps)  # type: ignore[misc]
        result[f"{name}_ms_per_mib"] = round(seconds * 1000 / (len(text) / MIB), 1)
        result[f"{name}_findings"] = len(scan(text))
    found = scan(ordinary)
    result["fp_per_mb"] = round(len(found) / (len(ordinary) / 1e6), 2)
    result["fp_rules"] = dict(Counter(f.rule for f in found))

    turns = [ordinary[i : i + 2048] for i in range(0, len(ordinary) - 2048, 2048)][: args.turns]
    escaped = [json.dumps({"type": "assistant", "text": t})[:2048] for t in turns]
    for name, batch in (("turn_2kb_us", turns), ("turn_2kb_json_us", escaped)):

        def run(batch: list[str] = batch) -> None:
            for turn in batch:
                scan(turn)

        result[name] = round(cpu(run, args.reps) * 1e6 / max(1, len(batch)), 1)

    worst = {}
    for name, text in hostile(args.worst_kib * 1024).items():
        worst[name] = round(cpu(lambda t=text: scan(t), 1) * 1000, 1)  # type: ignore[misc]
    result[f"worst_ms_at_{args.worst_kib}kib"] = worst
    result["detection"] = detection()
    result["load_after"] = os.getloadavg()

    print(f"load before {load[0]:.2f}, after {result['load_after'][0]:.2f}")  # type: ignore[index]
    print(
        f"ordinary: {result['ordinary_ms_per_mib']} ms CPU/MiB, dense: {result['dense_ms_per_mib']} ms CPU/MiB"
    )
    print(f"2 KB turn: {result['turn_2kb_us']} µs, JSON-escaped: {result['turn_2kb_json_us']} µs")
    print(f"false positives: {result['fp_per_mb']} per MB {result['fp_rules']}")
    print(f"hostile input, {args.worst_kib} KiB each (ms CPU):")
    for name, ms in worst.items():
        print(f"  {name:26s} {ms:8.1f}")
    print("detection per kind (plain / json / base64 / hex):")
    for kind, forms in result["detection"].items():  # type: ignore[attr-defined]
        print(f"  {kind:22s} " + "  ".join(f"{f} {r}" for f, r in forms.items()))
    RESULTS.mkdir(exist_ok=True)
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    body = json.dumps(result, indent=1, ensure_ascii=False) + "\n"
    (RESULTS / f"secrets_scan-{stamp}.json").write_text(body)
    (RESULTS / "secrets_scan-latest.json").write_text(body)


if __name__ == "__main__":
    main()
