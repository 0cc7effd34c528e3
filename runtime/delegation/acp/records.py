"""What an ACP session reports: its errors, its events and its result.

Errors, drawn from :class:`runtime.errors.CoterieError`::

    CoterieError
    └── AcpError                    .kind: AcpErrorKind; raised by AcpSession.start only
        ├── AcpStartError           missing_binary, exited, missing_secret
        ├── AcpStartupTimeoutError  startup_timeout: no session within startup_timeout
        └── AcpProtocolError        protocol_error: the agent answered with an error
                                    (or speaks another ACP version)

The events (:data:`AcpEvent`, one discriminated union) are what the agent
did, as :class:`~runtime.delegation.acp.session.AcpSession` streams them; a
:class:`CodingResult` is how one task ended. Plain pydantic: no SDK import.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field

from coterie.runtime.errors import CoterieError

AcpErrorKind = Literal[
    "missing_binary",
    "exited",
    "missing_secret",
    "startup_timeout",
    "protocol_error",
    "crashed",
    "timeout",
]
StopReason = Literal["end_turn", "max_tokens", "max_turn_requests", "refusal", "cancelled"]


# -- errors ------------------------------------------------------------------


class AcpError(CoterieError):
    """An ACP coding agent could not be started or failed; ``kind`` says how."""

    default_kind: AcpErrorKind = "protocol_error"

    def __init__(self, message: str, kind: AcpErrorKind | None = None) -> None:
        self.kind: AcpErrorKind = kind or self.default_kind
        self.detail = message
        super().__init__(message)

    def __reduce__(self) -> tuple[type, tuple[str, AcpErrorKind]]:
        return (type(self), (self.detail, self.kind))


class AcpStartError(AcpError):
    """The agent could not be started: binary missing, exited at once, secret missing."""

    default_kind: AcpErrorKind = "exited"


class AcpStartupTimeoutError(AcpError):
    """The agent did not answer ``initialize``/``session/new`` within its startup timeout."""

    default_kind: AcpErrorKind = "startup_timeout"


class AcpProtocolError(AcpError):
    """The agent answered with a JSON-RPC error or something the SDK could not read."""

    default_kind: AcpErrorKind = "protocol_error"


# -- events and results ------------------------------------------------------


class _Event(BaseModel):
    model_config = ConfigDict(extra="forbid")
    at: float = Field(default_factory=time.time)


class MessageEvent(_Event):
    """Text of the agent's reply (chunks of one message are merged in ``events``)."""

    kind: Literal["message"] = "message"
    text: str


class ThoughtEvent(_Event):
    kind: Literal["thought"] = "thought"
    text: str


class ToolCallEvent(_Event):
    """A tool call the agent started (``update=False``) or an update of it."""

    kind: Literal["tool_call"] = "tool_call"
    tool_call_id: str
    update: bool = False
    title: str | None = None
    tool_kind: str | None = None
    status: Literal["pending", "in_progress", "completed", "failed"] | None = None
    paths: list[str] = Field(default_factory=list)


class PlanStep(BaseModel):
    content: str
    status: Literal["pending", "in_progress", "completed"]
    priority: Literal["high", "medium", "low"]


class PlanEvent(_Event):
    kind: Literal["plan"] = "plan"
    steps: list[PlanStep]


class PermissionDecision(BaseModel):
    """How one ``session/request_permission`` was answered, and why."""

    tool_call_id: str
    title: str | None = None
    tool_kind: str | None = None
    paths: list[str] = Field(default_factory=list)
    decision: Literal["allow", "deny"]
    option_id: str | None = None
    reason: str


class AgentPermission(BaseModel):
    """One ``session/request_permission`` put to the persona's rules and a
    person (roster ``permissions: ask``)."""

    agent: str
    tool_call_id: str
    title: str | None = None
    tool_kind: str | None = None
    paths: list[str] = Field(default_factory=list)
    #: The shell command it would run, when it says (``raw_input.command``).
    command: str | None = None


