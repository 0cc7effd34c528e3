"""``placement:`` on a real two-node Ray cluster (two raylets on this machine).

The head offers ``{node_a: 100}`` and the label ``zone=a``, the worker
``{node_b: 100}`` and ``zone=b``. Personas pinned to each node talk to each
other; their shell processes and subagents run beside them; the router,
audit log and memory store go where ``runtime.yaml`` says; a placement no
node offers is an error at once; and a persona whose node is lost answers
with a readable error until a node like it joins, then comes back.

The module needs its own cluster: the session's Ray (``ray_session``) is
shut down for it and started again afterwards, as conftest starts it.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import duckdb
import pytest
import ray
from ray.cluster_utils import Cluster

from coterie import Runtime
from coterie.actors import persona_actor_name
from coterie.runtime import tracing
from coterie.runtime.errors import PlacementError
from coterie.runtime.messages import AssistantMessage
from tests.helpers import owned_by, poll, ray_actors, scripted, write_persona
from tests.phoenix import all_spans

pytestmark = pytest.mark.ray

NODE_A: dict[str, Any] = {"resources": {"node_a": 100}, "labels": {"zone": "a"}}
NODE_B: dict[str, Any] = {"resources": {"node_b": 100}, "labels": {"zone": "b"}}
#: The main runtime's own actors stay on the head, out of the way of node loss.
RUNTIME_ON_A = """
idle_timeout: null
memory: {embedder: hashing}
placement:
  router: {node_labels: {zone: a}}
  audit: {node_labels: {zone: a}}
  memory: {resources: {node_a: 1}}
"""


def call(name: str, **arguments: Any) -> dict[str, Any]:
    return {"name": name, "arguments": arguments}


def persona(me: str, peer: str, placement: dict[str, Any]) -> dict[str, Any]:
    """A scripted persona that asks ``peer``, remembers, runs a background
    command or spawns a subagent, as the message says."""
    return scripted(
        [
            {"when": {"context": "subagent"}, "text": f"{me}'s subagent looked"},
            {"when": {"contains": "finished"}, "text": "wake: {input}"},
            {"when": {"turn": 1, "contains": "hello from"}, "text": f"{me} hears: {{input}}"},
            {
                "when": {"turn": 1, "contains": f"ask {peer}"},
                "tool_calls": [call("ask_persona", persona=peer, text=f"hello from {me}")],
            },
            {
                "when": {"turn": 1, "contains": "ask nowhere"},
                "tool_calls": [call("ask_persona", persona="nowhere", text=f"hello from {me}")],
            },
            {
                "when": {"turn": 1, "contains": "remember"},
                "tool_calls": [
                    call("memory", action="write", category="cluster", content=f"{me} was here")
                ],
            },
            {
                "when": {"turn": 1, "contains": "run"},
                "tool_calls": [call("shell_exec", command="sleep 60", background=True)],
            },
            {
                "when": {"turn": 1, "contains": "spawn"},
                "tool_calls": [call("spawn_subagent", task="look around")],
            },
            {"when": {"turn": 2}, "text": "{last_tool_result}"},
        ],
        default=f"{me} is fine",
        access="full",  # shell without bubblewrap
        placement=placement,
    )


@dataclass
class Nodes:
    cluster: Cluster
    head: str
    worker: Any  # the worker's ray node (cluster.remove_node takes it)


def _restore_session_ray() -> None:
    """Ray as tests/conftest.py's ``ray_session`` starts it."""
    address = os.environ.get("RAY_ADDRESS")
    if address:
        ray.init(address=address, namespace="coterie-tests", log_to_driver=False)
    else:
        ray.init(
            address="local",
            num_cpus=2,
            namespace="coterie-tests",
            include_dashboard=False,
            log_to_driver=False,
        )


@pytest.fixture(scope="module")
def nodes() -> Iterator[Nodes]:
    had_ray = ray.is_initialized()
    if had_ray:
        ray.shutdown()
    cluster = Cluster(
        initialize_head=True,
        head_node_args={"num_cpus": 1, "include_dashboard": False, **NODE_A},
    )
    try:
        worker = cluster.add_node(num_cpus=1, **NODE_B)
        cluster.wait_for_nodes()
        ray.init(address=cluster.address, namespace="coterie-tests", log_to_driver=False)
        yield Nodes(cluster, head=cluster.head_node.node_id, worker=worker)
    finally:
        ray.shutdown()
        cluster.shutdown()
        if had_ray:
            _restore_session_ray()


@pytest.fixture(scope="module")
def receiver(request: pytest.FixtureRequest) -> str | None:
    """The session's Phoenix, or None where it is not installed (the
    placement tests run without it; the trace test is skipped)."""
    try:
        return str(request.getfixturevalue("phoenix"))
    except pytest.skip.Exception:
        return None


