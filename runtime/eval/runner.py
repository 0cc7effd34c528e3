"""The eval driver: samples × epochs through a sliding window, retries,
scoring, results written as they finish, resume.

:class:`EvalRunner` keeps ``max_samples`` samples in flight (a sliding
window: a new one starts as soon as one ends, never in batches), each run by
an :class:`Executor` — one :class:`~runtime.eval.worker.SampleWorker` in
this process (:class:`LocalExecutor`) or a pool of worker actors spread over
the cluster (``actors.eval.RayExecutor``). An attempt that ends in ``error``
is tried again, up to the task's ``retries``, after a backoff (1 s, 2 s, 4 s…,
jittered, at most 30 s); errors are never scored. ``ok`` and ``limit``
samples are scored here by every scorer of the task (a model-graded scorer
asks its grader persona through the executor). Each result goes to the
:class:`~runtime.eval.store.EvalStore` within ``flush_interval`` of its end,
so an interrupted run loses at most that; a resumed run skips every
(sample, epoch) the store has as finished, reading only their keys.

Cancelling :meth:`EvalRunner.run` (Ctrl-C) stops the samples in flight,
writes what had finished and marks the run ``interrupted``. So does a run
budget (``--max-cost``) that refused a call, more gently: no new sample
starts, those in flight end (their refused ones are not recorded), and
:attr:`Progress.stopped` says why.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Protocol

from coterie.runtime.config import ModelConfig, PersonaConfig, load_persona
from coterie.runtime.errors import BudgetExceededError, ConfigError
from coterie.runtime.eval.records import RunRecord, RunStatus, SampleResult, ScoreValue
from coterie.runtime.eval.scorers import Scorer, ScorerError
from coterie.runtime.eval.store import EvalStore
from coterie.runtime.eval.task import EvalTask, Sample
from coterie.runtime.eval.worker import SampleJob, SampleRun, SampleWorker, SolverSetup
from coterie.runtime.tracing import Carrier, active
from coterie.runtime.tracing import carrier as span_carrier
from coterie.runtime.tracing.spans import finish_sample, start_sample

log = logging.getLogger("coterie.eval")

#: Retry backoff: first delay and ceiling, in seconds.
RETRY_BACKOFF_S = 1.0
RETRY_BACKOFF_MAX_S = 30.0


class Executor(Protocol):
    """Runs sample attempts somewhere (this process, or worker actors)."""

    async def run(self, job: SampleJob) -> SampleRun: ...

    async def grade(
        self, grader: str, prompt: str, conversation_id: str, trace: Carrier | None = None
    ) -> str: ...

    async def aclose(self) -> None: ...


class _Stopped(Exception):
    """A sample the run's budget stopped (its reason is the message)."""


class LocalExecutor:
    """One :class:`SampleWorker` in this process."""

    def __init__(self, worker: SampleWorker) -> None:
        self.worker = worker

    async def run(self, job: SampleJob) -> SampleRun:
        return await self.worker.run(job)

    async def grade(
        self, grader: str, prompt: str, conversation_id: str, trace: Carrier | None = None
    ) -> str:
        return await self.worker.grade(grader, prompt, conversation_id, trace)

    async def aclose(self) -> None:
        await self.worker.aclose()


@dataclass
class Progress:
    """Where a run is, for the progress bar and the summary."""

    total: int
    skipped: int = 0
    done: int = 0
    in_flight: int = 0
    errors: int = 0
    limits: int = 0
    retries: int = 0
    scorer: str = ""
    score_sum: float = 0.0
    scored: int = 0
    nodes: dict[str, int] = field(default_factory=dict)
    # Why the run stopped before its end (the budget's refusal), if it did.
    stopped: str | None = None
    # What a capped run (--max-cost) spent in all, once it ended.
    spent_usd: float | None = None

    @property
    def score(self) -> float | None:
        """The running mean of the first scorer over what was scored."""
        return self.score_sum / self.scored if self.scored else None


# -- what answers -----------------------------------------------------------


def parse_model_option(text: str) -> dict[str, Any]:
    """``--model`` as a persona.yaml ``model:`` mapping: ``provider:name``
    (``openai:gpt-4.1-mini``), or ``scripted``."""
    provider, _, name = text.partition(":")
    if provider not in ("openai", "anthropic", "scripted"):
        raise ConfigError(
            f"--model {text!r}: expected provider:name with provider openai, anthropic "
            "or scripted (e.g. openai:gpt-4.1-mini)"
        )
    return {"provider": provider, **({"name": name} if name else {})}


def _with_model(config: PersonaConfig, model: dict[str, Any] | None, what: str) -> PersonaConfig:
    if model is None:
        return config
    from pydantic import TypeAdapter, ValidationError

    try:
        parsed = TypeAdapter(ModelConfig).validate_python(model)
    except ValidationError as exc:
        raise ConfigError(f"{what}: not a valid model: {exc.errors()[0]['msg']}") from None
    return config.model_copy(update={"model": parsed})


