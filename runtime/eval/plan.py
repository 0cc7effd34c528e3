"""Planning a run: the task with the command line's overrides, its samples,
who answers and who grades, the run's record; or the same rebuilt from the
store to resume a run.

A run's record keeps the task as it ran (``task_json``: the task and the
options that changed it), so ``--resume RUN_ID`` runs the very same task —
the dataset is read again (its samples are inputs), finished results are not.
A run with a spending cap (``max_cost``) is refused before it is recorded
when the solver's or a grader's model has no price.
"""

from __future__ import annotations

import json
import secrets
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field, ValidationError

from coterie.runtime.config import load_persona, load_settings
from coterie.runtime.errors import ConfigError
from coterie.runtime.eval.budget import check_priced
from coterie.runtime.eval.dataset import load_samples
from coterie.runtime.eval.records import RunRecord
from coterie.runtime.eval.runner import model_label, parse_model_option, resolve_solver
from coterie.runtime.eval.scorers import Scorer, build_scorers, grader_of, needs_grader
from coterie.runtime.eval.store import EvalStore
from coterie.runtime.eval.task import EvalTask, Sample, TaskFileError, load_task
from coterie.runtime.eval.worker import SolverSetup
from coterie.runtime.plugins import Plugins, plugins_for
from coterie.runtime.plugins.refs import discover
from coterie.runtime.usage.prices import PriceTable

SOLVER = "solver"


class RunOptions(BaseModel):
    """What ``coterie eval`` may change about a task."""

    persona: str | None = None
    model: str | None = None
    limit: int | None = None
    epochs: int | None = None
    max_samples: int | None = None
    max_connections: int | None = None
    # US dollars the whole run may spend (its earlier passes included).
    max_cost: float | None = Field(default=None, gt=0)


@dataclass
class RunPlan:
    task: EvalTask
    samples: list[Sample]
    run: RunRecord
    solvers: dict[str, SolverSetup]
    # scorer name -> the key in ``solvers`` of its grader
    graders: dict[str, str]
    scorers: list[Scorer]
    options: RunOptions
    resumed: bool = False
    # Tags the conversations of a resumed run's attempts (see SampleJob.pass_tag).
    pass_tag: str = ""


def new_run_id() -> str:
    return f"run_{datetime.now(UTC).strftime('%Y%m%d_%H%M%S')}_{secrets.token_hex(2)}"


def _apply(task: EvalTask, options: RunOptions, where: str) -> EvalTask:
    changes: dict[str, Any] = {
        k: v
        for k, v in {
            "epochs": options.epochs,
            "max_samples": options.max_samples,
            "max_connections": options.max_connections,
        }.items()
        if v is not None
    }
    if not changes:
        return task
    try:
        changed = EvalTask.model_validate(task.model_dump() | changes)
    except ValidationError as exc:
        err = exc.errors()[0]
        loc = ".".join(str(p) for p in err["loc"]) or "task"
        raise ConfigError(f"{where}: {loc}: {err['msg']}") from None
    changed = changed.model_copy(update={"base_dir": task.base_dir})
    changed._source = task._source  # errors keep naming the task file
    return changed


def _solvers(
    task: EvalTask, scorers: list[Scorer], home: Path, options: RunOptions
) -> tuple[dict[str, SolverSetup], dict[str, str]]:
    model = parse_model_option(options.model) if options.model else None
    solver = resolve_solver(task, home, persona=options.persona, model=model)
    solvers = {SOLVER: solver}
    graders: dict[str, str] = {}
    for spec, scorer in zip(task.scorers, scorers, strict=True):
        if not needs_grader(spec):
            continue
        name = scorer.name
        grader = grader_of(spec)
        if grader is None:
            graders[name] = SOLVER
            continue
        key = f"grader:{grader}"
        if key not in solvers:
            loaded = load_persona(home, grader)
            solvers[key] = SolverSetup(
                name=loaded.name,
                config=loaded.config,
                soul=loaded.soul,
                persona_dir=str(loaded.path),
            )
        graders[name] = key
    return solvers, graders


def _plugins(home: Path) -> Plugins:
    """The home's plugins, loaded here: their scorers and dataset loaders run
    in the process that runs the eval."""
    return plugins_for(discover(home, load_settings(home).plugins).refs, taken=[])


def _functions(table: dict[str, tuple[Callable[..., Any], str]]) -> dict[str, Callable[..., Any]]:
    return {name: fn for name, (fn, _) in table.items()}


def plan_run(
    task_path: str | Path,
    home: Path,
    store: EvalStore,
    options: RunOptions,
    *,
    run_id: str | None = None,
    plugins: Plugins | None = None,
) -> RunPlan:
    """A new run of the task file (recorded in ``store``); ``plugins``: the
    home's, when this process loaded them already (a runtime did)."""
    path = Path(task_path)
    if plugins is None:  # first: the task may name a plugin's model provider
        plugins = _plugins(home)
    task = _apply(load_task(path), options, str(path))
    samples = load_samples(task, limit=options.limit, loaders=_functions(plugins.datasets))
    if not samples:
        raise TaskFileError(str(path), ["dataset: it has no samples"])
    scorers = build_scorers(task, _functions(plugins.scorers))
    solvers, graders = _solvers(task, scorers, home, options)
    if options.max_cost is not None:
        check_priced(solvers, PriceTable.from_settings(load_settings(home).prices))
    run = RunRecord(
        run_id=run_id or new_run_id(),
        task=task.name,
        task_path=str(path.resolve()),
        task_json=json.dumps(
            {"task": task.model_dump(mode="json"), "options": options.model_dump(mode="json")}
        ),
        persona=solvers[SOLVER].name,
        model=model_label(solvers[SOLVER]),
        epochs=task.epochs,
        reducers=list(task.reducers),
        scorers=[s.name for s in scorers],
        samples=len(samples),
        created_at=datetime.now(UTC),
    )
    store.create_run(run)
    return RunPlan(task, samples, run, solvers, graders, scorers, options)


def plan_resume(
    run_id: str, home: Path, store: EvalStore, *, max_cost: float | None = None
) -> RunPlan:
    """The recorded run ``run_id``, to run what it has not finished;
    ``max_cost`` replaces the run's cap (the one it was started with)."""
    run = store.get_run(run_id)
    if run is None:
        raise ConfigError(f"no eval run {run_id!r} in {store.path}")
    saved = json.loads(run.task_json)
    plugins = _plugins(home)  # first: the task may name a plugin's model provider
    task = EvalTask.model_validate(saved["task"])
    if run.task_path:
        task = task.model_copy(update={"base_dir": Path(run.task_path).parent})
        task._source = Path(run.task_path)
    options = RunOptions.model_validate(saved.get("options", {}))
    if max_cost is not None:
        options = options.model_copy(update={"max_cost": max_cost})
    samples = load_samples(task, limit=options.limit, loaders=_functions(plugins.datasets))
    scorers = build_scorers(task, _functions(plugins.scorers))
    solvers, graders = _solvers(task, scorers, home, options)
    if options.max_cost is not None:
        check_priced(solvers, PriceTable.from_settings(load_settings(home).prices))
    store.set_status(run_id, "running")
    return RunPlan(
        task,
        samples,
        run,
        solvers,
        graders,
        scorers,
        options,
        resumed=True,
        pass_tag=f"r{secrets.token_hex(2)}",
    )


__all__ = ["SOLVER", "RunOptions", "RunPlan", "new_run_id", "plan_resume", "plan_run"]
