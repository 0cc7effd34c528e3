"""The tool contract and the registry.

A tool is a typed async function ``fn(args, ctx)``: ``args`` is one pydantic
model — the single source of the JSON schema the model sees and of argument
validation — and ``ctx`` is the :class:`~runtime.context.TurnContext`, never
part of the schema. A tool reads its turn from ``ctx``, what it is given
from ``ctx.settings``, reaches the runtime through ``ctx.services`` and
reports through ``ctx.outputs``.
"""

from __future__ import annotations

import copy
import dataclasses
import fnmatch
import functools
import inspect
import re
import typing
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from typing import Any, Literal, Protocol

from pydantic import BaseModel, ConfigDict, Field
from pydantic.json_schema import GenerateJsonSchema

from coterie.runtime.context import TurnContext
from coterie.runtime.errors import CoterieError
from coterie.runtime.messages import ToolDefinition

ToolFn = Callable[[Any, TurnContext], Awaitable[Any]]
#: How a tool's validated arguments become the effect permission rules read:
#: a :class:`runtime.permissions.effects.Effect`, or an awaitable of one (a
#: host lookup). Typed loosely: the permissions package sits above this module.
EffectFn = Callable[[Any, TurnContext], Any]

#: What providers accept as a tool name (OpenAI's and Anthropic's rule).
TOOL_NAME_RE = re.compile(r"^[A-Za-z][A-Za-z0-9_-]{0,63}$")

PUSHED_NEXT = (
    "Completion will be pushed to this conversation automatically. Do not poll this "
    "handle; use task_status or task_cancel only if the user asks."
)


class ToolDefinitionError(CoterieError, TypeError):
    """A function cannot be a tool (not async, not ``(args, ctx)``, no pydantic
    argument model, no description, or a model with no JSON schema); names it."""

    def __init__(self, tool_name: str, problem: str) -> None:
        self.tool_name = tool_name
        self.problem = problem
        super().__init__(f"tool {tool_name!r}: {problem}")

    def __reduce__(self) -> tuple[type, tuple[str, str]]:
        return (type(self), (self.tool_name, self.problem))


class Deferred(BaseModel):
    """What a tool returns when it started work that reports back later.

    The runner marks the call *deferred*; when every call of an assistant
    message is deferred, the turn ends, and the completion arrives in the
    conversation as a wake (see :mod:`runtime.delegation`).
    """

    model_config = ConfigDict(extra="allow")

    deferred: Literal[True] = True
    kind: str
    handle: str
    next: str = Field(default=PUSHED_NEXT)


@dataclass(frozen=True)
class ToolSpec:
    """A registered tool and the rules for offering it."""

    name: str
    description: str
    args_model: type[BaseModel]
    fn: ToolFn
    timeout: float = 30.0
    contexts: Literal["all"] | frozenset[str] = "all"
    allow_repeat: bool = False
    # A successful call ends the turn (end_task).
    terminal: bool = False
    # Delegation tools are withheld from subagents (depth > 0).
    delegation: bool = False
    available: Callable[[TurnContext], bool] | None = None
    customize: Callable[[ToolSpec, TurnContext], ToolSpec | None] | None = None
    # A schema given as is (an MCP server's): shown instead of the args
    # model's, which then only has to accept it (see ``PassThrough``).
    parameters: dict[str, Any] | None = None
    # Hints about the tool (an MCP server's annotations: read_only_hint, title…).
    annotations: dict[str, Any] | None = None
    # What a call does, for permission rules (None: its arguments).
    effect: EffectFn | None = None

    def schema(self) -> dict[str, Any]:
        """The JSON schema of the arguments: the given one, else the pydantic model's."""
        if self.parameters is not None:
            return copy.deepcopy(self.parameters)
        return copy.deepcopy(_schema_of(self.args_model))

    def definition(self) -> ToolDefinition:
        """What the model is shown; built once per spec (schemas are costly)."""
        cached: ToolDefinition | None = self.__dict__.get("_definition")
        if cached is None:
            cached = ToolDefinition(
                name=self.name, description=self.description, parameters=self.schema()
            )
            # A frozen dataclass still has a __dict__ to memoize into.
            object.__setattr__(self, "_definition", cached)
        return cached

    def offered_in(self, context: str) -> bool:
        return self.contexts == "all" or context in self.contexts


