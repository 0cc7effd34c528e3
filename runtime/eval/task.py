"""An eval task: what to ask (dataset), who answers (solver), how to score.

A task is an :class:`EvalTask`, written as YAML and read by :func:`load_task`,
or built in Python. Every problem with the file is a :class:`TaskFileError`
naming the file, the dotted field path (``scorers.1.tolerance``) and what
was expected. :func:`runtime.eval.dataset.load_samples` reads the dataset
(JSONL, CSV or a Python function) into :class:`Sample` rows; the scorers are
built from the specs by :mod:`runtime.eval.scorers`.

The dataset and ``file.py:func`` references are relative to the task file's
folder (``EvalTask.base_dir``).
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Annotated, Any, Literal, get_args

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PrivateAttr,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)

from coterie.runtime.config import PERSONA_NAME_RE, PersonaConfig
from coterie.runtime.config.models import BUILTIN_PROVIDERS
from coterie.runtime.errors import ConfigError

TASK_NAME_RE = re.compile(r"^[A-Za-z0-9_.-]+$")
#: The reducers a task may name; ``pass@K`` takes K from the name.
REDUCERS = ("mean", "max", "min", "mode", "median", "pass@K")
#: Sample fields a dataset's ``fields`` may rename.
SAMPLE_FIELDS = ("id", "input", "target", "metadata")
# The provider tags of ModelConfig (pydantic puts them in error paths).
_PROVIDERS = frozenset((*BUILTIN_PROVIDERS, "plugin"))
_FORMATS_BY_SUFFIX = {".jsonl": "jsonl", ".json": "jsonl", ".ndjson": "jsonl", ".csv": "csv"}


class TaskFileError(ConfigError):
    """An eval task file (or its dataset) is invalid: names the file and the fields."""

    def __init__(self, path: str, problems: list[str]) -> None:
        self.path = path
        self.problems = problems
        lines = "\n".join(f"  - {p}" for p in problems)
        super().__init__(f"invalid eval task {path}:\n{lines}")

    def __reduce__(self) -> tuple[type, tuple[str, list[str]]]:
        # Errors cross actor boundaries pickled; keep the constructor's arguments.
        return (type(self), (self.path, self.problems))


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class Sample(_Strict):
    """One dataset row. A list ``target`` holds several acceptable answers."""

    id: str
    input: str
    target: str | list[str] = ""
    metadata: dict[str, Any] = Field(default_factory=dict)

    @property
    def targets(self) -> list[str]:
        """The acceptable answers as a list (empty when there is no target)."""
        if isinstance(self.target, str):
            return [self.target] if self.target else []
        return list(self.target)


class DatasetSpec(_Strict):
    """Where the samples come from: exactly one of ``path`` or ``function``."""

    path: str | None = Field(default=None, description="JSONL or CSV file")
    format: Literal["jsonl", "csv"] | None = Field(
        default=None, description="default: from the suffix of path"
    )
    function: str | None = Field(
        default=None, description="'package.module:func' or 'file.py:func' returning rows"
    )
    loader: str | None = Field(
        default=None, description="a dataset loader a plugin registered (DATASETS), by name"
    )
    fields: dict[str, str] = Field(
        default_factory=dict, description="sample field -> column, e.g. {input: question}"
    )

    @field_validator("fields")
    @classmethod
    def _known_fields(cls, value: dict[str, str]) -> dict[str, str]:
        unknown = sorted(set(value) - set(SAMPLE_FIELDS))
        if unknown:
            raise ValueError(f"expected keys among {', '.join(SAMPLE_FIELDS)}, got {unknown}")
        return value

    @model_validator(mode="after")
    def _one_source(self) -> DatasetSpec:
        given = [k for k in ("path", "function", "loader") if getattr(self, k) is not None]
        if len(given) != 1:
            found = " and ".join(given) if given else "none"
            raise ValueError(
                f"expected exactly one of 'path', 'function' or 'loader', found {found}"
            )
        if self.function is not None or self.loader is not None:
            if self.function is not None:
                check_ref(self.function)
            if self.format is not None:
                raise ValueError("'format' applies to 'path' only")
        elif self.format is None:
            suffix = Path(self.path or "").suffix.lower()
            if suffix not in _FORMATS_BY_SUFFIX:
                raise ValueError(
                    f"cannot tell the format of {self.path!r} from its suffix; "
                    "expected .jsonl, .json or .csv, or set 'format: jsonl' or 'format: csv'"
                )
        return self

    @property
    def resolved_format(self) -> Literal["jsonl", "csv"]:
        """``format``, else the one the suffix of ``path`` implies."""
        if self.format is not None:
            return self.format
        suffix = Path(self.path or "").suffix.lower()
        return "csv" if _FORMATS_BY_SUFFIX.get(suffix) == "csv" else "jsonl"


class SolverSpec(_Strict):
    """Who answers: a persona of the home (``persona``) or an ``inline`` one.

    ``inline`` is a persona.yaml body plus an optional ``soul`` text; ``model``
    is a persona.yaml ``model:`` mapping that replaces the persona's model.
    """

    persona: str | None = None
    model: dict[str, Any] | None = None
    inline: dict[str, Any] | None = None

    @field_validator("persona")
    @classmethod
    def _persona_name(cls, value: str | None) -> str | None:
        return _persona_name(value)

    @field_validator("model")
    @classmethod
    def _model(cls, value: dict[str, Any] | None) -> dict[str, Any] | None:
        problems = [] if value is None else _persona_problems({"model": value}, only="model")
        if problems:
            raise ValueError("; ".join(_unprefix(p, "model") for p in problems))
        return value

    @field_validator("inline")
    @classmethod
    def _inline(cls, value: dict[str, Any] | None, info: ValidationInfo) -> dict[str, Any] | None:
        if value is None:
            return value
        body = {k: v for k, v in value.items() if k != "soul"}
        if "model" not in body and info.data.get("model") is not None:
            body["model"] = info.data["model"]
        problems = _persona_problems(body)
        if not isinstance(value.get("soul", ""), str):
            problems.append(f"soul: expected a string, got {type(value['soul']).__name__}")
        if problems:
            raise ValueError("; ".join(problems))
        return value

    @model_validator(mode="after")
    def _one_persona(self) -> SolverSpec:
        if (self.persona is None) == (self.inline is None):
            found = "both" if self.persona is not None else "neither"
            raise ValueError(f"expected exactly one of 'persona' or 'inline', found {found}")
        return self


def _persona_name(value: str | None) -> str | None:
    if value is not None and not PERSONA_NAME_RE.fullmatch(value):
        raise ValueError(
            f"expected a persona name (lowercase letters, digits, - or _), got {value!r}"
        )
    return value


def _unprefix(problem: str, field: str) -> str:
    for prefix in (f"{field}.", f"{field}: "):
        problem = problem.removeprefix(prefix)
    return problem


def _persona_problems(body: dict[str, Any], *, only: str | None = None) -> list[str]:
    """What is wrong with a persona.yaml body (``only``: keep errors under that field)."""
    try:
        PersonaConfig.model_validate(body)
    except ValidationError as exc:
        errors = [e for e in exc.errors() if only is None or e["loc"][:1] == (only,)]
        return [describe_error(dict(e)) for e in errors]
    return []


class _ScorerBase(_Strict):
    name: str | None = Field(default=None, description="default: the type")


class ExactSpec(_ScorerBase):
    """The output equals a target (after normalisation)."""

    type: Literal["exact"] = "exact"
    ignore_case: bool = True
    strip: bool = True


class IncludesSpec(_ScorerBase):
    """A target occurs in the output."""

    type: Literal["includes"] = "includes"
    ignore_case: bool = True


class RegexSpec(_ScorerBase):
    """The pattern's match (``group``) equals a target, or (``match_target: false``) matches."""

    type: Literal["regex"] = "regex"
    pattern: str
    ignore_case: bool = False
    group: int | str = 0
    match_target: bool = True

    @field_validator("pattern")
    @classmethod
    def _compiles(cls, value: str) -> str:
        try:
            re.compile(value)
        except re.error as exc:
            raise ValueError(f"expected a regular expression, got {value!r} ({exc})") from None
        return value

    @model_validator(mode="after")
    def _group_exists(self) -> RegexSpec:
        compiled = re.compile(self.pattern)
        group = self.group
        if isinstance(group, str) and group.isdigit():
            group = self.group = int(group)
        if isinstance(group, int) and not 0 <= group <= compiled.groups:
            raise ValueError(f"group: the pattern has {compiled.groups} group(s), got {group}")
        if isinstance(group, str) and group not in compiled.groupindex:
            names = ", ".join(compiled.groupindex) or "none"
            raise ValueError(f"group: no group named {group!r} (named groups: {names})")
        return self


