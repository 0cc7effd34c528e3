"""The runtime's metrics: what coterie counts, and how turn events become counts.

Plain logic, no Ray: :class:`EventMetrics` turns each recorded turn event
into counts, observations and gauge values on a :class:`Meter`. The Ray meter
(``actors.metrics``) hands them to ``ray.util.metrics``, which exports them
on every node's metrics endpoint (Prometheus text) and Ray's dashboard.
Nothing here runs on a timer: counts move when events happen, and the gauges
are read at each turn's start and end.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Literal

from coterie.runtime.messages import (
    ApprovalEvent,
    BudgetWarning,
    Compacted,
    DelegationEvent,
    ModelCalled,
    ScheduleEvent,
    ToolFinished,
    TurnEnded,
    TurnEvent,
    TurnStarted,
)

log = logging.getLogger("coterie.metrics")

MetricKind = Literal["counter", "histogram", "gauge"]
Tags = Mapping[str, str]

# Milliseconds: a tool call or a queue wait of a few ms up to a turn of minutes.
_MS = (5.0, 25.0, 100.0, 250.0, 500.0, 1000.0, 2500.0, 5000.0, 10000.0, 30000.0, 60000.0, 300000.0)


@dataclass(frozen=True, slots=True)
class Metric:
    """One metric: its name (Prometheus shows it prefixed ``ray_``, a
    counter suffixed ``_total``), kind, meaning, tag keys and, for a
    histogram, its bucket boundaries."""

    name: str
    kind: MetricKind
    description: str
    tags: tuple[str, ...]
    boundaries: tuple[float, ...] = ()


def _metrics(*metrics: Metric) -> dict[str, Metric]:
    return {m.name: m for m in metrics}


#: Every metric coterie emits (docs/watching.md lists them from here).
METRICS: dict[str, Metric] = _metrics(
    Metric("coterie_turns_started", "counter", "Turns started", ("persona", "context")),
    Metric("coterie_turns_finished", "counter", "Turns finished", ("persona", "status")),
    Metric(
        "coterie_turn_duration_ms",
        "histogram",
        "How long a turn took, start to end (ms)",
        ("persona", "status"),
        _MS,
    ),
    Metric(
        "coterie_queue_wait_ms",
        "histogram",
        "How long a turn's messages waited in their queue before it started (ms)",
        ("persona",),
        _MS,
    ),
    Metric(
        "coterie_model_calls",
        "counter",
        "Model calls, by outcome (ok, error)",
        ("provider", "model", "purpose", "outcome"),
    ),
    Metric(
        "coterie_model_tokens",
        "counter",
        "Tokens of model calls (kind: input, output, cache_read, cache_write)",
        ("provider", "model", "kind"),
    ),
    Metric(
        "coterie_model_cost_usd",
        "counter",
        "Cost of priced model calls (USD), by the persona billed",
        ("provider", "model", "billed_to"),
    ),
    Metric(
        "coterie_model_latency_ms",
        "histogram",
        "Model call latency (ms)",
        ("provider", "model"),
        _MS,
    ),
    Metric("coterie_tool_calls", "counter", "Tool calls", ("persona", "tool")),
    Metric(
        "coterie_tool_errors",
        "counter",
        "Tool calls that failed, by error kind",
        ("persona", "tool", "error_kind"),
    ),
    Metric("coterie_tool_duration_ms", "histogram", "Tool call duration (ms)", ("tool",), _MS),
    Metric(
        "coterie_delegations",
        "counter",
        "Delegations (subagents, coding agents) by phase: started, finished",
        ("persona", "work", "phase"),
    ),
    Metric(
        "coterie_delegations_running",
        "gauge",
        "Delegations started by this persona process and not finished",
        ("persona", "work"),
    ),
    Metric("coterie_turns_running", "gauge", "Turns running now", ("persona",)),
    Metric("coterie_messages_queued", "gauge", "Messages waiting for a turn", ("persona",)),
    Metric(
        "coterie_audit_backlog",
        "gauge",
        "Audit rows a process recorded and the audit log has not acknowledged",
        ("process",),
    ),
    Metric(
        "coterie_schedule_fires",
        "counter",
        "Scheduler fires by outcome (fired, skipped, missed, failed, ...)",
        ("persona", "entry_kind", "outcome"),
    ),
    Metric("coterie_approvals", "counter", "Approvals by state", ("persona", "state")),
    Metric("coterie_compactions", "counter", "Conversation compactions", ("persona", "method")),
    Metric(
        "coterie_budget_warnings",
        "counter",
        "Budget warnings (level: warning, exceeded)",
        ("persona", "level"),
    ),
    Metric(
        "coterie_personas_live",
        "gauge",
        "Persona actors alive (started and not passivated), per router",
        ("runtime",),
    ),
    Metric(
        "coterie_memory_operations",
        "counter",
        "Long-term memory operations (write_memory, recall, ingest, ...)",
        ("operation", "outcome"),
    ),
    Metric(
        "coterie_memory_duration_ms",
        "histogram",
        "Long-term memory operation duration (ms)",
        ("operation",),
        _MS,
    ),
)


class Meter:
    """Where metric values go; this one drops them (no metrics backend)."""

    def count(self, name: str, value: float, tags: Tags) -> None:
        """Add ``value`` to the counter ``name``."""

    def observe(self, name: str, value: float, tags: Tags) -> None:
        """Put ``value`` in the histogram ``name``."""

    def gauge(self, name: str, value: float, tags: Tags) -> None:
        """Set the gauge ``name`` to ``value``."""


class RecordingMeter(Meter):
    """A meter that keeps every value: ``(kind, name, tags) -> values``
    (tests, and a process that wants to read its own counts)."""

    def __init__(self) -> None:
        self.values: dict[tuple[str, str, tuple[tuple[str, str], ...]], list[float]] = {}

    def _put(self, kind: str, name: str, value: float, tags: Tags) -> None:
        _check(name, kind, tags)
        self.values.setdefault((kind, name, tuple(sorted(tags.items()))), []).append(value)

    def count(self, name: str, value: float, tags: Tags) -> None:
        self._put("counter", name, value, tags)

    def observe(self, name: str, value: float, tags: Tags) -> None:
        self._put("histogram", name, value, tags)

    def gauge(self, name: str, value: float, tags: Tags) -> None:
        self._put("gauge", name, value, tags)

    def total(self, name: str, **tags: str) -> float:
        """The sum of a counter's values (or last gauge value) whose tags include ``tags``."""
        found = 0.0
        for (kind, metric, have), values in self.values.items():
            if metric == name and set(tags.items()) <= set(have):
                found += values[-1] if kind == "gauge" else sum(values)
        return found