class PassThrough(BaseModel):
    """The arguments of a tool whose schema someone else checks (MCP): any object."""

    model_config = ConfigDict(extra="allow")

    def arguments(self) -> dict[str, Any]:
        return dict(self.model_extra or {})


class ToolSource(Protocol):
    """Tools that come and go while a persona runs (an MCP server's).

    :meth:`refresh` runs before every model call of a turn; :meth:`specs` is
    then read synchronously and filtered like the registry's own tools.
    """

    async def refresh(self) -> None: ...

    def specs(self) -> Iterable[ToolSpec]: ...


class _ToolJsonSchema(GenerateJsonSchema):
    """Pydantic's JSON schema without the titles it makes up from names.

    Every property would otherwise carry ``"title": "Max Results"`` beside
    its name ``max_results``: tokens in every request that tell the model
    nothing (97 of them over the built-in tools). Titles given with
    ``Field(title=...)`` stay.
    """

    def field_title_should_be_set(self, schema: Any) -> bool:
        return False


@functools.cache
def _schema_of(args_model: type[BaseModel]) -> dict[str, Any]:
    schema = args_model.model_json_schema(schema_generator=_ToolJsonSchema)
    schema.pop("title", None)
    # A nested model or enum is titled with its class name, its key in $defs.
    for name, definition in schema.get("$defs", {}).items():
        if isinstance(definition, dict) and definition.get("title") == name:
            del definition["title"]
    schema.setdefault("properties", {})
    return schema


def tool(
    *,
    name: str | None = None,
    description: str | None = None,
    timeout: float = 30.0,
    contexts: Literal["all"] | Iterable[str] = "all",
    allow_repeat: bool = False,
    terminal: bool = False,
    delegation: bool = False,
    available: Callable[[TurnContext], bool] | None = None,
    customize: Callable[[ToolSpec, TurnContext], ToolSpec | None] | None = None,
    effect: EffectFn | None = None,
) -> Callable[[ToolFn], ToolSpec]:
    """Turn ``async def fn(args: ArgsModel, ctx: TurnContext)`` into a :class:`ToolSpec`.

    The argument model comes from the annotation of the first parameter and
    the description from the docstring unless given. ``effect(args, ctx)``
    says what a call does for permission rules (default: its arguments).
    """

    def wrap(fn: ToolFn) -> ToolSpec:
        label: str = name or getattr(fn, "__name__", None) or repr(fn)
        if not inspect.iscoroutinefunction(fn):
            raise ToolDefinitionError(label, "must be an async function")
        params = list(inspect.signature(fn).parameters)
        if len(params) != 2:
            raise ToolDefinitionError(label, "must take (args, ctx)")
        try:
            hints = typing.get_type_hints(fn)
        except Exception as exc:  # an annotation that names nothing importable
            raise ToolDefinitionError(label, f"its annotations do not resolve: {exc}") from None
        args_model = hints.get(params[0])
        if not (isinstance(args_model, type) and issubclass(args_model, BaseModel)):
            raise ToolDefinitionError(label, "first parameter must be a pydantic model")
        desc = description or inspect.cleandoc(fn.__doc__ or "")
        if not desc:
            raise ToolDefinitionError(label, "needs a description or docstring")
        return ToolSpec(
            name=name or fn.__name__,
            description=desc,
            args_model=args_model,
            fn=fn,
            timeout=timeout,
            contexts="all" if contexts == "all" else frozenset(contexts),
            allow_repeat=allow_repeat,
            terminal=terminal,
            delegation=delegation,
            available=available,
            customize=customize,
            effect=effect,
        )

    return wrap


