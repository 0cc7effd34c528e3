"""Long-term memory: recall latency at 10k/100k memories, ingest, quality, actor memory.

Measured in one run and printed as one table:

1. recall latency p50/p99 (ms) for one persona holding 10k and 100k memories
   (plus other personas' rows, default half as many again, so the persona
   prefilter has work to do, and a few hundred knowledge chunks), over
   realistic query texts, after ``optimize()``. Three timings are kept apart:

   (a) search: ``MemoryStore.recall`` with the query's embedding already
       computed (the embedder answers from a dict), i.e. everything but the
       model — validation, the LanceDB search legs, fusion, result rows;
   (b) embed: all-MiniLM-L6-v2 embedding the query text alone (CPU, one
       torch thread, as the store runs it);
   (c) end-to-end: ``recall`` with the live MiniLM embedder, measured as a
       whole (not a+b).

   hybrid for both sizes (and, at the largest, for a persona that has no
   knowledge chunks), vector-only and fts-only for comparison, and each
   search leg of hybrid at the largest size on its own (issued the way
   ``recall`` issues them), then all four together, to say where the time
   goes. Each timed row also gives this process's CPU time per call (all
   threads): when it is close to the wall time, the search is CPU-bound. When
   a table has an ANN vector index, ``recall(mode="vector")`` is compared with
   exact (brute-force) kNN over the same rows.
2. ingest throughput (chunks/s) with MiniLM on a generated multi-page
   document (paragraphs of prose, ~3,000 characters a page);
3. recall@5 of vector, fts and hybrid on :mod:`runtime.testing.recall_eval`
   with MiniLM;
4. USS of the MemoryStore actor's process (pid from its ``stats()``) on a
   local Ray (``num_cpus=2``), after the model is loaded and a few memories
   were written through it.

How the large stores are filled quickly: memory texts are built from a few
hundred realistic sentence fragments (work log, people, projects, tickets,
appointments, family, travel…), each embedded once with MiniLM; a memory of
two or three fragments gets the normalised sum of its fragments' vectors plus
a little Gaussian noise, so every row's vector is distinct and the vectors
cluster like real ones. Queries are separate question-like texts embedded with
MiniLM itself. Everything is written through ``write_memories``/``ingest``.

    python benchmarks/recall.py [--sizes 10000,100000] [--queries 200]
                                [--others 0.5] [--pages 30] [--no-actor]

The defaults take 2-5 minutes on 2 cores; scale down with e.g.
``--sizes 2000,20000 --queries 50 --pages 5 --no-actor``.

Target: hybrid p50 <= 10 ms at 100k memories.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import os
import random
import re
import statistics
import sys
import tempfile
import time
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import psutil

os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
from rich.console import Console
from rich.table import Table

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from runtime.config import MemorySettings  # noqa: E402
from runtime.memory import MemoryInput, MemoryStore, MiniLMEmbedder, Mode, _lance  # noqa: E402
from runtime.memory.store import CANDIDATES  # noqa: E402
from runtime.testing import recall_eval  # noqa: E402

PERSONA = "bench"
OTHER_PERSONAS = 10
#: One of the other personas that is given no knowledge chunks.
NO_KNOWLEDGE = "other-05"
TARGET_MS = 10.0
SEED = 20240611

# -- a realistic corpus from embedded fragments -------------------------------

PEOPLE = [
    "Priya", "Tomasz", "Dana", "Marcus", "Aiko", "Lena", "Omar", "Sofia",
    "Raj", "Elena", "Ben", "Chen", "Fatima", "Jonas", "Grace", "Mateo",
]  # fmt: skip
PROJECTS = ["HALCYON", "BLUEJAY", "Zephyr", "Atlas", "Nimbus", "Kestrel", "Orion", "Juniper"]
SERVICES = [
    "billing service", "checkout API", "search indexer", "websocket gateway", "auth service",
    "payments worker", "mobile backend", "notification service", "cart service",
    "reporting pipeline",
]  # fmt: skip
TOPICS = [
    "the Q3 roadmap", "the on-call rotation", "the hiring plan", "the Postgres migration",
    "cloud cost cutting", "the incident review", "API versioning", "flaky tests",
    "the security audit", "the design system", "the data retention policy",
    "the quarterly planning",
]  # fmt: skip
CITIES = ["Amsterdam", "Lisbon", "Berlin", "Paris", "Copenhagen", "Milan", "Vienna", "Dublin"]
WEEKDAYS = ["Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday"]
FAMILY = ["Maya", "Leo", "my sister Clara", "my partner Sam", "Mum", "Dad"]
ACTIVITIES = [
    "swimming lesson", "piano recital", "football match", "school play", "doctor's visit",
    "parent-teacher meeting", "birthday party", "dentist check-up",
]  # fmt: skip
BILLS = ["electricity", "water", "internet", "phone", "car insurance", "gym", "council tax"]
FEELINGS = ["productive", "rushed", "frustrating", "calm", "energising", "tiring", "useful"]
ACTIONS = [
    "write the design doc", "update the runbook", "send the invoice", "file the expense report",
    "book the meeting room", "renew the TLS certificates", "review the budget",
    "prepare the slides", "answer the customer email", "order a replacement laptop",
]  # fmt: skip
RISKS = [
    "data loss during the cut-over", "a slow rollback", "missing the vendor deadline",
    "alert fatigue on call", "the legacy cron jobs", "a schema change in production",
]  # fmt: skip
PREFERENCES = [
    "prefers written async updates over meetings", "likes oat milk flat whites",
    "blocks focus time every morning", "wants bullet-point summaries",
    "does not take calls after 6 pm", "prefers aisle seats on trains",
    "keeps receipts in the finance folder", "is allergic to penicillin",
]  # fmt: skip

EVENT_TEMPLATES: list[tuple[str, list[list[str]]]] = [
    ("Met with {} to discuss {}.", [PEOPLE, TOPICS]),
    ("{} asked for an update on project {}.", [PEOPLE, PROJECTS]),
    ("Deployed the {} release {} to production.", [SERVICES, ["4.12", "4.13", "5.0", "5.1"]]),
    ("On-call page: the {} latency spiked after a Redis failover in {}.", [SERVICES, CITIES]),
    ("Reviewed {}'s pull request for the {}.", [PEOPLE, SERVICES]),
    ("Project {} kickoff with {} went well.", [PROJECTS, PEOPLE]),
    ("Paired with {} on a memory leak in the {}.", [PEOPLE, SERVICES]),
    ("Booked a train to {} for the team offsite on {}.", [CITIES, WEEKDAYS]),
    ("{} has a {} on {}.", [FAMILY, ACTIVITIES, WEEKDAYS]),
    ("Paid the {} bill early this month; it went up again.", [BILLS]),
    ("Ran {} km before work and felt {}.", [["5", "8", "10", "12"], FEELINGS]),
    ("{} recommended a book about {}.", [PEOPLE, TOPICS]),
    ("Dinner with {} in {} was lovely.", [FAMILY, CITIES]),
    ("The {} migration for project {} slipped by a week.", [SERVICES, PROJECTS]),
]
DETAIL_TEMPLATES: list[tuple[str, list[list[str]]]] = [
    ("Ticket {}-{} tracks the follow-up.", [["OPS", "INC", "BILL", "SEC", "WEB"], ["{num}"]]),
    ("Follow up with {} next {}.", [PEOPLE, WEEKDAYS]),
    ("It was {} overall.", [FEELINGS]),
    ("Need to {} before {}.", [ACTIONS, WEEKDAYS]),
    ("The main risk is {}.", [RISKS]),
    ("Budget impact is about {} euros.", [["{num}"]]),
    ("Notes are in the {} planning doc.", [PROJECTS]),
    ("Remember that {} {}.", [PEOPLE, PREFERENCES]),
]
QUERY_TEMPLATES: list[tuple[str, list[list[str]]]] = [
    ("what did {} say about {}", [PEOPLE, TOPICS]),
    ("status of project {}", [PROJECTS]),
    ("when is {}'s {}", [FAMILY, ACTIVITIES]),
    ("problems with the {} in production", [SERVICES]),
    ("trip to {} for the offsite", [CITIES]),
    ("how much was the {} bill", [BILLS]),
    ("who should I follow up with about {}", [TOPICS]),
    ("risks of {}", [RISKS]),
    ("{} ticket follow-up", [["OPS", "INC", "BILL", "SEC", "WEB"]]),
    ("what does {} prefer", [PEOPLE]),
    ("did I {} yet", [ACTIONS]),
    ("latency incident on the {}", [SERVICES]),
    ("{} and {} project sync", [PEOPLE, PROJECTS]),
    ("which {} release went to production", [SERVICES]),
    ("what should {} remember about {}", [PEOPLE, ACTIONS]),
]


def expand(
    templates: list[tuple[str, list[list[str]]]], rng: random.Random, per_template: int
) -> list[str]:
    """Up to ``per_template`` distinct fills of each template."""
    out: list[str] = []
    for template, slots in templates:
        combos = list(itertools.product(*slots))
        rng.shuffle(combos)
        for combo in combos[:per_template]:
            values = [str(rng.randint(100, 9999)) if v == "{num}" else v for v in combo]
            out.append(template.format(*values))
    return out


class Corpus:
    """Fragments embedded once; memories and documents composed from them."""

    def __init__(self, minilm: MiniLMEmbedder, rng: random.Random, n_queries: int) -> None:
        self.rng = rng
        self.events = expand(EVENT_TEMPLATES, rng, 40)
        self.details = expand(DETAIL_TEMPLATES, rng, 40)
        fragments = [*self.events, *self.details]
        vectors = np.asarray(minilm.embed(fragments), dtype=np.float32)
        self.vectors = dict(zip(fragments, vectors, strict=True))
        queries = expand(QUERY_TEMPLATES, rng, 1 + 2 * n_queries // len(QUERY_TEMPLATES))
        rng.shuffle(queries)
        self.queries = queries[:n_queries]
        self.query_vectors = dict(
            zip(self.queries, np.asarray(minilm.embed(self.queries), dtype=np.float32), strict=True)
        )

    @property
    def fragments(self) -> int:
        return len(self.vectors)

    def memory(self) -> str:
        parts = [self.rng.choice(self.events), self.rng.choice(self.details)]
        if self.rng.random() < 0.5:
            parts.append(self.rng.choice(self.details))
        return " ".join(parts)

    def document(self, pages: int) -> str:
        """Prose paragraphs under headings, ~3,000 characters a page."""
        out: list[str] = []
        size = 0
        section = 0
        while size < pages * 3000:
            if section % 4 == 0:
                out.append(f"## Section {section // 4 + 1}: {self.rng.choice(TOPICS).title()}")
            section += 1
            sentences = [
                self.rng.choice(self.events if i % 2 == 0 else self.details)
                for i in range(self.rng.randint(4, 9))
            ]
            out.append(" ".join(sentences))
            size += len(out[-1]) + 2
        return "\n\n".join(out)


_SENTENCE = re.compile(r"(?<=[.])\s+")


class ComposedEmbedder:
    """Stands in for MiniLM while filling and querying the large stores.

    Known query texts get their real MiniLM vectors (so recall's own embedding
    step costs a dict lookup); any other text gets the normalised sum of its
    fragments' MiniLM vectors plus noise. ``live`` switches to MiniLM itself.
    Same name and size as MiniLM, so the store cannot tell.
    """

    name = MiniLMEmbedder.name
    dim = MiniLMEmbedder.dim

    def __init__(self, corpus: Corpus, minilm: MiniLMEmbedder, seed: int) -> None:
        self.corpus = corpus
        self.minilm = minilm
        self.live = False
        self._noise = np.random.default_rng(seed)

    def embed(self, texts: Sequence[str]) -> list[list[float]]:
        if self.live:
            return self.minilm.embed(texts)
        out = np.empty((len(texts), self.dim), dtype=np.float32)
        noise = self._noise.normal(0.0, 0.3 / np.sqrt(self.dim), out.shape).astype(np.float32)
        for i, text in enumerate(texts):
            known = self.corpus.query_vectors.get(text)
            if known is not None:
                out[i] = known
                continue
            vec = noise[i].copy()
            for sentence in _SENTENCE.split(text):
                part = self.corpus.vectors.get(sentence)
                if part is not None:
                    vec += part
            out[i] = vec / np.linalg.norm(vec)
        # An ndarray is what the store turns the lists into anyway.
        return out  # type: ignore[return-value]


# -- measurement ----------------------------------------------------------------


def pct(samples: list[float], q: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def timed(fn: Callable[[], object], repeat: int) -> list[float]:
    """Milliseconds of each of ``repeat`` calls."""
    out = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        out.append((time.perf_counter() - t0) * 1000)
    return out


class Samples(list[float]):
    """Wall milliseconds per call, plus the process's CPU ms per call (all threads)."""

    cpu: float | None = None


