"""Traces of what personas do, in OpenTelemetry's GenAI conventions.

Each process has one :class:`Tracer` (:func:`tracer`). Until :func:`setup`
installs one that exports (``tracing.enabled``), it is a no-op: every span
it starts is :data:`NOOP`, nothing of the OpenTelemetry SDK is imported,
and a turn costs what it costs without tracing.

The spans (names and attributes: :mod:`coterie.runtime.tracing.genai`):

- ``invoke_agent {persona}``: one turn (:mod:`runtime.persona.turns`, a
  subagent's run, an eval sample's turn);
- ``chat {model}``: one model call (:mod:`runtime.loop`);
- ``execute_tool {tool}``: one tool call (:mod:`runtime.runner`).

The running span is a context variable (:func:`current`, :func:`active`):
a span started without a parent is a child of it, and a
:class:`~runtime.messages.MessageEnvelope` made while it runs carries its
context (:func:`carrier`, W3C ``traceparent``), so the turn that answers an
``ask_persona`` on another node is a child of the tool call that asked.
Audit rows carry the trace and span ids of the span they were recorded in
(:func:`ids`): a row leads to its span, and back.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from coterie.runtime.tracing.settings import TracingSettings

log = logging.getLogger("coterie.tracing")

#: A span's context as it travels in an envelope: W3C trace-context fields.
Carrier = dict[str, str]

AttributeValue = str | bool | int | float | list[str]


class Span:
    """A span that records nothing (tracing off); the SDK's spans subclass it."""

    #: Whether this span goes anywhere: attributes worth computing only then.
    recording = False
    trace_id: str | None = None
    span_id: str | None = None

    def set(self, key: str, value: AttributeValue | None) -> None:
        """Set one attribute (a None value is left out)."""

    def update(self, attributes: Mapping[str, AttributeValue | None]) -> None:
        """Set several attributes (None values are left out)."""

    def event(
        self, name: str, attributes: Mapping[str, AttributeValue | None] | None = None
    ) -> None:
        """Add a timestamped event."""

    def fail(self, kind: str, message: str | None = None) -> None:
        """Mark the span failed: ``error.type`` is ``kind``, its status an error."""

    def end(self) -> None:
        """End the span (once; later calls do nothing)."""

    def carrier(self) -> Carrier | None:
        """This span's context for another process, or None when it records nothing."""
        return None


#: The span of a process that does not trace.
NOOP = Span()

#: A span's ``parent``: none at all (a new trace), whatever runs now.
ROOT: Carrier = {}

_current: ContextVar[Span] = ContextVar("coterie_span", default=NOOP)


class Tracer:
    """Starts spans; this one starts only :data:`NOOP` (tracing off)."""

    enabled = False
    #: Tool arguments and results on ``execute_tool`` spans (``tracing.capture_content``).
    capture_content = False

    def start(
        self,
        name: str,
        *,
        attributes: Mapping[str, AttributeValue | None] | None = None,
        parent: Span | Carrier | None = None,
        kind: str = "internal",
    ) -> Span:
        """A started span named ``name``. ``parent``: a span, a carrier from
        an envelope, :data:`ROOT` for a new trace; default the running span
        (:func:`current`). ``kind``: ``internal``, ``client``, ``server`` or ``producer``."""
        return NOOP

    def flush(self, timeout: float = 5.0) -> bool:
        """Export what is batched; whether it all went within ``timeout`` seconds."""
        return True

    def shutdown(self) -> None:
        """Export what is batched and stop exporting."""


_tracer: Tracer = Tracer()


def tracer() -> Tracer:
    """This process's tracer (a no-op one until :func:`setup` installs another)."""
    return _tracer


def install(new: Tracer) -> Tracer:
    """Make ``new`` this process's tracer; the previous one (shut down by the caller)."""
    global _tracer
    old, _tracer = _tracer, new
    return old


def setup(
    settings: TracingSettings, *, process: str, attributes: Mapping[str, str] | None = None
) -> Tracer:
    """Install this process's tracer from ``settings`` (resolved against
    this process's environment when the starter did not resolve them), once:
    a second call with equal settings keeps the installed tracer. ``process``
    (``persona``, ``router``, …) and ``attributes`` describe the process on
    its spans' resource. Off: the no-op tracer, and the SDK is not imported."""
    import os

    resolved = settings if settings.enabled is not None else settings.resolved(os.environ)
    current_tracer = _tracer
    if not resolved.enabled:
        if current_tracer.enabled:
            install(Tracer()).shutdown()
        return _tracer
    key = (resolved.model_dump_json(), process, tuple(sorted((attributes or {}).items())))
    if getattr(current_tracer, "key", None) == key:
        return current_tracer
    from coterie.runtime.tracing.otel import OtelTracer

    new = OtelTracer(resolved, process=process, attributes=attributes or {}, key=key)
    install(new).shutdown()
    return new


def current() -> Span:
    """The span running in this task (:data:`NOOP` when none is)."""
    return _current.get()


@contextmanager
def active(span: Span) -> Iterator[Span]:
    """Make ``span`` the running one inside the block (this task and the tasks it starts)."""
    token = _current.set(span)
    try:
        yield span
    finally:
        _current.reset(token)


def carrier() -> Carrier | None:
    """The running span's context for an envelope; None when nothing traces."""
    return _current.get().carrier()


_TRACEPARENT = re.compile(
    r"(?!ff)[0-9a-f]{2}-(?!0{32})[0-9a-f]{32}-(?!0{16})[0-9a-f]{16}-[0-9a-f]{2}"
)
#: The longest ``tracestate`` passed on (the W3C limit a vendor must propagate).
TRACESTATE_MAX = 512


def incoming(headers: Mapping[str, str]) -> Carrier | None:
    """The W3C trace context a caller sent (``traceparent``, ``tracestate``
    headers), or None when it sent none or one that is not valid W3C
    (lowercase hex, version not ``ff``, ids not all zeros): a request with
    a broken header starts a new trace, it is not refused."""
    parent = headers.get("traceparent", "").strip()
    if not _TRACEPARENT.fullmatch(parent):
        return None
    out: Carrier = {"traceparent": parent}
    state = headers.get("tracestate", "").strip()
    if state and len(state) <= TRACESTATE_MAX:
        out["tracestate"] = state
    return out


def ids() -> tuple[str | None, str | None]:
    """The running span's trace id and span id (hex), for an audit row."""
    span = _current.get()
    return span.trace_id, span.span_id


__all__ = [
    "NOOP",
    "ROOT",
    "AttributeValue",
    "Carrier",
    "Span",
    "Tracer",
    "active",
    "carrier",
    "current",
    "ids",
    "incoming",
    "install",
    "setup",
    "tracer",
]