def check_spec(spec: object) -> ToolSpec:
    """``spec`` if it is a usable tool: a :class:`ToolSpec` with a valid name,
    a pydantic argument model whose JSON schema can be made, and an async
    function; else :class:`ToolDefinitionError` naming it and why."""
    if not isinstance(spec, ToolSpec):
        what = getattr(spec, "__name__", None) or type(spec).__name__
        raise ToolDefinitionError(
            str(what), "is not a tool (decorate an async function with @tool)"
        )
    if not TOOL_NAME_RE.match(spec.name):
        raise ToolDefinitionError(
            spec.name, "a tool name is 1-64 letters, digits, '_' or '-', starting with a letter"
        )
    if not (isinstance(spec.args_model, type) and issubclass(spec.args_model, BaseModel)):
        raise ToolDefinitionError(spec.name, "its argument model is not a pydantic model")
    if not inspect.iscoroutinefunction(spec.fn):
        raise ToolDefinitionError(spec.name, "must be an async function")
    try:
        spec.definition()
    except Exception as exc:  # pydantic cannot make a JSON schema of the model
        raise ToolDefinitionError(
            spec.name, f"its argument model has no JSON schema: {type(exc).__name__}: {exc}"
        ) from None
    return spec


def matches_any(name: str, patterns: Iterable[str]) -> bool:
    """Whether ``name`` matches one of the shell-style patterns (``mcp_*``),
    case-sensitively, as :func:`fnmatch.fnmatchcase` does."""
    return _one_pattern(tuple(patterns))(name) is not None


@functools.lru_cache(maxsize=256)
def _one_pattern(patterns: tuple[str, ...]) -> Callable[[str], re.Match[str] | None]:
    # Every visible() checks each tool against the same few lists: one regex
    # per list instead of one fnmatch per pattern and tool.
    if not patterns:
        return lambda name: None
    return re.compile("|".join(fnmatch.translate(p) for p in patterns)).match


class ToolRegistry:
    """All tools known to a persona; :meth:`visible` applies the filters."""

    def __init__(self, specs: Iterable[ToolSpec] = ()) -> None:
        self._specs: dict[str, ToolSpec] = {}
        for spec in specs:
            self.register(spec)

    def register(self, spec: ToolSpec) -> None:
        if spec.name in self._specs:
            raise ValueError(f"a tool named {spec.name!r} is already registered")
        self._specs[spec.name] = spec

    def get(self, name: str) -> ToolSpec | None:
        return self._specs.get(name)

    def names(self) -> list[str]:
        return sorted(self._specs)

    def __len__(self) -> int:
        return len(self._specs)

    def visible(self, ctx: TurnContext, extra: Iterable[ToolSpec] = ()) -> dict[str, ToolSpec]:
        """The tools offered on this turn, by name, after every filter.

        The registry's tools come first, then ``extra`` (the specs of tool
        sources; never below the top level, and never one that shadows a
        registered name). Filters are intersected:
        per-context availability, the persona's allow/deny patterns, the
        ``allowed-tools`` of the skills loaded on the turn, depth
        (no delegation below the top), the tool's own ``available(ctx)``, then
        its optional ``customize(spec, ctx)``.
        """
        offered: dict[str, ToolSpec] = {}
        # The two lists' matchers once per call, not once per tool and list.
        tool_filter = ctx.settings.tool_filter
        allowed = _one_pattern(tuple(tool_filter.allow))
        denied = _one_pattern(tuple(tool_filter.deny))
        # Skills loaded on this turn with allowed-tools: every list must match.
        limits = [_one_pattern(patterns) for patterns in ctx.outputs.tool_limits]
        specs: Iterable[ToolSpec] = self._specs.values()
        if extra and ctx.depth == 0:  # subagents get the registered tools only
            specs = [*specs, *(s for s in extra if s.name not in self._specs)]
        for spec in specs:
            if not spec.offered_in(ctx.kind):
                continue
            if allowed(spec.name) is None or denied(spec.name) is not None:
                continue
            if any(limit(spec.name) is None for limit in limits):
                continue
            if spec.delegation and ctx.depth > 0:
                continue
            if spec.available is not None and not spec.available(ctx):
                continue
            final: ToolSpec | None = spec
            if spec.customize is not None:
                final = spec.customize(spec, ctx)
                if final is not None and final.name != spec.name:
                    final = dataclasses.replace(final, name=spec.name)
            if final is not None:
                offered[final.name] = final
        return offered


__all__ = [
    "PUSHED_NEXT",
    "TOOL_NAME_RE",
    "Deferred",
    "EffectFn",
    "PassThrough",
    "ToolDefinitionError",
    "ToolFn",
    "ToolRegistry",
    "ToolSource",
    "ToolSpec",
    "check_spec",
    "matches_any",
    "tool",
]