def resolve_solver(
    task: EvalTask,
    home: Path,
    *,
    persona: str | None = None,
    model: dict[str, Any] | None = None,
) -> SolverSetup:
    """What answers: ``persona`` (the ``--persona`` option) or the task's
    solver, then the task's model override, then ``model`` (``--model``)."""
    solver = task.solver
    if persona is not None or solver.persona is not None:
        name = persona or solver.persona
        assert name is not None
        loaded = load_persona(home, name)
        setup = SolverSetup(
            name=loaded.name, config=loaded.config, soul=loaded.soul, persona_dir=str(loaded.path)
        )
    else:
        assert solver.inline is not None
        body = dict(solver.inline)
        soul = str(body.pop("soul", ""))
        from pydantic import ValidationError

        try:
            config = PersonaConfig.model_validate(body)
        except ValidationError as exc:
            err = exc.errors()[0]
            loc = ".".join(str(p) for p in err["loc"])
            raise ConfigError(f"task {task.name}: solver.inline.{loc}: {err['msg']}") from None
        setup = SolverSetup(name=f"eval-{task.name}", config=config, soul=soul)
    config = _with_model(setup.config, solver.model, f"task {task.name}: solver.model")
    config = _with_model(config, model, "--model")
    return setup.model_copy(update={"config": config})


def model_label(setup: SolverSetup) -> str:
    model = setup.config.model
    return f"{model.provider}:{model.name}"


# -- the run ------------------------------------------------------------------


def _now() -> datetime:
    return datetime.now(UTC)


def _ts(seconds: float) -> datetime:
    return datetime.fromtimestamp(seconds, UTC)


