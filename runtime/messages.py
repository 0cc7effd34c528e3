"""Typed messages: chat history, model requests/responses, envelopes, turn events.

Everything here is a pydantic model; the unions are discriminated by ``kind``
and (de)serialized through one ``TypeAdapter`` each. The same objects cross
actor boundaries and are what the audit log stores.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Sequence
from datetime import datetime
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter

from coterie.runtime import tracing

# Ids take their randomness from ``os.urandom``, as ``uuid.uuid4`` does, but
# 4 KiB at a time: a turn makes about ten ids (one per audit row), and each
# ``os.urandom`` call lets go of the GIL, which in a busy actor process meant
# waiting for Ray's threads to hand it back (uuid4 was ~5% of a persona's
# samples under load).
_POOL_BYTES = 4096
_pool = b""
_pool_at = 0
_pool_lock = threading.Lock()


def _forget_pool() -> None:
    """A forked child must not hand out the ids its parent will (nor wait on
    a lock another of its parent's threads held)."""
    global _pool, _pool_at, _pool_lock
    _pool, _pool_at, _pool_lock = b"", 0, threading.Lock()


os.register_at_fork(after_in_child=_forget_pool)


def random_bytes(n: int) -> bytes:
    """``n`` bytes from the operating system's CSPRNG (taken from the pool;
    more than a pool's 4,096 come from a pool drawn for them)."""
    global _pool, _pool_at
    with _pool_lock:
        if _pool_at + n > len(_pool):
            _pool, _pool_at = os.urandom(max(n, _POOL_BYTES)), 0
        start = _pool_at
        _pool_at += n
        return _pool[start : start + n]


def new_id(prefix: str = "") -> str:
    """A short random id (16 hex digits, 64 random bits), optionally
    prefixed (``turn_``, ``msg_`` …)."""
    return f"{prefix}{random_bytes(8).hex()}"


def new_uuid() -> str:
    """A random (version 4) UUID in its canonical text form, as
    ``str(uuid.uuid4())`` gives."""
    b = bytearray(random_bytes(16))
    b[6] = (b[6] & 0x0F) | 0x40  # version 4
    b[8] = (b[8] & 0x3F) | 0x80  # RFC 4122 variant
    h = b.hex()
    return f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"


def now() -> float:
    return time.time()


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid")


# --------------------------------------------------------------------------
# Chat history
# --------------------------------------------------------------------------


class ToolCall(_Model):
    """One call the model asked for.

    ``arguments`` is a dict, or the raw text when the model sent arguments
    that are not a JSON object (the runner answers that with
    ``invalid_arguments``).
    """

    id: str
    name: str
    arguments: dict[str, Any] | str = Field(default_factory=dict)


class ThinkingBlock(_Model):
    """Reasoning the provider returned; sent back with its signature."""

    text: str
    signature: str | None = None
    redacted: bool = False


class UserMessage(_Model):
    """Input to a turn: a person, another persona, a wake, or the harness."""

    kind: Literal["user"] = "user"
    text: str
    source: str = "user"
    ts: float = Field(default_factory=now)


class AssistantMessage(_Model):
    """A model reply: text, thinking, and the tool calls it asked for."""

    kind: Literal["assistant"] = "assistant"
    text: str = ""
    tool_calls: list[ToolCall] = Field(default_factory=list)
    thinking: list[ThinkingBlock] = Field(default_factory=list)
    # OpenAI-compatible reasoning providers return this beside the content.
    reasoning_content: str | None = None
    ts: float = Field(default_factory=now)


class ToolResultMessage(_Model):
    """The string result of one tool call, fed back to the model."""

    kind: Literal["tool_result"] = "tool_result"
    call_id: str
    name: str
    content: str
    # One of runtime.errors.ErrorKind when written now; a str so that logs
    # written by earlier versions (other spellings) still rebuild.
    error_kind: str | None = None
    ts: float = Field(default_factory=now)


ChatMessage = Annotated[
    UserMessage | AssistantMessage | ToolResultMessage, Field(discriminator="kind")
]
chat_message_adapter: TypeAdapter[ChatMessage] = TypeAdapter(ChatMessage)
chat_history_adapter: TypeAdapter[list[ChatMessage]] = TypeAdapter(list[ChatMessage])


# --------------------------------------------------------------------------
# Model requests and responses (provider-neutral)
# --------------------------------------------------------------------------


class ToolDefinition(_Model):
    """What the model sees of a tool: name, description, JSON schema."""

    name: str
    description: str
    parameters: dict[str, Any]


class ToolChoiceAuto(_Model):
    kind: Literal["auto"] = "auto"


class ToolChoiceNone(_Model):
    kind: Literal["none"] = "none"


class ToolChoiceNamed(_Model):
    kind: Literal["named"] = "named"
    name: str


ToolChoice = Annotated[
    ToolChoiceAuto | ToolChoiceNone | ToolChoiceNamed, Field(discriminator="kind")
]


TurnContextKind = Literal["user", "heartbeat", "cron", "subagent", "eval"]


class ModelRequest(_Model):
    """One call to a model: system prompt, history, tools and settings."""

    system: str
    messages: list[ChatMessage]
    tools: list[ToolDefinition] = Field(default_factory=list)
    tool_choice: ToolChoice = Field(default_factory=ToolChoiceAuto)
    thinking: bool = False
    max_tokens: int = 4096
    # 1-based index of this model call within the current turn.
    step: int = 1
    # What started the turn (a person, a heartbeat, a cron entry…).
    context: TurnContextKind = "user"


class Usage(_Model):
    """What a model call consumed, as the provider reported it.

    ``input_tokens`` counts every token of the request, cached or not (for
    Anthropic the sum of its ``input_tokens``, ``cache_read_input_tokens`` and
    ``cache_creation_input_tokens``; for OpenAI ``prompt_tokens``);
    ``cache_read_tokens`` and ``cache_write_tokens`` are the parts of it read
    from and written to the provider's prompt cache.
    """

    input_tokens: int = 0
    output_tokens: int = 0
    cache_read_tokens: int = 0
    cache_write_tokens: int = 0


class ModelResponse(_Model):
    message: AssistantMessage
    usage: Usage = Field(default_factory=Usage)
    provider: str
    model: str
    stop_reason: str | None = None


# --------------------------------------------------------------------------
# Envelopes: what travels between actors
# --------------------------------------------------------------------------


#: The origin of a message that came through the API (the Python API, HTTP),
#: not through a connector: its reply is the answer, there is nowhere else to send.
API_ORIGIN = "api"


class Origin(_Model):
    """Where a message came from and where its answer should go."""

    connector: str = API_ORIGIN
    destination: str | None = None


#: What a scheduler entry is: the persona's heartbeat, one of its cron
#: entries, or a reminder it set (``remind``).
ScheduleKind = Literal["heartbeat", "cron", "reminder"]


class ScheduleTurn(_Model):
    """What the scheduler says about the turn a fire starts (on
    :attr:`MessageEnvelope.schedule`).

    The persona accepts the fire before queuing it (``SchedulerService.accept``:
    a second delivery of one fire is dropped) and finishes it when the turn
    ends. ``model`` is a ``persona.yaml`` model entry (a mapping: this module
    sits below the config package) used for this turn only.
    """

    fire_id: str
    kind: ScheduleKind
    #: The entry's name (``heartbeat``, a cron entry's), or the reminder's.
    name: str
    #: The scheduled instant (UTC).
    instant: datetime
    #: Dispatched after a delay (the runtime was down when it fell due).
    late: bool = False
    #: A heartbeat in a fresh conversation: the system prompt is SOUL only.
    light: bool = False
    #: The fire has a conversation of its own (a light heartbeat, a ``fresh``
    #: cron entry): the persona forgets it once its turn has ended.
    fresh: bool = False
    model: dict[str, Any] | None = None
    #: Where the turn's final message goes (a cron entry's ``deliver``, a
    #: reminder's override or the origin it was asked from); also the
    #: envelope's ``origin``, so ``reply_to_origin`` goes there.
    deliver: Origin | None = None


class ResumeCall(_Model):
    """On a wake: a call that waited for an approval across a restart was
    answered; the turn goes on from it (it runs, or is refused)."""

    approval_id: str
    call_id: str
    tool: str
    state: Literal["pending", "approved", "denied", "expired"]
    always: bool = False
    decided_by: str | None = None
    via: str | None = None


class MessageEnvelope(_Model):
    """Text for a persona's conversation; the reply correlates by ``id``."""

    kind: Literal["message"] = "message"
    id: str = Field(default_factory=lambda: new_id("msg_"))
    sender: str = "user"
    recipient: str
    conversation_id: str
    text: str
    context: TurnContextKind = "user"
    origin: Origin = Field(default_factory=Origin)
    # When the sender stops waiting (wall clock, seconds since the epoch):
    # a message still queued then is not started as a turn, and a caller
    # still waiting gets an error reply saying so (see ``expired``).
    deadline: float | None = None
    # Personas currently waiting on this message, outermost first.
    ask_path: list[str] = Field(default_factory=list)
    # Who sent it: a person, another persona, or the runtime itself (a wake).
    # Only persona-sourced messages count against a conversation's queue cap.
    source_kind: Literal["user", "persona", "wake"] = "user"
    # return: the sender awaits the reply; mirror: the reply is posted back
    # into the sender's inbox conversation as a wake; none: nobody hears it.
    reply_mode: Literal["return", "mirror", "none"] = "return"
    # Set on a fire of the scheduler (heartbeat, cron entry, reminder).
    schedule: ScheduleTurn | None = None
    # An approval answered after a restart: the turn it paused goes on.
    resume: ResumeCall | None = None
    # The trace context of the span that sent it (W3C trace-context fields;
    # None when nothing traces): the turn that answers is its child.
    trace: dict[str, str] | None = Field(default_factory=tracing.carrier)

    def expired(self, at: float | None = None) -> bool:
        """Whether the deadline has passed (at ``at``, default now)."""
        return self.deadline is not None and (at or now()) > self.deadline


TurnStatus = Literal["ok", "skipped", "failed", "error"]


def inbox_id(target: str, source: str) -> str:
    """The conversation in ``target`` that holds what ``source`` sent it."""
    return f"{target}:inbox:{source}"


class Question(_Model):
    """A question a turn asked the person (``ask_user``): the turn ended on it,
    and the person's next message on the conversation answers it."""

    id: str = Field(default_factory=lambda: new_id("q_"))
    text: str
    # Choices a connector may show as buttons; a free-text answer is fine too.
    buttons: list[str] = Field(default_factory=list)
    expires_at: float | None = None

    def expired(self, at: float | None = None) -> bool:
        return self.expires_at is not None and (at or now()) > self.expires_at


class ReplyEnvelope(_Model):
    """The outcome of the turn that answered a message."""

    kind: Literal["reply"] = "reply"
    id: str = Field(default_factory=lambda: new_id("rep_"))
    reply_to: str
    sender: str
    conversation_id: str
    turn_id: str
    text: str
    status: TurnStatus = "ok"
    error: str | None = None
    steps: int = 0
    # The turn ended asking this (its text is the question too).
    question: Question | None = None

    @classmethod
    def failure(cls, envelope: MessageEnvelope, *, sender: str, error: str) -> ReplyEnvelope:
        """The reply to ``envelope`` of a turn that could not run or finish."""
        return cls(
            reply_to=envelope.id,
            sender=sender,
            conversation_id=envelope.conversation_id,
            turn_id="",
            text="",
            status="error",
            error=error,
        )


Envelope = Annotated[MessageEnvelope | ReplyEnvelope, Field(discriminator="kind")]
envelope_adapter: TypeAdapter[Envelope] = TypeAdapter(Envelope)


# --------------------------------------------------------------------------
# Turn events: what the audit log records
# --------------------------------------------------------------------------


class _Event(_Model):
    ts: float = Field(default_factory=now)
    persona: str
    conversation_id: str
    turn_id: str


class TurnStarted(_Event):
    kind: Literal["turn_started"] = "turn_started"
    context: TurnContextKind = "user"
    message_ids: list[str] = Field(default_factory=list)
    #: How long the longest-waiting of its new messages was queued (ms);
    #: None when it answers none (it goes on with an interrupted turn's).
    queue_wait_ms: float | None = None


class HistoryAppended(_Event):
    """A chat message added to a conversation (enough to rebuild it)."""

    kind: Literal["chat_message"] = "chat_message"
    message: ChatMessage


#: Who made a model call: a turn of one of these kinds, or a coding agent
#: (its usage as the agent reported it over ACP).
UsageContext = Literal["user", "heartbeat", "cron", "subagent", "eval", "coding_agent"]

#: Why a model call was made.
CallPurpose = Literal["turn", "compaction", "memory_flush"]


class ModelCalled(_Event):
    """One call to a model: who made it, what it consumed and cost.

    ``cost_usd`` is None when the model has no price (``priced`` False): an
    unknown cost is never counted as 0. ``context`` is the kind of turn that
    made the call; ``billed_to`` the persona whose budget it counts against
    (the persona that started the work: a subagent's parent, the first
    persona of an ``ask_persona`` chain)."""

    kind: Literal["model_call"] = "model_call"
    provider: str
    model: str
    step: int
    latency_ms: float
    input_tokens: int = 0
    output_tokens: int = 0
    cache_read_tokens: int = 0
    cache_write_tokens: int = 0
    cost_usd: float | None = None
    priced: bool = False
    context: UsageContext = "user"
    #: Why the call was made: a step of the turn, or summarizing its
    #: conversation (``compaction``), or the memory step before it.
    purpose: CallPurpose = "turn"
    billed_to: str | None = None
    #: The loop's estimate of the request's input tokens before it was sent.
    estimated_tokens: int | None = None
    tool_calls: int = 0
    # Chat messages the request carried (the conversation the model saw).
    messages: int = 0
    # Tool definitions the request carried.
    tools: int = 0
    stop_reason: str | None = None
    error: str | None = None


class ToolCalled(_Event):
    kind: Literal["tool_call"] = "tool_call"
    call_id: str
    tool: str
    arguments: dict[str, Any] | str


class ToolFinished(_Event):
    kind: Literal["tool_result"] = "tool_result"
    call_id: str
    tool: str
    duration_ms: float
    error_kind: str | None = None
    result: str


class TurnEnded(_Event):
    kind: Literal["turn_ended"] = "turn_ended"
    status: TurnStatus
    steps: int
    duration_ms: float
    error: str | None = None
    # Ended early by a soft interrupt; its messages are answered by the next turn.
    interrupted: bool = False


class TodoItem(BaseModel):
    """One entry of a conversation's todo list."""

    content: str = Field(min_length=1, max_length=500)
    status: Literal["pending", "in_progress", "completed"] = "pending"
    priority: Literal["high", "medium", "low"] = "medium"


def render_todos(todos: Sequence[TodoItem]) -> str:
    """A todo list as the model reads it (``todo_read``, a compaction's summary)."""
    if not todos:
        return "The todo list is empty."
    marks = {"pending": "[ ]", "in_progress": "[~]", "completed": "[x]"}
    lines = [f"{i}. {marks[t.status]} {t.content} ({t.priority})" for i, t in enumerate(todos, 1)]
    done = sum(t.status == "completed" for t in todos)
    return "\n".join([f"{done}/{len(todos)} completed", *lines])


class TodosSet(_Event):
    """A conversation's todo list was replaced (enough to rebuild it)."""

    kind: Literal["todos"] = "todos"
    todos: list[TodoItem]


class QuestionSet(_Event):
    """A conversation's pending question was set (``ask_user``) or cleared
    (answered: ``question`` is None) — enough to rebuild it."""

    kind: Literal["question"] = "question"
    question: Question | None


class ConversationRecord(_Model):
    """What the audit log holds of one conversation: its messages, oldest
    first, its latest todo list and its pending question."""

    messages: list[ChatMessage] = Field(default_factory=list)
    todos: list[TodoItem] = Field(default_factory=list)
    question: Question | None = None


class EnvelopeEvent(_Event):
    """An envelope delivered to, or sent from, a persona."""

    kind: Literal["envelope"] = "envelope"
    envelope: Envelope


class DelegationEvent(_Event):
    """Pushed work a turn delegated: started, progress, finished.

    Recorded in the *parent's* conversation and turn; ``child_conversation_id``
    is where the delegate's own events are (a subagent's model and tool calls).
    """

    kind: Literal["delegation"] = "delegation"
    handle: str
    work: Literal["subagent", "coding_agent"]
    phase: Literal["started", "update", "permission", "finished"]
    child_conversation_id: str
    status: str | None = None
    data: dict[str, Any] = Field(default_factory=dict)


class SkillsListed(_Event):
    """The skills a persona's system prompt lists, recorded by the first turn
    that uses a new listing (at start, and after the skills changed): those
    listed, those the prompt's budget left out, and those that cannot be used
    (``name: file: what is wrong``)."""

    kind: Literal["skills"] = "skills"
    listed: list[str]
    left_out: list[str] = Field(default_factory=list)
    problems: list[str] = Field(default_factory=list)
    #: ``skills.prompt_budget`` and the estimated tokens the listed lines took.
    budget: int
    tokens: int


#: What happened to a scheduled instant: fired/late (dispatched), skipped (a
#: gate stopped it before any model call), missed (due while the runtime was
#: down, past its grace), failed (never accepted in time, or its turn
#: failed), deliver_unavailable (its delivery connector is not running: it
#: did not run), accepted (the persona started it), dropped (a second
#: delivery of a fire already accepted), done (its turn ended).
ScheduleOutcome = Literal[
    "fired",
    "late",
    "skipped",
    "missed",
    "failed",
    "deliver_unavailable",
    "accepted",
    "dropped",
    "done",
]


class ScheduleEvent(_Event):
    """What happened to one fire of a heartbeat, cron entry or reminder.

    The scheduler records fired, late, skipped, missed, failed and
    deliver_unavailable on the persona's schedule log (conversation
    ``<persona>:schedule``, no turn); the persona records accepted, dropped
    and done on the fire's conversation and turn.
    """

    kind: Literal["schedule"] = "schedule"
    entry_kind: ScheduleKind
    name: str
    instant: datetime
    fire_id: str
    outcome: ScheduleOutcome
    reason: str | None = None


class TurnDropped(_Event):
    """A turn left out of its conversation's history: a heartbeat or cron
    turn that found nothing to do (it ended ``skipped`` without doing
    anything else). Its events stay in the log; a conversation rebuilt from
    the log leaves that turn's messages out, as the persona did in memory."""

    kind: Literal["turn_dropped"] = "turn_dropped"
    reason: str


class Compacted(_Event):
    """A conversation was compacted to fit its model's context window.

    ``messages`` is the whole history the model sees from now on (the
    summary, the kept turns and the current turn so far); a conversation
    rebuilt from the log starts from it and adds what was appended after.
    ``turn_start`` is where the current turn's own messages begin in it (a
    turn left out of the history afterwards is cut there). ``summary`` is
    None when the older turns were dropped instead (``method``
    ``dropped``: summarizing failed, was off, or could not fit), or when
    only old tool results were cut to stubs (``elided``)."""

    kind: Literal["compaction"] = "compaction"
    method: Literal["summarized", "dropped", "elided"]
    reason: Literal["threshold", "context_length_error"]
    summary: str | None = None
    #: Messages summarized or dropped, and tool results cut to a stub.
    replaced: int = 0
    elided: int = 0
    tokens_before: int
    tokens_after: int
    error: str | None = None
    messages: list[ChatMessage]
    turn_start: int


#: Where an approval stands: waiting, or how it was answered.
ApprovalState = Literal["pending", "approved", "denied", "expired"]


class ApprovalEvent(_Event):
    """A tool call a rule said to ``ask`` about: requested, then decided.

    Recorded in the turn that made the call (its listeners hear it: that is
    how ``coterie chat`` and the chat page show the question). The
    ``requested`` event holds what the turn needs to go on after a restart
    (the call and its arguments, redacted like every audit row); the
    ``decided`` one says who answered, how and when.
    """

    kind: Literal["approval"] = "approval"
    approval_id: str
    phase: Literal["requested", "decided"]
    state: ApprovalState
    tool: str
    call_id: str
    #: What the call would do, as a person reads it.
    summary: str
    #: The rule that asked (``persona.yaml rule 2: ask shell_exec 'git push'``).
    rule: str | None = None
    arguments: Any = None
    #: When it expires (seconds since the epoch).
    expires_at: float
    origin: Origin = Field(default_factory=Origin)
    #: Who answered (a person's name or token, ``timeout``), and through what
    #: (``cli``, ``web``, ``telegram``, ``http``, ``timeout``).
    decided_by: str | None = None
    via: str | None = None
    #: The rule an ``always`` wrote, and where.
    always_rule: dict[str, Any] | None = None


class BudgetWarning(_Event):
    """Spending passed a budget's warning share (``budget.warn_at``), or
    its limit, which refuses further model calls until the period ends
    (``run``: an eval run's ``--max-cost``, for the rest of the run)."""

    kind: Literal["budget"] = "budget"
    scope: str
    period: Literal["day", "month", "run"]
    limit_usd: float
    spent_usd: float
    exceeded: bool = False


def schedule_log_id(persona: str) -> str:
    """The conversation id the scheduler's events of ``persona`` are recorded on."""
    return f"{persona}:schedule"


class TextDelta(_Event):
    """A piece of the model's reply text as it streams (never audited: the
    whole text is in the ``chat_message`` event that follows)."""

    kind: Literal["text_delta"] = "text_delta"
    step: int
    text: str


# --------------------------------------------------------------------------
# Status
# --------------------------------------------------------------------------


class PersonaStats(BaseModel):
    """One persona's activity: conversations held, turns running, messages
    waiting, delegated work running, turns run since it started."""

    name: str
    conversations: int
    turns_running: int
    queued: int
    delegations_running: int
    turns_run: int
    idle_seconds: float
    #: Tool calls paused on a person's approval.
    waiting_approval: int = 0


TurnEvent = Annotated[
    TurnStarted
    | HistoryAppended
    | ModelCalled
    | ToolCalled
    | ToolFinished
    | TurnEnded
    | TodosSet
    | QuestionSet
    | EnvelopeEvent
    | DelegationEvent
    | SkillsListed
    | ScheduleEvent
    | TurnDropped
    | Compacted
    | ApprovalEvent
    | BudgetWarning,
    Field(discriminator="kind"),
]
turn_event_adapter: TypeAdapter[TurnEvent] = TypeAdapter(TurnEvent)

#: What a streaming caller hears while its message is answered: the turn's
#: events as they happen (text deltas included), then the reply.
StreamItem = Annotated[
    TurnStarted
    | HistoryAppended
    | ModelCalled
    | ToolCalled
    | ToolFinished
    | TurnEnded
    | TodosSet
    | QuestionSet
    | EnvelopeEvent
    | DelegationEvent
    | SkillsListed
    | ScheduleEvent
    | TurnDropped
    | Compacted
    | ApprovalEvent
    | BudgetWarning
    | TextDelta
    | ReplyEnvelope,
    Field(discriminator="kind"),
]
stream_item_adapter: TypeAdapter[StreamItem] = TypeAdapter(StreamItem)

__all__ = [
    "API_ORIGIN",
    "ApprovalEvent",
    "ApprovalState",
    "AssistantMessage",
    "BudgetWarning",
    "CallPurpose",
    "ChatMessage",
    "Compacted",
    "ConversationRecord",
    "DelegationEvent",
    "Envelope",
    "EnvelopeEvent",
    "HistoryAppended",
    "MessageEnvelope",
    "ModelCalled",
    "ModelRequest",
    "ModelResponse",
    "Origin",
    "PersonaStats",
    "Question",
    "QuestionSet",
    "ReplyEnvelope",
    "ResumeCall",
    "ScheduleEvent",
    "ScheduleKind",
    "ScheduleOutcome",
    "ScheduleTurn",
    "SkillsListed",
    "StreamItem",
    "TextDelta",
    "ThinkingBlock",
    "TodoItem",
    "TodosSet",
    "ToolCall",
    "ToolCalled",
    "ToolChoice",
    "ToolChoiceAuto",
    "ToolChoiceNamed",
    "ToolChoiceNone",
    "ToolDefinition",
    "ToolFinished",
    "ToolResultMessage",
    "TurnContextKind",
    "TurnDropped",
    "TurnEnded",
    "TurnEvent",
    "TurnStarted",
    "TurnStatus",
    "Usage",
    "UsageContext",
    "UserMessage",
    "chat_history_adapter",
    "chat_message_adapter",
    "envelope_adapter",
    "inbox_id",
    "new_id",
    "render_todos",
    "schedule_log_id",
    "stream_item_adapter",
    "turn_event_adapter",
]
