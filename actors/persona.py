"""PersonaActor: a thin Ray shell over :class:`runtime.persona.PersonaRuntime`."""

from __future__ import annotations

import logging
import os
import sys
from pathlib import Path
from typing import Any

import ray

from runtime.audit_buffer import AuditBuffer
from runtime.config import load_persona
from runtime.errors import ModelError
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
        namespace: str,
        roster: list[tuple[str, str]],
    ) -> None:
        persona = load_persona(Path(home), name)
        model: Model
        try:
            model = build_model(persona.config.model)
        except ModelError as exc:
            model = _UnavailableModel(
                persona.config.model.provider, getattr(persona.config.model, "name", ""), exc
            )
        self._audit_handle = ray.get_actor(audit_actor, namespace=namespace)
        self.buffer = AuditBuffer(self._send)
        self.runtime = PersonaRuntime(
            persona,
            model=model,
            registry=builtin_registry(),
            audit=self.buffer,
            roster=roster,
            history_loader=self._load_history,
        )

    async def _send(self, rows: list[dict[str, Any]]) -> None:
        await self._audit_handle.append.remote(rows)

    async def _load_history(self, conversation_id: str) -> list[Any]:
        # Rebuilds a conversation after the actor was restarted or passivated.
        history: list[Any] = await self._audit_handle.history.remote(
            self.runtime.name, conversation_id
        )
        return history

    async def handle(self, data: str) -> str:
        """Answer one message envelope (JSON) with a reply envelope (JSON).

        Envelopes cross actor boundaries as JSON through their TypeAdapter:
        it is several times cheaper than pickling the pydantic objects.
        """
        envelope = MessageEnvelope.model_validate_json(data)
        reply = await self.runtime.handle(envelope)
        return reply.model_dump_json()

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
            "audit_recorded": self.buffer.events_recorded,
            "audit_sent": self.buffer.events_sent,
            "audit_failures": self.buffer.failures,
        }

    async def ping(self) -> str:
        return self.runtime.name

    async def shutdown(self) -> None:
        await self.buffer.aclose()
        await self.runtime.model.aclose()


PersonaActorRemote = ray.remote(num_cpus=0, max_restarts=-1, max_task_retries=0)(PersonaActor)

__all__ = ["PersonaActor", "PersonaActorRemote"]
