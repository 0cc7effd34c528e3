"""Delegation: pushed work a persona hands off, and the wakes that report it.

``work`` holds what every kind shares (the :class:`Delegations` registry,
grouped completion wakes, timeouts, cancel); ``subagent`` runs a fresh,
tool-restricted helper through the turn loop; ``coding`` hands a task to an
external coding agent, and the ``acp`` package speaks the Agent Client
Protocol to it (its SDK loaded only when a session runs).
"""

from __future__ import annotations

from coterie.runtime.delegation.records import (
    SubagentLauncher,
    SubagentRequest,
    SubagentSetup,
    Work,
    WorkKind,
    WorkOutcome,
    WorkStatus,
)
from coterie.runtime.delegation.subagent import (
    LocalSubagents,
    SpawnRequest,
    SubagentRun,
    start_subagent,
)
from coterie.runtime.delegation.work import WAKE_SENDER, Delegations, render_wake

__all__ = [
    "WAKE_SENDER",
    "Delegations",
    "LocalSubagents",
    "SpawnRequest",
    "SubagentLauncher",
    "SubagentRequest",
    "SubagentRun",
    "SubagentSetup",
    "Work",
    "WorkKind",
    "WorkOutcome",
    "WorkStatus",
    "render_wake",
    "start_subagent",
]
