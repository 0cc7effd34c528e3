"""Scorers (one :class:`Score` per sample output) and reducers over epochs.

A scorer is built from its spec in the task (:func:`build_scorers`). Built-in
scorers give values in 0..1; a ``python`` scorer's function may give any
float. A scorer that cannot score (a user function that raised, a
``model_graded`` scorer without a grader, a sample without the target it
needs) raises :class:`ScorerError`; the runner records the sample as an
error. :func:`reduce_scores` folds one sample's values over its epochs.

Normalisation: ``exact`` strips the text, collapses inner whitespace and
drops one trailing period (unless ``strip: false``); ``includes`` strips the
targets; ``ignore_case`` lowercases both sides.
"""

from __future__ import annotations

import asyncio
import inspect
import math
import re
import statistics
from collections import Counter
from collections.abc import Awaitable, Callable, Mapping
from pathlib import Path
from typing import Any, Protocol, assert_never

from pydantic import BaseModel

from coterie.runtime.errors import BudgetExceededError, CoterieError
from coterie.runtime.eval.dataset import import_function
from coterie.runtime.eval.task import (
    ChoiceSpec,
    EvalTask,
    ExactSpec,
    IncludesSpec,
    ModelGradedSpec,
    NumericSpec,
    PluginScorerSpec,
    PythonSpec,
    RegexSpec,
    Sample,
    ScorerSpec,
    TaskFileError,
    parse_reducer,
)


class ScorerError(CoterieError):
    """A scorer could not score a sample (the sample is recorded as an error)."""


class Score(BaseModel):
    """One scorer's verdict on one output."""

    value: float
    answer: str | None = None
    explanation: str = ""


#: Sends a prompt to the grader persona and returns its reply text.
Grade = Callable[[str], Awaitable[str]]


class Scorer(Protocol):
    """Scores one sample's output; raises :class:`ScorerError` when it cannot."""

    name: str

    async def score(self, sample: Sample, output: str, *, grade: Grade | None = None) -> Score: ...


def _targets(sample: Sample, scorer: str) -> list[str]:
    targets = sample.targets
    if not targets:
        raise ScorerError(f"scorer {scorer!r} needs a target; sample {sample.id!r} has none")
    return targets


def _verdict(answer: str | None, matched: str | None, targets: list[str]) -> Score:
    if matched is not None:
        return Score(value=1.0, answer=answer, explanation=f"matches the target {matched!r}")
    wanted = " or ".join(repr(t) for t in targets)
    return Score(value=0.0, answer=answer, explanation=f"expected {wanted}")


class ExactScorer:
    """The output equals a target."""

    def __init__(self, spec: ExactSpec) -> None:
        self.spec = spec
        self.name = spec.name or spec.type

    def normalise(self, text: str) -> str:
        if self.spec.strip:
            text = " ".join(text.split()).removesuffix(".").rstrip()
        return text.lower() if self.spec.ignore_case else text

    async def score(self, sample: Sample, output: str, *, grade: Grade | None = None) -> Score:
        targets = _targets(sample, self.name)
        answer = self.normalise(output)
        matched = next((t for t in targets if self.normalise(t) == answer), None)
        return _verdict(answer, matched, targets)


class IncludesScorer:
    """A target occurs in the output."""

    def __init__(self, spec: IncludesSpec) -> None:
        self.spec = spec
        self.name = spec.name or spec.type

    async def score(self, sample: Sample, output: str, *, grade: Grade | None = None) -> Score:
        targets = [t for t in _targets(sample, self.name) if t.strip()]
        if not targets:
            raise ScorerError(f"scorer {self.name!r}: sample {sample.id!r} has only blank targets")
        fold = str.lower if self.spec.ignore_case else str
        text = fold(output)
        matched = next((t for t in targets if fold(t.strip()) in text), None)
        return _verdict(matched.strip() if matched else None, matched, targets)