class PermissionEvent(_Event):
    kind: Literal["permission"] = "permission"
    decision: PermissionDecision


class FileAccessEvent(_Event):
    """An ``fs/read_text_file`` or ``fs/write_text_file`` call, allowed or refused."""

    kind: Literal["file"] = "file"
    op: Literal["read", "write"]
    path: str
    allowed: bool
    detail: str = ""


class TerminalEvent(_Event):
    """A client terminal: created (or refused), waited for, killed, released."""

    kind: Literal["terminal"] = "terminal"
    op: Literal["create", "exit", "kill", "release"]
    terminal_id: str | None = None
    command: str
    cwd: str | None = None
    allowed: bool = True
    exit_code: int | None = None
    signal: str | None = None
    detail: str = ""


AnyEvent = (
    MessageEvent
    | ThoughtEvent
    | ToolCallEvent
    | PlanEvent
    | PermissionEvent
    | FileAccessEvent
    | TerminalEvent
)
#: The events as one discriminated union (``TypeAdapter(AcpEvent)`` reads them back).
AcpEvent = Annotated[AnyEvent, Field(discriminator="kind")]
UpdateCallback = Callable[[AnyEvent], Awaitable[None] | None]
#: Under ``permissions: ask``: whether a request is allowed, and why.
AskPermission = Callable[["AgentPermission"], Awaitable[tuple[bool, str]]]


class AgentUsage(BaseModel):
    """What the agent said one task consumed: the token counts of its
    prompt's reply (ACP's ``PromptResponse.usage``, where it sends one) and
    the growth of the session's cumulative cost over the task (its
    ``usage_update`` notifications' ``cost``, where it sends them). Nothing
    is estimated: what the agent did not report stays unknown.
    ``input_tokens`` counts the cached ones too (as a provider's usage does
    here); ``thought_tokens`` are apart from ``output_tokens``."""

    input_tokens: int = 0
    output_tokens: int = 0
    cache_read_tokens: int = 0
    cache_write_tokens: int = 0
    thought_tokens: int = 0
    # False when the agent sent no token counts (only a cost, say).
    tokens_reported: bool = False
    cost: float | None = None
    currency: str | None = None

    @property
    def cost_usd(self) -> float | None:
        """The cost in US dollars; None when unknown or in another currency."""
        if self.cost is None or (self.currency or "").upper() != "USD":
            return None
        return self.cost


class CodingResult(BaseModel):
    """The outcome of one delegated task."""

    agent: str
    session_id: str | None = None
    stop_reason: StopReason | None = None
    text: str = Field(default="", description="the agent's final message")
    files_changed: list[str] = Field(
        default_factory=list, description="created, modified or deleted; relative to the workspace"
    )
    files_changed_complete: bool = Field(
        default=True, description="false when the workspace was too large to snapshot whole"
    )
    permissions: list[PermissionDecision] = Field(default_factory=list)
    tool_calls: int = 0
    error: str | None = None
    error_kind: AcpErrorKind | None = None
    killed: bool = Field(default=False, description="the group was killed before the turn ended")
    duration_s: float = 0.0
    usage: AgentUsage | None = Field(default=None, description="None: the agent reported none")

    @property
    def ok(self) -> bool:
        return self.error is None and self.stop_reason == "end_turn"


__all__ = [
    "AcpError",
    "AcpErrorKind",
    "AcpEvent",
    "AcpProtocolError",
    "AcpStartError",
    "AcpStartupTimeoutError",
    "AgentPermission",
    "AgentUsage",
    "AnyEvent",
    "AskPermission",
    "CodingResult",
    "FileAccessEvent",
    "MessageEvent",
    "PermissionDecision",
    "PermissionEvent",
    "PlanEvent",
    "PlanStep",
    "StopReason",
    "TerminalEvent",
    "ThoughtEvent",
    "ToolCallEvent",
    "UpdateCallback",
]
