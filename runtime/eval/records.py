"""The records of ``coterie eval``: runs, per-sample results, scores and reports.

Plain pydantic models (no DuckDB): the driver makes them, :mod:`runtime.eval.store`
writes and reads them, the CLI prints the reports.

Every timestamp is held as an aware UTC ``datetime``: a naive one is taken to
be UTC already, an aware one is converted. The store keeps them in ``TIMESTAMP``
columns as UTC, so what goes in comes back equal.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, model_validator

#: How one sample (of one epoch) ended. ``limit``: a per-sample limit ended it
#: early; its output so far is still scored. ``error``: it failed and is not
#: scored (a resumed run tries it again).
SampleStatus = Literal["ok", "limit", "error"]

#: Where a run stands. ``interrupted``: stopped before every sample ran (Ctrl-C,
#: a lost driver); ``coterie eval --resume`` continues it.
RunStatus = Literal["running", "finished", "interrupted", "failed"]


def _to_utc(value: datetime) -> datetime:
    if value.tzinfo is None:
        return value.replace(tzinfo=UTC)
    return value.astimezone(UTC)


#: A datetime normalized to aware UTC (naive values are taken as UTC).
UTCDateTime = Annotated[datetime, AfterValidator(_to_utc)]


class _Record(BaseModel):
    model_config = ConfigDict(extra="forbid")


class ScoreValue(_Record):
    """One scorer's verdict on one sample of one epoch."""

    scorer: str
    value: float
    # What the scorer took as the answer (e.g. the extracted choice), if any.
    answer: str | None = None
    explanation: str = ""


class RunRecord(_Record):
    """One ``coterie eval`` run: what was evaluated, how, and where it stands."""

    run_id: str
    task: str
    task_path: str | None = None
    task_json: str = Field(description="The task definition as JSON.")
    persona: str
    model: str | None = Field(default=None, description="Model label (provider:name) if known.")
    epochs: int = Field(ge=1)
    reducers: list[str]
    scorers: list[str]
    samples: int = Field(ge=0, description="Samples planned (before epochs).")
    status: RunStatus = "running"
    created_at: UTCDateTime
    ended_at: UTCDateTime | None = None


class SampleResult(_Record):
    """The result of one sample in one epoch (epochs numbered from 1).

    The transcript is not copied here: it is the audit log's events of
    ``persona`` / ``conversation_id``.
    """

    run_id: str
    sample_id: str
    epoch: int = Field(ge=1)
    input: str
    target: str | list[str]
    output: str = ""
    status: SampleStatus
    error: str | None = None
    limit: str | None = Field(
        default=None, description="Which limit ended it: time/model_calls/tokens/tool_calls."
    )
    scores: list[ScoreValue] = []
    started_at: UTCDateTime
    ended_at: UTCDateTime
    duration_ms: float
    model_calls: int = 0
    tool_calls: int = 0
    input_tokens: int = 0
    output_tokens: int = 0
    attempts: int = 1
    persona: str
    conversation_id: str
    node: str | None = Field(default=None, description="Ray node id it ran on.")
    metadata: dict[str, Any] = {}

    @model_validator(mode="after")
    def _one_score_per_scorer(self) -> SampleResult:
        names = [s.scorer for s in self.scores]
        if len(names) != len(set(names)):
            dupes = sorted({n for n in names if names.count(n) > 1})
            raise ValueError(f"more than one score for scorer(s) {', '.join(dupes)}")
        return self


class ScorerSummary(_Record):
    """One scorer under one reducer: the mean over samples with its 95% CI.

    ``group`` is the value of the ``--by`` field this summary covers, ``None``
    for the whole run; ``n`` counts samples (each reduced over its epochs).
    """

    scorer: str
    reducer: str
    group: str | None = None
    n: int
    mean: float
    ci_low: float
    ci_high: float
    stderr: float


class RunReport(_Record):
    """What ``coterie eval report`` shows for one run."""

    run: RunRecord
    counts: dict[str, int] = Field(description="Sample rows (samples x epochs) by status.")
    summaries: list[ScorerSummary]
    by: str | None = None


class PairedDiff(_Record):
    """Run b against run a on one scorer and reducer, over the samples both scored.

    ``diff`` is ``mean_b - mean_a`` with the CI of the paired differences.
    Flips count samples right in one run and not the other: a reduced value is
    right when it is >= 1.0 for a binary scorer (every raw value 0 or 1), and
    >= 0.5 otherwise.
    """

    scorer: str
    reducer: str
    n: int
    mean_a: float
    mean_b: float
    diff: float
    ci_low: float
    ci_high: float
    a_only_right: int
    b_only_right: int


class CompareReport(_Record):
    """What ``coterie eval compare A B`` shows.

    ``only_in_a`` / ``only_in_b`` count sample ids with a row in one run and
    none in the other.
    """

    run_a: str
    run_b: str
    diffs: list[PairedDiff]
    only_in_a: int
    only_in_b: int


__all__ = [
    "CompareReport",
    "PairedDiff",
    "RunRecord",
    "RunReport",
    "RunStatus",
    "SampleResult",
    "SampleStatus",
    "ScoreValue",
    "ScorerSummary",
    "UTCDateTime",
]
