"""What the runtime hosting a persona hands it, beside its services.

Two small groups of typed dependencies of :class:`~runtime.persona.PersonaRuntime`:

- :class:`PersonaHost`: the runtime around the persona — its settings, the
  roster of personas, the cluster's node addresses, and where conversations
  a restart or passivation dropped are read back from;
- :class:`Launchers`: where the work a persona starts outside its turns runs
  — subagents, coding agents, MCP server sessions. Each left out runs in
  this process (tests, the eval worker, in-process use); a persona actor
  puts each in actors of its own.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from coterie.runtime.config import RuntimeSettings
from coterie.runtime.delegation import SubagentLauncher
from coterie.runtime.delegation.records import CodingAgentLauncher
from coterie.runtime.heap import HeapTrimmer
from coterie.runtime.mcp.hub import ClientFactory
from coterie.runtime.persona.history import HistoryLoader


@dataclass(frozen=True)
class PersonaHost:
    """The runtime around a persona."""

    #: The runtime's settings (queue and conversation caps, history length, limits…).
    settings: RuntimeSettings = field(default_factory=RuntimeSettings)
    #: Every persona on the runtime, (name, description), this one included.
    roster: Sequence[tuple[str, str]] = ()
    #: The Ray cluster's own node addresses (web tools refuse them unless allowed).
    cluster_addresses: frozenset[str] = frozenset()
    #: Reads a conversation back from the audit log; without it, conversations
    #: are never dropped from memory (they could not come back).
    history: HistoryLoader | None = None
    #: Gives the process's free heap back once no turn runs (one persona per
    #: process on Ray); None: never trimmed (personas sharing a process).
    heap: HeapTrimmer | None = None


@dataclass(frozen=True)
class Launchers:
    """Where a persona's work outside its turns runs (None: in this process)."""

    #: Starts a subagent per ``spawn_subagent`` call.
    subagents: SubagentLauncher | None = None
    #: Starts a coding-agent session per ``start_coding_agent`` call.
    coding_agents: CodingAgentLauncher | None = None
    #: Opens a client session per MCP server of the persona.
    mcp_clients: ClientFactory | None = None


__all__ = ["Launchers", "PersonaHost"]