class EvalRunner:
    """One run of ``task`` over ``samples`` (see the module docstring)."""

    def __init__(
        self,
        task: EvalTask,
        samples: list[Sample],
        *,
        run: RunRecord,
        store: EvalStore,
        executor: Executor,
        scorers: list[Scorer],
        graders: dict[str, str] | None = None,
        max_samples: int | None = None,
        on_progress: Callable[[Progress], None] | None = None,
        flush_interval: float = 0.25,
        retry_backoff: float = RETRY_BACKOFF_S,
        pass_tag: str = "",
    ) -> None:
        self.task = task
        self.samples = samples
        self.run_record = run
        self.store = store
        self.executor = executor
        self.scorers = scorers
        # scorer name -> the solver name of its grader (model-graded scorers).
        self.graders = graders or {}
        self.max_samples = max_samples or task.max_samples
        self.on_progress = on_progress
        self.flush_interval = flush_interval
        self.retry_backoff = retry_backoff
        self.pass_tag = pass_tag
        self.progress = Progress(
            total=len(samples) * task.epochs, scorer=scorers[0].name if scorers else ""
        )
        self._pending: list[SampleResult] = []
        self._stop_flushing = asyncio.Event()

    def _tick(self) -> None:
        if self.on_progress is not None:
            self.on_progress(self.progress)

    async def run(self) -> Progress:
        """Run what is not finished yet; the final progress. Cancel to stop."""
        run_id = self.run_record.run_id
        finished = await asyncio.to_thread(self.store.finished, run_id)
        queue = deque(
            (sample, epoch)
            for sample in self.samples
            for epoch in range(1, self.task.epochs + 1)
            if (sample.id, epoch) not in finished
        )
        self.progress.skipped = self.progress.total - len(queue)
        self.progress.done = self.progress.skipped
        self._tick()
        # Never cancelled (a write in its thread would go on regardless): stopped.
        flusher = asyncio.create_task(self._flush_loop())
        workers = [
            asyncio.create_task(self._work(queue)) for _ in range(min(self.max_samples, len(queue)))
        ]
        try:
            await asyncio.gather(*workers)
        except BaseException as exc:
            for worker in workers:
                worker.cancel()
            await asyncio.gather(*workers, return_exceptions=True)
            self._stop_flushing.set()
            await asyncio.gather(flusher, return_exceptions=True)
            stopped = isinstance(exc, asyncio.CancelledError | KeyboardInterrupt)
            status: RunStatus = "interrupted" if stopped else "failed"
            await asyncio.to_thread(self.store.set_status, run_id, status, ended_at=_now())
            raise
        self._stop_flushing.set()
        await flusher
        status = "interrupted" if self.progress.stopped is not None else "finished"
        await asyncio.to_thread(self.store.set_status, run_id, status, ended_at=_now())
        return self.progress

    async def _work(self, queue: deque[tuple[Sample, int]]) -> None:
        while queue and self.progress.stopped is None:
            sample, epoch = queue.popleft()
            self.progress.in_flight += 1
            self._tick()
            result: SampleResult | None = None
            span = start_sample(
                run_id=self.run_record.run_id, task=self.task.name, sample_id=sample.id, epoch=epoch
            )
            # Not a result unless it finishes: stopped by the budget, or interrupted.
            status, problem = "interrupted", None
            try:
                with active(span):
                    result = await self._attempts(sample, epoch)
            except (BudgetExceededError, _Stopped) as exc:
                # Not a result: a resume runs the sample again.
                log.info("sample %s/%s stopped: %s", sample.id, epoch, exc)
                status, problem = "stopped", str(exc)
                if self.progress.stopped is None:
                    self.progress.stopped = str(exc)
                queue.clear()
            finally:
                self.progress.in_flight -= 1
                first = result.scores[0] if result is not None and result.scores else None
                finish_sample(
                    span,
                    status=result.status if result is not None else status,
                    attempts=result.attempts if result is not None else 0,
                    limit=result.limit if result is not None else None,
                    error=result.error if result is not None else problem,
                    scorer=first.scorer if first is not None else None,
                    score=first.value if first is not None else None,
                )
            if result is not None:
                self._count(result)
                self._pending.append(result)
            self._tick()

    async def _attempts(self, sample: Sample, epoch: int) -> SampleResult:
        attempt = 1
        while True:
            job = SampleJob(
                run_id=self.run_record.run_id,
                sample=sample,
                epoch=epoch,
                attempt=attempt,
                limits=self.task.limits,
                pass_tag=self.pass_tag,
                trace=span_carrier(),
            )
            run = await self.executor.run(job)
            if run.stopped is not None:
                raise _Stopped(run.error or "the run's budget is spent")
            if run.status != "error" or attempt > self.task.retries:
                return await self._result(job, run)
            self.progress.retries += 1
            delay = min(self.retry_backoff * 2 ** (attempt - 1), RETRY_BACKOFF_MAX_S)
            log.info("sample %s/%s failed (%s); retry in %.1fs", sample.id, epoch, run.error, delay)
            await asyncio.sleep(delay * (0.5 + random.random() / 2))
            attempt += 1

    async def _result(self, job: SampleJob, run: SampleRun) -> SampleResult:
        status, error = run.status, run.error
        scores: list[ScoreValue] = []
        if status != "error":
            try:
                scores = await self._score(job, run)
            except ScorerError as exc:
                status, error, scores = "error", str(exc), []
        return SampleResult(
            run_id=job.run_id,
            sample_id=job.sample.id,
            epoch=job.epoch,
            input=job.sample.input,
            target=job.sample.target,
            output=run.output,
            status=status,
            error=error,
            limit=run.limit,
            scores=scores,
            started_at=_ts(run.started_at),
            ended_at=_ts(run.ended_at),
            duration_ms=round((run.ended_at - run.started_at) * 1000, 3),
            model_calls=run.model_calls,
            tool_calls=run.tool_calls,
            input_tokens=run.input_tokens,
            output_tokens=run.output_tokens,
            attempts=job.attempt,
            persona=run.persona,
            conversation_id=run.conversation_id,
            node=run.node,
            metadata=job.sample.metadata,
        )

    async def _score(self, job: SampleJob, run: SampleRun) -> list[ScoreValue]:
        out = []
        for scorer in self.scorers:
            grader = self.graders.get(scorer.name)
            grade = None
            if grader is not None:

                async def grade(prompt: str, grader: str = grader) -> str:
                    return await self.executor.grade(
                        grader, prompt, run.conversation_id, span_carrier()
                    )

            try:
                score = await scorer.score(job.sample, run.output, grade=grade)
            except (ScorerError, BudgetExceededError):
                raise
            except Exception as exc:  # boundary: a user's scorer function
                problem = f"{type(exc).__name__}: {exc}"
                raise ScorerError(f"scorer {scorer.name!r} failed: {problem}") from None
            out.append(
                ScoreValue(
                    scorer=scorer.name,
                    value=score.value,
                    answer=score.answer,
                    explanation=score.explanation,
                )
            )
        return out

    def _count(self, result: SampleResult) -> None:
        p = self.progress
        p.done += 1
        if result.status == "error":
            p.errors += 1
        if result.status == "limit":
            p.limits += 1
        if result.node:
            p.nodes[result.node] = p.nodes.get(result.node, 0) + 1
        if result.scores:
            p.score_sum += result.scores[0].value
            p.scored += 1

    async def _flush_loop(self) -> None:
        """Write what finished every ``flush_interval``; once stopped, the rest."""
        while True:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stop_flushing.wait(), self.flush_interval)
            # Set before this flush: nothing can be added after it.
            stopping = self._stop_flushing.is_set()
            try:
                await self._flush()
            except Exception:
                if stopping:
                    raise  # the last write failed: the run fails, saying why
                log.exception("writing eval results failed; trying again")
            if stopping:
                return

    async def _flush(self) -> None:
        batch, self._pending = self._pending, []
        if batch:
            try:
                await asyncio.to_thread(self.store.write_samples, batch)
            except Exception:
                self._pending[:0] = batch  # tried again by the next flush
                raise


__all__ = [
    "EvalRunner",
    "Executor",
    "LocalExecutor",
    "Progress",
    "model_label",
    "parse_model_option",
    "resolve_solver",
]
