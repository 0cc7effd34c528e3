"""Ray actors: thin shells over the plain logic in ``runtime`` and ``tools``.

Only entry points (the CLI, the Python API) import this package. ``Runtime``
is loaded on first use so that actor processes, which import submodules of
this package, do not pay for the API's imports.
"""

from __future__ import annotations

from typing import Any

__all__ = ["Runtime"]


def __getattr__(name: str) -> Any:
    if name == "Runtime":
        from actors.api import Runtime

        return Runtime
    raise AttributeError(name)
