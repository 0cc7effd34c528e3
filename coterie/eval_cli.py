"""``coterie eval``: run, resume, list, show and compare evaluations."""

from __future__ import annotations

import argparse
import asyncio
import sys
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, TextColumn, TimeElapsedColumn
from rich.progress import Progress as Bar
from rich.table import Table

from coterie.runtime.config import resolve_home
from coterie.runtime.errors import ConfigError
from coterie.runtime.eval.plan import RunOptions, RunPlan, plan_resume, plan_run
from coterie.runtime.eval.records import CompareReport, RunReport
from coterie.runtime.eval.runner import Progress
from coterie.runtime.eval.store import EvalStore, open_store

# Wide enough for the tables when the output goes to a file or a pipe.
console = Console(width=None if sys.stdout.isatty() else 160)


def add_parser(sub: Any) -> None:
    p = sub.add_parser(
        "eval",
        help="evaluate a persona on a task (or --resume/--list/--show/--compare runs)",
        description="Run an eval task (YAML) on the cluster; results go to <home>/evals.duckdb.",
    )
    p.add_argument("task", nargs="?", help="the task file (YAML)")
    p.add_argument("--persona", help="the persona that answers (instead of the task's)")
    p.add_argument("--model", help="model override, provider:name (e.g. openai:gpt-4.1-mini)")
    p.add_argument("--limit", type=int, help="only the first N samples")
    p.add_argument("--epochs", type=int, help="runs of each sample (the task's epochs)")
    p.add_argument("--max-samples", type=int, help="samples in flight (the task's max_samples)")
    p.add_argument(
        "--max-connections", type=int, help="model calls in flight per provider (max_connections)"
    )
    p.add_argument("--workers", type=int, help="eval worker actors (default: 2 per node)")
    p.add_argument(
        "--max-cost",
        type=_usd,
        metavar="USD",
        help="stop the run before it spends more than USD dollars in all (with --resume: "
        "a new cap for the run)",
    )
    p.add_argument("--run-id", help="id of the new run (default: generated)")
    p.add_argument("--resume", metavar="RUN_ID", help="finish an interrupted run")
    p.add_argument("--list", action="store_true", help="list the runs")
    p.add_argument("--show", metavar="RUN_ID", help="scores of a run")
    p.add_argument("--by", metavar="FIELD", help="with --show: per value of a metadata field")
    p.add_argument("--compare", nargs=2, metavar=("RUN_A", "RUN_B"), help="paired comparison")


def _usd(text: str) -> float:
    """``--max-cost``'s value: a positive, finite number of US dollars."""
    try:
        value = float(text.strip().removeprefix("$"))
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not an amount of US dollars (e.g. 5 or 0.50)"
        ) from None
    if not 0 < value < float("inf"):
        raise argparse.ArgumentTypeError(f"{text!r}: the cap must be more than 0 dollars")
    return value


def _pct(value: float) -> str:
    return f"{value:.3f}"


def print_report(report: RunReport) -> None:
    run = report.run
    counts = ", ".join(f"{k} {v}" for k, v in sorted(report.counts.items()))
    table = Table(title=f"{run.run_id} · {run.task} · {run.persona} ({run.model}) · {counts}")
    for column in ("scorer", "reducer", "group", "n", "mean", "95% CI", "stderr"):
        left = column in ("scorer", "reducer", "group")
        table.add_column(column, justify="left" if left else "right")
    for s in report.summaries:
        table.add_row(
            s.scorer,
            s.reducer,
            s.group if s.group is not None else "(all)",
            str(s.n),
            _pct(s.mean),
            f"[{_pct(s.ci_low)}, {_pct(s.ci_high)}]",
            _pct(s.stderr),
        )
    console.print(table)


def print_compare(report: CompareReport) -> None:
    table = Table(
        title=f"{report.run_b} − {report.run_a} on shared samples "
        f"(only in A: {report.only_in_a}, only in B: {report.only_in_b})"
    )
    columns = ("scorer", "reducer", "n", "A", "B", "B − A", "95% CI", "A only right", "B only")
    for column in columns:
        table.add_column(column, justify="left" if column in ("scorer", "reducer") else "right")
    for d in report.diffs:
        table.add_row(
            d.scorer,
            d.reducer,
            str(d.n),
            _pct(d.mean_a),
            _pct(d.mean_b),
            f"{d.diff:+.3f}",
            f"[{d.ci_low:+.3f}, {d.ci_high:+.3f}]",
            str(d.a_only_right),
            str(d.b_only_right),
        )
    console.print(table)