def _check(name: str, kind: str, tags: Tags) -> None:
    metric = METRICS.get(name)
    if metric is None:
        raise KeyError(f"unknown metric {name!r}")
    if metric.kind != kind:
        raise TypeError(f"metric {name!r} is a {metric.kind}, not a {kind}")
    if set(tags) != set(metric.tags):
        raise ValueError(f"metric {name!r} takes tags {metric.tags}, not {tuple(tags)}")


#: The gauges a process reads at each turn's start and end: name -> (tags, value).
Sample = Callable[[], Mapping[str, tuple[Tags, float]]]


class EventMetrics:
    """Counts turn events on ``meter`` (an :class:`~runtime.audit.AuditBuffer`
    observer: every event it records). ``sample`` gives the gauges read at
    each turn's start and end (queue length, audit backlog); turns and
    delegations running are counted from their start and end events.
    A meter that fails is logged once and never fails the recording."""

    def __init__(self, meter: Meter, *, sample: Sample | None = None) -> None:
        self.meter = meter
        self.sample = sample
        # (persona, work) -> delegations this process started and has not seen finish.
        self._running: dict[tuple[str, str], int] = {}
        self._failed = False
        # persona -> its turns started in this process and not ended.
        self._turns: dict[str, int] = {}

    def __call__(self, event: TurnEvent) -> None:
        try:
            self.record(event)
        except Exception:
            if not self._failed:
                self._failed = True
                log.exception(
                    "metrics: recording %s failed (further failures are not logged)", event.kind
                )

    def record(self, event: TurnEvent) -> None:
        m = self.meter
        persona = event.persona
        if isinstance(event, TurnStarted):
            m.count("coterie_turns_started", 1, {"persona": persona, "context": event.context})
            self._turn(persona, 1)
            if event.queue_wait_ms is not None:
                m.observe("coterie_queue_wait_ms", event.queue_wait_ms, {"persona": persona})
            self._sample()
        elif isinstance(event, TurnEnded):
            tags = {"persona": persona, "status": event.status}
            m.count("coterie_turns_finished", 1, tags)
            self._turn(persona, -1)
            m.observe("coterie_turn_duration_ms", event.duration_ms, tags)
            self._sample()
        elif isinstance(event, ModelCalled):
            model = {"provider": event.provider, "model": event.model}
            outcome = "error" if event.error is not None else "ok"
            m.count(
                "coterie_model_calls", 1, {**model, "purpose": event.purpose, "outcome": outcome}
            )
            m.observe("coterie_model_latency_ms", event.latency_ms, model)
            for kind, tokens in (
                ("input", event.input_tokens),
                ("output", event.output_tokens),
                ("cache_read", event.cache_read_tokens),
                ("cache_write", event.cache_write_tokens),
            ):
                if tokens:
                    m.count("coterie_model_tokens", tokens, {**model, "kind": kind})
            if event.cost_usd:
                billed = event.billed_to or persona
                m.count("coterie_model_cost_usd", event.cost_usd, {**model, "billed_to": billed})
        elif isinstance(event, ToolFinished):
            m.count("coterie_tool_calls", 1, {"persona": persona, "tool": event.tool})
            m.observe("coterie_tool_duration_ms", event.duration_ms, {"tool": event.tool})
            if event.error_kind:
                m.count(
                    "coterie_tool_errors",
                    1,
                    {"persona": persona, "tool": event.tool, "error_kind": event.error_kind},
                )
        elif isinstance(event, DelegationEvent) and event.phase in ("started", "finished"):
            m.count(
                "coterie_delegations",
                1,
                {"persona": persona, "work": event.work, "phase": event.phase},
            )
            key = (persona, event.work)
            n = self._running.get(key, 0) + (1 if event.phase == "started" else -1)
            # A finish of work a killed predecessor started is not below zero here.
            self._running[key] = max(n, 0)
            m.gauge(
                "coterie_delegations_running",
                self._running[key],
                {"persona": persona, "work": event.work},
            )
        elif isinstance(event, ScheduleEvent):
            m.count(
                "coterie_schedule_fires",
                1,
                {"persona": persona, "entry_kind": event.entry_kind, "outcome": event.outcome},
            )
        elif isinstance(event, ApprovalEvent):
            m.count("coterie_approvals", 1, {"persona": persona, "state": event.state})
        elif isinstance(event, Compacted):
            m.count("coterie_compactions", 1, {"persona": persona, "method": event.method})
        elif isinstance(event, BudgetWarning):
            level = "exceeded" if event.exceeded else "warning"
            m.count("coterie_budget_warnings", 1, {"persona": persona, "level": level})

    def _turn(self, persona: str, delta: int) -> None:
        n = max(self._turns.get(persona, 0) + delta, 0)
        self._turns[persona] = n
        self.meter.gauge("coterie_turns_running", n, {"persona": persona})

    def _sample(self) -> None:
        if self.sample is None:
            return
        for name, (tags, value) in self.sample().items():
            self.meter.gauge(name, value, tags)


__all__ = ["METRICS", "EventMetrics", "Meter", "Metric", "RecordingMeter", "Sample", "Tags"]
