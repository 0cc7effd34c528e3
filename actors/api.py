"""The Python API: :class:`Runtime` starts or joins Ray and talks to personas.

>>> rt = Runtime.start()                      # local Ray, ~/.coterie
>>> print(rt.ask("concierge", "what time is it?").text)
>>> rt.shutdown()

``RAY_ADDRESS`` (or ``address=``) joins an existing cluster; the runtime's
actors are then detached so they outlive this driver.
"""

from __future__ import annotations

import asyncio
import os
import socket
from pathlib import Path
from typing import Any

import ray

from actors.audit import get_or_create_audit_log
from actors.naming import NAMESPACE, audit_name, router_name, runtime_id
from actors.router import RouterActorRemote
from runtime.audit import QueryResult
from runtime.config import resolve_home
from runtime.errors import CoterieError, DeliveryError
from runtime.messages import MessageEnvelope, ReplyEnvelope

DEFAULT_ASK_TIMEOUT = 120.0


def _unwrap(exc: BaseException) -> BaseException:
    cause = getattr(exc, "cause", None)
    return cause if isinstance(cause, CoterieError) else exc


def _check_reachable(address: str) -> None:
    """Fail fast on a ``host:port`` nobody listens on (Ray itself retries for minutes)."""
    host, sep, port = address.rpartition(":")
    if not sep or "://" in address or not port.isdigit():
        return  # "auto", "ray://…" and the like: Ray resolves those itself
    try:
        socket.create_connection((host, int(port)), timeout=5).close()
    except OSError as exc:
        raise CoterieError(f"cannot reach the Ray cluster at {address}: {exc}") from None


