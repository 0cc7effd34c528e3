"""How plugin code reaches every node: a Ray runtime environment.

Ray's runtime environments carry code to the workers of a cluster: each
file or folder in ``py_modules`` is uploaded once (to the cluster's object
store), unpacked on every node that runs an actor needing it, and put on
that actor's ``PYTHONPATH`` — so the processes it starts (an MCP server's
command) import it too. Actors inherit their creator's environment, so the
subagents, coding agents, MCP servers and shell processes of a persona get
what its actor got.

This module only says *what* to ship (:func:`runtime_env_for`); uploading is
Ray's (``coterie.actors``). Nothing is shipped for a runtime without plugins
outside the Python installation: its actors start exactly as before.
"""

from __future__ import annotations

from typing import Any

from coterie.runtime.config.plugins import PluginSettings
from coterie.runtime.plugins.refs import PluginRef


def runtime_env_for(
    refs: list[PluginRef], requires: list[str], settings: PluginSettings
) -> dict[str, Any] | None:
    """The runtime environment (local paths, before upload) that makes every
    plugin importable on any node; None when nothing needs shipping."""
    env: dict[str, Any] = {}
    modules: list[str] = []
    for ref in refs:
        if ref.ship is not None and ref.ship not in modules:
            modules.append(ref.ship)
    if modules:
        env["py_modules"] = modules
    if settings.pip and requires:
        # Ray installs them into a virtualenv per node that keeps this
        # installation's packages; pip's own check would refuse Ray's pins.
        env["pip"] = {"packages": list(requires), "pip_check": False}
    return env or None


__all__ = ["runtime_env_for"]
