"""Long-term memory: recall latency beside LanceDB's own floor, ingest, quality, actor memory.

Measured in one run and printed as one table:

1. recall latency p50/p95 (ms) for one persona holding 10k and 100k memories
   (plus other personas' rows, default half as many again, so the persona
   prefilter has work to do, and a few hundred knowledge chunks), over
   realistic query texts, ``limit`` 8, after ``optimize()``. Three timings are
   kept apart:

   (a) search: ``MemoryStore.recall`` with the query's embedding already
       computed (the embedder answers from a dict), i.e. everything but the
       model — validation, the LanceDB searches, fusion, result rows;
   (b) embed: one query text through the default local embedder
       (all-MiniLM-L6-v2 in numpy) and through sentence-transformers/torch,
       each with one thread, as the MemoryStore actor runs them
       (``memory.embed_threads``: ``OMP_NUM_THREADS`` is set before numpy
       loads, torch gets ``set_num_threads``);
   (c) end to end: ``recall`` with the live embedder, measured whole.

   Beside each, LanceDB's own single-query floor on the same table, persona
   filter and top 8, measured in the same run and interleaved with it query
   by query (so both see the same moments of load): a bare
   ``table.search(vector).where(persona).limit(8)`` on the memories table
   (sync API; cosine, LanceDB's default partitions probed, no refine) and a
   bare full-text query likewise; ``ratio`` is ours / the floor, p50 to p50.
   Hybrid is split by query: a plain query (fusion gives the full-text leg
   weight 0; recall searches the vector leg only) against the bare vector
   query, a query with an identifier-like token (both legs) against the bare
   vector query followed by the bare full-text one, and end to end against
   the embedding followed by the bare vector query.

   Also at the largest size: vector-only and fts-only recall, a persona with
   no knowledge chunks, each LanceDB search of a recall on its own (issued the
   way ``recall`` issues them), and how far the ANN index's vector top 8 /
   top 50 agree with exact kNN. Each timed row also gives this process's CPU
   time per call (all threads): when it is close to the wall time, the search
   is CPU-bound.
2. ingest throughput (chunks/s) with the default embedder on a generated
   multi-page document (paragraphs of prose, ~3,000 characters a page);
3. recall@5 of vector, fts and hybrid on :mod:`tests.recall.recall_eval`;
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

    python benchmarks/recall.py [--memories 100000] [--sizes 10000,100000]
                                [--queries 200] [--others 0.5] [--pages 30]
                                [--no-actor]

The defaults take 2-4 minutes on 2 cores; scale down with e.g.
``--memories 20000 --queries 50 --pages 5 --no-actor`` (sizes 2k and 20k).

Targets at the largest size: search p50 <= 10 ms, end to end p50 <= 20 ms.
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
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from coterie.runtime.config import MemorySettings  # noqa: E402

# As the MemoryStore actor's process gets it (embedder_process_env): numpy's
# BLAS reads OMP_NUM_THREADS once, when numpy loads, so it is set first.
if MemorySettings().embed_threads is not None:
    os.environ.setdefault("OMP_NUM_THREADS", str(MemorySettings().embed_threads))
os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")

import numpy as np  # noqa: E402
import psutil  # noqa: E402
from rich.console import Console  # noqa: E402
from rich.table import Table  # noqa: E402

from coterie.runtime.memory import (  # noqa: E402
    Embedder,
    MemoryInput,
    MemoryStore,
    MiniLMEmbedder,
    Mode,
    _lance,
    embedders,
    fusion,
)
from coterie.runtime.memory.store import CANDIDATES  # noqa: E402
from tests.recall import recall_eval  # noqa: E402

PERSONA = "bench"
OTHER_PERSONAS = 10
#: One of the other personas that is given no knowledge chunks.
NO_KNOWLEDGE = "other-05"
#: Hits per recall (the tool's default), and the floor queries' top k.
LIMIT = 8
SEARCH_TARGET_MS = 10.0
E2E_TARGET_MS = 20.0
SEED = 20240611
#: The columns recall reads per memory, which the floor queries read too.
MEMORY_COLUMNS = ["id", "category", "content", "importance", "created_at", "day"]
KNOWLEDGE_COLUMNS = ["id", "source", "chunk", "content"]

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

    def __init__(self, minilm: Embedder, rng: random.Random, n_queries: int) -> None:
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
    fragments' MiniLM vectors plus noise. With ``live`` set, that embedder
    answers instead. Same name and size as MiniLM, so the store cannot tell.
    """

    name = MiniLMEmbedder.name
    dim = MiniLMEmbedder.dim

    def __init__(self, corpus: Corpus, seed: int) -> None:
        self.corpus = corpus
        self.live: Embedder | None = None
        self._noise = np.random.default_rng(seed)

    def embed(self, texts: Sequence[str]) -> list[list[float]]:
        if self.live is not None:
            return self.live.embed(texts)
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


