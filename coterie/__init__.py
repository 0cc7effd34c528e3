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

__all__ = ["Runtime"]


def __getattr__(name: str) -> Any:
    if name == "Runtime":
        from coterie.api import Runtime

        return Runtime
    raise AttributeError(name)
