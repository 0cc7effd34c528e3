"""coterie's entry points: the ``coterie`` command, the demo, and the Python API.

>>> from coterie import Runtime
>>> rt = Runtime.start()
>>> print(rt.ask("concierge", "what time is it?").text)
>>> rt.shutdown()

``Runtime`` loads on first use, so that ``coterie --help`` does not import Ray.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from coterie.api import Runtime
    from coterie.runtime.plugins.code import CodePersona as Persona
    from coterie.runtime.tool import tool

__all__ = ["Persona", "Runtime", "tool"]


def __getattr__(name: str) -> Any:
    if name == "Runtime":
        from coterie.api import Runtime

        return Runtime
    if name == "Persona":  # a persona defined in code, for Runtime.register
        from coterie.runtime.plugins.code import CodePersona

        return CodePersona
    if name == "tool":  # the decorator that makes an async function a tool
        from coterie.runtime.tool import tool

        return tool
    raise AttributeError(name)