def local_embedders() -> dict[str, Embedder]:
    """The local embedders to time, the default (what the runtime runs) first."""
    import torch

    # As the MemoryStore actor runs torch (memory.embed_threads).
    torch.set_num_threads(MemorySettings().embed_threads or torch.get_num_threads())
    out: dict[str, Embedder] = {}
    # The numpy MiniLM is the runtime's default where this version has it.
    numpy_minilm = getattr(embedders, "NumpyMiniLMEmbedder", None)
    if numpy_minilm is not None:
        out["numpy MiniLM"] = numpy_minilm()
    out["torch MiniLM"] = MiniLMEmbedder()
    return out


# -- measurement ----------------------------------------------------------------


@dataclass
class Samples:
    """Wall and CPU milliseconds (this process, all threads) of each call, by query."""

    queries: list[str] = field(default_factory=list)
    wall: list[float] = field(default_factory=list)
    cpu: list[float] = field(default_factory=list)

    def add(self, query: str, wall: float, cpu: float) -> None:
        self.queries.append(query)
        self.wall.append(wall)
        self.cpu.append(cpu)

    def where(self, keep: Callable[[str], bool]) -> Samples:
        """The calls whose query ``keep`` accepts."""
        out = Samples()
        for query, wall, cpu in zip(self.queries, self.wall, self.cpu, strict=True):
            if keep(query):
                out.add(query, wall, cpu)
        return out

    def plus(self, other: Samples) -> Samples:
        """Call by call, this one's time and then ``other``'s (same queries, same order)."""
        assert self.queries == other.queries
        out = Samples()
        for q, w1, c1, w2, c2 in zip(
            self.queries, self.wall, self.cpu, other.wall, other.cpu, strict=True
        ):
            out.add(q, w1 + w2, c1 + c2)
        return out

    @property
    def p50(self) -> float:
        return statistics.median(self.wall)

    def pct(self, q: float) -> float:
        ordered = sorted(self.wall)
        return ordered[min(len(ordered) - 1, int(q * len(ordered)))]

    @property
    def cpu_per_call(self) -> float:
        return statistics.mean(self.cpu)


def interleaved(
    fns: dict[str, Callable[[str], object]], queries: Sequence[str], warmup: int = 10
) -> dict[str, Samples]:
    """Each of ``fns`` called once per query, in turn, so that all see the same load."""
    for query in queries[:warmup]:
        for fn in fns.values():
            fn(query)
    out = {name: Samples() for name in fns}
    for query in queries:
        for name, fn in fns.items():
            cpu0, t0 = time.process_time(), time.perf_counter()
            fn(query)
            out[name].add(
                query, (time.perf_counter() - t0) * 1000, (time.process_time() - cpu0) * 1000
            )
    return out


def over_queries(fn: Callable[[str], object], queries: Sequence[str]) -> Samples:
    return interleaved({"": fn}, queries)[""]


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


def floor_queries(store: MemoryStore, corpus: Corpus) -> dict[str, Callable[[str], object]]:
    """LanceDB's own single queries for what recall asks of the memories table:
    the persona's top ``LIMIT`` for the query's vector, and for its words,
    through the sync API with LanceDB's defaults (no probes or refine set)."""
    search: Any = store._table("memories").search  # typed as the generic builder
    where = _lance.match(persona=PERSONA).to_sql()

    def vector(query: str) -> object:
        return (
            search(corpus.query_vectors[query].tolist(), vector_column_name="vector")
            .distance_type("cosine")
            .where(where, prefilter=True)
            .select([*MEMORY_COLUMNS, "_distance"])
            .limit(LIMIT)
            .to_arrow()
        )

    def fts(query: str) -> object:
        return (
            search(query, query_type="fts", fts_columns="content")
            .where(where, prefilter=True)
            .select([*MEMORY_COLUMNS, "_score"])
            .limit(LIMIT)
            .to_arrow()
        )

    return {"floor vector": vector, "floor fts": fts}


