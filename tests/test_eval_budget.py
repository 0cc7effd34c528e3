"""``coterie eval --max-cost``: a run's spending cap, kept before each model
call, with samples running at once; the run stops, is resumable, and never
starts with a model whose cost cannot be counted."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import duckdb
import pytest
import yaml

from coterie import cli
from coterie.runtime.config import ModelPrice, RuntimeSettings
from coterie.runtime.errors import BudgetExceededError, ConfigError
from coterie.runtime.eval import (
    EvalRunner,
    RunOptions,
    open_store,
    plan_resume,
    plan_run,
)
from coterie.runtime.eval.budget import RunBudget, spent_sql
from coterie.runtime.eval.plan import RunPlan
from coterie.runtime.eval.store import EvalStore
from coterie.runtime.messages import BudgetWarning, ModelCalled
from coterie.runtime.services import NullAudit
from tests.helpers import write_persona
from tests.test_eval_runner import make_runner

#: $10 per million tokens: a call of a solver's ~2,300 tokens costs ~2 cents.
DEAR = ModelPrice(input=10, output=10)
SETTINGS = RuntimeSettings(prices={"priced*": DEAR})
RUNTIME_YAML = {"prices": {"priced*": {"input": 10, "output": 10}}}


def write_task(tmp_path: Path, body: dict[str, Any], samples: int) -> Path:
    rows = [{"id": f"s{i}", "input": f"question {i}", "target": "ok"} for i in range(samples)]
    (tmp_path / "data.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    path = tmp_path / "task.yaml"
    path.write_text(
        yaml.safe_dump(
            {"name": "capped", "dataset": {"path": "data.jsonl"}, "scorers": [{"type": "includes"}]}
            | body
        )
    )
    return path


def priced_solver(**model: Any) -> dict[str, Any]:
    return {
        "inline": {
            "model": {
                "provider": "scripted",
                "name": "priced-solver",
                "max_tokens": 20,
                "default": "ok",
                **model,
            }
        }
    }


def runner(
    plan: RunPlan, store: EvalStore, tmp_path: Path, budget: RunBudget, audit: NullAudit
) -> EvalRunner:
    return make_runner(plan, store, tmp_path, audit=audit, settings=SETTINGS, budget=budget)


def costs(audit: NullAudit) -> list[float]:
    return [e.cost_usd or 0.0 for e in audit.events if isinstance(e, ModelCalled)]


@pytest.fixture
def home(tmp_path: Path) -> Path:
    path = tmp_path / "home"
    (path / "personas").mkdir(parents=True)
    (path / "runtime.yaml").write_text(yaml.safe_dump(RUNTIME_YAML))
    return path


async def test_a_capped_run_stops_inside_its_cap_and_a_resume_finishes_it(
    home: Path, tmp_path: Path
) -> None:
    # Four samples at once, each call held 50 ms: without reservations they
    # would all pass the cap together.
    task = write_task(tmp_path, {"solver": priced_solver(latency_ms=50), "max_samples": 4}, 30)
    store = open_store(home)
    plan = plan_run(task, home, store, RunOptions(max_cost=0.3))
    audit = NullAudit()
    budget = RunBudget(plan.run.run_id, 0.3)
    progress = await runner(plan, store, tmp_path, budget, audit).run()

    spent = sum(costs(audit))
    assert 0 < spent <= 0.3 and budget.spent == pytest.approx(spent)
    assert progress.stopped is not None and "budget_exceeded" in progress.stopped
    assert f"eval run '{plan.run.run_id}'" in progress.stopped
    run_id = plan.run.run_id
    assert store.get_run(run_id).status == "interrupted"  # type: ignore[union-attr]
    results = store.samples(run_id)
    # The samples the cap cut off are not results: none is an error.
    assert 0 < len(results) < 30 and all(r.status == "ok" for r in results)
    refused = [e for e in audit.events if isinstance(e, BudgetWarning) and e.exceeded]
    assert refused and refused[0].period == "run"
    warned = [e for e in audit.events if isinstance(e, BudgetWarning) and not e.exceeded]
    assert len(warned) == 1 and warned[0].spent_usd >= 0.8 * 0.3

    # Resumed with a higher cap, counting what the first pass spent.
    resumed = plan_resume(run_id, home, store, max_cost=50.0)
    assert resumed.options.max_cost == 50.0
    again = NullAudit()
    more = RunBudget(run_id, 50.0, base=spent)
    progress = await runner(resumed, store, tmp_path, more, again).run()
    assert progress.stopped is None and progress.skipped == len(results)
    assert store.get_run(run_id).status == "finished"  # type: ignore[union-attr]
    assert len(store.finished(run_id)) == 30
    assert more.spent == pytest.approx(spent + sum(costs(again)))


async def test_a_spent_budget_refuses_the_first_call_of_a_resumed_run(
    home: Path, tmp_path: Path
) -> None:
    task = write_task(tmp_path, {"solver": priced_solver()}, 3)
    store = open_store(home)
    plan = plan_run(task, home, store, RunOptions(max_cost=1.0))
    audit = NullAudit()
    # Earlier passes spent it all: nothing is sent, nothing recorded.
    progress = await runner(
        plan, store, tmp_path, RunBudget(plan.run.run_id, 1.0, base=1.0), audit
    ).run()
    assert progress.stopped is not None and "spent $1.0000" in progress.stopped
    assert costs(audit) == [] and store.samples(plan.run.run_id) == []
    assert progress.retries == 0  # a refusal is not an error to try again


async def test_a_grader_the_budget_refuses_stops_the_run_unscored(
    home: Path, tmp_path: Path
) -> None:
    # The solver is free, the grader dear: the grader's call passes the cap.
    write_persona(
        home,
        "judge",
        {"model": {"provider": "scripted", "name": "priced-judge", "default": "GRADE: C"}},
    )
    task = write_task(
        tmp_path,
        {
            "solver": {"inline": {"model": {"provider": "scripted", "default": "ok"}}},
            "scorers": [{"type": "model_graded", "grader": "judge", "rubric": "says ok"}],
        },
        2,
    )
    store = open_store(home)
    plan = plan_run(task, home, store, RunOptions(max_cost=0.01))
    progress = await runner(
        plan, store, tmp_path, RunBudget(plan.run.run_id, 0.01), NullAudit()
    ).run()
    assert progress.stopped is not None and "budget_exceeded" in progress.stopped
    assert store.samples(plan.run.run_id) == []  # not recorded as graded, nor as errors


def test_an_unpriced_model_is_refused_before_the_run_is_recorded(
    home: Path, tmp_path: Path
) -> None:
    solver = {"inline": {"model": {"provider": "openai", "name": "my-local-model"}}}
    task = write_task(tmp_path, {"solver": solver}, 2)
    store = open_store(home)
    with pytest.raises(ConfigError, match=r"--max-cost: .*openai:my-local-model has no price"):
        plan_run(task, home, store, RunOptions(max_cost=5.0))
    assert store.list_runs() == []
    # Without a cap the same run is allowed (its cost is NULL in the audit log).
    plan_run(task, home, store, RunOptions())
    assert len(store.list_runs()) == 1


async def test_the_run_budget_holds_reservations_and_names_itself() -> None:
    budget = RunBudget("r1", 1.0)
    first = await budget.reserve("p", 0.6, model="m", persona="p", conversation_id="c")
    with pytest.raises(BudgetExceededError, match=r"eval run 'r1'.*run budget of \$1\.00"):
        await budget.reserve("p", 0.6, model="m", persona="p", conversation_id="c")
    assert first.ticket is not None
    assert await budget.settle(first.ticket, 0.1) == []  # under 80%
    second = await budget.reserve("p", 0.6, model="m", persona="p", conversation_id="c")
    assert second.ticket is not None
    (warning,) = await budget.settle(second.ticket, 0.75)
    assert warning.period == "run" and not warning.exceeded
    with pytest.raises(BudgetExceededError, match="has no price"):
        await budget.reserve("p", None, model="m", persona="p", conversation_id="c")
    with pytest.raises(ValueError):
        RunBudget("r2", 0)


def test_spent_sql_matches_the_run_and_its_grading_only(tmp_path: Path) -> None:
    con = duckdb.connect(str(tmp_path / "a.duckdb"))
    con.execute("create table events (kind varchar, conversation_id varchar, cost_usd double)")
    rows = [
        ("model_call", "eval:run_1:s1:1:1", 1.0),
        ("model_call", "eval:run_1:s2:1:1@r1", 2.0),
        ("model_call", "eval:grade:eval_run_1_s1_1_1-ab12cd-0f0f0f:1:1", 4.0),
        ("model_call", "eval:run_10:s1:1:1", 8.0),  # another run
        ("model_call", "eval:grade:eval_runX1_s1_1_1:1:1", 16.0),  # _ is not a wildcard
        ("tool_result", "eval:run_1:s1:1:1", 32.0),
    ]
    con.executemany("insert into events values (?, ?, ?)", rows)
    assert con.execute(spent_sql("run_1")).fetchone() == (7.0,)
    assert con.execute(spent_sql("it's")).fetchone() == (0.0,)


@pytest.mark.parametrize("value", ["0", "-2", "abc", "inf", "nan"])
def test_bad_max_cost_values_are_refused_by_the_command_line(
    value: str, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["--home", str(tmp_path), "eval", "task.yaml", "--max-cost", value])
    assert exit_info.value.code == 2
    assert "--max-cost" in capsys.readouterr().err


@pytest.mark.usefixtures("ray_session")
def test_coterie_eval_max_cost_on_ray_stops_and_resumes(
    home: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    task = write_task(tmp_path, {"solver": priced_solver(latency_ms=20), "max_samples": 4}, 20)
    base = ["--home", str(home), "eval"]
    code = cli.main([*base, str(task), "--run-id", "capped", "--max-cost", "0.2"])
    out = capsys.readouterr().out
    assert code == 1, out
    assert "stopped" in out and "budget_exceeded" in out
    assert "--resume capped --max-cost" in out
    with duckdb.connect(str(home / "evals.duckdb"), read_only=True) as con:
        (status,) = con.execute("select status from eval_runs where run_id = 'capped'").fetchone()
        (first,) = con.execute(
            "select count(*) from eval_samples where run_id = 'capped'"
        ).fetchone()
    assert status == "interrupted" and 0 < first < 20
    with duckdb.connect(str(home / "audit.duckdb"), read_only=True) as con:
        (spent,) = con.execute(spent_sql("capped")).fetchone()
    assert 0 < spent <= 0.2

    code = cli.main([*base, "--resume", "capped", "--max-cost", "100"])
    out = capsys.readouterr().out
    assert code == 0, out
    assert f"${spent:.4f} spent by earlier passes" in out
    assert f"{20 - first} run now, {first} already finished, 0 errors" in out
