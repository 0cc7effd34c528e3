"""The eval runner without Ray: samples in fresh personas, scoring, results in
DuckDB as they finish, resume that redoes nothing, retries, limits,
isolation of workspaces, memories and background processes."""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psutil
import pytest
import yaml

from coterie.runtime.config import MemorySettings, RuntimeSettings, ScriptedModelConfig
from coterie.runtime.errors import ModelHTTPError
from coterie.runtime.eval import (
    AdaptiveGate,
    EvalRunner,
    LimitedModel,
    LocalExecutor,
    Progress,
    RunOptions,
    SampleLimits,
    SampleWorker,
    SolverSetup,
    open_store,
    plan_resume,
    plan_run,
)
from coterie.runtime.eval.plan import RunPlan
from coterie.runtime.eval.store import EvalStore
from coterie.runtime.memory import MemoryClient, MemoryServer
from coterie.runtime.messages import AssistantMessage, ModelRequest, ModelResponse
from coterie.runtime.models import build_model
from coterie.runtime.models.base import Model
from coterie.runtime.models.scripted import FunctionModel, latest_user_text
from coterie.runtime.services import BudgetService, NullAudit
from coterie.runtime.shell.sandbox import bwrap_available
from coterie.tools import builtin_registry
from tests.helpers import write_persona

REPO = Path(__file__).resolve().parents[1]
EXAMPLES = REPO / "configs" / "evals"


class Counting:
    """Wraps each solver's model; counts the calls per sample input."""

    def __init__(self, make: Callable[[SolverSetup], Model] | None = None) -> None:
        self.calls: dict[str, int] = {}
        self.make = make or (lambda s: build_model(s.config.model))

    def __call__(self, setup: SolverSetup) -> Model:
        inner = self.make(setup)
        outer = self

        class _Counted:
            provider = inner.provider
            name = inner.name

            async def request(self, request: ModelRequest) -> ModelResponse:
                text = latest_user_text(request)
                outer.calls[text] = outer.calls.get(text, 0) + 1
                return await inner.request(request)

            async def aclose(self) -> None:
                await inner.aclose()

        return _Counted()

    @property
    def total(self) -> int:
        return sum(self.calls.values())


def make_runner(
    plan: RunPlan,
    store: EvalStore,
    tmp_path: Path,
    *,
    models: Callable[[SolverSetup], Model] | None = None,
    on_progress: Callable[[Progress], None] | None = None,
    memory: Callable[[str], Any] | None = None,
    audit: NullAudit | None = None,
    settings: RuntimeSettings | None = None,
    budget: BudgetService | None = None,
) -> EvalRunner:
    worker = SampleWorker(
        plan.solvers,
        registry=builtin_registry(),
        scratch=tmp_path / "scratch",
        audit=audit,
        model_factory=models,
        memory=memory,
        settings=settings,
        budget=budget,
    )
    return EvalRunner(
        plan.task,
        plan.samples,
        run=plan.run,
        store=store,
        executor=LocalExecutor(worker),
        scorers=plan.scorers,
        graders=plan.graders,
        on_progress=on_progress,
        flush_interval=0.01,
        retry_backoff=0.01,
        pass_tag=plan.pass_tag,
    )


