"""RouterActor: the address book, activation of persona actors, delivery."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path
from typing import Any

import ray

from actors.naming import persona_actor_name
from actors.persona import PersonaActorRemote
from runtime.config import load_persona_dir, persona_names
from runtime.errors import CoterieError, PersonaConfigError, UnknownPersonaError
from runtime.messages import MessageEnvelope, ReplyEnvelope

log = logging.getLogger("coterie.actors.router")


class RouterActor:
    """Delivers envelopes to persona actors, activating them on first use."""

    def __init__(
        self, home: str, *, runtime_id: str, namespace: str, audit_actor: str, detached: bool
    ) -> None:
        self.home = Path(home)
        self.runtime_id = runtime_id
        self.namespace = namespace
        self.audit_actor = audit_actor
        self.detached = detached
        self._actors: dict[str, Any] = {}
        self._activating: dict[str, asyncio.Future[Any]] = {}
        self._roster: list[tuple[str, str]] = []
        self.refresh()

    def refresh(self) -> list[str]:
        """Re-read the persona directories (names and descriptions)."""
        roster = []
        for name in persona_names(self.home):
            try:
                persona = load_persona_dir(self.home / "personas" / name, name)
            except PersonaConfigError as exc:
                log.warning("skipping persona %s: %s", name, exc)
                continue
            roster.append((name, persona.config.description))
        self._roster = roster
        return [n for n, _ in roster]

    def _known(self) -> list[str]:
        return [n for n, _ in self._roster]

    async def _activate(self, name: str) -> Any:
        handle: Any = self._actors.get(name)
        if handle is not None:
            return handle
        pending = self._activating.get(name)
        if pending is not None:
            return await pending
        if name not in self._known():
            self.refresh()
            if name not in self._known():
                # A broken persona file gets its own clear error.
                path = self.home / "personas" / name
                if (path / "persona.yaml").is_file():
                    load_persona_dir(path, name)
                raise UnknownPersonaError(name, self._known())
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._activating[name] = future
        try:
            handle = PersonaActorRemote.options(  # type: ignore[attr-defined]
                name=persona_actor_name(self.runtime_id, name),
                namespace=self.namespace,
                get_if_exists=True,
                lifetime="detached" if self.detached else None,
            ).remote(
                name,
                str(self.home),
                audit_actor=self.audit_actor,
                namespace=self.namespace,
                roster=self._roster,
            )
            await handle.ping.remote()
        except BaseException as exc:
            self._activating.pop(name, None)
            future.set_exception(_unwrap(exc))
            future.exception()  # mark retrieved; the raise below reports it
            raise _unwrap(exc) from None
        self._actors[name] = handle
        self._activating.pop(name, None)
        future.set_result(handle)
        return handle

    async def resolve(self, name: str) -> Any:
        """The actor handle of persona ``name``, activating it if needed.

        Callers cache the handle and deliver to it directly (one hop instead
        of two); they come back here when it fails or is unknown.
        """
        return await self._activate(name)

    async def deliver(self, data: str) -> str:
        """Deliver an envelope (JSON) and return the reply envelope (JSON).

        For callers without a handle cache; a failed recipient becomes an
        error reply rather than an exception.
        """
        envelope = MessageEnvelope.model_validate_json(data)
        handle = await self._activate(envelope.recipient)
        try:
            reply: str = await handle.handle.remote(data)
        except ray.exceptions.RayError as exc:
            self._actors.pop(envelope.recipient, None)
            return ReplyEnvelope(
                reply_to=envelope.id,
                sender=envelope.recipient,
                conversation_id=envelope.conversation_id,
                turn_id="",
                text="",
                status="error",
                error=f"persona {envelope.recipient!r} failed: {_unwrap(exc)}",
            ).model_dump_json()
        return reply

    async def personas(self) -> list[dict[str, Any]]:
        """The roster: name, description, whether its actor is active."""
        self.refresh()
        return [{"name": n, "description": d, "active": n in self._actors} for n, d in self._roster]

    async def flush_all(self) -> int:
        """Flush every active persona's audit buffer; returns how many."""
        handles = list(self._actors.values())
        await asyncio.gather(*(h.flush.remote() for h in handles), return_exceptions=True)
        return len(handles)

    async def stop_all(self) -> None:
        """Flush and stop every persona actor."""
        handles = list(self._actors.values())
        await asyncio.gather(*(h.shutdown.remote() for h in handles), return_exceptions=True)
        for handle in handles:
            ray.kill(handle)
        self._actors.clear()

    async def ping(self) -> str:
        return self.runtime_id


def _unwrap(exc: BaseException) -> BaseException:
    """The original exception inside a Ray task error, if there is one."""
    cause = getattr(exc, "cause", None)
    if isinstance(cause, CoterieError):
        return cause
    return exc


RouterActorRemote = ray.remote(num_cpus=0, max_restarts=-1, max_task_retries=0)(RouterActor)

__all__ = ["RouterActor", "RouterActorRemote"]
