"""The results of ``coterie eval``: runs, samples and scores in one DuckDB file.

:class:`EvalStore` owns the file (by default ``<home>/evals.duckdb``, see
:func:`open_store`). One process writes it at a time (the ``coterie eval``
driver); ``coterie eval report`` and friends open it ``read_only``. Its three
tables are meant to be queried with plain SQL too; timestamps are UTC::

    eval_runs       one row per run
        run_id VARCHAR PRIMARY KEY, task VARCHAR, task_path VARCHAR,
        task_json JSON, persona VARCHAR, model VARCHAR, epochs INTEGER,
        reducers JSON (list of names), scorers JSON (list of names),
        samples INTEGER (planned, before epochs), status VARCHAR
        (running/finished/interrupted/failed), created_at TIMESTAMP,
        ended_at TIMESTAMP

    eval_samples    one row per sample and epoch (epochs from 1)
        run_id VARCHAR, sample_id VARCHAR, epoch INTEGER, input VARCHAR,
        target JSON (string or list of strings), output VARCHAR,
        status VARCHAR (ok/limit/error), error VARCHAR, "limit" VARCHAR,
        started_at TIMESTAMP, ended_at TIMESTAMP, duration_ms DOUBLE,
        model_calls INTEGER, tool_calls INTEGER, input_tokens INTEGER,
        output_tokens INTEGER, attempts INTEGER, persona VARCHAR,
        conversation_id VARCHAR, node VARCHAR, metadata JSON
        PRIMARY KEY (run_id, sample_id, epoch)

    eval_scores     one row per sample, epoch and scorer
        run_id VARCHAR, sample_id VARCHAR, epoch INTEGER, scorer VARCHAR,
        value DOUBLE, answer VARCHAR, explanation VARCHAR
        PRIMARY KEY (run_id, sample_id, epoch, scorer)

A sample's transcript is not copied: it is the audit log's events of its
``persona`` and ``conversation_id``. For example, the accuracy per run::

    SELECT run_id, avg(value) FROM eval_scores JOIN eval_samples
    USING (run_id, sample_id, epoch) WHERE status IN ('ok', 'limit')
    AND scorer = 'match' GROUP BY run_id

Errors::

    CoterieError
    └── EvalStoreError   unknown or duplicate run, unopenable file, closed store

``duckdb`` and ``pyarrow`` are imported when used, not with this module.
"""

from __future__ import annotations

import functools
import json
import uuid
from collections import defaultdict
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, get_args

from pydantic import TypeAdapter

from coterie.runtime.errors import CoterieError
from coterie.runtime.eval.records import (
    CompareReport,
    RunRecord,
    RunReport,
    RunStatus,
    SampleResult,
    SampleStatus,
    ScoreValue,
)
from coterie.runtime.eval.stats import NO_GROUP, ScoredValues, compare_scores, summarize

if TYPE_CHECKING:
    import duckdb
    import pyarrow as pa

_DDL = """
CREATE TABLE IF NOT EXISTS eval_runs (
    run_id VARCHAR PRIMARY KEY,
    task VARCHAR NOT NULL,
    task_path VARCHAR,
    task_json JSON NOT NULL,
    persona VARCHAR NOT NULL,
    model VARCHAR,
    epochs INTEGER NOT NULL,
    reducers JSON NOT NULL,
    scorers JSON NOT NULL,
    samples INTEGER NOT NULL,
    status VARCHAR NOT NULL,
    created_at TIMESTAMP NOT NULL,
    ended_at TIMESTAMP
);
CREATE TABLE IF NOT EXISTS eval_samples (
    run_id VARCHAR NOT NULL,
    sample_id VARCHAR NOT NULL,
    epoch INTEGER NOT NULL,
    input VARCHAR NOT NULL,
    target JSON NOT NULL,
    output VARCHAR NOT NULL,
    status VARCHAR NOT NULL,
    error VARCHAR,
    "limit" VARCHAR,
    started_at TIMESTAMP NOT NULL,
    ended_at TIMESTAMP NOT NULL,
    duration_ms DOUBLE NOT NULL,
    model_calls INTEGER NOT NULL,
    tool_calls INTEGER NOT NULL,
    input_tokens INTEGER NOT NULL,
    output_tokens INTEGER NOT NULL,
    attempts INTEGER NOT NULL,
    persona VARCHAR NOT NULL,
    conversation_id VARCHAR NOT NULL,
    node VARCHAR,
    metadata JSON NOT NULL,
    PRIMARY KEY (run_id, sample_id, epoch)
);
CREATE TABLE IF NOT EXISTS eval_scores (
    run_id VARCHAR NOT NULL,
    sample_id VARCHAR NOT NULL,
    epoch INTEGER NOT NULL,
    scorer VARCHAR NOT NULL,
    value DOUBLE NOT NULL,
    answer VARCHAR,
    explanation VARCHAR NOT NULL,
    PRIMARY KEY (run_id, sample_id, epoch, scorer)
);
"""

