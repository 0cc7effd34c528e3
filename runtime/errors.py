"""The coterie exception tree: every exception the package raises.

Failures of the runtime itself are exceptions, all of them a
:class:`CoterieError`; failures the *model* should read (a tool that timed
out, bad arguments) are never raised to the loop but returned as tool-result
strings (see ``runtime.runner``). Where a class is defined elsewhere, its
module is named.

::

    CoterieError
    ├── ConfigError                 a config or persona file is wrong
    │   ├── PersonaConfigError      names the file, the field and what was expected
    │   │   ├── McpConfigError      an mcp.json (runtime.mcp.config)
    │   │   └── ScheduleConfigError a schedules.yaml: names the file, the entry and the field
    │   ├── ScheduleError           a cron expression, interval or time zone that cannot be used
    │   ├── SkillFormatError        a SKILL.md: names the file and field (runtime.skills.format)
    │   ├── PlacementError          no alive node can hold an actor's placement
    │   ├── PluginError             a plugin failed, or a persona needs a tool none provides
    │   ├── TaskFileError           an eval task or its dataset (runtime.eval.task)
    │   ├── AcpRosterError          an acp.json (runtime.delegation.acp.roster)
    │   └── SpawnError              an MCP server's command cannot run (runtime.mcp._stdio)
    ├── UnknownPersonaError         no persona of that name exists
    ├── ModelError                  a model provider failed
    │   ├── MissingAPIKeyError      names the environment variable to set
    │   ├── ModelHTTPError          the provider answered with an error status
    │   │   └── ContextLengthError  the request was longer than the model's window
    │   ├── ModelTimeoutError       no answer within the configured timeout
    │   ├── ContextOverflowError    a request cannot be made to fit its window (not sent)
    │   └── BudgetExceededError     a budget refused the call (not sent)
    ├── DeliveryError               a message could not be delivered or answered
    │   ├── TurnFailedError         the target's turn crashed
    │   ├── QueueFullError          the target's queue of persona messages is full
    │   ├── PersonaPassivatedError  the actor is closing; resolve the persona again
    │   ├── AskCycleError           the ask would wait on a persona waiting on the asker
    │   └── ActorLostError          an actor's process is gone (it may be restarting)
    ├── AcpError                    a coding agent's session (runtime.delegation.acp.records)
    │   ├── AcpStartError           the agent is missing, exited at once, or lacks a secret
    │   ├── AcpStartupTimeoutError  no session within the entry's startup_timeout
    │   └── AcpProtocolError        the agent answered with an error (or another version)
    ├── ScorerError                 an eval scorer could not score (runtime.eval.scorers)
    ├── SampleLimitReached          a per-sample eval limit ended it (runtime.eval.limits)
    ├── EvalStoreError              the eval results store refused (runtime.eval.store)
    ├── AuditQueryError             an audit query was refused or failed
    ├── AuditOverloadedError        the audit log holds too many unwritten rows right now
    ├── AuditSpoolInUseError        another audit buffer holds the spool file
    ├── ScheduleStoreError          the schedule store cannot be opened (held by another process)
    ├── ShellParseError             a shell line cannot be read (runtime.permissions.shell)
    ├── ToolDefinitionError         a function cannot be a tool (runtime.tool)
    ├── ApprovalError               an approval cannot be answered
    │   ├── UnknownApprovalError    no approval has that id (for that persona)
    │   └── ApprovalClosedError     it was answered already, or expired
    ├── ConnectorError              a connector could not deliver, or none runs
    │   └── UnknownConnectorError   under that id (they run in coterie serve)
    ├── ServeError                  a front door failed
    │   ├── ApiError                a request answered with an error status (runtime.serve.http)
    │   └── ServerError             a server's error, as its client sees it (runtime.serve.client)
    └── HomeInUseError              another runtime holds this home (its audit log's lock)

    ToolError                       (apart from the tree) a tool's failure the
                                    model should read: the runner turns it into
                                    {"error": kind, "detail": …}

Not drawn: private exceptions (``_Name``), signals raised and caught inside
one module that never reach a caller. tests/test_error_tree.py holds the
drawing to the code: every exception class of the package is a
``CoterieError`` (``ToolError`` aside) drawn under its real parent.

:data:`ErrorKind` is the one vocabulary of those kinds: every ``ToolError``,
every runner outcome and the ``error_kind`` column of the audit log use it
(the guide's reliability page lists them with their meaning).
"""