def write_task(tmp_path: Path, body: dict[str, Any], rows: list[dict[str, Any]]) -> Path:
    (tmp_path / "data.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    path = tmp_path / "task.yaml"
    path.write_text(yaml.safe_dump({"dataset": {"path": "data.jsonl"}, **body}))
    return path


def scripted_solver(rules: list[dict[str, Any]], default: str = "ok") -> dict[str, Any]:
    model = {"provider": "scripted", "rules": rules, "default": default}
    return {"inline": {"model": model}}


@pytest.fixture
def home(tmp_path: Path) -> Path:
    path = tmp_path / "home"
    (path / "personas").mkdir(parents=True)
    return path


# -- the bundled example, end to end ----------------------------------------------


async def test_the_arithmetic_example_runs_and_scores(home: Path, tmp_path: Path) -> None:
    store = open_store(home)
    plan = plan_run(EXAMPLES / "arithmetic.yaml", home, store, RunOptions())
    audit = NullAudit()
    progress = await make_runner(plan, store, tmp_path, audit=audit).run()
    assert (progress.done, progress.errors, progress.skipped) == (24, 0, 0)  # 12 × 2 epochs
    results = {(r.sample_id, r.epoch): r for r in store.samples(plan.run.run_id)}
    assert len(results) == 24
    add = results[("add-1", 1)]
    assert add.output == "The answer is 42." and add.status == "ok"
    assert (add.model_calls, add.tool_calls) == (2, 1)
    assert [s.value for s in add.scores] == [1.0, 1.0]
    words = results[("words-1", 2)]
    assert [s.value for s in words.scores] == [0.0, 0.0]  # calculate refused the words
    report = store.report(plan.run.run_id, by="op")
    overall = [s for s in report.summaries if s.group is None and s.reducer == "mean"]
    assert [(s.scorer, s.n, round(s.mean, 4)) for s in overall] == [
        ("numeric", 12, round(11 / 12, 4)),
        ("includes", 12, round(11 / 12, 4)),
    ]
    assert store.get_run(plan.run.run_id).status == "finished"  # type: ignore[union-attr]
    # The transcript is in the audit log under the sample's conversation.
    convs = {e.conversation_id for e in audit.events}
    assert (
        add.conversation_id in convs and add.conversation_id == f"eval:{plan.run.run_id}:add-1:1:1"
    )
    # Every scratch workspace is gone.
    assert list((tmp_path / "scratch").iterdir()) == []


async def test_samples_write_the_same_file_in_their_own_workspaces(
    home: Path, tmp_path: Path
) -> None:
    store = open_store(home)
    plan = plan_run(EXAMPLES / "files.yaml", home, store, RunOptions(max_samples=8))
    progress = await make_runner(plan, store, tmp_path).run()
    results = store.samples(plan.run.run_id)
    # file_write refuses to replace a file: a shared workspace would fail 7 of 8.
    assert progress.errors == 0 and len(results) == 8
    assert all(r.output == f"The note says: 1\t{r.sample_id}" for r in results), [
        r.output for r in results
    ]
    assert all(s.value == 1.0 for r in results for s in r.scores)


# -- resume --------------------------------------------------------------------------


async def test_an_interrupted_run_resumes_without_redoing_samples(
    home: Path, tmp_path: Path
) -> None:
    store = open_store(home)
    plan = plan_run(EXAMPLES / "arithmetic.yaml", home, store, RunOptions(max_samples=2))
    counting = Counting()
    stop = asyncio.Event()

    def watch(p: Progress) -> None:
        if p.done >= 9:
            stop.set()

    runner = make_runner(plan, store, tmp_path, models=counting, on_progress=watch)
    task = asyncio.create_task(runner.run())
    await stop.wait()
    task.cancel()  # what Ctrl-C does to the run
    with pytest.raises(asyncio.CancelledError):
        await task
    run_id = plan.run.run_id
    assert store.get_run(run_id).status == "interrupted"  # type: ignore[union-attr]
    finished = store.finished(run_id)
    assert 9 <= len(finished) < 24
    first_calls = counting.total

    resumed = plan_resume(run_id, home, store)
    assert resumed.pass_tag.startswith("r")
    again = Counting()
    progress = await make_runner(resumed, store, tmp_path, models=again).run()
    assert progress.skipped == len(finished)
    # Each remaining (sample, epoch) ran once, with its two model calls; none finished twice.
    assert again.total == 2 * (24 - len(finished))
    convs = [r.conversation_id for r in store.samples(run_id)]
    tags = {c.rpartition("@")[2] for c in convs if "@" in c}
    assert tags == {resumed.pass_tag}  # the resumed attempts have transcripts of their own
    assert len(store.samples(run_id)) == 24 and store.finished(run_id) == {
        (s.id, e) for s in plan.samples for e in (1, 2)
    }
    # Cancelled attempts may have made calls that were not recorded, no more.
    assert first_calls >= 2 * len(finished)
    assert store.get_run(run_id).status == "finished"  # type: ignore[union-attr]


# -- retries, limits, errors ----------------------------------------------------------


def flaky(failures: dict[str, int]) -> Callable[[SolverSetup], Model]:
    """A model that fails with HTTP 500 the first N calls for an input."""

    def make(setup: SolverSetup) -> Model:
        def answer(request: ModelRequest) -> AssistantMessage:
            text = latest_user_text(request)
            if failures.get(text, 0) > 0:
                failures[text] -= 1
                raise ModelHTTPError(500, "upstream broke")
            return AssistantMessage(text=f"echo {text}")

        return FunctionModel(answer)

    return make


async def test_errored_samples_are_retried_and_never_scored(home: Path, tmp_path: Path) -> None:
    path = write_task(
        tmp_path,
        {
            "name": "retry",
            "solver": scripted_solver([]),
            "scorers": [{"type": "includes"}],
            "retries": 2,
        },
        [
            {"id": "a", "input": "alpha", "target": "alpha"},
            {"id": "b", "input": "beta", "target": "beta"},
            {"id": "c", "input": "gamma", "target": "gamma"},
        ],
    )
    store = open_store(home)
    plan = plan_run(path, home, store, RunOptions())
    # alpha fails once (ok on attempt 2); gamma fails every time (3 attempts).
    progress = await make_runner(
        plan, store, tmp_path, models=flaky({"alpha": 1, "gamma": 9})
    ).run()
    results = {r.sample_id: r for r in store.samples(plan.run.run_id)}
    assert (results["a"].status, results["a"].attempts) == ("ok", 2)
    assert (results["b"].status, results["b"].attempts) == ("ok", 1)
    assert (results["c"].status, results["c"].attempts, results["c"].scores) == ("error", 3, [])
    assert "upstream broke" in (results["c"].error or "")
    assert progress.retries == 3 and progress.errors == 1
    (summary,) = [s for s in store.report(plan.run.run_id).summaries if s.group is None]
    assert (summary.n, summary.mean) == (2, 1.0)  # the error is not a wrong answer
    assert store.finished(plan.run.run_id) == {("a", 1), ("b", 1)}


@pytest.mark.parametrize(
    ("limits", "limit", "tools_run"),
    [
        ({"model_calls": 1}, "model_calls", 1),
        # A tool-call limit stops the calls before they run.
        ({"tool_calls": 0}, "tool_calls", 0),
        ({"tokens": 1}, "tokens", 1),
    ],
)
async def test_a_sample_past_a_limit_ends_and_is_still_scored(
    home: Path, tmp_path: Path, limits: dict[str, int], limit: str, tools_run: int
) -> None:
    rules = [
        {"when": {"turn": 1}, "tool_calls": [{"name": "clock", "arguments": {}}]},
        {"when": {"turn": 2}, "text": "done"},
    ]
    path = write_task(
        tmp_path,
        {
            "name": "limits",
            "solver": scripted_solver(rules),
            "scorers": [{"type": "includes"}],
            "limits": limits,
        },
        [{"id": "a", "input": "go", "target": "done"}],
    )
    store = open_store(home)
    plan = plan_run(path, home, store, RunOptions())
    await make_runner(plan, store, tmp_path).run()
    (result,) = store.samples(plan.run.run_id)
    assert (result.status, result.limit, result.output) == ("limit", limit, "")
    assert [s.value for s in result.scores] == [0.0]  # scored: it did not say "done"
    assert result.tool_calls == tools_run
    assert store.finished(plan.run.run_id) == {("a", 1)}


async def test_the_time_limit_ends_a_slow_sample(home: Path, tmp_path: Path) -> None:
    rules = [{"when": {"turn": 1}, "text": "late"}]
    solver = {"inline": {"model": {"provider": "scripted", "rules": rules, "latency_ms": 30_000}}}
    path = write_task(
        tmp_path,
        {
            "name": "slow",
            "solver": solver,
            "scorers": [{"type": "includes"}],
            "limits": {"time_s": 0.5},
        },
        [{"id": "a", "input": "go", "target": "late"}],
    )
    store = open_store(home)
    plan = plan_run(path, home, store, RunOptions())
    await make_runner(plan, store, tmp_path).run()
    (result,) = store.samples(plan.run.run_id)
    assert (result.status, result.limit) == ("limit", "time")
    assert [s.value for s in result.scores] == [0.0]


# -- isolation of what samples leave behind -------------------------------------------


async def test_samples_do_not_see_each_other_s_memories(home: Path, tmp_path: Path) -> None:
    rules = [
        {
            "when": {"turn": 1, "contains": "remember"},
            "tool_calls": [
                {
                    "name": "memory",
                    "arguments": {"action": "write", "category": "c", "content": "{input}"},
                }
            ],
        },
        {"when": {"turn": 1}, "tool_calls": [{"name": "recall", "arguments": {"query": "kiwi"}}]},
        {"when": {"turn": 2}, "text": "{last_tool_result}"},
    ]
    path = write_task(
        tmp_path,
        {
            "name": "memory",
            "solver": scripted_solver(rules),
            "scorers": [{"type": "includes"}],
            "max_samples": 1,
        },
        [
            {"id": "writer", "input": "remember kiwi", "target": "kiwi"},
            {"id": "reader", "input": "what do you know", "target": "kiwi"},
        ],
    )
    store = open_store(home)
    plan = plan_run(path, home, store, RunOptions())
    server = MemoryServer(str(tmp_path / "memory"), MemorySettings(embedder="hashing"))
    try:
        runner = make_runner(
            plan, store, tmp_path, memory=lambda scope: MemoryClient(server, scope, new_scope=True)
        )
        await runner.run()
        results = {r.sample_id: r for r in store.samples(plan.run.run_id)}
        assert results["writer"].status == "ok"
        # The reader ran after the writer, and found nothing.
        assert "kiwi" not in results["reader"].output
        kept = await server.recall(f"eval-memory@eval/{plan.run.run_id}/writer/1", query="kiwi")
        assert [h.content for h in kept] == ["remember kiwi"]
    finally:
        await server.aclose()


@pytest.mark.skipif(
    bwrap_available() is None and not os.environ.get("CI"), reason="bubblewrap is not installed"
)
async def test_background_processes_a_sample_leaves_are_stopped(home: Path, tmp_path: Path) -> None:
    marker = "sleep 293"
    rules = [
        {
            "when": {"turn": 1},
            "tool_calls": [
                {"name": "shell_exec", "arguments": {"command": marker, "background": True}}
            ],
        },
        {"when": {"turn": 2}, "text": "started"},
    ]
    path = write_task(
        tmp_path,
        {"name": "bg", "solver": scripted_solver(rules), "scorers": [{"type": "includes"}]},
        [{"id": "a", "input": "go", "target": "started"}],
    )
    store = open_store(home)
    plan = plan_run(path, home, store, RunOptions())
    await make_runner(plan, store, tmp_path).run()
    (result,) = store.samples(plan.run.run_id)
    assert result.status == "ok" and result.tool_calls == 1
    left = [
        p
        for p in psutil.process_iter(["cmdline"])
        if p.info["cmdline"] and " ".join(p.info["cmdline"]).startswith(marker)
    ]
    assert left == []


# -- graders, personas from the home, overrides ---------------------------------------


def graded_task(home: Path, tmp_path: Path, rows: list[dict[str, Any]]) -> Path:
    """A task ``graded``: persona ``student`` answers, persona ``judge``
    grades (C when the answer names Paris as the capital)."""
    write_persona(
        home,
        "student",
        {"model": {"provider": "scripted", "rules": [], "default": "Paris is the capital."}},
    )
    write_persona(
        home,
        "judge",
        {
            "model": {
                "provider": "scripted",
                "rules": [{"when": {"contains": "Paris is the capital"}, "text": "GRADE: C"}],
                "default": "GRADE: I",
            }
        },
    )
    return write_task(
        tmp_path,
        {
            "name": "graded",
            "solver": {"persona": "student"},
            "scorers": [{"type": "model_graded", "grader": "judge", "rubric": "Names Paris."}],
        },
        rows,
    )


async def test_a_grader_persona_grades_and_the_persona_comes_from_the_home(
    home: Path, tmp_path: Path
) -> None:
    path = graded_task(
        home, tmp_path, [{"id": "q", "input": "Capital of France?", "target": "Paris"}]
    )
    store = open_store(home)
    plan = plan_run(path, home, store, RunOptions())
    assert plan.run.persona == "student"
    await make_runner(plan, store, tmp_path).run()
    (result,) = store.samples(plan.run.run_id)
    assert [(s.scorer, s.value) for s in result.scores] == [("model_graded", 1.0)]


async def test_a_model_override_changes_who_answers(home: Path, tmp_path: Path) -> None:
    path = write_task(
        tmp_path,
        {
            "name": "override",
            "solver": scripted_solver([], default="first"),
            "scorers": [{"type": "exact"}],
        },
        [{"id": "q", "input": "?", "target": "second"}],
    )
    store = open_store(home)
    plan = plan_run(path, home, store, RunOptions(model="scripted"))
    assert plan.run.model == "scripted:scripted"
    # A scripted override with no rules answers its default, not the task's model.
    await make_runner(plan, store, tmp_path).run()
    (result,) = store.samples(plan.run.run_id)
    assert result.output == ScriptedModelConfig(provider="scripted").default != "first"


def test_bad_overrides_are_refused_naming_them(home: Path, tmp_path: Path) -> None:
    from coterie.runtime.errors import ConfigError

    store = open_store(home)
    with pytest.raises(ConfigError, match="--model 'gpt4': expected provider:name"):
        plan_run(EXAMPLES / "arithmetic.yaml", home, store, RunOptions(model="gpt4"))
    with pytest.raises(ConfigError, match="epochs"):
        plan_run(EXAMPLES / "arithmetic.yaml", home, store, RunOptions(epochs=0))
    assert store.list_runs() == []  # nothing half-written


# -- the connection gate ---------------------------------------------------------------


async def test_429s_shrink_the_gate_and_successes_grow_it_back() -> None:
    gate = AdaptiveGate(8)
    throttles = {"left": 2}

    def answer(request: ModelRequest) -> AssistantMessage:
        if throttles["left"]:
            throttles["left"] -= 1
            raise ModelHTTPError(429, "slow down")
        return AssistantMessage(text="fine", tool_calls=[])

    model = LimitedModel(FunctionModel(answer), SampleLimits(), gate)
    request = ModelRequest(system="", messages=[])
    from coterie.runtime.eval import limits as limits_module

    limits_module.THROTTLE_BACKOFF_S = 0.001
    response = await model.request(request)
    assert response.message.text == "fine"
    assert (gate.throttled, gate.capacity) == (2, 2)  # 8 -> 4 -> 2
    for _ in range(2 + 3):
        await model.request(request)
    assert gate.capacity == 4  # +1 after 2 successes at 2, +1 after 3 at 3
    assert model.model_calls == 6 and gate.in_use == 0


async def test_the_gate_bounds_calls_in_flight() -> None:
    gate = AdaptiveGate(3)
    running = {"now": 0, "max": 0}

    async def slow() -> None:
        async with gate:
            running["now"] += 1
            running["max"] = max(running["max"], running["now"])
            await asyncio.sleep(0.01)
            running["now"] -= 1

    await asyncio.gather(*(slow() for _ in range(20)))
    assert running["max"] == 3


async def test_a_new_memory_scope_does_not_read_its_empty_user_model(tmp_path: Path) -> None:
    server = MemoryServer(str(tmp_path / "memory"), MemorySettings(embedder="hashing"))
    reads: list[str] = []
    real = server.user_model

    async def spy(persona: str) -> Any:
        reads.append(persona)
        return await real(persona)

    server.user_model = spy  # type: ignore[method-assign]
    try:
        assert await MemoryClient(server, "fresh", new_scope=True).user_model() == []
        assert await MemoryClient(server, "old").user_model() == []
        assert reads == ["old"]  # only the ordinary client asked the store
    finally:
        await server.aclose()


async def test_a_broken_run_is_marked_failed(home: Path, tmp_path: Path) -> None:
    store = open_store(home)
    plan = plan_run(EXAMPLES / "arithmetic.yaml", home, store, RunOptions(limit=2))

    class Broken:
        async def run(self, job: Any) -> Any:
            raise RuntimeError("the executor is broken")

        async def grade(self, grader: str, prompt: str, conversation_id: str) -> str:
            raise AssertionError

        async def aclose(self) -> None:
            return None

    runner = EvalRunner(
        plan.task, plan.samples, run=plan.run, store=store, executor=Broken(), scorers=plan.scorers
    )
    with pytest.raises(RuntimeError, match="broken"):
        await runner.run()
    assert store.get_run(plan.run.run_id).status == "failed"  # type: ignore[union-attr]