@pytest.fixture(scope="module")
def rt(
    nodes: Nodes, tmp_path_factory: pytest.TempPathFactory, receiver: str | None
) -> Iterator[Runtime]:
    home = tmp_path_factory.mktemp("placed")
    traced = ""
    if receiver is not None:
        traced = f"tracing: {{enabled: true, endpoint: {receiver}/v1/traces}}\n"
    (home / "runtime.yaml").write_text(RUNTIME_ON_A + traced, encoding="utf-8")
    write_persona(
        home, "alice", persona("alice", "bob", {"node_labels": {"zone": "a"}, "resources": {}})
    )
    write_persona(home, "bob", persona("bob", "alice", {"resources": {"node_b": 0.01}}))
    write_persona(home, "nowhere", persona("nowhere", "alice", {"node_labels": {"zone": "c"}}))
    write_persona(home, "greedy", persona("greedy", "alice", {"resources": {"node_b": 1000}}))
    for name in ("big", "bigger"):  # room for one of them on the worker
        write_persona(
            home, name, persona(name, "alice", {"resources": {"node_b": 60}, "start_timeout": 3})
        )
    runtime = Runtime.start(home=home)
    try:
        yield runtime
    finally:
        runtime.shutdown(stop_actors=True)
        # The driver's tracer goes with its runtime: later tests trace nothing.
        tracing.install(tracing.Tracer()).shutdown()


# -- where actors run (the GCS's actor table: no dashboard needed) -------------------


def node_of_named(name: str) -> str:
    (entry,) = [a for a in ray_actors() if a["Name"] == name and a["State"] == "ALIVE"]
    return str(entry["Address"]["NodeID"])


def named(name: str, namespace: str) -> bool:
    try:
        ray.get_actor(name, namespace=namespace)
    except ValueError:
        return False
    return True


def persona_node(rt: Runtime, name: str) -> str:
    handle = ray.get_actor(persona_actor_name(rt.id, name), namespace=rt.namespace)
    return str(ray.get(handle.stats.remote(), timeout=30)["node_id"])


def until(condition: Callable[[], bool], what: str, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.2)


# -- tests (in this order: the last one takes the worker away) ------------------------


def test_personas_on_two_nodes_talk_to_each_other(rt: Runtime, nodes: Nodes) -> None:
    reply = rt.ask("alice", "ask bob something", conversation_id="alice:talk")
    assert reply.status == "ok", reply.error
    assert reply.text == "bob hears: [message from persona alice] hello from alice"
    reply = rt.ask("bob", "ask alice something", conversation_id="bob:talk")
    assert reply.status == "ok", reply.error
    assert reply.text == "alice hears: [message from persona bob] hello from bob"
    assert persona_node(rt, "alice") == nodes.head
    assert persona_node(rt, "bob") == nodes.worker.node_id


def test_one_trace_crosses_the_two_nodes(rt: Runtime, nodes: Nodes, receiver: str | None) -> None:
    if receiver is None:
        pytest.skip("needs Phoenix in .otlp-receiver (tests/run.sh installs it)")
    reply = rt.ask("alice", "ask bob something", conversation_id="alice:traced")
    assert reply.status == "ok", reply.error
    rt.flush()  # every persona's batched spans, on both nodes
    (trace_id,) = {
        row[0]
        for row in rt.query(
            "select trace_id from events where kind = 'turn_started' "
            "and conversation_id = 'alice:traced'"
        ).rows
    }

    def arrived() -> list[Any] | None:
        spans = all_spans(receiver, trace_id)
        return spans if any(s["name"] == "invoke_agent bob" for s in spans) else None

    spans = poll(arrived, 60, "the cross-node trace in Phoenix")
    by_name = {s["name"]: s for s in spans}
    alice, asked, bob = (
        by_name[n] for n in ("invoke_agent alice", "execute_tool ask_persona", "invoke_agent bob")
    )
    # bob's turn ran on the worker node, alice's call on the head: one trace.
    assert persona_node(rt, "bob") == nodes.worker.node_id != persona_node(rt, "alice")
    assert asked["parent_id"] == alice["context"]["span_id"]
    assert bob["parent_id"] == asked["context"]["span_id"]
    assert bob["attributes"]["coterie.sender"] == "alice"


