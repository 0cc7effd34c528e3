"""Which cluster nodes can hold an actor's :class:`~runtime.config.Placement`.

Ray leaves an actor whose resources or labels no node offers pending
forever; checking first against the alive nodes (as ``ray.nodes()`` lists
them: ``NodeID``, ``Alive``, ``Resources``, ``Labels``) turns that into an
error naming what was asked and what the nodes offer. Plain logic: the actor
shells pass the node list in.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from coterie.runtime.config import Placement
from coterie.runtime.errors import PlacementError

#: Resources and labels every node has, left out of descriptions unless asked for.
_NOISE_RESOURCES = ("memory", "object_store_memory")
_NOISE_PREFIXES = ("node:", "accelerator_type:", "ray.io/")
#: Nodes an error message describes at most.
DESCRIBED_NODES = 8


def _amount(value: float) -> str:
    return f"{value:g}"


def describe(placement: Placement) -> str:
    """``resources {gpu_box: 1} and labels {zone: a}`` (what it asks for)."""
    parts = []
    if placement.resources:
        items = ", ".join(f"{k}: {_amount(v)}" for k, v in sorted(placement.resources.items()))
        parts.append(f"resources {{{items}}}")
    if placement.node_labels:
        items = ", ".join(f"{k}: {v}" for k, v in sorted(placement.node_labels.items()))
        parts.append(f"labels {{{items}}}")
    return " and ".join(parts) or "no particular node"


def fits(placement: Placement, node: Mapping[str, Any]) -> bool:
    """Whether an alive node offers every resource (in its total) and label asked for."""
    if not node.get("Alive"):
        return False
    resources = node.get("Resources") or {}
    labels = node.get("Labels") or {}
    return all(
        float(resources.get(name, 0.0)) + 1e-9 >= amount
        for name, amount in placement.resources.items()
    ) and all(labels.get(key) == value for key, value in placement.node_labels.items())


def fitting_nodes(placement: Placement, nodes: Iterable[Mapping[str, Any]]) -> list[str]:
    """The ids of the alive nodes that can hold ``placement``."""
    return [str(n.get("NodeID", "")) for n in nodes if fits(placement, n)]


def _shown(name: str, asked: Iterable[str]) -> bool:
    if name in asked:
        return True
    return name not in _NOISE_RESOURCES and not name.startswith(_NOISE_PREFIXES)


def describe_node(node: Mapping[str, Any], placement: Placement) -> str:
    """``5f3a9c01: labels {zone: b}, resources {CPU: 1, node_b: 100}``: what the
    node offers, without what every node has."""
    labels = {
        k: v for k, v in (node.get("Labels") or {}).items() if _shown(k, placement.node_labels)
    }
    resources = {
        k: v for k, v in (node.get("Resources") or {}).items() if _shown(k, placement.resources)
    }
    label_text = ", ".join(f"{k}: {v}" for k, v in sorted(labels.items()))
    resource_text = ", ".join(f"{k}: {_amount(float(v))}" for k, v in sorted(resources.items()))
    return (
        f"{str(node.get('NodeID', '?'))[:8]}: labels {{{label_text}}}, "
        f"resources {{{resource_text}}}"
    )


def check_placement(placement: Placement, nodes: Iterable[Mapping[str, Any]], who: str) -> None:
    """Raise :class:`PlacementError` unless an alive node can hold ``placement``.

    ``who`` names the actor in the message (``persona 'gpu'``, ``the router``).
    """
    if not placement.pinned:
        return
    alive = [n for n in nodes if n.get("Alive")]
    if any(fits(placement, n) for n in alive):
        return
    shown = "; ".join(describe_node(n, placement) for n in alive[:DESCRIBED_NODES])
    if len(alive) > DESCRIBED_NODES:
        shown += f"; … and {len(alive) - DESCRIBED_NODES} more"
    raise PlacementError(
        f"{who} needs {describe(placement)}; no alive node has them (nodes: {shown or 'none'})"
    )


def start_timeout_message(placement: Placement, who: str) -> str:
    """Why an actor that passed :func:`check_placement` is still not up."""
    timeout = f"{placement.start_timeout:g}"
    if placement.pinned:
        return (
            f"{who} did not start within {timeout} s: the nodes with "
            f"{describe(placement)} have no room left for it (raise the node's resource "
            "or placement.start_timeout)"
        )
    return (
        f"{who} did not start within {timeout} s (its actor stayed pending: the cluster "
        "may be out of memory or worker processes; placement.start_timeout sets the wait)"
    )


__all__ = [
    "DESCRIBED_NODES",
    "PlacementError",
    "check_placement",
    "describe",
    "describe_node",
    "fits",
    "fitting_nodes",
    "start_timeout_message",
]