_RUN_COLUMNS = tuple(RunRecord.model_fields)
_SAMPLE_COLUMNS = tuple(c for c in SampleResult.model_fields if c != "scores")
_SCORE_FIELDS = tuple(ScoreValue.model_fields)
_SCORE_COLUMNS = ("run_id", "sample_id", "epoch", *_SCORE_FIELDS)
# Rows that were scored: a sample a limit ended is scored on its output so far.
_SCORED = "status IN ('ok', 'limit')"
_STATUSES: tuple[str, ...] = get_args(SampleStatus)
_metadata_json = TypeAdapter(dict[str, Any])


def _columns(names: Sequence[str]) -> str:
    return ", ".join(f'"{n}"' for n in names)  # quoted: "limit" is a keyword


@functools.cache
def _sample_schema() -> pa.Schema:
    import pyarrow as pa

    types = {"epoch": pa.int32(), "duration_ms": pa.float64()}
    for name in ("model_calls", "tool_calls", "input_tokens", "output_tokens", "attempts"):
        types[name] = pa.int32()
    for name in ("started_at", "ended_at"):
        types[name] = pa.timestamp("us")
    return pa.schema([(c, types.get(c, pa.string())) for c in _SAMPLE_COLUMNS])


@functools.cache
def _score_schema() -> pa.Schema:
    import pyarrow as pa

    types = {"epoch": pa.int32(), "value": pa.float64()}
    return pa.schema([(c, types.get(c, pa.string())) for c in _SCORE_COLUMNS])


class EvalStoreError(CoterieError):
    """The eval store cannot do what was asked: unknown or duplicate run, bad file."""


def _naive_utc(value: datetime | None) -> datetime | None:
    """TIMESTAMP columns hold naive UTC (the records hold aware UTC)."""
    return None if value is None else value.astimezone(UTC).replace(tzinfo=None)


def _group_label(value: Any) -> str:
    if value is None:
        return NO_GROUP
    return value if isinstance(value, str) else json.dumps(value)