class NumericSpec(_ScorerBase):
    """The last number in the output is the target number (within ``tolerance``)."""

    type: Literal["numeric"] = "numeric"
    tolerance: float = Field(default=0.0, ge=0)
    relative: bool = False


class ChoiceSpec(_ScorerBase):
    """The multiple-choice letter in the output is the target letter."""

    type: Literal["choice"] = "choice"


class PythonSpec(_ScorerBase):
    """``func(sample, output) -> bool | float | Score``, sync or async."""

    type: Literal["python"] = "python"
    function: str

    @field_validator("function")
    @classmethod
    def _ref(cls, value: str) -> str:
        check_ref(value)
        return value


class PluginScorerSpec(_ScorerBase):
    """A scorer a plugin registered (``SCORERS``), by name: it is called as a
    ``python`` scorer's function is."""

    type: Literal["plugin"] = "plugin"
    scorer: str = Field(min_length=1)


class ModelGradedSpec(_ScorerBase):
    """A grader persona reads the input, target, output and rubric and grades C/P/I."""

    type: Literal["model_graded"] = "model_graded"
    grader: str | None = Field(default=None, description="a persona; default: the solver's")
    rubric: str
    instructions: str | None = Field(default=None, description="default: ask for GRADE: C/P/I")
    grade_pattern: str = r"GRADE:\s*([CPI])"

    @field_validator("grader")
    @classmethod
    def _grader(cls, value: str | None) -> str | None:
        return _persona_name(value)

    @field_validator("grade_pattern")
    @classmethod
    def _one_group(cls, value: str) -> str:
        try:
            groups = re.compile(value).groups
        except re.error as exc:
            raise ValueError(f"expected a regular expression, got {value!r} ({exc})") from None
        if groups < 1:
            raise ValueError(f"expected a pattern with a group capturing the grade, got {value!r}")
        return value