def over_queries(fn: Callable[[str], object], queries: list[str], warmup: int = 10) -> Samples:
    for q in queries[:warmup]:
        fn(q)
    samples = Samples()
    cpu0 = time.process_time()
    for q in queries:
        t0 = time.perf_counter()
        fn(q)
        samples.append((time.perf_counter() - t0) * 1000)
    samples.cpu = (time.process_time() - cpu0) * 1000 / len(queries)
    return samples


def fill(
    store: MemoryStore, corpus: Corpus, rng: random.Random, size: int, others: float
) -> dict[str, int]:
    """``size`` memories for PERSONA, ``others * size`` spread over other personas,
    and ~size/200 knowledge chunks (min 20) for PERSONA and for the others."""
    personas = [f"other-{i:02d}" for i in range(OTHER_PERSONAS)]
    owners = [PERSONA] * size + [personas[i % OTHER_PERSONAS] for i in range(int(size * others))]
    rng.shuffle(owners)
    batch = 10_000
    for start in range(0, len(owners), batch):
        store.write_memories(
            [
                MemoryInput(
                    owner,
                    rng.choice(["work", "project", "personal", "family"]),
                    corpus.memory(),
                    rng.randint(1, 10),
                )
                for owner in owners[start : start + batch]
            ]
        )
    chunks = max(20, size // 200)
    pages_per_doc = 10  # ~11 chunks a document at the default chunk size
    for persona in [PERSONA, *personas[:3]]:
        done, doc = 0, 0
        while done < chunks:
            text = corpus.document(pages_per_doc)
            done += store.ingest(persona, source=f"handbook-{doc}", text=text).chunks
            doc += 1
    return store.counts(PERSONA)


def leg_timings(store: MemoryStore, corpus: Corpus, queries: list[str]) -> dict[str, Samples]:
    """Each search of a hybrid recall on its own, issued as ``recall`` issues
    them (``_lance.ranked_many``), then all four together."""
    where = _lance.match(persona=PERSONA)
    searches: dict[str, Callable[[str], _lance.Search]] = {}
    for table, columns in (
        ("memories", ["id", "category", "content", "importance", "created_at", "day"]),
        ("knowledge", ["id", "source", "chunk", "content"]),
    ):
        tbl, skip = store._table(table), table == "knowledge"
        searches[f"{table} vector"] = lambda q, t=tbl, c=columns, s=skip: _lance.Search(  # type: ignore[misc]
            t, corpus.query_vectors[q].tolist(), where, c, CANDIDATES, s
        )
        searches[f"{table} fts"] = lambda q, t=tbl, c=columns, s=skip: _lance.Search(  # type: ignore[misc]
            t, q, where, c, CANDIDATES, s
        )
    out = {
        name: over_queries(lambda q, m=make: _lance.ranked_many([m(q)]), queries)  # type: ignore[misc]
        for name, make in searches.items()
    }
    out["all 4 concurrently"] = over_queries(
        lambda q: _lance.ranked_many([make(q) for make in searches.values()]), queries
    )
    return out


def ann_agreement(store: MemoryStore, corpus: Corpus, queries: list[str]) -> tuple[float, float]:
    """Mean overlap of recall(mode=vector, source=memories) with exact kNN, at 8 and 50."""
    search: Any = store._table("memories").search  # typed as the generic builder
    where = _lance.match(persona=PERSONA)
    at8, at50 = [], []
    for q in queries:
        exact = (
            search(corpus.query_vectors[q].tolist(), vector_column_name="vector")
            .distance_type("cosine")
            .where(where, prefilter=True)
            .bypass_vector_index()
            .select(["id", "_distance"])
            .limit(50)
            .to_arrow()
            .column("id")
            .to_pylist()
        )
        hits = store.recall(PERSONA, query=q, mode="vector", source="memories", limit=50)
        got = [hit.id for hit in hits]
        at8.append(len(set(got[:8]) & set(exact[:8])) / 8)
        at50.append(len(set(got) & set(exact)) / 50)
    return statistics.mean(at8), statistics.mean(at50)


def bench_size(
    minilm: MiniLMEmbedder, corpus: Corpus, size: int, args: argparse.Namespace, tmp: Path
) -> dict[str, Any]:
    rng = random.Random(SEED + size)
    embedder = ComposedEmbedder(corpus, minilm, SEED + size)
    store = MemoryStore(str(tmp / f"db-{size}"), embedder)
    t0 = time.perf_counter()
    counts = fill(store, corpus, rng, size, args.others)
    fill_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    store.optimize()
    optimize_s = time.perf_counter() - t0
    total = store.counts()
    queries = corpus.queries
    result: dict[str, Any] = {
        "counts": counts,
        "total": total,
        "fill_s": fill_s,
        "optimize_s": optimize_s,
        "ann": _lance.has_vector_index(store._table("memories")),
    }
    modes: tuple[Mode, ...] = ("hybrid", "vector", "fts")
    for mode in modes:
        result[f"search {mode}"] = over_queries(
            lambda q, m=mode: store.recall(PERSONA, query=q, mode=m),  # type: ignore[misc]
            queries,
        )
    result["no knowledge"] = over_queries(lambda q: store.recall(NO_KNOWLEDGE, query=q), queries)
    result["legs"] = leg_timings(store, corpus, queries)
    if result["ann"]:
        result["agreement"] = ann_agreement(store, corpus, queries[:100])
    embedder.live = True
    result["e2e hybrid"] = over_queries(lambda q: store.recall(PERSONA, query=q), queries)
    return result


def bench_ingest(minilm: MiniLMEmbedder, corpus: Corpus, pages: int, tmp: Path) -> dict[str, Any]:
    store = MemoryStore(str(tmp / "ingest"), minilm)
    text = corpus.document(pages)
    store.ingest(PERSONA, source="warmup", text=corpus.document(2))
    runs = []
    for i in range(3):
        t0 = time.perf_counter()
        result = store.ingest(PERSONA, source=f"handbook-{i}", text=text)
        runs.append((result.chunks, time.perf_counter() - t0))
    chunks, seconds = min(runs, key=lambda r: r[1] / r[0])
    return {
        "chars": len(text),
        "chunks": chunks,
        "rate": [c / s for c, s in runs],
        "best_s": seconds,
    }


def bench_quality(minilm: MiniLMEmbedder, tmp: Path) -> dict[str, float]:
    counter = itertools.count()
    return recall_eval.evaluate(
        lambda: MemoryStore(str(tmp / f"eval-{next(counter)}"), minilm), k=5
    )


def bench_actor(tmp: Path) -> dict[str, Any]:
    import ray

    from actors.memory import get_or_create_memory_store

    # Ray forks helpers after LanceDB has started its threads; LanceDB warns
    # about it on every fork. Nothing here uses LanceDB in those children.
    warnings.filterwarnings("ignore", message="lancedb fork support", category=RuntimeWarning)
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        handle = get_or_create_memory_store(
            str(tmp / "actor-db"),
            MemorySettings(),
            name="bench-memory",
            namespace=f"bench-recall-{os.getpid()}",
            detached=False,
        )

        async def write_some() -> None:
            await asyncio.gather(
                *[
                    handle.write.remote(
                        PERSONA,
                        category="work",
                        content=f"Benchmark memory {i}: met with Priya about the Q3 roadmap.",
                        importance=5,
                    )
                    for i in range(20)
                ]
            )

        asyncio.run(write_some())
        hits = ray.get(handle.recall.remote(PERSONA, query="what did Priya say"))
        assert hits, "the actor recalled nothing"
        time.sleep(1.0)
        stats = ray.get(handle.stats.remote())
        proc = psutil.Process(stats.pid)
        info = proc.memory_full_info()
        return {
            "uss": info.uss / 2**20,
            "rss": info.rss / 2**20,
            "rows": stats.rows,
            "embedder": stats.embedder,
        }
    finally:
        ray.shutdown()


# -- report -------------------------------------------------------------------


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--sizes", default="10000,100000", help="memories of the persona")
    parser.add_argument("--queries", type=int, default=200)
    parser.add_argument("--others", type=float, default=0.5, help="other personas' rows / size")
    parser.add_argument("--pages", type=int, default=30, help="pages of the ingested document")
    parser.add_argument("--no-actor", action="store_true", help="skip the Ray actor section")
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    console = Console(width=int(os.environ.get("COLUMNS", "200")))
    started, load_start = time.perf_counter(), os.getloadavg()[0]

    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        with console.status("loading MiniLM, embedding fragments and queries"):
            # As the MemoryStore actor runs it (memory.embed_threads: 1).
            import torch

            torch.set_num_threads(MemorySettings().embed_threads or torch.get_num_threads())
            minilm = MiniLMEmbedder()
            corpus = Corpus(minilm, random.Random(SEED), args.queries)
            embed = over_queries(lambda q: minilm.embed([q]), corpus.queries)
        by_size = {}
        for size in sizes:
            with console.status(f"{size:,} memories: fill, optimize, query"):
                by_size[size] = bench_size(minilm, corpus, size, args, tmp)
        with console.status("ingest"):
            ingest = bench_ingest(minilm, corpus, args.pages, tmp)
        with console.status("recall@5"):
            quality = bench_quality(minilm, tmp)
        actor = None
        if not args.no_actor:
            with console.status("MemoryStore actor on Ray"):
                actor = bench_actor(tmp)

    largest = max(sizes)
    label = {size: f"{size // 1000}k" for size in sizes}
    table = Table(
        title=(
            f"MemoryStore recall: {len(corpus.queries)} queries per timed row; persona "
            f"'{PERSONA}' + {args.others:g}x as many rows of {OTHER_PERSONAS} other personas"
        )
    )
    for column, justify in [
        ("measurement", "left"),
        ("what is timed", "left"),
        ("p50 ms", "right"),
        ("p99 ms", "right"),
        ("CPU ms/q", "right"),
        ("notes", "left"),
    ]:
        table.add_column(column, justify=justify)  # type: ignore[arg-type]

    def row(name: str, what: str, samples: Samples | None, notes: str = "") -> None:
        if samples is None:
            table.add_row(name, what, "", "", "", notes)
            return
        p50, p99 = statistics.median(samples), pct(samples, 0.99)
        cpu = "" if samples.cpu is None else f"{samples.cpu:.1f}"
        table.add_row(name, what, f"{p50:.2f}", f"{p99:.2f}", cpu, notes)

    def verdict(samples: Samples) -> str:
        met = statistics.median(samples) <= TARGET_MS
        return f"target p50 <= {TARGET_MS:g} ms: {'MET' if met else 'NOT met'}"

    row("query embedding", "(b) MiniLM embed of the query text alone", embed)
    for size in sizes:
        r = by_size[size]
        last = size == largest
        row(
            f"hybrid @ {label[size]}",
            "(a) recall(), query embedding given",
            r["search hybrid"],
            f"{r['counts']['memories']:,} memories + {r['counts']['knowledge']} chunks of "
            f"{r['total']['memories']:,} + {r['total']['knowledge']:,} rows; fill "
            f"{r['fill_s']:.0f} s, optimize {r['optimize_s']:.1f} s; vector index: "
            + (
                "IVF_SQ (ANN; vector top-8 / top-50 = {:.1%} / {:.1%} of exact kNN's)".format(
                    *r["agreement"]
                )
                if r["ann"]
                else "none (exact kNN)"
            )
            + (f"  [{verdict(r['search hybrid'])}]" if last else ""),
        )
        row(
            f"hybrid @ {label[size]}",
            "(c) recall() end to end, live MiniLM",
            r["e2e hybrid"],
            f"[{verdict(r['e2e hybrid'])}]" if last else "",
        )
    r = by_size[largest]
    big = label[largest]
    row(
        f"hybrid @ {big}, no knowledge",
        "(a) recall() for a persona without chunks",
        r["no knowledge"],
        f"'{NO_KNOWLEDGE}': {int(largest * args.others) // OTHER_PERSONAS:,} memories, "
        "no knowledge chunks",
    )
    row(f"vector @ {big}", "(a) recall(mode='vector')", r["search vector"])
    row(f"fts @ {big}", "(a) recall(mode='fts')", r["search fts"])
    for leg, samples in r["legs"].items():
        row(f"  leg @ {big}: {leg}", f"search(es) of hybrid, top {CANDIDATES}, no fusion", samples)
    rates = ingest["rate"]
    row(
        "ingest throughput",
        "ingest(): chunk + MiniLM + merge",
        None,
        f"{max(rates):.1f} chunks/s best of 3 (median {statistics.median(rates):.1f}); "
        f"{ingest['chars']:,} chars (~{ingest['chars'] / 3000:.0f} pages) -> "
        f"{ingest['chunks']} chunks in {ingest['best_s']:.1f} s",
    )
    row(
        "recall@5, MiniLM",
        "runtime/testing/recall_eval.py",
        None,
        "  ".join(f"{mode} {quality[mode]:.3f}" for mode in recall_eval.MODES)
        + f"  ({len(recall_eval.MEMORIES)} memories, {len(recall_eval.QUERIES)} queries)",
    )
    if actor is not None:
        row(
            "MemoryStore actor memory",
            "USS of the actor process",
            None,
            f"USS {actor['uss']:.0f} MiB (RSS {actor['rss']:.0f} MiB) with {actor['embedder']} "
            f"loaded, after {actor['rows']['memories']} writes and a recall",
        )
    console.print(table)
    console.print(
        f"(a) excludes the model, (b) is the model alone, (c) is measured whole. CPU ms/q: this "
        f"process's CPU time per call, all threads (LanceDB's included). Load average "
        f"{load_start:.1f} at the start, {os.getloadavg()[0]:.1f} at the end, on "
        f"{os.cpu_count()} cores (shared machine); run took {time.perf_counter() - started:.0f} s. "
        f"Memories are composed from {corpus.fragments} MiniLM-embedded fragments (module doc)."
    )


if __name__ == "__main__":
    main()