from __future__ import annotations

from typing import Any, Literal, get_args

#: Every error kind a tool result or an audit row can carry. Grouped by where
#: they arise; the guide's reliability page lists them with their meaning.
ErrorKind = Literal[
    # the runner and the loop
    "timeout",
    "crashed",
    "unknown_tool",
    "invalid_arguments",
    "repeated_call",
    "runner_exception",
    "interrupted",
    # any tool
    "unavailable",
    "not_found",
    "too_large",
    "limit_reached",
    # personas talking to each other
    "unknown_persona",
    "invalid_target",
    "ask_cycle",
    "delivery_failed",
    "not_in_team",
    # permission rules: a deny rule, or an approval denied or expired
    "permission_denied",
    # files and paths
    "invalid_path",
    "path_denied",
    "is_directory",
    "not_a_directory",
    "binary_file",
    "not_utf8",
    "unreadable",
    "already_exists",
    "write_failed",
    "no_change",
    "ambiguous_match",
    "disproportionate_match",
    # shell processes
    "not_running",
    "missing_secret",
    # coding agents (ACP)
    "agent_start_failed",
    "protocol_error",
    # the web
    "network_denied",
    "invalid_url",
    "too_many_redirects",
    "http_error",
    "fetch_failed",
    "unsupported_content",
    "search_failed",
    # connectors (send_message, ask_user, reply_to_origin)
    "unknown_connector",
    "no_origin",
    "already_replied",
    "connector_failed",
    # MCP servers: not started (or failed to), died mid-call, answered with an
    # error of its own (``isError``), or broke the protocol
    "server_unavailable",
    "server_crashed",
    "tool_error",
    "mcp_error",
    # skills: a skill whose SKILL.md cannot be used (load_skill names the file and field)
    "invalid_skill",
    # audit rows only: a failed model call, a turn that failed or errored
    "model_error",
    "turn_error",
    # audit rows only: a model call refused before it was sent (a budget, or
    # a conversation that cannot be fitted into the model's window)
    "budget_exceeded",
    "context_overflow",
    # audit rows only (``compaction`` events): the summarizer failed, the
    # oldest turns were dropped instead
    "compaction_failed",
    # audit rows only (``schedule`` events): fires that did not run as scheduled
    "schedule_missed",
    "schedule_failed",
    "deliver_unavailable",
]
ERROR_KINDS: frozenset[str] = frozenset(get_args(ErrorKind))


class CoterieError(Exception):
    """Base of every error raised by coterie itself."""


class ConfigError(CoterieError):
    """A configuration file or value is invalid."""


class PersonaConfigError(ConfigError):
    """A persona directory or its ``persona.yaml`` is invalid.

    The message names the file, the field and what was expected.
    """

    def __init__(self, path: str, problems: list[str]) -> None:
        self.path = path
        self.problems = problems
        lines = "\n".join(f"  - {p}" for p in problems)
        super().__init__(f"invalid persona file {path}:\n{lines}")

    def __reduce__(self) -> tuple[type, tuple[str, list[str]]]:
        # Errors cross actor boundaries pickled; keep the constructor's arguments.
        return (type(self), (self.path, self.problems))


class ScheduleConfigError(PersonaConfigError):
    """A persona's ``schedules.yaml`` is invalid: names the file, the entry
    (``heartbeat``, ``cron 'name'`` or ``(file)``) and the field."""

    def __init__(self, path: str, entry: str, field: str, message: str) -> None:
        self.entry = entry
        self.field = field
        self.message = message
        super().__init__(path, [f"{entry}: {field}: {message}"])

    def __reduce__(self) -> tuple[type, tuple[str, str, str, str]]:  # type: ignore[override]
        return (type(self), (self.path, self.entry, self.field, self.message))


class ScheduleError(ConfigError):
    """A cron expression, an interval or a time zone that cannot be used; the
    message quotes it and says why."""


class PlacementError(ConfigError):
    """No alive node offers what an actor's placement asks for, or none had
    room for it in time."""