def test_shell_processes_and_subagents_run_on_their_personas_node(
    rt: Runtime, nodes: Nodes
) -> None:
    for name, node in (("alice", nodes.head), ("bob", nodes.worker.node_id)):
        reply = rt.ask(name, "run something", conversation_id=f"{name}:shell")
        assert reply.status == "ok" and '"running": true' in reply.text, reply
        reply = rt.ask(name, "spawn a subagent", conversation_id=f"{name}:spawn")
        assert reply.status == "ok", reply.error
        rt.wait_settled(name, f"{name}:spawn", timeout=120)
        owner = persona_actor_name(rt.id, name)
        shells = owned_by(owner, "ShellProcessActor")
        subagents = owned_by(owner, "SubagentActor")
        assert shells and subagents, (shells, subagents)
        assert {a["Address"]["NodeID"] for a in shells + subagents} == {node}
        history = rt.history(name, f"{name}:spawn")
        wake = [m.text for m in history if isinstance(m, AssistantMessage)]
        assert any(f"{name}'s subagent looked" in text for text in wake), wake


def test_the_audit_log_and_memory_serve_both_nodes(rt: Runtime) -> None:
    for name in ("alice", "bob"):
        reply = rt.ask(name, "remember this", conversation_id=f"{name}:memory")
        assert reply.status == "ok" and reply.text.startswith("saved"), reply
    rows = rt.query(
        "select persona, count(*) from events where kind = 'turn_ended' "
        "and persona in ('alice', 'bob') group by 1 order by 1"
    ).rows
    assert [name for name, _ in rows] == ["alice", "bob"] and all(n >= 3 for _, n in rows), rows
    for name in ("alice", "bob"):
        hits = ray.get(rt.memory.recall.remote(name, query="was here"), timeout=30)
        assert [h.content for h in hits] == [f"{name} was here"]


def test_the_runtime_actors_run_where_runtime_yaml_says(
    rt: Runtime, nodes: Nodes, tmp_path: Path
) -> None:
    for actor in (rt.router, rt.audit, rt.memory):
        assert ray.get(actor.__ray_call__.remote(_node_id), timeout=30) == nodes.head
    # A second home with its actors on the worker; its persona goes anywhere.
    home = tmp_path / "on-b"
    write_persona(home, "echo", scripted(default="echo"))
    (home / "runtime.yaml").write_text(
        "idle_timeout: null\n"
        "memory: {embedder: hashing}\n"
        "placement:\n"
        "  router: {resources: {node_b: 0.5}}\n"
        "  audit: {node_labels: {zone: b}}\n"
        "  memory: {node_labels: {zone: b}, resources: {node_b: 0.5}}\n",
        encoding="utf-8",
    )
    other = Runtime.start(home=home)
    try:
        for actor in (other.router, other.audit, other.memory):
            assert ray.get(actor.__ray_call__.remote(_node_id), timeout=30) == nodes.worker.node_id
        assert other.ask("echo", "hi").text == "echo"
    finally:
        other.shutdown(stop_actors=True)


def _node_id(_actor: Any) -> str:
    return str(ray.get_runtime_context().get_node_id())


def test_a_placement_no_node_offers_is_a_clear_error(rt: Runtime, tmp_path: Path) -> None:
    with pytest.raises(PlacementError) as caught:
        rt.ask("nowhere", "hi", timeout=60)
    message = str(caught.value)
    assert message.startswith("persona 'nowhere' needs labels {zone: c}; no alive node has them")
    assert "labels {zone: a}, resources {CPU: 1, node_a: 100}" in message
    assert "labels {zone: b}, resources {CPU: 1, node_b: 100}" in message
    with pytest.raises(PlacementError, match=r"persona 'greedy' needs resources \{node_b: 1000\}"):
        rt.ask("greedy", "hi", timeout=60)
    # From another persona: its ask_persona call fails with the same words.
    reply = rt.ask("alice", "ask nowhere", conversation_id="alice:nowhere")
    assert reply.status == "ok", reply.error
    assert "persona 'nowhere' needs labels {zone: c}" in reply.text
    # The runtime's own actors: refused before any is created.
    home = tmp_path / "off"
    (home / "personas").mkdir(parents=True)
    (home / "runtime.yaml").write_text(
        "placement:\n  audit: {node_labels: {zone: c}}\n", encoding="utf-8"
    )
    with pytest.raises(PlacementError, match=r"^the audit log needs labels \{zone: c\}; no alive"):
        Runtime.start(home=home)


def test_a_full_node_is_an_error_after_the_start_timeout(rt: Runtime) -> None:
    assert rt.ask("big", "hi", timeout=60).text == "big is fine"
    # bigger fits the worker's total but not what big left of it.
    with pytest.raises(PlacementError, match=r"persona 'bigger' did not start within 3 s"):
        rt.ask("bigger", "hi", timeout=60)
    # Its pending actor was stopped: nothing starts behind the caller's back.
    until(lambda: not named(persona_actor_name(rt.id, "bigger"), rt.namespace), "bigger gone")


