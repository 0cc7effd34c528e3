"""``placement:`` without Ray: the config models, which nodes can hold one,
and what a caller hears from a persona whose node is gone."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from coterie.runtime.config import Placement, RuntimeSettings, load_persona_dir, load_settings
from coterie.runtime.errors import ActorLostError, ConfigError, DeliveryError, PersonaConfigError
from coterie.runtime.messages import MessageEnvelope
from coterie.runtime.routing import Directory
from coterie.runtime.routing.placement import (
    DESCRIBED_NODES,
    PlacementError,
    check_placement,
    describe,
    fitting_nodes,
    start_timeout_message,
)
from tests.helpers import scripted, write_persona


def node(
    node_id: str, resources: dict[str, float], labels: dict[str, str], *, alive: bool = True
) -> dict[str, Any]:
    """A node as ``ray.nodes()`` lists it (with what every node has)."""
    return {
        "NodeID": node_id,
        "Alive": alive,
        "Resources": {
            "CPU": 1.0,
            "memory": 2e10,
            "object_store_memory": 1.5e8,
            f"node:10.0.0.{node_id[-1]}": 1.0,
            **resources,
        },
        "Labels": {"ray.io/node-id": node_id, **labels},
    }


NODES = [
    node("aaaaaaaa01", {"node_a": 100}, {"zone": "a"}),
    node("bbbbbbbb02", {"node_b": 100, "gpu_box": 1}, {"zone": "b", "disk": "ssd"}),
]


def test_an_empty_placement_fits_every_node_and_is_not_checked() -> None:
    empty = Placement()
    assert not empty.pinned
    assert fitting_nodes(empty, NODES) == ["aaaaaaaa01", "bbbbbbbb02"]
    check_placement(empty, [], "persona 'x'")  # no nodes listed: still fine
    assert describe(empty) == "no particular node"


def test_resources_and_labels_must_all_be_on_one_node() -> None:
    assert fitting_nodes(Placement(resources={"node_b": 0.01}), NODES) == ["bbbbbbbb02"]
    assert fitting_nodes(Placement(node_labels={"zone": "a"}), NODES) == ["aaaaaaaa01"]
    both = Placement(resources={"gpu_box": 1}, node_labels={"zone": "b", "disk": "ssd"})
    assert fitting_nodes(both, NODES) == ["bbbbbbbb02"]
    # Each is somewhere, but not together.
    assert (
        fitting_nodes(Placement(resources={"gpu_box": 1}, node_labels={"zone": "a"}), NODES) == []
    )
    # More than the node's total.
    assert fitting_nodes(Placement(resources={"node_a": 100.5}), NODES) == []
    assert fitting_nodes(Placement(resources={"node_a": 100}), NODES) == ["aaaaaaaa01"]


def test_dead_nodes_do_not_count() -> None:
    nodes = [NODES[0], {**NODES[1], "Alive": False}]
    assert fitting_nodes(Placement(node_labels={"zone": "b"}), nodes) == []
    with pytest.raises(PlacementError) as caught:
        check_placement(Placement(node_labels={"zone": "b"}), nodes, "persona 'bee'")
    assert "bbbbbbbb" not in str(caught.value)  # only the alive nodes are described


def test_an_unsatisfiable_placement_names_who_what_and_what_the_nodes_offer() -> None:
    asked = Placement(resources={"gpu_box": 1}, node_labels={"zone": "a"})
    with pytest.raises(PlacementError) as caught:
        check_placement(asked, NODES, "persona 'gpu'")
    assert str(caught.value) == (
        "persona 'gpu' needs resources {gpu_box: 1} and labels {zone: a}; no alive node has "
        "them (nodes: aaaaaaaa: labels {zone: a}, resources {CPU: 1, node_a: 100}; "
        "bbbbbbbb: labels {disk: ssd, zone: b}, resources {CPU: 1, gpu_box: 1, node_b: 100})"
    )
    assert isinstance(caught.value, ConfigError)


def test_labels_ray_sets_are_shown_only_when_asked_for() -> None:
    asked = Placement(node_labels={"ray.io/node-id": "cccccccc03"})
    with pytest.raises(PlacementError, match=r"labels \{ray.io/node-id: aaaaaaaa01, zone: a\}"):
        check_placement(asked, NODES, "the router")
    assert fitting_nodes(Placement(node_labels={"ray.io/node-id": "aaaaaaaa01"}), NODES) == [
        "aaaaaaaa01"
    ]


def test_a_large_cluster_is_described_in_part() -> None:
    nodes = [node(f"n{i:08d}", {}, {"zone": "x"}) for i in range(DESCRIBED_NODES + 3)]
    with pytest.raises(PlacementError, match=r"; … and 3 more\)$"):
        check_placement(Placement(node_labels={"zone": "y"}), nodes, "the audit log")
    with pytest.raises(PlacementError, match=r"\(nodes: none\)"):
        check_placement(Placement(node_labels={"zone": "y"}), [], "the audit log")


def test_the_start_timeout_message_says_why() -> None:
    pinned = Placement(resources={"node_b": 60}, start_timeout=3)
    assert start_timeout_message(pinned, "persona 'big'") == (
        "persona 'big' did not start within 3 s: the nodes with resources {node_b: 60} have "
        "no room left for it (raise the node's resource or placement.start_timeout)"
    )
    assert "stayed pending" in start_timeout_message(Placement(), "the router")


@pytest.mark.parametrize(
    ("placement", "expected"),
    [
        ({"resources": {"CPU": 1}}, "not a custom resource"),
        ({"resources": {"node:10.0.0.1": 1}}, "not a custom resource"),
        ({"resources": {"gpu_box": 0}}, "at least 0.0001"),
        ({"resources": {"gpu_box": "lots"}}, "valid number"),
        ({"node_labels": {"-zone": "a"}}, "not a valid label key"),
        ({"node_labels": {"zone": "in(a,b)"}}, "not a valid label value"),
        ({"node_labels": {"zone": True}}, "quote the value"),
        ({"node_labels": {"zone": 1}}, "quote the value"),
        ({"start_timeout": 0}, "greater than 0"),
        ({"nodes": 2}, "unknown field"),
    ],
)
def test_a_bad_placement_field_is_an_error_naming_the_file_and_field(
    tmp_path: Path, placement: dict[str, Any], expected: str
) -> None:
    path = write_persona(tmp_path, "gpu", scripted(placement=placement))
    with pytest.raises(PersonaConfigError) as caught:
        load_persona_dir(path)
    message = str(caught.value)
    assert str(path / "persona.yaml") in message
    assert "placement." in message and expected in message


def test_persona_placement_loads() -> None:
    placement = Placement.model_validate(
        {"resources": {"gpu_box": 0.01}, "node_labels": {"zone": "b", "example.com/disk": "ssd"}}
    )
    assert placement.pinned and placement.start_timeout == 120
    assert (
        describe(placement)
        == "resources {gpu_box: 0.01} and labels {example.com/disk: ssd, zone: b}"
    )


def test_runtime_yaml_places_the_router_audit_and_memory(tmp_path: Path) -> None:
    (tmp_path / "runtime.yaml").write_text(
        "placement:\n"
        "  router: {node_labels: {zone: a}}\n"
        "  memory: {resources: {node_a: 0.5}, start_timeout: 30}\n",
        encoding="utf-8",
    )
    settings = load_settings(tmp_path)
    assert settings.placement.router.node_labels == {"zone": "a"}
    assert settings.placement.memory.resources == {"node_a": 0.5}
    assert not settings.placement.audit.pinned
    assert not RuntimeSettings().placement.router.pinned
    (tmp_path / "runtime.yaml").write_text("placement:\n  shell: {}\n", encoding="utf-8")
    with pytest.raises(ConfigError, match=r"runtime.yaml: placement.shell: unknown field"):
        load_settings(tmp_path)
    with pytest.raises(ValidationError):
        RuntimeSettings.model_validate({"placement": {"router": {"resources": {"GPU": 1}}}})


# -- a persona whose node is gone (the caller's side) -------------------------------


class LostLink:
    """A persona whose actor is lost and does not come back (its node is gone:
    Ray holds the restart until a node can take it)."""

    def __init__(self, ping_seconds: float = 0.0) -> None:
        self.ping_seconds = ping_seconds
        self.pings = 0

    async def call_router(self, method: str, *args: Any) -> Any:
        return {"resolve": "bob#1", "was_passivated": False}[method]

    async def call(self, handle: str, method: str, data: str) -> Any:
        raise ActorLostError("ActorUnavailableError: the actor is restarting")

    async def ping(self, handle: str) -> None:
        self.pings += 1
        await asyncio.sleep(self.ping_seconds)
        raise ActorLostError("no answer within 5 s")

    def actor_id(self, handle: str) -> str:
        return handle


async def no_sleep(seconds: float) -> None:
    return None


def bob_envelope() -> MessageEnvelope:
    return MessageEnvelope(recipient="bob", conversation_id="bob:x", text="hi")


async def test_a_persona_that_does_not_come_back_is_said_not_to_have_restarted() -> None:
    directory: Directory[str] = Directory(LostLink(), sleep=no_sleep)  # type: ignore[arg-type]
    with pytest.raises(DeliveryError) as caught:
        await directory.ask(bob_envelope(), timeout=5)
    message = str(caught.value)
    assert message.startswith("persona 'bob' died while handling the message")
    assert "has not restarted yet" in message and "send again later" in message


async def test_the_wait_for_a_restart_counts_the_pings_own_time() -> None:
    # Each ping takes 0.3 s (a real one to an actor with no node takes 5 s):
    # a 1 s wait ends after at most four, not once the sleeps alone add to 1 s.
    link = LostLink(ping_seconds=0.3)
    directory: Directory[str] = Directory(link, router_wait=1.0, sleep=no_sleep)  # type: ignore[arg-type]
    with pytest.raises(DeliveryError, match="has not restarted yet"):
        await directory.ask(bob_envelope(), timeout=5)
    assert link.pings <= 4