ScorerSpec = Annotated[
    ExactSpec
    | IncludesSpec
    | RegexSpec
    | NumericSpec
    | ChoiceSpec
    | PythonSpec
    | PluginScorerSpec
    | ModelGradedSpec,
    Field(discriminator="type"),
]
#: The ``type`` of every scorer spec, in the order of the union.
SCORER_TYPES: tuple[str, ...] = tuple(
    get_args(spec.model_fields["type"].annotation)[0] for spec in get_args(get_args(ScorerSpec)[0])
)


class SampleLimits(_Strict):
    """Per-sample limits; ``None`` is no limit."""

    time_s: float | None = Field(default=None, gt=0)
    model_calls: int | None = Field(default=None, ge=1)
    tokens: int | None = Field(default=None, ge=1)
    tool_calls: int | None = Field(default=None, ge=0)


#: A reducer name: mean, max, min, mode, median or pass@K.
Reducer = str


def parse_reducer(text: str) -> tuple[str, int | None]:
    """``"pass@3"`` -> ``("pass", 3)``, ``"mean"`` -> ``("mean", None)``; else ValueError."""
    if text in REDUCERS[:-1]:
        return text, None
    match = re.fullmatch(r"pass@(\d+)", text)
    if match and int(match.group(1)) >= 1:
        return "pass", int(match.group(1))
    raise ValueError(f"expected one of {', '.join(REDUCERS)} (K >= 1), got {text!r}")


class EvalTask(_Strict):
    """One eval task. ``base_dir`` (not serialised) anchors its relative paths."""

    name: str
    description: str = ""
    dataset: DatasetSpec
    solver: SolverSpec
    scorers: list[ScorerSpec] = Field(min_length=1)
    epochs: int = Field(default=1, ge=1, le=100)
    reducers: list[Reducer] = Field(default_factory=lambda: ["mean"], min_length=1)
    limits: SampleLimits = Field(default_factory=SampleLimits)
    retries: int = Field(default=2, ge=0, le=10, description="retries of an errored sample")
    max_samples: int = Field(default=16, ge=1, le=10_000, description="samples in flight")
    max_connections: int = Field(
        default=8, ge=1, le=10_000, description="concurrent model calls per provider"
    )
    base_dir: Path = Field(default=Path("."), exclude=True)
    _source: Path | None = PrivateAttr(default=None)

    @field_validator("name")
    @classmethod
    def _name(cls, value: str) -> str:
        if not TASK_NAME_RE.fullmatch(value):
            raise ValueError(f"expected letters, digits, '_', '.' or '-' only, got {value!r}")
        return value

    @field_validator("scorers")
    @classmethod
    def _unique_names(cls, value: list[ScorerSpec]) -> list[ScorerSpec]:
        seen: dict[str, int] = {}
        for i, spec in enumerate(value):
            name = spec.name or spec.type
            if name in seen:
                raise ValueError(
                    f"scorers {seen[name]} and {i} are both named {name!r}; "
                    "expected unique names (set 'name:')"
                )
            seen[name] = i
        return value

    @field_validator("reducers")
    @classmethod
    def _reducers(cls, value: list[str], info: ValidationInfo) -> list[str]:
        epochs = info.data.get("epochs")  # None: epochs itself is invalid
        problems = []
        for text in value:
            try:
                _, k = parse_reducer(text)
            except ValueError as exc:
                problems.append(str(exc))
                continue
            if k is not None and epochs is not None and k > epochs:
                problems.append(f"{text}: expected K <= epochs ({epochs}), got {k}")
        if len(set(value)) != len(value):
            problems.append(f"expected each reducer once, got {value}")
        if problems:
            raise ValueError("; ".join(problems))
        return value

    @property
    def source(self) -> Path | None:
        """The task file :func:`load_task` read, if any."""
        return self._source

    @property
    def label(self) -> str:
        """How errors name the task: its file, else its name."""
        return str(self._source) if self._source is not None else f"<task {self.name}>"