WHERE_PLUGIN = """
import os
import ray
from pydantic import BaseModel
from coterie.runtime.tool import tool

class NoArgs(BaseModel):
    pass

@tool()
async def where_am_i(args: NoArgs, ctx) -> str:
    "Where this code runs: its node and its file."
    return ray.get_runtime_context().get_node_id() + " " + __file__

TOOLS = [where_am_i]
"""


def test_a_plugin_only_the_driver_has_runs_on_the_other_node(
    rt: Runtime, nodes: Nodes, tmp_path: Path
) -> None:
    """The plugin lives in a temporary folder of the driver's and is deleted
    once the runtime started: the persona on the worker node can only have
    it from Ray (its runtime environment), not from the driver's disk."""
    folder = tmp_path / "driver_only"
    folder.mkdir()
    plugin = folder / "where_plugin.py"
    plugin.write_text(WHERE_PLUGIN, encoding="utf-8")
    home = tmp_path / "home"
    home.mkdir()
    (home / "runtime.yaml").write_text(
        RUNTIME_ON_A + f"plugins: [{str(plugin)!r}]\n", encoding="utf-8"
    )
    rules = [
        {"when": {"tool_result": False}, "tool_calls": [call("where_am_i")]},
        {"when": {"tool_result": True}, "text": "{last_tool_result}"},
    ]
    write_persona(home, "roamer", scripted(rules, placement={"resources": {"node_b": 0.01}}))
    second = Runtime.start(home=home)
    try:
        assert second.plugins.runtime_env is not None
        [uri] = second.plugins.runtime_env["py_modules"]
        assert uri.startswith("gcs://")
        plugin.unlink()
        folder.rmdir()
        reply = second.ask("roamer", "where?", timeout=120)
        assert reply.status == "ok", reply.error
        node, file = reply.text.split(" ", 1)
        assert node == nodes.worker.node_id != nodes.head
        assert "runtime_resources" in file and str(folder) not in file
        # Eval workers, one pair per node, get it the same way.
        samples = [
            {"id": f"s{i}", "input": "where?", "target": "runtime_resources"} for i in range(6)
        ]
        (tmp_path / "where.jsonl").write_text("\n".join(json.dumps(s) for s in samples))
        task = {
            "name": "where",
            "dataset": {"path": "where.jsonl"},
            "solver": {"persona": "roamer"},
            "scorers": [{"type": "includes"}],
        }
        (tmp_path / "where.yaml").write_text(json.dumps(task))
        report = second.eval(tmp_path / "where.yaml", run_id="where-1")
        assert report.counts["ok"] == 6 and report.summaries[0].mean == 1.0
        with duckdb.connect(str(home / "evals.duckdb"), read_only=True) as db:
            rows = db.execute("select node, output from eval_samples").fetchall()
        assert {node for node, _ in rows} == {nodes.head, nodes.worker.node_id}
        assert all(output.split(" ", 1)[0] == node for node, output in rows)
    finally:
        second.shutdown()


def test_losing_a_node_fails_its_persona_until_a_node_like_it_joins(
    rt: Runtime, nodes: Nodes
) -> None:
    assert rt.ask("bob", "hi", conversation_id="bob:loss").text == "bob is fine"
    # The caller waits this long for a persona to come back before answering.
    rt.directory.router_wait = 10
    nodes.cluster.remove_node(nodes.worker)
    began = time.monotonic()
    reply = rt.ask("bob", "are you there?", conversation_id="bob:loss", timeout=60)
    waited = time.monotonic() - began
    assert reply.status == "error", reply
    assert "persona 'bob' died while handling the message" in (reply.error or "")
    assert "has not restarted yet" in (reply.error or ""), reply.error
    print(f"bob's error after {waited:.1f} s: {reply.error}")
    # Until a node offers what bob needs, asking again is refused at once.
    with pytest.raises(PlacementError, match=r"^persona 'bob' needs resources \{node_b: 0.01\}"):
        rt.ask("bob", "still there?", conversation_id="bob:loss", timeout=60)
    # The persona on the head goes on.
    assert rt.ask("alice", "hi", conversation_id="alice:loss").text == "alice is fine"
    # A node offering what bob asks for: Ray starts bob's actor there.
    new_worker = nodes.cluster.add_node(num_cpus=1, **NODE_B)
    nodes.cluster.wait_for_nodes()
    nodes.worker = new_worker
    replies = []

    def answers() -> bool:
        replies.append(rt.ask("bob", "back?", conversation_id="bob:loss", timeout=30))
        return replies[-1].status == "ok"

    until(answers, "bob to come back", timeout=120)
    assert replies[-1].text == "bob is fine"
    assert persona_node(rt, "bob") == new_worker.node_id
    # Its conversation was rebuilt from the audit log: the earlier turn is in it.
    texts = [m.text for m in rt.history("bob", "bob:loss")]
    assert "hi" in texts and "bob is fine" in texts