class PluginError(ConfigError):
    """A plugin could not be used (it failed to import, or defines a tool or
    provider that cannot be registered), or a persona names a tool that no
    built-in or plugin provides under ``plugins.strict``; the message names
    the plugin, the name and the cause."""


class UnknownPersonaError(CoterieError):
    """A message was addressed to a persona that does not exist."""

    def __init__(self, name: str, known: list[str]) -> None:
        self.name = name
        self.known = known
        listing = ", ".join(known[:20]) if known else "none"
        if len(known) > 20:
            listing += f", … and {len(known) - 20} more"
        super().__init__(f"unknown persona {name!r} (known personas: {listing})")

    def __reduce__(self) -> tuple[type, tuple[str, list[str]]]:
        return (type(self), (self.name, self.known))


class ModelError(CoterieError):
    """A model provider could not produce a response."""


class MissingAPIKeyError(ModelError):
    """The environment variable holding a provider's API key is not set."""

    def __init__(self, env_var: str, provider: str) -> None:
        self.env_var = env_var
        self.provider = provider
        super().__init__(
            f"{provider} model needs an API key: set the environment variable {env_var}"
        )

    def __reduce__(self) -> tuple[type, tuple[str, str]]:
        return (type(self), (self.env_var, self.provider))


class ModelHTTPError(ModelError):
    """The provider answered with an error status after all retries."""

    def __init__(self, status: int | None, message: str) -> None:
        self.status = status
        self.detail = message
        super().__init__(f"model request failed (status {status}): {message}")

    def __reduce__(self) -> tuple[type, tuple[int | None, str]]:
        return (type(self), (self.status, self.detail))


class ModelTimeoutError(ModelError):
    """The provider did not answer within the configured timeout."""


class ContextLengthError(ModelHTTPError):
    """The provider refused the request as longer than the model's context
    window (OpenAI's ``context_length_exceeded``, Anthropic's "prompt is too
    long"). The loop compacts the conversation once and retries."""


class ContextOverflowError(ModelError):
    """A request cannot be made to fit its model's window, even after
    compaction: it was not sent. The message says how large it is, the
    window, and what could not be cut."""


class BudgetExceededError(ModelError):
    """A budget refused a model call before it was sent: what was spent plus
    what running calls may still cost would pass a limit. The message names
    the budget (the persona's, the runtime's, an eval run's), its limit and
    what is spent."""

    def __init__(
        self, scope: str, period: str, limit: float, spent: float, *, model: str | None = None
    ) -> None:
        self.scope = scope
        self.period = period
        self.limit = limit
        self.spent = spent
        self.model = model
        if period == "unpriced":
            message = (
                f"budget_exceeded: {scope} has a budget, and model {model!r} has no price, so "
                "what its calls cost cannot be counted; give it one under prices: in "
                "runtime.yaml"
            )
        else:
            until = {"daily": "until the next day", "monthly": "until the next month"}.get(
                period, "for the rest of the run"
            )
            message = (
                f"budget_exceeded: {scope} has spent ${spent:.4f} of its {period} budget of "
                f"${limit:.2f} (with the calls still running); model calls are refused {until}"
            )
        super().__init__(message)

    def __reduce__(self) -> tuple[Any, ...]:
        return (
            _rebuild_budget_error,
            (type(self), self.scope, self.period, self.limit, self.spent, self.model),
        )


def _rebuild_budget_error(
    cls: type[BudgetExceededError],
    scope: str,
    period: str,
    limit: float,
    spent: float,
    model: str | None,
) -> BudgetExceededError:
    return cls(scope, period, limit, spent, model=model)


class DeliveryError(CoterieError):
    """A message could not be delivered to, or answered by, its recipient."""


class TurnFailedError(DeliveryError):
    """The recipient's turn failed with a runtime error."""


class QueueFullError(DeliveryError):
    """A conversation already holds its cap of queued persona-sourced messages."""

    def __init__(self, conversation_id: str, queued: int, cap: int) -> None:
        self.conversation_id = conversation_id
        self.queued = queued
        self.cap = cap
        super().__init__(
            f"the message queue of {conversation_id} is full ({queued}/{cap} messages from "
            "other personas waiting); try again after its current turn"
        )

    def __reduce__(self) -> tuple[type, tuple[str, int, int]]:
        return (type(self), (self.conversation_id, self.queued, self.cap))


