"""Coding agents over the Agent Client Protocol (ACP).

- :mod:`~coterie.runtime.delegation.acp.roster`: ``<home>/acp.json``, the
  agents a persona may delegate to (:class:`AgentSpec`, :class:`RosterFile`);
- :mod:`~coterie.runtime.delegation.acp.records`: what a session reports,
  its errors (:class:`AcpError` and its branches), events and result;
- :mod:`~coterie.runtime.delegation.acp.session`: :class:`AcpSession`, one
  agent process speaking ACP over stdio, and :func:`run_coding_task`;
- :mod:`~coterie.runtime.delegation.acp.rails`: what the agent may touch
  (permission decisions, paths inside the workspace, changed files);
- :mod:`~coterie.runtime.delegation.acp.terminals`: the ``terminal/*``
  commands an agent runs under the sandbox.

The roster and the records are plain pydantic. The session, the rails and the
terminals import the ACP SDK (``acp``, close to half a second of imports), so
their names load on first use: a persona process that holds a roster but
never delegates never loads the SDK.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from coterie.runtime.delegation.acp.records import (
    AcpError,
    AcpErrorKind,
    AcpEvent,
    AcpProtocolError,
    AcpStartError,
    AcpStartupTimeoutError,
    AnyEvent,
    CodingResult,
    FileAccessEvent,
    MessageEvent,
    PermissionDecision,
    PermissionEvent,
    PlanEvent,
    PlanStep,
    StopReason,
    TerminalEvent,
    ThoughtEvent,
    ToolCallEvent,
    UpdateCallback,
)
from coterie.runtime.delegation.acp.roster import (
    AGENT_NAME_RE,
    ROSTER_FILE,
    AcpRoster,
    AcpRosterError,
    AgentSpec,
    CwdPolicy,
    PermissionPolicy,
    RosterFile,
    load_acp_roster,
    parse_acp_roster,
    resolve_agent_env,
)

if TYPE_CHECKING:
    from coterie.runtime.delegation.acp.rails import (
        changed_files,
        decide_permission,
        inside_root,
        snapshot_tree,
    )
    from coterie.runtime.delegation.acp.session import AcpSession, run_coding_task
    from coterie.runtime.delegation.acp.terminals import Terminal, Terminals

#: Names that load the ACP SDK, by the module that defines them.
_LAZY = {
    "AcpSession": "session",
    "run_coding_task": "session",
    "changed_files": "rails",
    "decide_permission": "rails",
    "inside_root": "rails",
    "snapshot_tree": "rails",
    "Terminal": "terminals",
    "Terminals": "terminals",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    globals()[name] = value
    return value


__all__ = [
    "AGENT_NAME_RE",
    "ROSTER_FILE",
    "AcpError",
    "AcpErrorKind",
    "AcpEvent",
    "AcpProtocolError",
    "AcpRoster",
    "AcpRosterError",
    "AcpSession",
    "AcpStartError",
    "AcpStartupTimeoutError",
    "AgentSpec",
    "AnyEvent",
    "CodingResult",
    "CwdPolicy",
    "FileAccessEvent",
    "MessageEvent",
    "PermissionDecision",
    "PermissionEvent",
    "PermissionPolicy",
    "PlanEvent",
    "PlanStep",
    "RosterFile",
    "StopReason",
    "Terminal",
    "TerminalEvent",
    "Terminals",
    "ThoughtEvent",
    "ToolCallEvent",
    "UpdateCallback",
    "changed_files",
    "decide_permission",
    "inside_root",
    "load_acp_roster",
    "parse_acp_roster",
    "resolve_agent_env",
    "run_coding_task",
    "snapshot_tree",
]