def leg_timings(store: MemoryStore, corpus: Corpus, queries: list[str]) -> dict[str, Samples]:
    """Each LanceDB search of a hybrid recall on its own, issued as ``recall``
    issues them (``_lance.ranked_many``), then together: a plain query's two
    vector searches (top ``LIMIT + 1``), and an identifier query's four
    (top :data:`CANDIDATES` each)."""
    where = _lance.match(persona=PERSONA)
    plain = LIMIT + 1
    searches: dict[str, Callable[[str], _lance.Search]] = {}
    for table, columns in (("memories", MEMORY_COLUMNS), ("knowledge", KNOWLEDGE_COLUMNS)):
        tbl, skip = store._table(table), table == "knowledge"

        def vector(q: str, n: int, t: Any = tbl, c: list[str] = columns, s: bool = skip) -> Any:
            vec = corpus.query_vectors[q].tolist()
            return _lance.Search(t, vec, where, c, n, skip_if_empty=s, rerank=CANDIDATES)

        def text(q: str, t: Any = tbl, c: list[str] = columns, s: bool = skip) -> Any:
            return _lance.Search(t, q, where, c, CANDIDATES, skip_if_empty=s)

        searches[f"{table} vector, top {plain}"] = lambda q, v=vector: v(q, plain)  # type: ignore[misc]
        searches[f"{table} vector, top {CANDIDATES}"] = lambda q, v=vector: v(q, CANDIDATES)  # type: ignore[misc]
        searches[f"{table} fts, top {CANDIDATES}"] = text
    fns: dict[str, Callable[[str], object]] = {
        name: lambda q, m=make: _lance.ranked_many([m(q)])  # type: ignore[misc]
        for name, make in searches.items()
    }
    fns["plain query: both vector searches"] = lambda q: _lance.ranked_many(
        [make(q) for name, make in searches.items() if name.endswith(f"vector, top {plain}")]
    )
    fns["identifier query: all four searches"] = lambda q: _lance.ranked_many(
        [make(q) for name, make in searches.items() if name.endswith(f"top {CANDIDATES}")]
    )
    return {name: over_queries(fn, queries) for name, fn in fns.items()}


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
    local: dict[str, Embedder],
    corpus: Corpus,
    size: int,
    args: argparse.Namespace,
    tmp: Path,
    *,
    detail: bool,
) -> dict[str, Any]:
    """Fill a store of ``size`` memories, optimize it, and time recall beside
    the floors; ``detail`` adds the legs, the other modes' extras and ANN agreement."""
    rng = random.Random(SEED + size)
    embedder = ComposedEmbedder(corpus, SEED + size)
    store = MemoryStore(str(tmp / f"db-{size}"), embedder)
    t0 = time.perf_counter()
    counts = fill(store, corpus, rng, size, args.others)
    fill_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    store.optimize()
    optimize_s = time.perf_counter() - t0
    queries = corpus.queries
    result: dict[str, Any] = {
        "counts": counts,
        "total": store.counts(),
        "fill_s": fill_s,
        "optimize_s": optimize_s,
        "ann": _lance.has_vector_index(store._table("memories")),
    }
    floors = floor_queries(store, corpus)

    def recall(mode: Mode, persona: str = PERSONA) -> Callable[[str], object]:
        return lambda q: store.recall(persona, query=q, mode=mode, limit=LIMIT)

    searches: dict[str, Callable[[str], object]] = {"hybrid": recall("hybrid")}
    if detail:
        searches |= {"vector": recall("vector"), "fts": recall("fts")}
    result |= interleaved({**searches, **floors}, queries)
    ends: dict[str, Callable[[str], object]] = {}
    for name, model in local.items():

        def live(q: str, model: Embedder = model) -> object:
            embedder.live = model
            try:
                return store.recall(PERSONA, query=q, limit=LIMIT)
            finally:
                embedder.live = None

        ends[f"e2e {name}"] = live
        ends[f"embed {name}"] = lambda q, model=model: model.embed([q])  # type: ignore[misc]
    ends["floor vector, e2e"] = floors["floor vector"]
    result |= interleaved(ends, queries)
    if detail:
        result["no knowledge"] = over_queries(recall("hybrid", NO_KNOWLEDGE), queries)
        result["legs"] = leg_timings(store, corpus, queries)
        if result["ann"]:
            result["agreement"] = ann_agreement(store, corpus, queries[:100])
    return result


def bench_ingest(minilm: Embedder, corpus: Corpus, pages: int, tmp: Path) -> dict[str, Any]:
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


def bench_quality(minilm: Embedder, tmp: Path) -> dict[str, float]:
    counter = itertools.count()
    return recall_eval.evaluate(
        lambda: MemoryStore(str(tmp / f"eval-{next(counter)}"), minilm), k=5
    )


