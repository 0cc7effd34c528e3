"""``plugins:`` in ``runtime.yaml``: the user's own tools, scorers, dataset
loaders and model providers (see :mod:`coterie.runtime.plugins`).

A bare list is the ``load`` list. Each entry of ``load`` is a module name
(``mypkg.tools``) or a path to a ``.py`` file or a package directory,
relative to the home unless absolute (``./plugins/weather.py``).
"""

from __future__ import annotations

from typing import Any

from pydantic import Field, field_validator, model_validator

from coterie.runtime.config._strict import Strict


class PluginSettings(Strict):
    """Which plugins a runtime loads, and how their code reaches every node."""

    load: list[str] = Field(
        default_factory=list,
        description="modules (mypkg.tools) or files and package folders (./plugins/weather.py, "
        "relative to the home) to load",
    )
    entry_points: bool = Field(
        default=True,
        description="also load what installed distributions announce under the coterie.tools, "
        "coterie.models, coterie.scorers and coterie.datasets entry points",
    )
    strict: bool = Field(
        default=False,
        description="a persona whose tools.allow names a tool that no built-in or plugin "
        "provides refuses to start (false: it starts without it, with a warning)",
    )
    ship: bool = Field(
        default=True,
        description="send plugin code that lives outside the Python installation (home files, "
        "folders on the driver's path) to every node with Ray's runtime environments",
    )
    pip: bool = Field(
        default=False,
        description="have Ray install the requirements plugins declare (REQUIRES) on every "
        "node, in a virtualenv per node (needs the virtualenv package and a reachable index)",
    )

    @model_validator(mode="before")
    @classmethod
    def _bare_list(cls, value: Any) -> Any:
        if isinstance(value, list):
            return {"load": value}
        return value

    @field_validator("load")
    @classmethod
    def _entries(cls, value: list[str]) -> list[str]:
        for i, entry in enumerate(value):
            if not isinstance(entry, str) or not entry.strip():
                raise ValueError(f"entry {i}: a module name or path is empty")
        repeated = sorted({e for e in value if value.count(e) > 1})
        if repeated:
            raise ValueError(f"{', '.join(repeated)} listed more than once")
        return value


__all__ = ["PluginSettings"]
