"""``coterie stop``: stop a runtime that was left running on a Ray cluster.

A runtime joined to a cluster (``--address``) keeps its actors there,
detached, after its command ends: the next command on that cluster finds
them, and a command on the home without ``--address`` cannot open the home
(its audit log is a DuckDB file those actors hold). :func:`stop_runtime`
joins the cluster and stops the home's actors in the order that loses
nothing: the scheduler is stopped first (no fire starts a turn any more; it flushes its
audit buffer and lets go of ``schedule.duckdb``), the personas' audit
buffers are flushed into the audit log, the personas stopped, the audit log
flushed and closed (which lets go of its DuckDB file), then the audit log,
the memory store, the scheduler and the router go.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import ray

from coterie import cluster
from coterie.actors._ray import (
    NAMESPACE,
    audit_name,
    memory_name,
    persona_actor_name,
    router_name,
    runtime_id,
    scheduler_name,
)
from coterie.holder import clear_holder
from coterie.runtime.audit.log import AuditLogStats

#: Seconds each step of the stop may take (a flush of a large backlog included).
STEP_TIMEOUT = 120.0


@dataclass(frozen=True)
class Stopped:
    """What :func:`stop_runtime` found and stopped."""

    #: The cluster's address (its GCS), as joined.
    address: str
    #: Whether any actor of the home's runtime was there.
    found: bool
    #: Persona actors stopped.
    personas: int = 0
    #: Audit rows the audit log could still not write when it closed.
    audit_pending: int = 0


def _actor(name: str) -> Any | None:
    try:
        return ray.get_actor(name, namespace=NAMESPACE)
    except ValueError:
        return None


def _named_personas(rid: str) -> list[Any]:
    """The persona actors of runtime ``rid`` that are alive, found by name."""
    prefix = persona_actor_name(rid, "")
    found = []
    for entry in ray.util.list_named_actors(all_namespaces=True):
        if entry["namespace"] == NAMESPACE and entry["name"].startswith(prefix):
            handle = _actor(entry["name"])
            if handle is not None:
                found.append(handle)
    return found


def stop_actors(rid: str) -> tuple[bool, int, int]:
    """Stop the actors of runtime ``rid`` on the cluster this process is on:
    whether any was found, how many personas were stopped, and how many audit
    rows were left unwritten."""
    router, audit, memory, scheduler = (
        _actor(n(rid)) for n in (router_name, audit_name, memory_name, scheduler_name)
    )
    if scheduler is not None:
        # Gone or restarting: it is killed below all the same.
        with contextlib.suppress(ray.exceptions.RayError):
            ray.get(scheduler.shutdown.remote(), timeout=STEP_TIMEOUT)
    if router is not None:
        # The router flushes every persona's audit buffer, then shuts down and
        # stops each persona actor of the runtime (found by name, so also
        # those a restarted router did not start).
        ray.get(router.flush_all.remote(), timeout=STEP_TIMEOUT)
        personas: int = ray.get(router.stop_all.remote(), timeout=STEP_TIMEOUT)
    else:  # the router is gone: its personas are shut down here
        orphans = _named_personas(rid)
        with contextlib.suppress(ray.exceptions.RayError):
            ray.get([h.shutdown.remote() for h in orphans], timeout=STEP_TIMEOUT)
        for handle in orphans:
            ray.kill(handle, no_restart=True)
        personas = len(orphans)
    pending = 0
    if audit is not None:
        ray.get(audit.flush.remote(), timeout=STEP_TIMEOUT)
        stats: AuditLogStats = ray.get(audit.shutdown.remote(), timeout=STEP_TIMEOUT)
        pending = stats.pending
    for handle in (audit, memory, scheduler, router):
        if handle is not None:
            ray.kill(handle, no_restart=True)
    found = any(h is not None for h in (router, audit, memory, scheduler)) or personas > 0
    return found, personas, pending


def stop_runtime(home: Path, address: str) -> Stopped:
    """Join the cluster at ``address`` and stop the runtime of ``home`` there
    (see the module docstring); its record in the home goes with it."""
    cluster.join(address)
    try:
        joined = ray.get_runtime_context().gcs_address
        found, personas, pending = stop_actors(runtime_id(home))
        clear_holder(home, address=joined)
        return Stopped(joined, found, personas, pending)
    finally:
        ray.shutdown()


__all__ = ["Stopped", "stop_actors", "stop_runtime"]
