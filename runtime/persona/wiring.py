"""A persona's wiring: the services it owns, built from those it is handed.

Beside the handles it is given (audit, messenger, memory, processes,
deliveries), a persona owns two services its tools reach through
``ctx.services``: its delegations (subagents and coding agents, each started
through a :class:`~runtime.persona.host.Launchers` entry or in this process)
and its MCP hub (the servers of its ``mcp.json``). :class:`PersonaWiring`
builds both, sets them on the persona's :class:`~runtime.services.Services`,
and stops everything tools left running when the persona closes.
"""

from __future__ import annotations

from collections.abc import Callable

from coterie.runtime.config import Persona, RuntimeSettings
from coterie.runtime.delegation import Delegations, LocalSubagents, SubagentSetup
from coterie.runtime.delegation.acp.records import AskPermission
from coterie.runtime.delegation.acp.roster import RosterFile
from coterie.runtime.delegation.coding import LocalCodingAgents
from coterie.runtime.delegation.records import CodingRequest, CodingSetup, SubagentLauncher
from coterie.runtime.mcp.hub import McpHub, local_clients
from coterie.runtime.messages import MessageEnvelope
from coterie.runtime.models import build_model_or_unavailable
from coterie.runtime.persona.host import Launchers
from coterie.runtime.services import Services
from coterie.runtime.shell.table import LocalProcesses
from coterie.runtime.tool import ToolRegistry


class PersonaWiring:
    """The services one persona owns: its delegations and its MCP hub."""

    def __init__(
        self,
        persona: Persona,
        *,
        registry: ToolRegistry,
        services: Services,
        launchers: Launchers,
        settings: RuntimeSettings,
        deliver: Callable[[MessageEnvelope], None],
        agent_ask: Callable[[CodingRequest], AskPermission] | None = None,
    ) -> None:
        """``deliver`` queues a wake in one of the persona's conversations
        (the report of delegated work that finished)."""
        self.services = services
        cfg = persona.config
        home = persona.path.parent.parent
        self.delegations = Delegations(
            persona=persona.name,
            deliver=deliver,
            audit=services.audit,
            max_running={
                "subagent": cfg.subagents.max_running,
                "coding_agent": cfg.coding_agents.max_running,
            },
        )
        self.delegations.subagents = SubagentSetup(
            launcher=launchers.subagents or self._local_subagents(registry, settings),
            registry=registry,
            config=cfg,
        )
        self.delegations.coding = CodingSetup(
            launcher=launchers.coding_agents
            or LocalCodingAgents(audit=services.audit, ask=agent_ask),
            roster=RosterFile(home),
            # Outside every persona's directory: agents' stderr stays unreadable to tools.
            logs=home / "logs" / "acp" / persona.name,
        )
        # MCP servers (mcp.json): sessions start on the first turn, in this
        # process unless the launchers put them elsewhere (their own actors).
        self.mcp = McpHub(
            persona=persona.name,
            home=home,
            persona_dir=persona.path,
            workspace=persona.workspace,
            factory=launchers.mcp_clients or local_clients,
            gateway=cfg.mcp_gateway,
            logs=home / "logs" / "mcp",
        )
        services.delegations = self.delegations
        services.mcp = self.mcp
        # The workspace is where the file and shell tools work: it exists.
        persona.workspace.mkdir(parents=True, exist_ok=True)

    def _local_subagents(
        self, registry: ToolRegistry, settings: RuntimeSettings
    ) -> SubagentLauncher:
        """Subagents in this process, each with its own process table when the
        persona has one (their commands die with them)."""
        processes = None
        if self.services.processes is not None:
            cap = settings.max_background_processes
            processes = lambda: LocalProcesses(max_processes=cap)  # noqa: E731
        return LocalSubagents(
            registry=registry,
            model_factory=build_model_or_unavailable,
            audit=self.services.audit,
            processes=processes,
            budget=self.services.budget,
        )

    def running(self) -> int:
        """How many delegations are still running."""
        return self.delegations.running()

    async def aclose(self) -> None:
        """Stop what tools left running — delegated work, MCP sessions,
        background tasks, shell processes — and flush the audit sink."""
        await self.delegations.aclose()
        await self.mcp.aclose()
        await self.services.background.aclose()
        if self.services.processes is not None:
            await self.services.processes.close()
        await self.services.audit.flush()


__all__ = ["PersonaWiring"]