class EvalStore:
    """The eval results: a DuckDB file (default ``<home>/evals.duckdb``).

    One writer process at a time (the ``coterie eval`` driver); readers open
    it ``read_only``. Each call uses its own cursor, so calls may come from
    worker threads (``asyncio.to_thread``).
    """

    def __init__(self, path: Path | str, *, read_only: bool = False) -> None:
        import duckdb

        self.path = str(path)
        self.read_only = read_only
        if not read_only and self.path != ":memory:":
            Path(self.path).parent.mkdir(parents=True, exist_ok=True)
        try:
            # No file access from SQL: the store reads and writes this file only.
            con = duckdb.connect(
                self.path, read_only=read_only, config={"enable_external_access": False}
            )
        except duckdb.Error as exc:
            raise EvalStoreError(f"cannot open eval results {self.path}: {exc}") from exc
        if not read_only:
            try:
                con.execute(_DDL)
            except BaseException:
                con.close()
                raise
        self._con: duckdb.DuckDBPyConnection | None = con

    def _cursor(self) -> duckdb.DuckDBPyConnection:
        if self._con is None:
            raise EvalStoreError(f"eval store {self.path} is closed")
        return self._con.cursor()

    def _fetchall(self, sql: str, params: Sequence[object] = ()) -> list[tuple[Any, ...]]:
        """Run one statement and return its rows (every read goes through here)."""
        cur = self._cursor()
        try:
            return cur.execute(sql, list(params)).fetchall()
        finally:
            cur.close()

    # -- runs ---------------------------------------------------------------

    def create_run(self, run: RunRecord) -> None:
        """Add a run; a run with the same id raises :class:`EvalStoreError`."""
        import duckdb

        row = run.model_dump()
        row["reducers"] = json.dumps(run.reducers)
        row["scorers"] = json.dumps(run.scorers)
        row["created_at"] = _naive_utc(run.created_at)
        row["ended_at"] = _naive_utc(run.ended_at)
        marks = ", ".join("?" for _ in _RUN_COLUMNS)
        try:
            self._fetchall(
                f"INSERT INTO eval_runs ({_columns(_RUN_COLUMNS)}) VALUES ({marks})",
                [row[c] for c in _RUN_COLUMNS],
            )
        except duckdb.ConstraintException as exc:
            raise EvalStoreError(f"an eval run with id {run.run_id!r} already exists") from exc

    @staticmethod
    def _run_from_row(row: tuple[Any, ...]) -> RunRecord:
        data = dict(zip(_RUN_COLUMNS, row, strict=True))
        data["reducers"] = json.loads(data["reducers"])
        data["scorers"] = json.loads(data["scorers"])
        return RunRecord.model_validate(data)

    def get_run(self, run_id: str) -> RunRecord | None:
        """The run of that id, or ``None``."""
        rows = self._fetchall(
            f"SELECT {_columns(_RUN_COLUMNS)} FROM eval_runs WHERE run_id = ?", [run_id]
        )
        return self._run_from_row(rows[0]) if rows else None

    def _require_run(self, run_id: str) -> RunRecord:
        run = self.get_run(run_id)
        if run is None:
            raise EvalStoreError(f"no eval run with id {run_id!r} in {self.path}")
        return run

    def set_status(
        self, run_id: str, status: RunStatus, *, ended_at: datetime | None = None
    ) -> None:
        """Set a run's status and ``ended_at`` (``None`` clears it, as when resuming)."""
        rows = self._fetchall(
            "UPDATE eval_runs SET status = ?, ended_at = ? WHERE run_id = ?",
            [status, _naive_utc(ended_at), run_id],
        )
        if not rows or rows[0][0] == 0:
            raise EvalStoreError(f"no eval run with id {run_id!r} in {self.path}")

    def _counts(self, run_id: str | None = None) -> dict[str, dict[str, int]]:
        where = "WHERE run_id = ?" if run_id is not None else ""
        rows = self._fetchall(
            f"SELECT run_id, status, count(*) FROM eval_samples {where} GROUP BY ALL",
            [run_id] if run_id is not None else [],
        )
        counts: dict[str, dict[str, int]] = defaultdict(lambda: dict.fromkeys(_STATUSES, 0))
        for rid, status, n in rows:
            counts[rid][status] = int(n)
        return counts

    def list_runs(self) -> list[tuple[RunRecord, dict[str, int]]]:
        """Every run, newest first, with its sample rows counted by status."""
        rows = self._fetchall(
            f"SELECT {_columns(_RUN_COLUMNS)} FROM eval_runs ORDER BY created_at DESC, run_id"
        )
        counts = self._counts()
        runs = [self._run_from_row(r) for r in rows]
        return [(run, counts[run.run_id]) for run in runs]

    # -- samples ------------------------------------------------------------

    def finished(self, run_id: str) -> set[tuple[str, int]]:
        """The ``(sample_id, epoch)`` pairs of a run that need not run again (ok or limit).

        Reads only the key and status columns: a resume must not load the
        outputs of what already ran. An unknown run has none.
        """
        rows = self._fetchall(
            f"SELECT sample_id, epoch FROM eval_samples WHERE run_id = ? AND {_SCORED}",
            [run_id],
        )
        return {(sample_id, int(epoch)) for sample_id, epoch in rows}

    def write_samples(self, results: list[SampleResult]) -> None:
        """Write results in one transaction (one Arrow batch per table).

        A result replaces the row of the same ``(run_id, sample_id, epoch)``
        and all of that row's scores (a retried sample replaces its error
        row); within one call the last result for a key wins. Every run must
        exist, else :class:`EvalStoreError` and nothing is written.
        """
        import pyarrow as pa

        if not results:
            return
        latest = {(r.run_id, r.sample_id, r.epoch): r for r in results}
        run_ids = sorted({r.run_id for r in latest.values()})
        known = {
            rid
            for (rid,) in self._fetchall(
                "SELECT run_id FROM eval_runs WHERE run_id IN (SELECT unnest(?))", [run_ids]
            )
        }
        if missing := [r for r in run_ids if r not in known]:
            raise EvalStoreError(f"no eval run with id(s) {', '.join(map(repr, missing))}")
        sample_rows: list[dict[str, Any]] = []
        score_rows: list[dict[str, Any]] = []
        for result in latest.values():
            row = result.model_dump(exclude={"scores"})
            row["target"] = json.dumps(result.target)
            row["metadata"] = _metadata_json.dump_json(result.metadata).decode()
            row["started_at"] = _naive_utc(result.started_at)
            row["ended_at"] = _naive_utc(result.ended_at)
            sample_rows.append(row)
            key = {"run_id": result.run_id, "sample_id": result.sample_id, "epoch": result.epoch}
            score_rows.extend(key | score.model_dump() for score in result.scores)
        samples = pa.Table.from_pylist(sample_rows, schema=_sample_schema())
        scores = pa.Table.from_pylist(score_rows, schema=_score_schema())
        batch = f"_eval_samples_{uuid.uuid4().hex}"
        score_batch = f"_eval_scores_{uuid.uuid4().hex}"
        same_key = "{t}.run_id = b.run_id AND {t}.sample_id = b.sample_id AND {t}.epoch = b.epoch"
        cur = self._cursor()
        try:
            cur.register(batch, samples)
            cur.register(score_batch, scores)
            cur.begin()
            try:
                for table in ("eval_scores", "eval_samples"):
                    cur.execute(
                        f"DELETE FROM {table} USING {batch} AS b WHERE {same_key.format(t=table)}"
                    )
                cur.execute(
                    f"INSERT INTO eval_samples ({_columns(_SAMPLE_COLUMNS)}) "
                    f"SELECT {_columns(_SAMPLE_COLUMNS)} FROM {batch}"
                )
                cur.execute(
                    f"INSERT INTO eval_scores ({_columns(_SCORE_COLUMNS)}) "
                    f"SELECT {_columns(_SCORE_COLUMNS)} FROM {score_batch}"
                )
                cur.commit()
            except BaseException:
                cur.rollback()
                raise
        finally:
            cur.close()

    def samples(self, run_id: str, *, status: SampleStatus | None = None) -> list[SampleResult]:
        """A run's results (optionally of one status), by sample id and epoch.

        Scores come in the order of the run's scorers. Unknown run:
        :class:`EvalStoreError`.
        """
        run = self._require_run(run_id)
        where, params = "run_id = ?", [run_id]
        if status is not None:
            where, params = where + " AND status = ?", [run_id, status]
        rows = self._fetchall(
            f"SELECT {_columns(_SAMPLE_COLUMNS)} FROM eval_samples WHERE {where} "
            "ORDER BY sample_id, epoch",
            params,
        )
        order = {name: i for i, name in enumerate(run.scorers)}
        scores: dict[tuple[str, int], list[ScoreValue]] = defaultdict(list)
        for sample_id, epoch, *score in self._fetchall(
            f"SELECT sample_id, epoch, {_columns(_SCORE_FIELDS)} FROM eval_scores "
            "WHERE run_id = ? ORDER BY scorer",
            [run_id],
        ):
            scores[(sample_id, epoch)].append(
                ScoreValue.model_validate(dict(zip(_SCORE_FIELDS, score, strict=True)))
            )
        results = []
        for row in rows:
            data = dict(zip(_SAMPLE_COLUMNS, row, strict=True))
            data["target"] = json.loads(data["target"])
            data["metadata"] = json.loads(data["metadata"])
            own = scores.get((data["sample_id"], data["epoch"]), [])
            data["scores"] = sorted(own, key=lambda s: order.get(s.scorer, len(order)))
            results.append(SampleResult.model_validate(data))
        return results

    # -- reports ------------------------------------------------------------

    def _scored_values(self, run_id: str) -> ScoredValues:
        values: ScoredValues = defaultdict(lambda: defaultdict(list))
        for scorer, sample_id, value in self._fetchall(
            "SELECT c.scorer, c.sample_id, c.value FROM eval_scores AS c JOIN eval_samples AS s "
            "ON c.run_id = s.run_id AND c.sample_id = s.sample_id AND c.epoch = s.epoch "
            f"WHERE c.run_id = ? AND s.{_SCORED} ORDER BY c.scorer, c.sample_id, c.epoch",
            [run_id],
        ):
            values[scorer][sample_id].append(float(value))
        return values

    def _groups(self, run_id: str, field: str) -> dict[str, str]:
        """sample_id -> its ``metadata[field]`` as a label (from its first scored epoch)."""
        groups: dict[str, str] = {}
        for sample_id, metadata in self._fetchall(
            f"SELECT sample_id, metadata FROM eval_samples WHERE run_id = ? AND {_SCORED} "
            "ORDER BY sample_id, epoch",
            [run_id],
        ):
            if sample_id not in groups:
                groups[sample_id] = _group_label(json.loads(metadata).get(field))
        return groups

    def report(self, run_id: str, *, by: str | None = None) -> RunReport:
        """Per scorer and reducer: each sample's scored epochs reduced to one
        value, then the mean over samples with its 95% CI.

        With ``by``, each such summary is followed by one per distinct value
        of ``metadata[by]`` (samples without it: ``"(none)"``), in sorted order.
        Unknown run (or reducer): :class:`EvalStoreError`.
        """
        run = self._require_run(run_id)
        values = self._scored_values(run_id)
        groups = self._groups(run_id, by) if by is not None else None
        try:
            summaries = summarize(
                values, scorers=run.scorers, reducers=run.reducers or ["mean"], groups=groups
            )
        except ValueError as exc:
            raise EvalStoreError(f"cannot report eval run {run_id!r}: {exc}") from exc
        counts = self._counts(run_id)[run_id]
        return RunReport(run=run, counts=counts, summaries=summaries, by=by)

    def compare(self, run_a: str, run_b: str) -> CompareReport:
        """Run b against run a, paired on the samples both scored.

        For each scorer both runs have and each reducer both share (``mean``
        if they share none): the paired difference b - a with its 95% CI and
        the flips (see :class:`PairedDiff`). Unknown run: :class:`EvalStoreError`.
        """
        a, b = self._require_run(run_a), self._require_run(run_b)
        reducers = [r for r in a.reducers if r in b.reducers] or ["mean"]
        try:
            diffs = compare_scores(
                self._scored_values(run_a),
                self._scored_values(run_b),
                scorers=a.scorers,
                reducers=reducers,
            )
        except ValueError as exc:
            raise EvalStoreError(f"cannot compare {run_a!r} and {run_b!r}: {exc}") from exc
        ids_a, ids_b = self._sample_ids(run_a), self._sample_ids(run_b)
        return CompareReport(
            run_a=run_a,
            run_b=run_b,
            diffs=diffs,
            only_in_a=len(ids_a - ids_b),
            only_in_b=len(ids_b - ids_a),
        )

    def _sample_ids(self, run_id: str) -> set[str]:
        rows = self._fetchall(
            "SELECT DISTINCT sample_id FROM eval_samples WHERE run_id = ?", [run_id]
        )
        return {sid for (sid,) in rows}

    # -- lifetime -----------------------------------------------------------

    def close(self) -> None:
        """Close the file; further calls raise :class:`EvalStoreError`."""
        if self._con is not None:
            self._con.close()
            self._con = None

    def __enter__(self) -> EvalStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def open_store(home: Path, *, read_only: bool = False) -> EvalStore:
    """The eval store of a coterie home: ``<home>/evals.duckdb``."""
    return EvalStore(home / "evals.duckdb", read_only=read_only)


__all__ = ["EvalStore", "EvalStoreError", "open_store"]