class PersonaPassivatedError(DeliveryError):
    """The persona's actor is being passivated; the message was not taken.

    Callers resolve the persona through the router again and resend.
    """


class AskCycleError(DeliveryError):
    """Asking would close a loop of personas waiting on each other."""

    def __init__(self, cycle: list[str]) -> None:
        self.cycle = cycle
        super().__init__(
            "ask cycle: " + " → ".join(cycle) + f" ({cycle[-1]} is already waiting on this ask "
            "chain; asking it would deadlock)"
        )

    def __reduce__(self) -> tuple[type, tuple[list[str]]]:
        return (type(self), (self.cycle,))


class ActorLostError(DeliveryError):
    """The actor a call went to is gone: killed, crashed, or not reachable yet.

    Raised by the transports that carry calls between actors; the caller
    decides whether to wait for a restart and try again.
    """


class AuditQueryError(CoterieError):
    """An audit query was refused (not read-only) or failed."""


class AuditOverloadedError(CoterieError):
    """The audit log holds too many unwritten rows to accept more right now."""


class AuditSpoolInUseError(CoterieError):
    """Another audit buffer (in this or another process) holds the spool file."""


class ScheduleStoreError(CoterieError):
    """The schedule store (``<home>/schedule.duckdb``) cannot be opened or used:
    another process holds it, or it is closed."""


class ApprovalError(CoterieError):
    """An approval cannot be answered."""


class UnknownApprovalError(ApprovalError):
    """No approval has that id."""


class ApprovalClosedError(ApprovalError):
    """The approval was answered already, or it expired."""


class ConnectorError(CoterieError):
    """A connector could not deliver a message, or none runs under that id."""


class UnknownConnectorError(ConnectorError):
    """No connector of that id runs (they run in ``coterie serve``)."""


class ServeError(CoterieError):
    """A front door (``coterie serve``, ``coterie mcp-serve``) failed: a request
    it answers with an error (``runtime.serve.http.ApiError``), an error a
    running server answered a client with (``runtime.serve.client.ServerError``),
    or a server that cannot start, such as a second one for a home already served."""


class HomeInUseError(CoterieError):
    """Another runtime holds this home (its audit log's lock): the message
    names it (a runtime left detached on a Ray cluster, or another process)
    and what to do about it."""


class ToolError(Exception):
    """A tool's expected failure, reported to the model (not a runtime fault).

    ``kind`` is one of :data:`ErrorKind`; anything else is a bug and raises
    ``ValueError`` at once.
    """

    def __init__(self, kind: ErrorKind, detail: str) -> None:
        if kind not in ERROR_KINDS:
            raise ValueError(f"unknown error kind {kind!r} (see runtime.errors.ErrorKind)")
        self.kind: ErrorKind = kind
        self.detail = detail
        super().__init__(f"{kind}: {detail}")

    def __reduce__(self) -> tuple[type, tuple[ErrorKind, str]]:
        return (type(self), (self.kind, self.detail))


__all__ = [
    "ERROR_KINDS",
    "ActorLostError",
    "ApprovalClosedError",
    "ApprovalError",
    "AskCycleError",
    "AuditOverloadedError",
    "AuditQueryError",
    "AuditSpoolInUseError",
    "BudgetExceededError",
    "ConfigError",
    "ConnectorError",
    "ContextLengthError",
    "ContextOverflowError",
    "CoterieError",
    "DeliveryError",
    "ErrorKind",
    "HomeInUseError",
    "MissingAPIKeyError",
    "ModelError",
    "ModelHTTPError",
    "ModelTimeoutError",
    "PersonaConfigError",
    "PersonaPassivatedError",
    "PlacementError",
    "PluginError",
    "QueueFullError",
    "ScheduleConfigError",
    "ScheduleError",
    "ScheduleStoreError",
    "ServeError",
    "ToolError",
    "TurnFailedError",
    "UnknownApprovalError",
    "UnknownConnectorError",
    "UnknownPersonaError",
]