def describe_error(err: dict[str, Any]) -> str:
    """One pydantic error as ``dotted.field: what was expected, what was found``."""
    parts: list[str] = []
    for i, part in enumerate(err["loc"]):
        # A discriminated union puts the tag in the path: scorers.1.numeric.tolerance.
        before = err["loc"][i - 1] if i else None
        if (isinstance(before, int) and part in SCORER_TYPES) or (
            before == "model" and part in _PROVIDERS
        ):
            continue
        parts.append(str(part))
    loc = ".".join(parts) or "(top level)"
    msg = str(err["msg"]).removeprefix("Value error, ")
    kind = err["type"]
    in_scorers = len(parts) == 2 and parts[0] == "scorers"
    if kind == "union_tag_invalid":
        tag, expected = err["ctx"]["tag"], err["ctx"]["expected_tags"]
        if in_scorers:
            msg = f"unknown scorer type {tag!r}; expected one of {', '.join(SCORER_TYPES)}"
        else:
            msg = f"expected one of {expected}, got {tag!r}"
    elif kind == "union_tag_not_found":
        if in_scorers:
            msg = f"missing 'type'; expected one of {', '.join(SCORER_TYPES)}"
        else:
            msg = f"missing {err['ctx']['discriminator']}"
    elif kind == "extra_forbidden":
        msg = "unknown field"
    elif kind == "missing":
        msg = "required field missing"
    elif "input" in err and kind not in ("value_error", "assertion_error"):
        msg = f"{msg}, got {err['input']!r}"
    return f"{loc}: {msg}"


def load_task(path: str | os.PathLike[str]) -> EvalTask:
    """Read a task YAML file; every problem raises :class:`TaskFileError`."""
    file = Path(path)
    label = str(file)
    if not file.is_file():
        raise TaskFileError(label, ["file not found"])
    try:
        raw = yaml.safe_load(file.read_text(encoding="utf-8"))
    except (yaml.YAMLError, UnicodeDecodeError) as exc:
        raise TaskFileError(label, [f"not valid YAML: {exc}"]) from None
    if not isinstance(raw, dict):
        found = "an empty file" if raw is None else type(raw).__name__
        raise TaskFileError(label, [f"(top level): expected a mapping, got {found}"])
    if "base_dir" in raw:
        raise TaskFileError(label, ["base_dir: unknown field (it is the task file's folder)"])
    try:
        task = EvalTask.model_validate({**raw, "base_dir": file.resolve().parent})
    except ValidationError as exc:
        raise TaskFileError(label, [describe_error(dict(e)) for e in exc.errors()]) from None
    task._source = file
    return task


def check_ref(ref: str) -> None:
    module, sep, func = ref.rpartition(":")
    if not sep or not module or not re.fullmatch(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)*", func):
        raise ValueError(f"expected 'package.module:func' or 'file.py:func', got {ref!r}")


__all__ = [
    "REDUCERS",
    "SCORER_TYPES",
    "ChoiceSpec",
    "DatasetSpec",
    "EvalTask",
    "ExactSpec",
    "IncludesSpec",
    "ModelGradedSpec",
    "NumericSpec",
    "PluginScorerSpec",
    "PythonSpec",
    "Reducer",
    "RegexSpec",
    "Sample",
    "SampleLimits",
    "ScorerSpec",
    "SolverSpec",
    "TaskFileError",
    "check_ref",
    "describe_error",
    "load_task",
    "parse_reducer",
]
