"""The testing API: doubles for running personas and tools without a network,
an API key or Ray. They are product (they ship in the wheel): the demo, the
benchmarks and anyone testing their own tools and personas use them.

- :class:`ScriptedModel` answers with given steps in order, records every
  request and can :meth:`~ScriptedModel.assert_consumed` them;
  :class:`FunctionModel` answers by calling a function of the request;
  :class:`RulesModel` is ``provider: scripted`` of persona.yaml (rules tried
  in order); :func:`tool_call` builds a tool call for a scripted reply. They
  are defined in :mod:`coterie.runtime.models.scripted`.
- :func:`turn_context` builds a turn context on a fresh conversation, to call
  a tool directly.
- :class:`LocalHub` lets several persona runtimes of one process ask and
  message each other (the in-process stand-in for the router).

The fake protocol servers (OpenAI, Anthropic, Telegram) and the recall
datasets are test equipment: they live in the repository's ``tests/fakes``
and ``tests/recall``, not here.
"""

from __future__ import annotations

from coterie.runtime.hub import LocalHub
from coterie.runtime.models.scripted import FunctionModel, RulesModel, ScriptedModel, tool_call
from coterie.runtime.testing.context import turn_context

__all__ = [
    "FunctionModel",
    "LocalHub",
    "RulesModel",
    "ScriptedModel",
    "tool_call",
    "turn_context",
]
