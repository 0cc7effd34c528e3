"""A persona's conversations and turns, without Ray (the logic inside
``PersonaActor``).

:class:`PersonaRuntime` puts together the parts: the per-conversation queues
and soft interrupts (``queues``), the turns built around the tool loop
(``turns``), the services the persona owns (``wiring``), what it is handed
(``host``: :class:`PersonaHost`, :class:`Launchers`), its conversations'
history (``history``) and the scheduler's fires (``scheduled``).
"""

from __future__ import annotations

from coterie.runtime.persona.history import (
    HistoryLoader,
    render_input,
    trim_history,
    unanswered_calls,
)
from coterie.runtime.persona.host import Launchers, PersonaHost
from coterie.runtime.persona.queues import Batch, ConversationQueues, Pending
from coterie.runtime.persona.runtime import PersonaRuntime
from coterie.runtime.persona.scheduled import ScheduledTurns
from coterie.runtime.persona.turns import TurnBuilder
from coterie.runtime.persona.wiring import PersonaWiring

__all__ = [
    "Batch",
    "ConversationQueues",
    "HistoryLoader",
    "Launchers",
    "Pending",
    "PersonaHost",
    "PersonaRuntime",
    "PersonaWiring",
    "ScheduledTurns",
    "TurnBuilder",
    "render_input",
    "trim_history",
    "unanswered_calls",
]