class Runtime:
    """A handle on one coterie runtime (one home) on a Ray cluster."""

    def __init__(self, *, home: Path, namespace: str, owns_ray: bool, detached: bool) -> None:
        self.home = home
        self.namespace = namespace
        self.id = runtime_id(home)
        self._owns_ray = owns_ray
        self.detached = detached
        self._handles: dict[str, Any] = {}
        self.audit: Any = get_or_create_audit_log(
            str(home / "audit.duckdb"),
            name=audit_name(self.id),
            namespace=namespace,
            detached=detached,
        )
        # Ray's handle typing does not follow .remote on async methods.
        self.router: Any
        self.router = RouterActorRemote.options(  # type: ignore[attr-defined]
            name=router_name(self.id),
            namespace=namespace,
            get_if_exists=True,
            lifetime="detached" if detached else None,
        ).remote(
            str(home),
            runtime_id=self.id,
            namespace=namespace,
            audit_actor=audit_name(self.id),
            detached=detached,
        )
        ray.get(self.router.ping.remote())

    @classmethod
    def start(
        cls,
        *,
        home: str | os.PathLike[str] | None = None,
        address: str | None = None,
        num_cpus: int | None = None,
    ) -> Runtime:
        """Join ``address`` / ``$RAY_ADDRESS``, reuse an initialized Ray, or start one."""
        home_path = resolve_home(home)
        (home_path / "personas").mkdir(parents=True, exist_ok=True)
        address = address or os.environ.get("RAY_ADDRESS") or None
        owns_ray = False
        if ray.is_initialized():
            namespace = ray.get_runtime_context().namespace or NAMESPACE
            detached = False
        elif address:
            _check_reachable(address)
            ray.init(address=address, namespace=NAMESPACE, log_to_driver=False)
            namespace, detached = NAMESPACE, True
        else:
            ray.init(
                num_cpus=num_cpus or os.cpu_count() or 2,
                namespace=NAMESPACE,
                include_dashboard=False,
                log_to_driver=False,
                configure_logging=False,
            )
            namespace, detached, owns_ray = NAMESPACE, False, True
        return cls(home=home_path, namespace=namespace, owns_ray=owns_ray, detached=detached)

    # -- messaging -------------------------------------------------------

    def envelope(
        self, persona: str, text: str, *, conversation_id: str | None = None, sender: str = "user"
    ) -> MessageEnvelope:
        return MessageEnvelope(
            sender=sender,
            recipient=persona,
            conversation_id=conversation_id or f"{persona}:api",
            text=text,
        )

    def _handle(self, persona: str) -> Any:
        handle = self._handles.get(persona)
        if handle is None:
            try:
                handle = ray.get(self.router.resolve.remote(persona))
            except ray.exceptions.RayError as exc:
                raise _unwrap(exc) from None
            self._handles[persona] = handle
        return handle

    def _failed(self, envelope: MessageEnvelope, exc: BaseException) -> ReplyEnvelope:
        # The handle may be stale (actor died); the router re-activates next time.
        self._handles.pop(envelope.recipient, None)
        return ReplyEnvelope(
            reply_to=envelope.id,
            sender=envelope.recipient,
            conversation_id=envelope.conversation_id,
            turn_id="",
            text="",
            status="error",
            error=f"persona {envelope.recipient!r} failed: {_unwrap(exc)}",
        )

    async def ask_async(
        self,
        persona: str,
        text: str,
        *,
        conversation_id: str | None = None,
        timeout: float = DEFAULT_ASK_TIMEOUT,
    ) -> ReplyEnvelope:
        """Send ``text`` and wait for the persona's reply (``asyncio``)."""
        envelope = self.envelope(persona, text, conversation_id=conversation_id)
        handle = self._handles.get(persona)
        if handle is None:
            try:
                handle = await self.router.resolve.remote(persona)
            except ray.exceptions.RayError as exc:
                raise _unwrap(exc) from None
            self._handles[persona] = handle
        try:
            data = await asyncio.wait_for(handle.handle.remote(envelope.model_dump_json()), timeout)
        except TimeoutError:
            raise DeliveryError(f"{persona!r} did not reply within {timeout:g} s") from None
        except ray.exceptions.RayError as exc:
            return self._failed(envelope, exc)
        return ReplyEnvelope.model_validate_json(data)

    def ask(
        self,
        persona: str,
        text: str,
        *,
        conversation_id: str | None = None,
        timeout: float = DEFAULT_ASK_TIMEOUT,
    ) -> ReplyEnvelope:
        """Send ``text`` and wait for the persona's reply.

        The persona's actor handle comes from the router once and is cached;
        messages then go to it directly.
        """
        envelope = self.envelope(persona, text, conversation_id=conversation_id)
        ref = self._handle(persona).handle.remote(envelope.model_dump_json())
        try:
            data = ray.get(ref, timeout=timeout)
        except ray.exceptions.GetTimeoutError:
            raise DeliveryError(f"{persona!r} did not reply within {timeout:g} s") from None
        except ray.exceptions.RayError as exc:
            return self._failed(envelope, exc)
        return ReplyEnvelope.model_validate_json(data)

    def personas(self) -> list[dict[str, Any]]:
        """Name, description and activity of every persona in the home."""
        result: list[dict[str, Any]] = ray.get(self.router.personas.remote())
        return result

    # -- audit -----------------------------------------------------------

    def flush(self) -> None:
        """Push every buffered audit event into DuckDB."""
        ray.get(self.router.flush_all.remote())
        ray.get(self.audit.flush.remote())

    def query(self, sql: str) -> QueryResult:
        """Run a read-only SQL query on the audit store (after a flush)."""
        self.flush()
        try:
            result: QueryResult = ray.get(self.audit.query.remote(sql))
        except ray.exceptions.RayError as exc:
            raise _unwrap(exc) from None
        return result

    # -- lifecycle -------------------------------------------------------

    def shutdown(self, *, stop_actors: bool | None = None) -> None:
        """Flush everything; stop this runtime's actors unless they are detached.

        Shuts Ray down too when this runtime started it.
        """
        stop = (not self.detached) if stop_actors is None else stop_actors
        try:
            ray.get(self.router.flush_all.remote())
            if stop:
                ray.get(self.router.stop_all.remote())
            ray.get(self.audit.flush.remote())
            if stop:
                ray.get(self.audit.shutdown.remote())
                ray.kill(self.audit)
                ray.kill(self.router)
        finally:
            if self._owns_ray:
                ray.shutdown()


__all__ = ["Runtime"]