class RegexScorer:
    """The pattern's match (its ``group``) equals a target, or matches at all."""

    def __init__(self, spec: RegexSpec) -> None:
        self.spec = spec
        self.name = spec.name or spec.type
        self.pattern = re.compile(spec.pattern, re.IGNORECASE if spec.ignore_case else 0)

    async def score(self, sample: Sample, output: str, *, grade: Grade | None = None) -> Score:
        targets = _targets(sample, self.name) if self.spec.match_target else []
        match = self.pattern.search(output)
        answer = match.group(self.spec.group) if match else None
        if answer is None:
            return Score(value=0.0, explanation=f"no match of {self.spec.pattern!r}")
        if not self.spec.match_target:
            return Score(value=1.0, answer=answer, explanation=f"matches {self.spec.pattern!r}")
        norm = ExactScorer(ExactSpec(ignore_case=self.spec.ignore_case)).normalise
        matched = next((t for t in targets if norm(t) == norm(answer)), None)
        return _verdict(answer, matched, targets)


# 1,234.5 / -3 / 2e3 / .5 — a sign only where it is not a hyphen (gpt-4 gives 4, not -4).
_NUMBER = re.compile(
    r"(?<![\w.])[-+−]?(?:(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?|\.\d+)(?:[eE][-+]?\d+)?(?!\d)"
)


def parse_number(text: str) -> float | None:
    """The last number in ``text`` (``1,234.5``, ``-3``, ``2e3``), else None."""
    found = _NUMBER.findall(text)
    if not found:
        return None
    return float(found[-1].replace(",", "").replace("−", "-"))


class NumericScorer:
    """The last number in the output is a target number, within the tolerance."""

    def __init__(self, spec: NumericSpec) -> None:
        self.spec = spec
        self.name = spec.name or spec.type

    def close(self, value: float, target: float) -> bool:
        bound = self.spec.tolerance * (abs(target) if self.spec.relative else 1.0)
        diff = abs(value - target)
        # 1.1 vs 1.0 with tolerance 0.1 is within it, float rounding aside.
        return diff <= bound or math.isclose(diff, bound, rel_tol=1e-9, abs_tol=1e-12)

    async def score(self, sample: Sample, output: str, *, grade: Grade | None = None) -> Score:
        targets = _targets(sample, self.name)
        numbers: list[float] = []
        for target in targets:
            number = parse_number(target)
            if number is None or _NUMBER.fullmatch(target.strip()) is None:
                raise ScorerError(
                    f"scorer {self.name!r}: target {target!r} of sample {sample.id!r} "
                    "is not a number"
                )
            numbers.append(number)
        value = parse_number(output)
        if value is None:
            return Score(value=0.0, explanation="no number in the output")
        answer = f"{value:g}"
        pairs = zip(targets, numbers, strict=True)
        matched = next((t for t, number in pairs if self.close(value, number)), None)
        return _verdict(answer, matched, targets)


_CHOICE_FORMATS = (
    re.compile(r"\bANSWER\s*[:：]\s*[(\[]?([A-Z])\b", re.IGNORECASE),  # ANSWER: B
    re.compile(r"^\s*[(\[]?([A-Z])[)\].:]?\s*$", re.IGNORECASE),  # a lone letter
    re.compile(r"(?<!\w)[(\[]([A-Z])[)\]]", re.IGNORECASE),  # (B) or [B]
    re.compile(r"(?<![\w.])([A-Z])[.)](?!\w)"),  # B. or B) (capitals only: not "e.g.")
)


def parse_choice(text: str) -> str | None:
    """The answer letter of a multiple-choice output (upper case), else None."""
    for pattern in _CHOICE_FORMATS:
        found = pattern.findall(text)
        if found:
            return str(found[-1]).upper()
    return None


class ChoiceScorer:
    """The answer letter in the output is a target letter."""

    def __init__(self, spec: ChoiceSpec) -> None:
        self.spec = spec
        self.name = spec.name or spec.type

    async def score(self, sample: Sample, output: str, *, grade: Grade | None = None) -> Score:
        targets = _targets(sample, self.name)
        letters = [t.strip().strip("()[].").upper() for t in targets]
        if not all(len(letter) == 1 and "A" <= letter <= "Z" for letter in letters):
            raise ScorerError(
                f"scorer {self.name!r}: sample {sample.id!r} has target {sample.target!r}; "
                "expected a letter A-Z (or a list of them)"
            )
        answer = parse_choice(output)
        if answer is None:
            return Score(value=0.0, explanation="no answer letter in the output")
        pairs = zip(targets, letters, strict=True)
        matched = next((t for t, letter in pairs if letter == answer), None)
        return _verdict(answer, matched, targets)