def _list(store: EvalStore) -> int:
    table = Table(title=f"eval runs in {store.path}")
    for column in ("run", "task", "persona", "model", "status", "samples", "results", "created"):
        table.add_column(column)
    for run, counts in store.list_runs():
        results = ", ".join(f"{k} {v}" for k, v in sorted(counts.items())) or "-"
        table.add_row(
            run.run_id,
            run.task,
            run.persona,
            run.model or "",
            run.status,
            f"{run.samples} × {run.epochs}",
            results,
            run.created_at.strftime("%Y-%m-%d %H:%M:%S"),
        )
    console.print(table)
    return 0


def _describe(p: Progress) -> str:
    score = f"{p.scorer} {p.score:.3f}" if p.score is not None else "no score yet"
    return f"in flight {p.in_flight} · errors {p.errors} · limits {p.limits} · {score}"


async def _execute(plan: RunPlan, rt: Any, workers: int | None, store: EvalStore) -> Progress:
    from coterie.evals import execute

    columns = (
        TextColumn("[bold]{task.fields[name]}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("{task.description}"),
        TimeElapsedColumn(),
    )
    with Bar(*columns, console=console, transient=False) as bar:
        total = len(plan.samples) * plan.task.epochs
        tid = bar.add_task("starting", total=total, name=plan.task.name)

        def show(p: Progress) -> None:
            bar.update(tid, completed=p.done, description=_describe(p))

        return await execute(plan, rt, store, workers=workers, on_progress=show, say=console.print)


def cmd_eval(args: argparse.Namespace) -> int:
    home = resolve_home(args.home)
    reading = bool(args.list or args.show or args.compare)
    if reading and not (home / "evals.duckdb").is_file():
        if args.list:
            console.print(f"No eval runs in {home} yet.")
            return 0
        raise ConfigError(f"no eval results in {home / 'evals.duckdb'} yet")
    # Reads open the file read-only (still not while a run writes it: DuckDB
    # lets one process at a time hold a file that is being written).
    store = open_store(home, read_only=reading)
    try:
        if args.list:
            return _list(store)
        if args.show:
            print_report(store.report(args.show, by=args.by))
            return 0
        if args.compare:
            print_compare(store.compare(*args.compare))
            return 0
        if args.resume:
            plan = plan_resume(args.resume, home, store, max_cost=args.max_cost)
        elif args.task:
            options = RunOptions(
                persona=args.persona,
                model=args.model,
                limit=args.limit,
                epochs=args.epochs,
                max_samples=args.max_samples,
                max_connections=args.max_connections,
                max_cost=args.max_cost,
            )
            plan = plan_run(Path(args.task), home, store, options, run_id=args.run_id)
        else:
            raise ConfigError("coterie eval: name a task file, or --resume/--list/--show/--compare")
        return _run(plan, args, store)
    finally:
        store.close()


def _run(plan: RunPlan, args: argparse.Namespace, store: EvalStore) -> int:
    address = args.address
    if address is None:
        # A running `coterie serve`: join its cluster and runtime instead of
        # starting another (its personas, audit log and memory are shared).
        # Before Ray is imported: joining needs the server's auth mode.
        from coterie.runtime.serve.client import find_server

        server = find_server(resolve_home(args.home))
        if server is not None and server.state.ray_address:
            address = server.state.join_ray()
            console.print(f"  through coterie serve at {server.state.url}")
    from coterie.api import Runtime

    verb = "resuming" if plan.resumed else "running"
    console.print(
        f"{verb} [bold]{plan.run.run_id}[/]: {plan.task.name}, {len(plan.samples)} samples × "
        f"{plan.task.epochs} epochs, {plan.run.persona} ({plan.run.model})"
    )
    if plan.task.description:
        console.print(f"  {plan.task.description}", markup=False, highlight=False)
    with console.status("Starting Ray and the runtime actors…"):
        rt = Runtime.start(home=args.home, address=address)
    try:
        progress = asyncio.run(_execute(plan, rt, args.workers, store))
    except KeyboardInterrupt:
        console.print(
            f"[yellow]interrupted[/]: what finished is saved; "
            f"resume with `coterie eval --resume {plan.run.run_id}`"
        )
        return 130
    finally:
        rt.shutdown()
    nodes = ", ".join(f"{n[:8]}… {c}" for n, c in sorted(progress.nodes.items()))
    console.print(
        f"done: {progress.done - progress.skipped} run now, {progress.skipped} already finished, "
        f"{progress.errors} errors, {progress.retries} retries; on nodes {nodes or '-'}"
    )
    if progress.spent_usd is not None:
        console.print(f"spent ${progress.spent_usd:.4f} of ${plan.options.max_cost:.2f}")
    if progress.stopped is not None:
        console.print(f"[yellow]stopped[/]: {escape(progress.stopped)}", highlight=False)
        console.print(
            f"what finished is saved; resume with `coterie eval --resume {plan.run.run_id} "
            "--max-cost USD` (a higher cap)"
        )
    print_report(store.report(plan.run.run_id))
    return 0 if progress.errors == 0 and progress.stopped is None else 1
