"""PersonaActor: a thin Ray shell over :class:`runtime.persona.PersonaRuntime`."""

from __future__ import annotations

import asyncio
import logging
import os
import sys
from pathlib import Path
from typing import Any

import ray

from actors._retry import idempotent_call
from actors.audit_client import audit_buffer_for
from actors.directory import PersonaDirectory
from actors.memory_client import MemoryClient
from actors.shell import ShellProcesses
from runtime.config import RuntimeSettings, load_persona
from runtime.errors import ModelError, PersonaPassivatedError
from runtime.messages import MessageEnvelope, ModelRequest, ModelResponse
from runtime.models import build_model
from runtime.models.base import Model
from runtime.persona import PersonaRuntime
from tools import builtin_registry

log = logging.getLogger("coterie.actors.persona")


class _UnavailableModel:
    """Stands in for a model that could not be built (e.g. a missing key).

    The persona still starts; each turn fails with the original, readable error.
    """

    def __init__(self, provider: str, name: str, error: ModelError) -> None:
        self.provider = provider
        self.name = name
        self.error = error

    async def request(self, request: ModelRequest) -> ModelResponse:
        raise self.error

    async def aclose(self) -> None:
        return None


class PersonaActor:
    """One persona: its conversations and turns. Created by the router."""

    def __init__(
        self,
        name: str,
        home: str,
        *,
        audit_actor: str,
        router_actor: str,
        memory_actor: str,
        namespace: str,
        roster: list[tuple[str, str]],
        settings: RuntimeSettings,
    ) -> None:
        persona = load_persona(Path(home), name)
        model: Model
        try:
            model = build_model(persona.config.model)
        except ModelError as exc:
            model = _UnavailableModel(
                persona.config.model.provider, getattr(persona.config.model, "name", ""), exc
            )
        self.settings = settings
        self._audit_handle = ray.get_actor(audit_actor, namespace=namespace)
        self._router_name, self._namespace = router_actor, namespace
        # One spool per persona on local disk: a restarted actor resends what
        # its killed predecessor recorded but had not delivered yet.
        self.buffer = audit_buffer_for(
            self._audit_handle, spool_path=Path(home) / "spool" / f"{name}.audit.jsonl"
        )
        self.directory = PersonaDirectory(router_actor, namespace)
        memory = MemoryClient(ray.get_actor(memory_actor, namespace=namespace), name)
        self.runtime = PersonaRuntime(
            persona,
            model=model,
            registry=builtin_registry(),
            audit=self.buffer,
            messenger=self.directory,
            memory=memory,
            roster=roster,
            history_loader=self._load_history,
            max_queue=settings.max_queue,
        )
        # Shell processes: one actor per command, on this node, owned by this actor.
        self.processes = ShellProcesses()
        self.runtime.processes = self.processes
        self.closing = False
        self._monitor: asyncio.Task[None] | None = None

    async def _load_history(self, conversation_id: str) -> list[Any]:
        # Rebuilds a conversation after the actor was restarted or passivated.
        await self.buffer.flush()
        history: list[Any] = await idempotent_call(
            lambda: self._audit_handle.history.remote(self.runtime.name, conversation_id)
        )
        return history

    def _admit(self, data: str) -> MessageEnvelope:
        if self.closing:
            raise PersonaPassivatedError(f"persona {self.runtime.name!r} is passivating")
        if self._monitor is None and self.settings.idle_timeout is not None:
            self._monitor = asyncio.create_task(self._watch_idle(self.settings.idle_timeout))
        return MessageEnvelope.model_validate_json(data)

    async def handle(self, data: str) -> str:
        """Answer one message envelope (JSON) with a reply envelope (JSON).

        Envelopes cross actor boundaries as JSON through their TypeAdapter:
        it is several times cheaper than pickling the pydantic objects.
        """
        reply = await self.runtime.handle(self._admit(data))
        return reply.model_dump_json()

    async def post(self, data: str) -> None:
        """Queue an envelope (JSON) without waiting for its turn."""
        self.runtime.post(self._admit(data))

    async def _watch_idle(self, idle_timeout: float) -> None:
        """Ask the router to passivate this actor once it has been idle long enough."""
        while not self.closing:
            await asyncio.sleep(min(idle_timeout / 4, 5.0))
            if self.runtime.idle_for() >= idle_timeout:
                try:
                    router = ray.get_actor(self._router_name, namespace=self._namespace)
                    await router.passivate.remote(self.runtime.name)
                except Exception as exc:  # the router may be restarting: try next tick
                    log.warning("passivation request failed: %s", exc)

    async def prepare_passivation(self, idle_timeout: float) -> bool:
        """Stop taking messages and flush, if still idle; the router then kills us."""
        if self.runtime.busy() or self.runtime.idle_for() < idle_timeout:
            return False
        if any(p.get("running") for p in await self.processes.list()):
            return False  # background commands still running: not idle
        self.closing = True
        await self.processes.close()
        await self.buffer.aclose()
        await self.runtime.model.aclose()
        return True

    async def flush(self) -> int:
        await self.buffer.flush()
        return self.buffer.events_sent

    async def stats(self) -> dict[str, Any]:
        return {
            "persona": self.runtime.name,
            "pid": os.getpid(),
            "sdks_loaded": sorted(m for m in ("openai", "anthropic") if m in sys.modules),
            "turns": self.runtime.turns_run,
            "busy": self.runtime.busy(),
            "idle_for": self.runtime.idle_for(),
            "audit_recorded": self.buffer.events_recorded,
            "audit_sent": self.buffer.events_sent,
            "audit_failures": self.buffer.failures,
        }

    async def history(self, conversation_id: str) -> list[str]:
        """The message kinds of a conversation as this actor holds it in memory."""
        return [m.kind for m in self.runtime.conversation(conversation_id).history]

    async def ping(self) -> str:
        # The first call after a restart: deliver what the spool recovered.
        await self.buffer.flush()
        return self.runtime.name

    async def shutdown(self) -> None:
        self.closing = True
        await self.processes.close()
        await self.buffer.aclose()
        await self.runtime.model.aclose()


PersonaActorRemote = ray.remote(num_cpus=0, max_restarts=-1, max_task_retries=0)(PersonaActor)

__all__ = ["PersonaActor", "PersonaActorRemote"]