def bench_actor(tmp: Path) -> dict[str, Any]:
    import ray

    from coterie.actors.memory import get_or_create_memory_store

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


def _plain(query: str) -> bool:
    return not fusion.has_identifier(query)


def _label(size: int) -> str:
    return f"{size // 1000}k" if size % 1000 == 0 else f"{size:,}"


def _store_notes(r: dict[str, Any]) -> str:
    index = "none (exact kNN)"
    if r["ann"]:
        index = "IVF_SQ (ANN" + (
            "; vector top-8 / top-50 = {:.1%} / {:.1%} of exact kNN's)".format(*r["agreement"])
            if "agreement" in r
            else ")"
        )
    return (
        f"{r['counts']['memories']:,} memories + {r['counts']['knowledge']} chunks of "
        f"{r['total']['memories']:,} + {r['total']['knowledge']:,} rows; fill "
        f"{r['fill_s']:.0f} s, optimize {r['optimize_s']:.1f} s; vector index: {index}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--memories",
        type=int,
        default=100_000,
        help="the persona's memories at the largest size; the other size is a tenth of it",
    )
    parser.add_argument("--sizes", help="comma-separated sizes instead, e.g. 10000,100000")
    parser.add_argument("--queries", type=int, default=200)
    parser.add_argument("--others", type=float, default=0.5, help="other personas' rows / size")
    parser.add_argument("--pages", type=int, default=30, help="pages of the ingested document")
    parser.add_argument("--no-actor", action="store_true", help="skip the Ray actor section")
    args = parser.parse_args()
    if args.sizes:
        sizes = sorted({int(s) for s in args.sizes.split(",")})
    else:
        sizes = sorted({max(1, args.memories // 10), args.memories})
    largest = max(sizes)
    console = Console(width=int(os.environ.get("COLUMNS", "220")))
    started, load_start = time.perf_counter(), os.getloadavg()

    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        with console.status("loading the local embedders, embedding fragments and queries"):
            local = local_embedders()
            default_name, default = next(iter(local.items()))
            corpus = Corpus(default, random.Random(SEED), args.queries)
        by_size = {}
        for size in sizes:
            with console.status(f"{size:,} memories: fill, optimize, query"):
                by_size[size] = bench_size(local, corpus, size, args, tmp, detail=size == largest)
        with console.status("ingest"):
            ingest = bench_ingest(default, corpus, args.pages, tmp)
        with console.status("recall@5"):
            quality = bench_quality(default, tmp)
        actor = None
        if not args.no_actor:
            with console.status("MemoryStore actor on Ray"):
                actor = bench_actor(tmp)
    load_end = os.getloadavg()

    plain = sum(map(_plain, corpus.queries))
    table = Table(
        title=(
            f"MemoryStore recall, top {LIMIT}: {len(corpus.queries)} queries per timed row "
            f"({plain} plain, {len(corpus.queries) - plain} with an identifier-like token); "
            f"persona '{PERSONA}' + {args.others:g}x as many rows of {OTHER_PERSONAS} others"
        )
    )
    for column, justify in [
        ("measurement", "left"),
        ("what is timed", "left"),
        ("n", "right"),
        ("p50 ms", "right"),
        ("p95 ms", "right"),
        ("CPU ms/q", "right"),
        ("LanceDB floor p50 ms", "right"),
        ("ratio", "right"),
        ("target p50", "left"),
        ("notes", "left"),
    ]:
        table.add_column(column, justify=justify)  # type: ignore[arg-type]

    def row(
        name: str,
        what: str,
        samples: Samples | None = None,
        *,
        floor: Samples | None = None,
        floor_name: str = "",
        target: float | None = None,
        notes: str = "",
    ) -> None:
        if samples is None:
            table.add_row(name, what, "", "", "", "", "", "", "", notes)
            return
        if not samples.wall:
            return  # e.g. no identifier queries among a few
        floor_cell = ratio = goal = ""
        if floor is not None:
            floor_cell = f"{floor.p50:.2f} {floor_name}"
            ratio = f"{samples.p50 / floor.p50:.2f}x"
        if target is not None:
            goal = f"<= {target:g} ms: {'MET' if samples.p50 <= target else 'NOT met'}"
        table.add_row(
            name,
            what,
            str(len(samples.wall)),
            f"{samples.p50:.2f}",
            f"{samples.pct(0.95):.2f}",
            f"{samples.cpu_per_call:.1f}",
            floor_cell,
            ratio,
            goal,
            notes,
        )

    big, big_label = by_size[largest], _label(largest)
    for name in local:
        row(
            f"embed one query: {name}",
            "(b) the model alone, one thread",
            big[f"embed {name}"],
            notes="the runtime's default embedder" if name == default_name else "",
        )
    for size in sizes:
        r, label, last = by_size[size], _label(size), size == largest
        vector_floor, fts_floor = r["floor vector"], r["floor fts"]
        row(
            f"hybrid @ {label}",
            "(a) recall(), embedding given",
            r["hybrid"],
            floor=vector_floor,
            floor_name="bare vector",
            target=SEARCH_TARGET_MS if last else None,
            notes=_store_notes(r),
        )
        row(
            "  plain queries",
            "(a) vector leg only",
            r["hybrid"].where(_plain),
            floor=vector_floor.where(_plain),
            floor_name="bare vector",
        )
        row(
            "  identifier queries",
            "(a) both legs",
            r["hybrid"].where(fusion.has_identifier),
            floor=vector_floor.where(fusion.has_identifier).plus(
                fts_floor.where(fusion.has_identifier)
            ),
            floor_name="bare vector + bare FTS",
        )
        for name in local:
            row(
                f"hybrid @ {label} end to end",
                f"(c) recall(), live {name}",
                r[f"e2e {name}"],
                floor=r[f"embed {name}"].plus(r["floor vector, e2e"]),
                floor_name="embed + bare vector",
                target=E2E_TARGET_MS if last else None,
                notes="the runtime's default embedder" if name == default_name else "",
            )
    row(
        f"vector @ {big_label}",
        "(a) recall(mode='vector')",
        big["vector"],
        floor=big["floor vector"],
        floor_name="bare vector",
    )
    row(
        f"fts @ {big_label}",
        "(a) recall(mode='fts')",
        big["fts"],
        floor=big["floor fts"],
        floor_name="bare FTS",
    )
    row(
        f"hybrid @ {big_label}, no knowledge",
        "(a) recall() for a persona without chunks",
        big["no knowledge"],
        notes=f"'{NO_KNOWLEDGE}': {int(largest * args.others) // OTHER_PERSONAS:,} memories, "
        "no knowledge chunks",
    )
    for leg, samples in big["legs"].items():
        row(f"  search @ {big_label}: {leg}", "LanceDB search(es) of recall, no fusion", samples)
    rates = ingest["rate"]
    row(
        "ingest throughput",
        f"ingest(): chunk + {default_name} + merge",
        notes=f"{max(rates):.1f} chunks/s best of 3 (median {statistics.median(rates):.1f}); "
        f"{ingest['chars']:,} chars (~{ingest['chars'] / 3000:.0f} pages) -> "
        f"{ingest['chunks']} chunks in {ingest['best_s']:.1f} s",
    )
    row(
        f"recall@5, {default_name}",
        "tests/recall/recall_eval.py",
        notes="  ".join(f"{mode} {quality[mode]:.3f}" for mode in recall_eval.MODES)
        + f"  ({len(recall_eval.MEMORIES)} memories, {len(recall_eval.QUERIES)} queries)",
    )
    if actor is not None:
        row(
            "MemoryStore actor memory",
            "USS of the actor process",
            notes=f"USS {actor['uss']:.0f} MiB (RSS {actor['rss']:.0f} MiB) with "
            f"{actor['embedder']} loaded, after {actor['rows']['memories']} writes and a recall",
        )
    console.print(table)

    def load(avg: Iterable[float]) -> str:
        return "/".join(f"{x:.1f}" for x in avg)

    from importlib.metadata import version

    console.print(
        f"(a) excludes the model, (b) is the model alone, (c) is measured whole. Floors: LanceDB "
        f"{version('lancedb')}'s bare query on the memories table, same persona filter, top "
        f"{LIMIT}, interleaved with ours query by query; ratio = our p50 / the floor's. CPU "
        f"ms/q: this process's CPU time per call, all threads (LanceDB's included). Machine: "
        f"{os.cpu_count()} cores ({len(os.sched_getaffinity(0))} usable), load average "
        f"(1/5/15 min) {load(load_start)} at the start, {load(load_end)} at the end (shared "
        f"machine); run took {time.perf_counter() - started:.0f} s. Memories are composed from "
        f"{corpus.fragments} MiniLM-embedded fragments (module doc)."
    )


if __name__ == "__main__":
    main()
