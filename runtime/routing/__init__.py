"""Routing personas, without Ray: the roster of a home, the router's
activation and passivation of virtual actors, the caller-side directory, the
idle watcher, and retries through transient failures."""

from __future__ import annotations

from coterie.runtime.routing.directory import Directory, PersonaLink
from coterie.runtime.routing.idle import IdleWatcher
from coterie.runtime.routing.retry import retry_transient
from coterie.runtime.routing.roster import ROSTER_LIMIT, Roster
from coterie.runtime.routing.router import PersonaHost, PersonaInfo, Router, RouterStatus

__all__ = [
    "ROSTER_LIMIT",
    "Directory",
    "IdleWatcher",
    "PersonaHost",
    "PersonaInfo",
    "PersonaLink",
    "Roster",
    "Router",
    "RouterStatus",
    "retry_transient",
]
