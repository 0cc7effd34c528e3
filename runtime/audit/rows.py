"""Audit rows: a turn event flattened into a row of the ``events`` table.

Plain Python (no DuckDB, no Arrow): persona processes make rows, only the
writer's process loads the database.
"""

from __future__ import annotations

import itertools
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from typing import Any

from coterie.runtime import tracing
from coterie.runtime.messages import (
    ApprovalEvent,
    BudgetWarning,
    Compacted,
    DelegationEvent,
    HistoryAppended,
    ModelCalled,
    ScheduleEvent,
    SkillsListed,
    ToolCalled,
    ToolFinished,
    ToolResultMessage,
    TurnEnded,
    TurnEvent,
    new_uuid,
    turn_event_adapter,
)

Row = dict[str, Any]
# Ships one batch of rows to the audit log (e.g. ``AuditLog.append``).
Send = Callable[[list[Row]], Awaitable[object]]

# The columns of the ``events`` table, in order (runtime.audit.writer holds the types).
EVENT_COLUMNS: tuple[str, ...] = (
    "id",
    "seq",
    "ts",
    "kind",
    "persona",
    "conversation_id",
    "turn_id",
    "provider",
    "model",
    "tool",
    "call_id",
    "input_tokens",
    "output_tokens",
    "latency_ms",
    "duration_ms",
    "error_kind",
    "status",
    "payload",
    # Added after the first release: new files have them in this order, older
    # ones get them appended on open (see runtime.audit.writer).
    "cache_read_tokens",
    "cache_write_tokens",
    "cost_usd",
    "context",
    "billed_to",
    "trace_id",
    "span_id",
)

#: The kinds of event a conversation is rebuilt from (``AuditWriter.conversation``):
#: its messages, its todo lists, its questions, the turns left out of it and
#: its compactions (each holds the whole history from which it goes on).
HISTORY_KINDS: tuple[str, ...] = (
    "chat_message",
    "todos",
    "question",
    "turn_dropped",
    "compaction",
)

#: The ``error_kind`` of a ``schedule`` event whose fire did not run as scheduled.
SCHEDULE_ERRORS: dict[str, str] = {
    "missed": "schedule_missed",
    "failed": "schedule_failed",
    "deliver_unavailable": "deliver_unavailable",
}

# Orders events of one process that share a timestamp; ``ts`` orders the rest.
_seq = itertools.count(1)


def event_to_row(event: TurnEvent) -> Row:
    """Flatten a turn event into a row of the ``events`` table.

    Columns that do not apply to the event's kind are ``None``; ``payload``
    holds the whole event as JSON, so nothing is lost by flattening.
    ``trace_id`` and ``span_id`` are the span running as it is recorded (the
    turn's, the model call's, the tool call's), so a row leads to its span.
    """
    payload = turn_event_adapter.dump_json(event).decode()
    return event_row(event, new_uuid(), next(_seq), payload, tracing.ids())


def event_row(
    event: TurnEvent,
    row_id: str,
    seq: int,
    payload: str,
    trace: tuple[str | None, str | None] = (None, None),
) -> Row:
    """The row of ``event``; ``payload`` is its JSON (the spool replays it verbatim)."""
    row: Row = dict.fromkeys(EVENT_COLUMNS)
    row["id"] = row_id
    row["seq"] = seq
    row["trace_id"], row["span_id"] = trace
    row["ts"] = datetime.fromtimestamp(event.ts, UTC)
    row["kind"] = event.kind
    row["persona"] = event.persona
    row["conversation_id"] = event.conversation_id
    row["turn_id"] = event.turn_id
    row["payload"] = payload
    if isinstance(event, ModelCalled):
        row["provider"] = event.provider
        row["model"] = event.model
        row["input_tokens"] = event.input_tokens
        row["output_tokens"] = event.output_tokens
        row["latency_ms"] = event.latency_ms
        row["cache_read_tokens"] = event.cache_read_tokens
        row["cache_write_tokens"] = event.cache_write_tokens
        row["cost_usd"] = event.cost_usd
        row["context"] = event.context
        row["billed_to"] = event.billed_to or event.persona
        if event.error is not None:
            row["error_kind"] = "model_error"
    elif isinstance(event, ToolCalled):
        row["tool"] = event.tool
        row["call_id"] = event.call_id
    elif isinstance(event, ToolFinished):
        row["tool"] = event.tool
        row["call_id"] = event.call_id
        row["duration_ms"] = event.duration_ms
        row["error_kind"] = event.error_kind
    elif isinstance(event, TurnEnded):
        row["status"] = event.status
        row["duration_ms"] = event.duration_ms
        if event.error is not None or event.status in ("failed", "error"):
            row["error_kind"] = "turn_error"
    elif isinstance(event, DelegationEvent):
        # The handle joins a delegation's rows; its own events carry it as
        # their conversation_id.
        row["call_id"] = event.handle
        row["tool"] = event.work
        row["status"] = event.status
    elif isinstance(event, ScheduleEvent):
        # Who fired, skipped, missed and why: ``status`` is the outcome,
        # ``call_id`` joins the fire's events (the scheduler's and the
        # persona's), ``tool`` is the entry's kind.
        row["status"] = event.outcome
        row["call_id"] = event.fire_id
        row["tool"] = event.entry_kind
        row["error_kind"] = SCHEDULE_ERRORS.get(event.outcome)
    elif isinstance(event, ApprovalEvent):
        # Joins the call's tool rows; a call that was not approved shows up
        # in a query for errors.
        row["call_id"] = event.call_id
        row["tool"] = event.tool
        row["status"] = event.state
        if event.state in ("denied", "expired"):
            row["error_kind"] = "permission_denied"
    elif isinstance(event, Compacted):
        # How it was compacted (summarized, dropped, elided), and a summarizer
        # that failed shows up in a query for errors.
        row["status"] = event.method
        if event.error is not None:
            row["error_kind"] = "compaction_failed"
    elif isinstance(event, BudgetWarning):
        row["status"] = "exceeded" if event.exceeded else "warning"
        if event.exceeded:
            row["error_kind"] = "budget_exceeded"
    elif isinstance(event, SkillsListed) and event.problems:
        # Skills the persona cannot use show up in a query for errors.
        row["error_kind"] = "invalid_skill"
    elif isinstance(event, HistoryAppended) and isinstance(event.message, ToolResultMessage):
        # Only the join key: tool and error_kind stay on the tool_result event so
        # that aggregations over those columns do not count a tool call twice.
        row["call_id"] = event.message.call_id
    return row


__all__ = [
    "EVENT_COLUMNS",
    "HISTORY_KINDS",
    "SCHEDULE_ERRORS",
    "Row",
    "Send",
    "event_row",
    "event_to_row",
]
