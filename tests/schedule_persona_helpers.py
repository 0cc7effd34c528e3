"""A persona and a scheduler in one process, for the scheduler's persona-side
tests: a LocalScheduler on a fake clock dispatching through a FireDispatcher
to PersonaRuntimes in a LocalHub, every event kept and written to an
in-memory audit log (so conversations rebuild through the real SQL)."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from coterie.runtime.audit import AuditWriter, event_to_row
from coterie.runtime.config import RuntimeSettings, ScheduleSettings, load_persona
from coterie.runtime.connectors import ConnectorInfo, OutboundMessage
from coterie.runtime.fires import FireDispatcher
from coterie.runtime.hub import LocalHub
from coterie.runtime.messages import (
    ConversationRecord,
    ScheduleEvent,
    TurnEvent,
    TurnStarted,
)
from coterie.runtime.models import Model
from coterie.runtime.models.scripted import FunctionModel
from coterie.runtime.persona import PersonaHost, PersonaRuntime
from coterie.runtime.schedule import FakeClock, Fire, LocalScheduler
from coterie.runtime.services import NullAudit, Services
from coterie.tools import builtin_registry
from tests.schedule_helpers import T0, touch


class LogSink(NullAudit):
    """Keeps every event, and writes it to an in-memory audit log."""

    def __init__(self) -> None:
        super().__init__()
        self.writer = AuditWriter(":memory:")

    def record(self, event: TurnEvent) -> None:
        super().record(event)
        self.writer.write_rows([event_to_row(event)])

    def schedule(self, outcome: str | None = None) -> list[ScheduleEvent]:
        return [
            e
            for e in self.events
            if isinstance(e, ScheduleEvent) and (outcome is None or e.outcome == outcome)
        ]

    def turns(self, context: str | None = None) -> list[TurnStarted]:
        return [
            e
            for e in self.events
            if isinstance(e, TurnStarted) and (context is None or e.context == context)
        ]


class FakeDeliveries:
    """The connectors' side of ``send_message``/``reply_to_origin``."""

    def __init__(self, running: tuple[str, ...] = ("web", "cli")) -> None:
        self.running = list(running)
        self.sent: list[OutboundMessage] = []

    async def deliver(self, message: OutboundMessage) -> None:
        self.sent.append(message)

    async def connectors(self) -> list[ConnectorInfo]:
        return [ConnectorInfo(id=c) for c in self.running]


def write_persona(
    home: Path,
    name: str = "ada",
    *,
    schedules: dict[str, Any] | None = None,
    checklist: str | None = None,
    soul: str = "You are Ada.",
) -> Path:
    folder = home / "personas" / name
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "persona.yaml").write_text("model: {provider: scripted, default: ok}\n")
    (folder / "SOUL.md").write_text(soul)
    if schedules is not None:
        touch(folder / "schedules.yaml", yaml.safe_dump(schedules))
    if checklist is not None:
        touch(folder / "HEARTBEAT.md", checklist)
    return folder


@dataclass
class Rig:
    """A home, its scheduler and its personas, all in this process."""

    home: Path
    clock: FakeClock = field(default_factory=lambda: FakeClock(T0))
    audit: LogSink = field(default_factory=LogSink)
    deliveries: FakeDeliveries = field(default_factory=FakeDeliveries)
    hub: LocalHub = field(default_factory=LocalHub)
    check_connectors: bool = True
    sched: LocalScheduler | None = None
    dispatcher: FireDispatcher | None = None

    def open(self) -> LocalScheduler:
        self.dispatcher = FireDispatcher(
            self.hub,
            self.audit,
            connectors=self.deliveries.connectors if self.check_connectors else None,
        )
        self.sched = LocalScheduler.open(
            self.home,
            dispatch=self.dispatcher.dispatch,
            report=self.dispatcher.report,
            settings=ScheduleSettings(min_interval=1, reload_interval=0.5),
            clock=self.clock,
        )
        self.dispatcher.bind(self.sched)
        return self.sched

    @property
    def s(self) -> LocalScheduler:
        assert self.sched is not None
        return self.sched

    def persona(self, name: str = "ada", model: Model | None = None) -> PersonaRuntime:
        """A persona runtime on the hub, its history read back from the log."""

        async def history(conversation_id: str) -> ConversationRecord:
            return self.audit.writer.conversation(name, conversation_id)

        rt = PersonaRuntime(
            load_persona(self.home, name),
            model=model or FunctionModel(lambda r: "ok"),
            registry=builtin_registry(),
            services=Services(audit=self.audit, scheduler=self.sched, deliveries=self.deliveries),
            host=PersonaHost(settings=RuntimeSettings(), history=history),
        )
        self.hub.add(rt)
        return rt

    async def tick(self, seconds: float = 0) -> list[Fire]:
        """Move the clock, run one pass of the scheduler and let the turns
        it started end; the fires it sent."""
        self.clock.advance(seconds)
        decisions = await self.s.tick()
        await self.settle()
        return [d for d in decisions if isinstance(d, Fire)]

    async def settle(self) -> None:
        async def idle() -> None:
            while any(rt.busy() for rt in self.hub.personas.values()):
                await asyncio.sleep(0.005)

        await asyncio.wait_for(idle(), 10)
