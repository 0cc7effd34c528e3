"""RouterActor: the address book; activation and passivation of persona actors.

Persona actors are *virtual*: a registered persona costs nothing until its
first message, when the router creates its actor; an actor idle for
``idle_timeout`` asks to be passivated and is stopped (its conversations come
back from the audit store on the next message). Callers cache the handles the
router gives out (:mod:`actors.directory`) and deliver to personas directly.
"""

from __future__ import annotations

import asyncio
import logging
import os
from pathlib import Path
from typing import Any

import ray

from actors.directory import unwrap
from actors.naming import persona_actor_name
from actors.persona import PersonaActorRemote
from runtime.config import RuntimeSettings, load_persona_dir, persona_names
from runtime.errors import PersonaConfigError, UnknownPersonaError
from runtime.messages import MessageEnvelope, ReplyEnvelope

log = logging.getLogger("coterie.actors.router")

# Personas listed (with descriptions) in each persona's prompt and tools.
ROSTER_LIMIT = 200


class RouterActor:
    """Activates, tracks and passivates the persona actors of one runtime."""

    def __init__(
        self,
        home: str,
        *,
        runtime_id: str,
        namespace: str,
        audit_actor: str,
        router_actor: str,
        memory_actor: str,
        detached: bool,
        settings: RuntimeSettings,
    ) -> None:
        self.home = Path(home)
        self.runtime_id = runtime_id
        self.namespace = namespace
        self.audit_actor = audit_actor
        self.router_actor = router_actor
        self.memory_actor = memory_actor
        self.detached = detached
        self.settings = settings
        self._actors: dict[str, Any] = {}
        self._activating: dict[str, asyncio.Future[Any]] = {}
        self._passivated: set[str] = set()
        self._names: list[str] = []
        # name -> (mtime of persona.yaml, description)
        self._descriptions: dict[str, tuple[float, str]] = {}
        self.refresh()

    # -- the address book -------------------------------------------------

    def refresh(self) -> list[str]:
        """Re-list the persona directories (cheap: names only)."""
        self._names = persona_names(self.home)
        return self._names

    def _description(self, name: str) -> str | None:
        """The persona's description, re-read only when its file changed."""
        path = self.home / "personas" / name / "persona.yaml"
        try:
            mtime = os.stat(path).st_mtime
        except OSError:
            return None
        cached = self._descriptions.get(name)
        if cached is not None and cached[0] == mtime:
            return cached[1]
        try:
            description = load_persona_dir(path.parent, name).config.description
        except PersonaConfigError as exc:
            log.warning("skipping persona %s: %s", name, exc)
            return None
        self._descriptions[name] = (mtime, description)
        return description

    def roster(self, limit: int | None = ROSTER_LIMIT) -> list[tuple[str, str]]:
        """(name, description) of valid personas, the first ``limit`` by name."""
        out: list[tuple[str, str]] = []
        for name in self._names:
            description = self._description(name)
            if description is not None:
                out.append((name, description))
            if limit is not None and len(out) >= limit:
                break
        return out

    # -- activation --------------------------------------------------------

    async def _activate(self, name: str) -> Any:
        handle: Any = self._actors.get(name)
        if handle is not None:
            return handle
        pending = self._activating.get(name)
        if pending is not None:
            return await pending
        path = self.home / "personas" / name
        if name not in self._names:
            self.refresh()
            if name not in self._names:
                raise UnknownPersonaError(name, self._names)
        load_persona_dir(path, name)  # a broken file gets its own clear error
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._activating[name] = future
        try:
            handle = PersonaActorRemote.options(  # type: ignore[attr-defined]
                name=persona_actor_name(self.runtime_id, name),
                namespace=self.namespace,
                get_if_exists=True,
                # Detached, so a persona is not owned by (and does not die
                # with) the router; stop_all and passivation end them.
                lifetime="detached",
            ).remote(
                name,
                str(self.home),
                audit_actor=self.audit_actor,
                router_actor=self.router_actor,
                memory_actor=self.memory_actor,
                namespace=self.namespace,
                roster=self.roster(),
                settings=self.settings,
            )
            await handle.ping.remote()
        except BaseException as exc:
            error = unwrap(exc)
            future.set_exception(error)
            future.exception()  # retrieved here; waiters re-raise it themselves
            raise error from None
        finally:
            self._activating.pop(name, None)
        self._actors[name] = handle
        future.set_result(handle)
        return handle

    async def resolve(self, name: str) -> Any:
        """The actor handle of persona ``name``, activating it if needed."""
        return await self._activate(name)

    async def deliver(self, data: str) -> str:
        """Deliver an envelope (JSON) through the router; returns the reply (JSON).

        For callers without a directory; a failed recipient becomes an error
        reply rather than an exception.
        """
        envelope = MessageEnvelope.model_validate_json(data)
        handle = await self._activate(envelope.recipient)
        try:
            reply: str = await handle.handle.remote(data)
        except ray.exceptions.RayError as exc:
            return ReplyEnvelope(
                reply_to=envelope.id,
                sender=envelope.recipient,
                conversation_id=envelope.conversation_id,
                turn_id="",
                text="",
                status="error",
                error=f"persona {envelope.recipient!r} failed: {unwrap(exc)}",
            ).model_dump_json()
        return reply

    # -- passivation -------------------------------------------------------

    async def passivate(self, name: str) -> bool:
        """Stop persona ``name``'s actor if it is still idle (it asked for this)."""
        handle = self._actors.get(name)
        timeout = self.settings.idle_timeout
        if handle is None or timeout is None or name in self._activating:
            return False
        try:
            ready = await handle.prepare_passivation.remote(timeout)
        except ray.exceptions.RayError:
            ready = True  # already gone
        if not ready:
            return False
        self._actors.pop(name, None)
        self._passivated.add(handle._actor_id.hex())
        ray.kill(handle, no_restart=True)
        return True

    async def was_passivated(self, actor_id: str) -> bool:
        """Whether the actor with this id was stopped on purpose (while idle)."""
        return actor_id in self._passivated

    async def active(self) -> list[str]:
        return sorted(self._actors)

    # -- listing and lifecycle ---------------------------------------------

    async def personas(self) -> list[dict[str, Any]]:
        """Every persona: name, description, whether its actor is active."""
        self.refresh()
        # Reading thousands of persona files takes seconds: not on the loop,
        # which must keep resolving and passivating meanwhile.
        roster = await asyncio.to_thread(self.roster, None)
        return [{"name": n, "description": d, "active": n in self._actors} for n, d in roster]

    async def flush_all(self) -> int:
        """Flush every active persona's audit buffer; returns how many."""
        handles = list(self._actors.values())
        await asyncio.gather(*(h.flush.remote() for h in handles), return_exceptions=True)
        return len(handles)

    async def stop_all(self) -> None:
        """Flush and stop every persona actor of this runtime.

        Found by name, so actors this router did not start (it may have been
        restarted) are stopped too.
        """
        prefix = persona_actor_name(self.runtime_id, "")
        handles = dict(self._actors)
        for entry in ray.util.list_named_actors(all_namespaces=True):
            if entry["namespace"] == self.namespace and entry["name"].startswith(prefix):
                persona = entry["name"][len(prefix) :]
                if persona not in handles:
                    try:
                        handles[persona] = ray.get_actor(entry["name"], namespace=self.namespace)
                    except ValueError:
                        continue  # gone meanwhile
        await asyncio.gather(
            *(h.shutdown.remote() for h in handles.values()), return_exceptions=True
        )
        for handle in handles.values():
            ray.kill(handle, no_restart=True)
        self._actors.clear()

    async def ping(self) -> str:
        return self.runtime_id


RouterActorRemote = ray.remote(num_cpus=0, max_restarts=-1, max_task_retries=0)(RouterActor)

__all__ = ["ROSTER_LIMIT", "RouterActor", "RouterActorRemote"]