class PythonScorer:
    """A user function: ``func(sample, output) -> bool | float | Score``
    (a ``python`` scorer's, or one a plugin registered)."""

    def __init__(self, spec: PythonSpec | PluginScorerSpec, function: Callable[..., Any]) -> None:
        self.spec = spec
        # A plugin's scorer is named after itself unless the task names it.
        default = spec.scorer if isinstance(spec, PluginScorerSpec) else spec.type
        self.name = spec.name or default
        self.function = function
        self.origin = spec.function if isinstance(spec, PythonSpec) else f"plugin {spec.scorer}"

    async def score(self, sample: Sample, output: str, *, grade: Grade | None = None) -> Score:
        try:
            if inspect.iscoroutinefunction(self.function):
                result = await self.function(sample, output)
            else:
                # A sync function may be slow: keep it off the event loop.
                result = await asyncio.to_thread(self.function, sample, output)
                if inspect.isawaitable(result):
                    result = await result
        except Exception as exc:  # the user's code: its failure is the sample's error
            raise ScorerError(
                f"scorer {self.name!r} ({self.origin}) failed on sample {sample.id!r}: "
                f"{type(exc).__name__}: {exc}"
            ) from exc
        if isinstance(result, Score):
            return result
        if isinstance(result, bool):
            return Score(value=1.0 if result else 0.0)
        if isinstance(result, int | float) and math.isfinite(result):
            return Score(value=float(result))
        raise ScorerError(
            f"scorer {self.name!r} ({self.origin}) returned {result!r}; "
            "expected a bool, a finite number or a Score"
        )


DEFAULT_GRADER_INSTRUCTIONS = (
    "Grade the submitted answer against the target and the rubric. Explain your reasoning "
    "briefly, then end your reply with one line: 'GRADE: C' if the answer is correct, "
    "'GRADE: P' if it is partially correct, or 'GRADE: I' if it is incorrect."
)
_GRADE_VALUES = {"C": 1.0, "P": 0.5, "I": 0.0}


class ModelGradedScorer:
    """A grader persona grades the output C (1.0), P (0.5) or I (0.0)."""

    def __init__(self, spec: ModelGradedSpec) -> None:
        self.spec = spec
        self.name = spec.name or spec.type
        self.grade_pattern = re.compile(spec.grade_pattern)

    def prompt(self, sample: Sample, output: str) -> str:
        """The text sent to the grader."""
        target = " | ".join(sample.targets) or "(none given)"
        instructions = self.spec.instructions or DEFAULT_GRADER_INSTRUCTIONS
        return (
            "You are grading an answer to a task.\n\n"
            f"[Task]\n{sample.input}\n\n"
            f"[Target answer]\n{target}\n\n"
            f"[Submitted answer]\n{output}\n\n"
            f"[Rubric]\n{self.spec.rubric}\n\n"
            f"{instructions}"
        )

    async def score(self, sample: Sample, output: str, *, grade: Grade | None = None) -> Score:
        if grade is None:
            raise ScorerError(f"scorer {self.name!r} is model_graded and needs a grader")
        try:
            reply = await grade(self.prompt(sample, output))
        except BudgetExceededError:
            raise  # the run's budget is spent: the run stops, the sample is not scored
        except Exception as exc:  # the grader's failure is the sample's error
            raise ScorerError(
                f"scorer {self.name!r}: the grader failed on sample {sample.id!r}: "
                f"{type(exc).__name__}: {exc}"
            ) from exc
        matches = list(self.grade_pattern.finditer(reply))
        letter = (matches[-1].group(1) or "").strip().upper() if matches else ""
        if letter not in _GRADE_VALUES:
            return Score(value=0.0, explanation=f"no grade in the grader's reply: {reply}")
        return Score(value=_GRADE_VALUES[letter], answer=letter, explanation=reply)


#: Scorer name -> function, from the plugins (see runtime.plugins.loader).
PluginScorers = Mapping[str, Callable[..., Any]]


