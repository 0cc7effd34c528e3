"""Running an eval plan on a runtime's cluster: what ``coterie eval`` and
:meth:`coterie.Runtime.eval` share."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from coterie.runtime.eval.budget import spent_sql
from coterie.runtime.eval.plan import RunPlan
from coterie.runtime.eval.runner import EvalRunner, Progress
from coterie.runtime.eval.store import EvalStore


def _ignore(_: str) -> None:
    return None


async def _budget(plan: RunPlan, rt: Any, say: Callable[[str], None]) -> Any:
    """The run's budget actor (None without ``max_cost``), starting from
    what the run's earlier passes spent."""
    limit = plan.options.max_cost
    if limit is None:
        return None
    from coterie.actors.eval import EvalBudgetRemote

    spent = float((await rt.query_async(spent_sql(plan.run.run_id))).rows[0][0] or 0.0)
    say(f"  budget ${limit:.2f}, ${spent:.4f} spent by earlier passes")
    return EvalBudgetRemote.remote(plan.run.run_id, limit, spent)  # type: ignore[attr-defined]


async def execute(
    plan: RunPlan,
    rt: Any,
    store: EvalStore,
    *,
    workers: int | None = None,
    on_progress: Callable[[Progress], None] | None = None,
    say: Callable[[str], None] = _ignore,
) -> Progress:
    """Run ``plan`` on eval workers of ``rt`` (a ``coterie.Runtime``: its
    cluster, audit log, memory store and plugins), recording into ``store``."""
    from coterie.actors.eval import RayExecutor

    budget = await _budget(plan, rt, say)
    executor = RayExecutor.for_runtime(plan, rt, workers=workers, budget=budget)
    try:
        placed = await executor.nodes()
        say(f"{executor.size} eval workers on {len(set(placed))} node(s)")
        runner = EvalRunner(
            plan.task,
            plan.samples,
            run=plan.run,
            store=store,
            executor=executor,
            scorers=plan.scorers,
            graders=plan.graders,
            on_progress=on_progress,
            pass_tag=plan.pass_tag,
        )
        progress = await runner.run()
        if budget is not None:
            progress.spent_usd = await budget.spent.remote()
        return progress
    finally:
        await executor.aclose()
        if budget is not None:
            import ray

            ray.kill(budget)


__all__ = ["execute"]
