"""The eval results store (runtime.eval.store) and its statistics (runtime.eval.stats).

Real DuckDB files in tmp_path; expected numbers are computed by hand in the
comments next to them.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import duckdb
import pytest
from pydantic import ValidationError

from coterie.runtime.eval.records import RunRecord, SampleResult, SampleStatus, ScoreValue
from coterie.runtime.eval.stats import (
    compare_scores,
    mean_ci,
    paired_diff,
    reduce_epochs,
    summarize,
    wilson_interval,
)
from coterie.runtime.eval.store import EvalStore, EvalStoreError, open_store

T0 = datetime(2025, 3, 1, 12, 0, 0, 123456, tzinfo=UTC)
Z = 1.959963984540054


def make_run(run_id: str = "run1", **kw: Any) -> RunRecord:
    fields: dict[str, Any] = {
        "run_id": run_id,
        "task": "arith",
        "task_path": "/tasks/arith.yaml",
        "task_json": json.dumps({"name": "arith", "samples": 4}),
        "persona": "solver",
        "model": "openai:gpt-test",
        "epochs": 1,
        "reducers": ["mean"],
        "scorers": ["match"],
        "samples": 4,
        "created_at": T0,
    }
    fields.update(kw)
    return RunRecord(**fields)


def make_sample(
    sample_id: str,
    scores: dict[str, float] | None = None,
    *,
    run_id: str = "run1",
    epoch: int = 1,
    status: SampleStatus = "ok",
    **kw: Any,
) -> SampleResult:
    fields: dict[str, Any] = {
        "run_id": run_id,
        "sample_id": sample_id,
        "epoch": epoch,
        "input": f"question {sample_id}",
        "target": "42",
        "output": f"answer {sample_id}",
        "status": status,
        "scores": [ScoreValue(scorer=k, value=v) for k, v in (scores or {}).items()],
        "started_at": T0,
        "ended_at": T0 + timedelta(seconds=2),
        "duration_ms": 2000.0,
        "persona": "solver",
        "conversation_id": f"conv-{sample_id}-{epoch}",
    }
    fields.update(kw)
    return SampleResult(**fields)


@pytest.fixture
def store(tmp_path: Path) -> Any:
    with EvalStore(tmp_path / "evals.duckdb") as s:
        s.create_run(make_run())
        yield s


def sql(s: EvalStore, query: str, params: Sequence[object] = ()) -> list[tuple[Any, ...]]:
    return s._fetchall(query, params)


# -- runs -------------------------------------------------------------------


def test_create_and_get_run(tmp_path: Path) -> None:
    run = make_run(reducers=["mean", "pass@2"], scorers=["match", "includes"], epochs=3)
    with open_store(tmp_path) as s:
        assert s.path == str(tmp_path / "evals.duckdb")
        s.create_run(run)
        assert s.get_run("run1") == run
        assert s.get_run("nope") is None
        # Plain SQL sees natural types: JSON lists, UTC timestamps.
        row = sql(s, "SELECT reducers->>0, epochs, created_at FROM eval_runs")[0]
        assert row == ("mean", 3, T0.replace(tzinfo=None))


def test_duplicate_run_id_raises(store: EvalStore) -> None:
    with pytest.raises(EvalStoreError, match="'run1' already exists"):
        store.create_run(make_run(task="other"))
    assert store.get_run("run1") == make_run()


def test_set_status(store: EvalStore) -> None:
    end = T0 + timedelta(minutes=5)
    store.set_status("run1", "interrupted", ended_at=end)
    run = store.get_run("run1")
    assert run is not None and (run.status, run.ended_at) == ("interrupted", end)
    store.set_status("run1", "running")  # resumed: no end any more
    run = store.get_run("run1")
    assert run is not None and (run.status, run.ended_at) == ("running", None)
    with pytest.raises(EvalStoreError, match="'ghost'"):
        store.set_status("ghost", "finished")


def test_list_runs_newest_first_with_counts(store: EvalStore) -> None:
    store.create_run(make_run("run2", created_at=T0 + timedelta(hours=1)))
    store.create_run(make_run("run0", created_at=T0 - timedelta(hours=1)))
    store.write_samples(
        [
            make_sample("a", {"match": 1}),
            make_sample("b", {"match": 1}, status="limit", limit="tokens"),
            make_sample("c", status="error", error="boom"),
            make_sample("d", status="error", error="boom"),
            make_sample("a", {"match": 0}, run_id="run2"),
        ]
    )
    listed = [(run.run_id, counts) for run, counts in store.list_runs()]
    assert listed == [
        ("run2", {"ok": 1, "limit": 0, "error": 0}),
        ("run1", {"ok": 1, "limit": 1, "error": 2}),
        ("run0", {"ok": 0, "limit": 0, "error": 0}),
    ]


def test_timestamps_are_utc(store: EvalStore) -> None:
    plus2 = timezone(timedelta(hours=2))
    naive = datetime(2025, 3, 1, 9, 0, 0)
    sample = make_sample("a", started_at=naive, ended_at=datetime(2025, 3, 1, 13, 0, tzinfo=plus2))
    assert sample.started_at == naive.replace(tzinfo=UTC)
    assert sample.ended_at == datetime(2025, 3, 1, 11, 0, tzinfo=UTC)
    store.write_samples([sample])
    assert store.samples("run1") == [sample]
    assert sql(store, "SELECT ended_at FROM eval_samples") == [(datetime(2025, 3, 1, 11, 0),)]


# -- samples ----------------------------------------------------------------


def test_samples_round_trip(store: EvalStore) -> None:
    store.create_run(make_run("run2", scorers=["match", "includes"], epochs=2))
    written = [
        make_sample(
            "q1",
            run_id="run2",
            epoch=2,
            target=["42", "forty-two"],
            scores=[],
            status="limit",
            limit="model_calls",
            model_calls=7,
            tool_calls=3,
            input_tokens=1234,
            output_tokens=56,
            attempts=2,
            node="node-abc",
            metadata={"level": "hard", "tags": ["x", 1], "nested": {"ok": True}},
        ).model_copy(
            update={
                # declared order, not alphabetical
                "scores": [
                    ScoreValue(scorer="match", value=0.0, answer="41", explanation="off by one"),
                    ScoreValue(scorer="includes", value=1.0),
                ]
            }
        ),
        make_sample("q1", {"match": 1.0}, run_id="run2", epoch=1, output="é ✓ \n multi"),
        make_sample("q0", run_id="run2", status="error", error="ModelHTTPError: 500"),
    ]
    store.write_samples(written)
    got = store.samples("run2")
    assert got == sorted(written, key=lambda r: (r.sample_id, r.epoch))
    assert store.samples("run2", status="limit") == [written[0]]
    assert store.samples("run2", status="error") == [written[2]]
    assert store.samples("run1") == []
    with pytest.raises(EvalStoreError, match="'ghost'"):
        store.samples("ghost")


def test_duplicate_scorer_in_one_sample_is_refused() -> None:
    with pytest.raises(ValidationError, match="more than one score for scorer"):
        SampleResult.model_validate(
            make_sample("a").model_dump()
            | {"scores": [{"scorer": "m", "value": 1}, {"scorer": "m", "value": 0}]}
        )


def test_upsert_replaces_error_row_and_scores(store: EvalStore) -> None:
    store.write_samples([make_sample("a", {"match": 0.0}, status="error", error="timeout")])
    retried = make_sample("a", {"match": 1.0}, attempts=2)
    store.write_samples([retried])
    assert store.samples("run1") == [retried]
    # A rewrite with fewer scorers drops the stale score rows.
    store.write_samples([make_sample("a", {"match": 1.0, "extra": 0.5})])
    final = make_sample("a", {"match": 0.0})
    store.write_samples([final])
    assert store.samples("run1") == [final]
    assert sql(store, "SELECT count(*) FROM eval_scores") == [(1,)]
    # Within one call, the last result of a key wins.
    store.write_samples([make_sample("b", {"match": 0.0}), make_sample("b", {"match": 1.0})])
    assert [s.scores[0].value for s in store.samples("run1")] == [0.0, 1.0]


def test_write_to_unknown_run_writes_nothing(store: EvalStore) -> None:
    with pytest.raises(EvalStoreError, match="'ghost'"):
        store.write_samples([make_sample("a"), make_sample("b", run_id="ghost")])
    assert sql(store, "SELECT count(*) FROM eval_samples") == [(0,)]


def test_write_100_samples_quickly(store: EvalStore) -> None:
    results = [make_sample(f"s{i:03}", {"match": i % 2, "other": 0.5}) for i in range(100)]
    start = time.perf_counter()
    store.write_samples(results)
    elapsed = time.perf_counter() - start
    assert len(store.samples("run1")) == 100
    assert elapsed < 1.0, f"writing 100 results took {elapsed:.2f}s"


def test_finished_returns_only_ok_and_limit(store: EvalStore) -> None:
    store.create_run(make_run("run2"))
    store.write_samples(
        [
            make_sample("a", epoch=1),
            make_sample("a", epoch=2, status="limit", limit="time"),
            make_sample("a", epoch=3, status="error", error="x"),
            make_sample("b", epoch=1, status="error", error="x"),
            make_sample("c", run_id="run2"),
        ]
    )
    assert store.finished("run1") == {("a", 1), ("a", 2)}
    assert store.finished("ghost") == set()


class RecordingStore(EvalStore):
    """Keeps every statement the store runs."""

    def __init__(self, path: Path) -> None:
        super().__init__(path)
        self.statements: list[tuple[str, list[object]]] = []

    def _fetchall(self, sql: str, params: Sequence[object] = ()) -> list[tuple[Any, ...]]:
        self.statements.append((sql, list(params)))
        return super()._fetchall(sql, params)


def columns_read(s: EvalStore, statement: str, params: Sequence[object]) -> set[str]:
    """The columns of eval_samples the query plan of ``statement`` scans."""
    (plan,) = EvalStore._fetchall(s, f"EXPLAIN (FORMAT JSON) {statement}", params)
    read: set[str] = set()
    scans = 0

    def walk(node: dict[str, Any]) -> None:
        nonlocal scans
        info = node.get("extra_info", {})
        if str(info.get("Table", "")).endswith("eval_samples"):
            scans += 1
            projections = info.get("Projections", [])
            read.update([projections] if isinstance(projections, str) else projections)
        for child in node.get("children", []):
            walk(child)

    for root in json.loads(plan[1]):
        walk(root)
    assert scans, f"no scan of eval_samples in the plan of {statement!r}"
    return read


def test_finished_reads_only_key_and_status_columns(tmp_path: Path) -> None:
    s = RecordingStore(tmp_path / "evals.duckdb")
    s.create_run(make_run())
    s.write_samples([make_sample("a", {"match": 1}, output="x" * 100_000)])
    s.statements.clear()
    assert s.finished("run1") == {("a", 1)}
    assert s.statements, "finished() ran no statement through _fetchall"
    for statement, params in s.statements:
        assert columns_read(s, statement, params) <= {"run_id", "sample_id", "epoch", "status"}
    # The check does catch a query that loads the outputs.
    assert "output" in columns_read(s, "SELECT * FROM eval_samples WHERE run_id = ?", ["run1"])
    s.close()


# -- reports ----------------------------------------------------------------


def test_report_three_of_four_with_wilson_ci(store: EvalStore) -> None:
    store.write_samples(
        [
            make_sample("a", {"match": 1}),
            make_sample("b", {"match": 1}),
            make_sample("c", {"match": 1}, status="limit", limit="tool_calls"),
            make_sample("d", {"match": 0}),
            # not scored: its stray score must not count
            make_sample("e", {"match": 0}, status="error", error="crash"),
        ]
    )
    report = store.report("run1")
    assert report.counts == {"ok": 3, "limit": 1, "error": 1}
    assert report.run == make_run() and report.by is None
    (summary,) = report.summaries
    assert (summary.scorer, summary.reducer, summary.group, summary.n) == ("match", "mean", None, 4)
    assert summary.mean == 0.75
    # Wilson, p=3/4, n=4, z=1.96: center 0.62752, half-width 0.32689.
    assert summary.ci_low == pytest.approx(0.3006, abs=1e-4)
    assert summary.ci_high == pytest.approx(0.9544, abs=1e-4)
    # sample sd of (1,1,1,0) is 0.5; / sqrt(4)
    assert summary.stderr == pytest.approx(0.25)


def test_report_reduces_epochs_with_mean_and_pass_at_k(tmp_path: Path) -> None:
    epochs = {"s1": [1, 0, 0], "s2": [1, 1, 0], "s3": [0, 0, 0]}
    with EvalStore(tmp_path / "e.duckdb") as s:
        s.create_run(make_run(epochs=3, reducers=["mean", "pass@2"]))
        s.write_samples(
            [
                make_sample(sid, {"match": v}, epoch=e)
                for sid, values in epochs.items()
                for e, v in enumerate(values, start=1)
            ]
            # an errored epoch does not count toward its sample
            + [make_sample("s3", {"match": 1}, epoch=4, status="error", error="x")]
        )
        mean, pass2 = s.report("run1").summaries
    # mean per sample: 1/3, 2/3, 0 -> mean 1/3; sd 1/3, stderr (1/3)/sqrt(3)
    assert (mean.reducer, mean.n) == ("mean", 3)
    assert mean.mean == pytest.approx(1 / 3)
    assert mean.stderr == pytest.approx(1 / 3 / math.sqrt(3))
    assert mean.ci_low == pytest.approx(1 / 3 - Z * 0.19245009, abs=1e-7)
    assert mean.ci_high == pytest.approx(1 / 3 + Z * 0.19245009, abs=1e-7)
    # pass@2, n=3: s1 (c=1) 1 - C(2,2)/C(3,2) = 2/3; s2 (c=2) 1 - 0 = 1; s3 (c=0) 0
    assert pass2.reducer == "pass@2"
    assert pass2.mean == pytest.approx((2 / 3 + 1 + 0) / 3)


def test_reduce_epochs() -> None:
    values = [0.0, 1.0, 0.5, 1.0]
    assert reduce_epochs("mean", values) == 0.625
    assert reduce_epochs("max", values) == 1.0
    assert reduce_epochs("min", values) == 0.0
    assert reduce_epochs("median", values) == 0.75
    assert reduce_epochs("mode", values) == 1.0
    assert reduce_epochs("mode", [0.5, 0.0, 0.0, 0.5]) == 0.5  # a tie: the earliest
    # n=4, c=2, k=3: 1 - C(2,3)/C(4,3) = 1; k=1: 1 - C(2,1)/C(4,1) = 1/2
    assert reduce_epochs("pass@3", values) == 1.0
    assert reduce_epochs("pass@1", values) == 0.5
    assert reduce_epochs("pass@5", [0.0, 1.0]) == 1.0  # fewer epochs than k: k = n
    assert reduce_epochs("pass@5", [0.0, 0.0]) == 0.0
    for bad in ("average", "pass@0", "pass@x"):
        with pytest.raises(ValueError, match="unknown reducer"):
            reduce_epochs(bad, values)
    with pytest.raises(ValueError):
        reduce_epochs("mean", [])


def test_report_by_metadata_field(store: EvalStore) -> None:
    store.write_samples(
        [
            make_sample("a", {"match": 1}, metadata={"level": "easy"}),
            make_sample("b", {"match": 1}, metadata={"level": "easy"}),
            make_sample("c", {"match": 0}, metadata={"level": "hard"}),
            make_sample("d", {"match": 1}, metadata={"level": 2}),
            make_sample("e", {"match": 0}, metadata={}),
        ]
    )
    report = store.report("run1", by="level")
    assert report.by == "level"
    got = [(s.group, s.n, s.mean) for s in report.summaries]
    assert got == [
        (None, 5, 0.6),
        ("(none)", 1, 0.0),
        ("2", 1, 1.0),
        ("easy", 2, 1.0),
        ("hard", 1, 0.0),
    ]
    easy = report.summaries[3]
    low, high = wilson_interval(2, 2)
    assert (easy.ci_low, easy.ci_high) == (low, high)


def test_report_unknown_run(store: EvalStore) -> None:
    with pytest.raises(EvalStoreError, match="'ghost'"):
        store.report("ghost")


def test_report_without_scores_has_no_summaries(store: EvalStore) -> None:
    store.write_samples([make_sample("a", status="error", error="x")])
    report = store.report("run1")
    assert report.summaries == []
    assert report.counts == {"ok": 0, "limit": 0, "error": 1}


# -- compare ----------------------------------------------------------------


def test_compare_paired_diff_and_flips(tmp_path: Path) -> None:
    a_scores = {"s1": 1, "s2": 1, "s3": 0, "s4": 0, "s5": 1}
    b_scores = {"s1": 1, "s2": 0, "s3": 1, "s4": 1, "s6": 0}
    ratings_a = {"s1": 0.4, "s2": 0.6}
    ratings_b = {"s1": 0.7, "s2": 0.2}
    with EvalStore(tmp_path / "e.duckdb") as s:
        s.create_run(make_run("A", scorers=["match", "rating", "only_a"], reducers=["mean", "max"]))
        s.create_run(make_run("B", scorers=["match", "rating"], reducers=["max"]))

        def scores(sid: str, match: dict[str, int], rating: dict[str, float]) -> dict[str, float]:
            out: dict[str, float] = {"match": match[sid]}
            if sid in rating:
                out["rating"] = rating[sid]
            return out

        s.write_samples(
            [
                make_sample(sid, scores(sid, a_scores, ratings_a) | {"only_a": 1}, run_id="A")
                for sid in a_scores
            ]
            + [make_sample(sid, scores(sid, b_scores, ratings_b), run_id="B") for sid in b_scores]
            # errored in B: not paired, but not "only in A" either
            + [make_sample("s7", {"match": 1}, run_id="A")]
            + [make_sample("s7", run_id="B", status="error", error="x")]
        )
        report = s.compare("A", "B")
    assert (report.run_a, report.run_b) == ("A", "B")
    assert (report.only_in_a, report.only_in_b) == (1, 1)  # s5 / s6
    match, rating = report.diffs
    # shared s1..s4: a (1,1,0,0), b (1,0,1,1); the only shared reducer is max
    assert (match.scorer, match.reducer, match.n) == ("match", "max", 4)
    assert (match.mean_a, match.mean_b, match.diff) == (0.5, 0.75, 0.25)
    # differences (0,-1,1,1): sd sqrt(2.75/3) = 0.957427, stderr 0.478714
    assert match.ci_low == pytest.approx(0.25 - Z * 0.4787136, abs=1e-6)
    assert match.ci_high == pytest.approx(0.25 + Z * 0.4787136, abs=1e-6)
    assert (match.a_only_right, match.b_only_right) == (1, 2)  # s2 / s3, s4
    # not binary: right means >= 0.5; a right on s2 only, b on s1 only
    assert (rating.scorer, rating.n) == ("rating", 2)
    assert rating.diff == pytest.approx(-0.05)
    assert (rating.a_only_right, rating.b_only_right) == (1, 1)


def test_compare_falls_back_to_mean_and_needs_known_runs(tmp_path: Path) -> None:
    with EvalStore(tmp_path / "e.duckdb") as s:
        s.create_run(make_run("A", epochs=2, reducers=["max"]))
        s.create_run(make_run("B", epochs=2, reducers=["pass@1"]))
        s.write_samples(
            [make_sample("x", {"match": v}, run_id="A", epoch=e) for e, v in ((1, 1), (2, 0))]
            + [make_sample("x", {"match": 1}, run_id="B", epoch=e) for e in (1, 2)]
        )
        (diff,) = s.compare("A", "B").diffs
        with pytest.raises(EvalStoreError, match="'ghost'"):
            s.compare("A", "ghost")
    assert (diff.reducer, diff.n, diff.mean_a, diff.mean_b) == ("mean", 1, 0.5, 1.0)
    assert (diff.diff, diff.ci_low, diff.ci_high) == (0.5, 0.5, 0.5)  # one pair: zero width
    # binary scorer: 0.5 (right in one epoch of two) is not right
    assert (diff.a_only_right, diff.b_only_right) == (0, 1)


def test_summarize_and_compare_scores_directly() -> None:
    values = {"m": {"a": [1.0], "b": [0.0]}, "z": {"a": [0.5]}}
    summaries = summarize(values, scorers=["z", "m"], reducers=["mean"])
    assert [(x.scorer, x.n, x.mean) for x in summaries] == [("z", 1, 0.5), ("m", 2, 0.5)]
    assert compare_scores(values, {"q": {"a": [1.0]}}, scorers=["m"], reducers=["mean"]) == []


# -- the file ---------------------------------------------------------------


def test_read_only_store(tmp_path: Path) -> None:
    path = tmp_path / "evals.duckdb"
    with pytest.raises(EvalStoreError, match="cannot open eval results"):
        EvalStore(path, read_only=True)
    assert not path.exists()
    with EvalStore(path) as s:
        s.create_run(make_run())
        s.write_samples([make_sample("a", {"match": 1})])
    with EvalStore(path, read_only=True) as r:
        assert r.finished("run1") == {("a", 1)}
        assert r.report("run1").summaries[0].mean == 1.0
        with pytest.raises(duckdb.Error):
            r.create_run(make_run("run2"))


def test_closed_store_raises(tmp_path: Path) -> None:
    s = EvalStore(tmp_path / "e.duckdb")
    s.close()
    s.close()  # twice is fine
    with pytest.raises(EvalStoreError, match="closed"):
        s.get_run("run1")


# -- stats ------------------------------------------------------------------


def test_mean_ci_binary_uses_wilson() -> None:
    mean, low, high, stderr = mean_ci([1, 1, 0, 1])
    assert mean == 0.75
    assert (low, high) == pytest.approx((0.3006, 0.9544), abs=1e-4)
    assert stderr == pytest.approx(0.25)
    # one right answer: p=1, n=1 -> center (1 + z²/2)/(1 + z²) = 0.60330, half 0.39670
    mean, low, high, stderr = mean_ci([1.0])
    assert (mean, stderr) == (1.0, 0.0)
    assert (low, high) == pytest.approx((0.20655, 1.0), abs=1e-5)  # low = 1/(1 + z²)
    # all wrong: the interval still has width
    mean, low, high, _ = mean_ci([0.0] * 10)
    assert mean == 0.0
    assert low == pytest.approx(0.0)
    assert high == pytest.approx(0.27753, abs=1e-5)  # z²/(n + z²) = 3.8415/13.8415


def test_mean_ci_normal() -> None:
    mean, low, high, stderr = mean_ci([1.0, 2.0, 3.0, 4.0])
    # sd sqrt(5/3) = 1.290994, stderr 0.645497
    assert mean == 2.5
    assert stderr == pytest.approx(0.6454972)
    assert (low, high) == pytest.approx((2.5 - Z * 0.6454972, 2.5 + Z * 0.6454972))
    assert mean_ci([0.3]) == (0.3, 0.3, 0.3, 0.0)
    # 90%: z = 1.6448536
    _, low, high, _ = mean_ci([1.0, 2.0, 3.0, 4.0], confidence=0.9)
    assert high - low == pytest.approx(2 * 1.6448536 * 0.6454972)
    with pytest.raises(ValueError):
        mean_ci([])
    with pytest.raises(ValueError):
        mean_ci([1.0], confidence=1.0)


def test_paired_diff() -> None:
    diff, low, high = paired_diff([1, 1, 0, 0], [1, 0, 1, 1])
    assert diff == 0.25
    assert (low, high) == pytest.approx((0.25 - Z * 0.4787136, 0.25 + Z * 0.4787136))
    assert paired_diff([0.2], [0.7]) == pytest.approx((0.5, 0.5, 0.5))
    with pytest.raises(ValueError):
        paired_diff([], [])
    with pytest.raises(ValueError):
        paired_diff([1.0], [1.0, 2.0])
