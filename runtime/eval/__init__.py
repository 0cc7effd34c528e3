"""Batch evaluation of agents (``coterie eval``).

A task (:mod:`~runtime.eval.task`: dataset × solver persona × scorers, with
epochs, reducers and per-sample limits) is planned into a run
(:mod:`~runtime.eval.plan`), whose samples an :class:`EvalRunner` keeps in
flight through a sliding window (:mod:`~runtime.eval.runner`); each sample
runs in a fresh persona and conversation on a :class:`SampleWorker`
(:mod:`~runtime.eval.worker`, on Ray one per worker actor), under its limits
(:mod:`~runtime.eval.limits`); the results go, as they finish, to DuckDB
(:mod:`~runtime.eval.store`), where reports and paired comparisons
(:mod:`~runtime.eval.stats`) are computed.
"""

from coterie.runtime.eval.dataset import import_function, load_samples
from coterie.runtime.eval.limits import AdaptiveGate, LimitedModel, SampleLimitReached
from coterie.runtime.eval.plan import RunOptions, RunPlan, new_run_id, plan_resume, plan_run
from coterie.runtime.eval.records import (
    CompareReport,
    PairedDiff,
    RunRecord,
    RunReport,
    SampleResult,
    ScorerSummary,
    ScoreValue,
)
from coterie.runtime.eval.runner import (
    EvalRunner,
    Executor,
    LocalExecutor,
    Progress,
    resolve_solver,
)
from coterie.runtime.eval.scorers import Score, Scorer, ScorerError, build_scorers
from coterie.runtime.eval.store import EvalStore, EvalStoreError, open_store
from coterie.runtime.eval.task import EvalTask, Sample, SampleLimits, TaskFileError, load_task
from coterie.runtime.eval.worker import SampleJob, SampleRun, SampleWorker, SolverSetup

__all__ = [
    "AdaptiveGate",
    "CompareReport",
    "EvalRunner",
    "EvalStore",
    "EvalStoreError",
    "EvalTask",
    "Executor",
    "LimitedModel",
    "LocalExecutor",
    "PairedDiff",
    "Progress",
    "RunOptions",
    "RunPlan",
    "RunRecord",
    "RunReport",
    "Sample",
    "SampleJob",
    "SampleLimitReached",
    "SampleLimits",
    "SampleResult",
    "SampleRun",
    "SampleWorker",
    "Score",
    "ScoreValue",
    "Scorer",
    "ScorerError",
    "ScorerSummary",
    "SolverSetup",
    "TaskFileError",
    "build_scorers",
    "import_function",
    "load_samples",
    "load_task",
    "new_run_id",
    "open_store",
    "plan_resume",
    "plan_run",
    "resolve_solver",
]
