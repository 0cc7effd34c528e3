"""``placement:``: which Ray nodes an actor may run on.

A persona's ``persona.yaml`` places its actor; ``runtime.yaml`` places the
runtime's own actors (router, audit log, memory store).
"""

from __future__ import annotations

import re
from typing import Any

from pydantic import Field, field_validator

from coterie.runtime.config._strict import Strict

#: Kubernetes label syntax, as Ray checks it: an optional DNS-subdomain prefix
#: and ``/``, then a name (and values) of at most 63 characters.
_LABEL_NAME = r"[A-Za-z0-9]([A-Za-z0-9_.-]{0,61}[A-Za-z0-9])?"
_LABEL_KEY_RE = re.compile(rf"^({_LABEL_NAME}(\.{_LABEL_NAME})*/)?{_LABEL_NAME}$")
_LABEL_VALUE_RE = re.compile(rf"^({_LABEL_NAME})?$")


class Placement(Strict):
    """Which Ray nodes an actor may run on (``placement:``).

    ``resources`` are custom Ray resources the actor holds while it lives
    (actors take no CPU, so a fraction such as 0.01 lets many share a node);
    ``node_labels`` must equal the node's labels (``ray start --labels``).
    Checked against the alive nodes before the actor is created, so a
    placement no node offers is an error, not an actor pending forever.
    """

    resources: dict[str, float] = Field(default_factory=dict)
    node_labels: dict[str, str] = Field(default_factory=dict)
    start_timeout: float = Field(
        default=120.0,
        gt=0,
        le=3600,
        description="seconds the actor may take to start (a matching node that is full "
        "leaves it pending); a persona's start is bounded only when it asks for resources "
        "or labels (else a slow start is load, not placement)",
    )

    @field_validator("resources")
    @classmethod
    def _resources(cls, value: dict[str, float]) -> dict[str, float]:
        for name, amount in value.items():
            if name in ("CPU", "GPU") or not name or name.startswith("node:"):
                raise ValueError(f"{name!r}: not a custom resource (name one the nodes declare)")
            # Ray counts resources in units of 0.0001.
            if amount < 0.0001:
                raise ValueError(f"{name}: the amount must be at least 0.0001, got {amount:g}")
        return value

    @field_validator("node_labels", mode="before")
    @classmethod
    def _labels(cls, value: Any) -> Any:
        if not isinstance(value, dict):
            return value
        for key, label in value.items():
            if not isinstance(key, str) or not _LABEL_KEY_RE.match(key):
                raise ValueError(f"{key!r}: not a valid label key")
            # YAML reads bare true/1 as non-strings; labels are strings on the nodes.
            if isinstance(label, bool | int | float):
                raise ValueError(f"{key}: quote the value ({label!r} is not a string)")
            if not isinstance(label, str) or not _LABEL_VALUE_RE.match(label):
                raise ValueError(
                    f"{key}: {label!r} is not a valid label value (an exact value: "
                    "letters, digits, '-', '_', '.')"
                )
        return value

    @property
    def pinned(self) -> bool:
        """Whether it asks for anything (an empty placement fits any node)."""
        return bool(self.resources or self.node_labels)


class RuntimePlacement(Strict):
    """``placement:`` in ``runtime.yaml``: where the runtime's own actors run."""

    router: Placement = Field(default_factory=lambda: Placement())
    audit: Placement = Field(default_factory=lambda: Placement())
    memory: Placement = Field(default_factory=lambda: Placement())


__all__ = ["Placement", "RuntimePlacement"]