def build_scorer(
    spec: ScorerSpec, *, base_dir: Path, plugin_scorers: PluginScorers | None = None
) -> Scorer:
    """The scorer of one spec. A python function that cannot be imported raises
    ImportError, AttributeError or ValueError (:func:`build_scorers` names the
    field), as does a plugin scorer no plugin registered."""
    if isinstance(spec, ExactSpec):
        return ExactScorer(spec)
    if isinstance(spec, IncludesSpec):
        return IncludesScorer(spec)
    if isinstance(spec, RegexSpec):
        return RegexScorer(spec)
    if isinstance(spec, NumericSpec):
        return NumericScorer(spec)
    if isinstance(spec, ChoiceSpec):
        return ChoiceScorer(spec)
    if isinstance(spec, PythonSpec):
        return PythonScorer(spec, import_function(spec.function, base_dir=base_dir))
    if isinstance(spec, PluginScorerSpec):
        found = (plugin_scorers or {}).get(spec.scorer)
        if found is None:
            known = ", ".join(sorted(plugin_scorers or {})) or "none"
            raise ValueError(f"no plugin registered a scorer {spec.scorer!r} (loaded: {known})")
        return PythonScorer(spec, found)
    if isinstance(spec, ModelGradedSpec):
        return ModelGradedScorer(spec)
    assert_never(spec)


def build_scorers(task: EvalTask, plugin_scorers: PluginScorers | None = None) -> list[Scorer]:
    """The task's scorers, in order; an unimportable function (or a plugin
    scorer nobody registered) raises :class:`TaskFileError`."""
    scorers: list[Scorer] = []
    problems: list[str] = []
    for i, spec in enumerate(task.scorers):
        try:
            scorers.append(
                build_scorer(spec, base_dir=task.base_dir, plugin_scorers=plugin_scorers)
            )
        except (ImportError, AttributeError, ValueError) as exc:
            if isinstance(spec, PluginScorerSpec):
                problems.append(f"scorers.{i}.scorer: {exc}")
                continue
            function = getattr(spec, "function", "")
            problems.append(f"scorers.{i}.function: cannot import {function!r}: {exc}")
    if problems:
        raise TaskFileError(task.label, problems)
    return scorers


def grader_of(spec: ScorerSpec) -> str | None:
    """The grader persona a model_graded spec names (None: the solver's, or not graded)."""
    return spec.grader if isinstance(spec, ModelGradedSpec) else None


def needs_grader(spec: ScorerSpec) -> bool:
    """Whether the scorer calls a grader (``grade`` must be given to ``score``)."""
    return isinstance(spec, ModelGradedSpec)


def reduce_scores(reducer: str, values: list[float]) -> float:
    """One sample's values over its epochs, folded by ``reducer``.

    ``mode`` breaks ties towards the larger value; ``pass@k`` is the unbiased
    estimator ``1 - C(n-c, k) / C(n, k)`` (``c``: values >= 1.0).
    """
    name, k = parse_reducer(reducer)
    if not values:
        raise ValueError(f"reducer {reducer!r} needs at least one value")
    if name == "mean":
        return statistics.fmean(values)
    if name == "max":
        return max(values)
    if name == "min":
        return min(values)
    if name == "median":
        return float(statistics.median(values))
    if name == "mode":
        counts = Counter(values)
        return max(counts, key=lambda v: (counts[v], v))
    assert name == "pass" and k is not None
    n = len(values)
    if k > n:
        raise ValueError(f"{reducer} needs at least {k} values, got {n}")
    c = sum(1 for v in values if v >= 1.0)
    if n - c < k:
        return 1.0
    return 1.0 - math.comb(n - c, k) / math.comb(n, k)


__all__ = [
    "DEFAULT_GRADER_INSTRUCTIONS",
    "ChoiceScorer",
    "ExactScorer",
    "Grade",
    "IncludesScorer",
    "ModelGradedScorer",
    "NumericScorer",
    "PythonScorer",
    "RegexScorer",
    "Score",
    "Scorer",
    "ScorerError",
    "build_scorer",
    "build_scorers",
    "grader_of",
    "needs_grader",
    "parse_choice",
    "parse_number",
    "parse_reducer",
    "reduce_scores",
]
