"""Scripted personas calling real MCP servers, in-process and on Ray.

Servers: ``mcp-server-time`` (PyPI), ``@modelcontextprotocol/server-everything``
(npm, installed by tests/run.sh into .mcp-servers/) and the test's own misbehaving
server for hangs and crashes.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from coterie.runtime import tracing
from coterie.runtime.config import load_persona
from coterie.runtime.errors import ToolError
from coterie.runtime.messages import MessageEnvelope, ToolFinished
from coterie.runtime.models import build_model
from coterie.runtime.persona import PersonaRuntime
from coterie.runtime.services import NullAudit, Services
from coterie.tools import builtin_registry
from tests.helpers import scripted, write_persona
from tests.mcp_fixtures.everything import EVERYTHING, free_port, serve_everything_http, stop

ROOT = Path(__file__).resolve().parent.parent
MISBEHAVING = ROOT / "tests" / "mcp_fixtures" / "misbehaving_server.py"


def servers(**entries: dict[str, Any]) -> dict[str, Any]:
    return {"mcpServers": entries}


TIME = {"command": "mcp-server-time", "args": ["--local-timezone", "UTC"]}
MISBEHAVE = {"command": sys.executable, "args": [str(MISBEHAVING)], "timeout": 2}


def everything() -> dict[str, Any]:
    return {"command": "node", "args": [str(EVERYTHING), "stdio"]}


def call(name: str, **arguments: Any) -> dict[str, Any]:
    return {"name": name, "arguments": arguments}


def persona_calling(*calls: dict[str, Any], **extra: Any) -> dict[str, Any]:
    """A persona that makes ``calls`` on its first step, then says it is done."""
    return scripted(
        [
            {"when": {"turn": 1}, "tool_calls": list(calls)},
            {"when": {"turn": 2}, "text": "done"},
        ],
        **extra,
    )


def results(audit: NullAudit) -> dict[str, ToolFinished]:
    return {e.tool: e for e in audit.events if isinstance(e, ToolFinished)}


async def call_until_up(rt: PersonaRuntime, server: str, tool: str) -> Any:
    """Call ``tool`` until its server is back (at most a minute)."""
    deadline = time.monotonic() + 60
    while True:
        try:
            return await rt.mcp.call(server, tool, {})
        except ToolError:
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.5)


Run = tuple[Any, NullAudit, PersonaRuntime]


async def run_once(home: Path, name: str, text: str = "go") -> Run:
    persona = load_persona(home, name)
    audit = NullAudit()
    rt = PersonaRuntime(
        persona,
        model=build_model(persona.config.model),
        registry=builtin_registry(),
        services=Services(audit=audit),
    )
    reply = await rt.handle(MessageEnvelope(recipient=name, conversation_id="c1", text=text))
    return reply, audit, rt


@pytest.mark.needs("server-everything")
async def test_a_persona_calls_time_and_everything_tools(tmp_path: Path) -> None:
    (tmp_path / "mcp.json").write_text(
        json.dumps(servers(time=TIME, everything=everything())), encoding="utf-8"
    )
    write_persona(
        tmp_path,
        "p",
        persona_calling(
            call("time__get_current_time", timezone="Europe/Oslo"),
            call("everything__echo", message="hello from coterie"),
        ),
    )
    reply, audit, rt = await run_once(tmp_path, "p")
    try:
        assert reply.status == "ok" and reply.text == "done"
        got = results(audit)
        when = json.loads(got["time__get_current_time"].result)
        assert got["time__get_current_time"].error_kind is None
        assert when["timezone"] == "Europe/Oslo" and "datetime" in when
        assert got["everything__echo"].result == "Echo: hello from coterie"
        # Their schemas went to the model as the servers wrote them.
        view = {v.name: v for v in rt.mcp.servers()}
        schema = next(t for t in view["time"].tools if t.name == "get_current_time").input_schema
        assert schema["required"] == ["timezone"]
        # The server's stderr went to its log, not to the persona's output.
        assert (tmp_path / "logs" / "mcp" / "p").is_dir()
    finally:
        await rt.aclose()


@pytest.mark.needs("server-everything")
async def test_a_persona_calls_a_streamable_http_server(tmp_path: Path) -> None:
    port = free_port()
    proc = serve_everything_http(port, {"PATH": os.environ["PATH"], "HOME": str(tmp_path)})
    try:
        persona_dir = write_persona(
            tmp_path, "p", persona_calling(call("remote__get-sum", a=2, b=40))
        )
        (persona_dir / ".env").write_text("REMOTE_TOKEN=tok-123456\n", encoding="utf-8")
        remote = {
            "url": f"http://127.0.0.1:{port}/mcp",
            "headers": {"Authorization": "Bearer ${secret:REMOTE_TOKEN}"},
        }
        (persona_dir / "mcp.json").write_text(json.dumps(servers(remote=remote)))
        reply, audit, rt = await run_once(tmp_path, "p")
        try:
            assert reply.status == "ok"
            # "get-sum" is offered (and called) as remote__get-sum.
            summed = results(audit)["remote__get-sum"]
            assert summed.error_kind is None and "42" in summed.result
        finally:
            await rt.aclose()
    finally:
        stop(proc)


async def test_a_hanging_tool_ends_the_turn_within_the_timeout(tmp_path: Path) -> None:
    write_persona(tmp_path, "p", persona_calling(call("bad__hang")))
    (tmp_path / "personas" / "p" / "mcp.json").write_text(
        json.dumps(servers(bad=MISBEHAVE)), encoding="utf-8"
    )
    started = time.monotonic()
    reply, audit, rt = await run_once(tmp_path, "p")
    took = time.monotonic() - started
    try:
        hung = results(audit)["bad__hang"]
        assert hung.error_kind == "timeout", hung.result
        assert "within 2 s; the session was restarted" in json.loads(hung.result)["detail"]
        assert reply.status == "ok"
        assert took < 60  # bounded by the 2 s timeout and one start, nothing near a hang
        # The session was recycled: the next call on it works.
        answer = await rt.mcp.call("bad", "ok", {"text": "again"})
        assert answer.content[0].text == "ok again"
        assert rt.mcp.servers()[0].status.restarts >= 1
    finally:
        await rt.aclose()


async def test_a_crashing_server_is_a_readable_error_and_comes_back(tmp_path: Path) -> None:
    write_persona(tmp_path, "p", persona_calling(call("bad__crash")))
    (tmp_path / "personas" / "p" / "mcp.json").write_text(
        json.dumps(servers(bad=MISBEHAVE)), encoding="utf-8"
    )
    reply, audit, rt = await run_once(tmp_path, "p")
    try:
        crashed = results(audit)["bad__crash"]
        assert crashed.error_kind == "server_crashed", crashed.result
        assert "bad" in json.loads(crashed.result)["detail"]
        assert reply.status == "ok"
        # Restarted with backoff: a later call gets through.
        answer = await call_until_up(rt, "bad", "ok")
        assert answer.content[0].text == "ok"
    finally:
        await rt.aclose()


async def test_a_server_that_cannot_start_does_not_block_the_turn(tmp_path: Path) -> None:
    (tmp_path / "mcp.json").write_text(
        json.dumps(servers(ghost={"command": "no-such-mcp-server-here"}, time=TIME)),
        encoding="utf-8",
    )
    write_persona(tmp_path, "p", persona_calling(call("time__get_current_time", timezone="UTC")))
    reply, audit, rt = await run_once(tmp_path, "p")
    try:
        assert reply.status == "ok"
        assert results(audit)["time__get_current_time"].error_kind is None
        ghost = next(v for v in rt.mcp.servers() if v.name == "ghost")
        assert ghost.status.state == "failed"
        assert "no-such-mcp-server-here" in (ghost.status.error or "")
    finally:
        await rt.aclose()


async def test_gateway_mode_offers_one_tool(tmp_path: Path) -> None:
    (tmp_path / "mcp.json").write_text(json.dumps(servers(time=TIME)), encoding="utf-8")
    write_persona(
        tmp_path,
        "p",
        persona_calling(
            call("mcp", action="servers"),
            call(
                "mcp",
                action="call",
                server="time",
                tool="convert_time",
                arguments={
                    "source_timezone": "UTC",
                    "time": "12:00",
                    "target_timezone": "Asia/Tokyo",
                },
            ),
            mcp_gateway=True,
        ),
    )
    reply, audit, rt = await run_once(tmp_path, "p")
    try:
        assert reply.status == "ok"
        finished = [e for e in audit.events if isinstance(e, ToolFinished)]
        listed = json.loads(finished[0].result)
        assert listed[0]["server"] == "time" and listed[0]["state"] == "ready"
        converted = json.loads(finished[1].result)
        assert converted["target"]["timezone"] == "Asia/Tokyo"
        assert converted["target"]["datetime"].endswith("21:00:00+09:00")
    finally:
        await rt.aclose()


# -- on Ray ----------------------------------------------------------------------


@pytest.fixture(scope="module")
def ray_home(
    tmp_path_factory: pytest.TempPathFactory, ray_session: None
) -> Iterator[tuple[Any, Path]]:
    from coterie import Runtime
    from coterie.runtime.config import RuntimeSettings

    home = tmp_path_factory.mktemp("mcp-ray")
    (home / "mcp.json").write_text(
        json.dumps(servers(time={**TIME, "shared": True})), encoding="utf-8"
    )
    for name in ("alice", "bob"):
        write_persona(home, name, persona_calling(call("time__get_current_time", timezone="UTC")))
    own = write_persona(home, "carol", persona_calling(call("bad__pid")))
    (own / "mcp.json").write_text(json.dumps(servers(bad=MISBEHAVE)), encoding="utf-8")
    broken = write_persona(home, "dave", scripted())
    (broken / "mcp.json").write_text(json.dumps(servers(x={"command": "y", "colour": 1})))
    rt = Runtime.start(home=home, settings=RuntimeSettings(idle_timeout=None))
    try:
        yield rt, home
    finally:
        rt.shutdown()


def mcp_actors() -> list[dict[str, Any]]:
    """The live McpServer actors (the GCS's actor table: no dashboard needed)."""
    import ray

    return [
        a
        for a in ray._private.state.actors().values()
        if a["ActorClassName"] == "McpServerActor" and a["State"] == "ALIVE"
    ]


def tool_results(rt: Any, persona: str) -> list[tuple[str, str | None, str]]:
    rt.flush()
    rows = rt.query(
        "select tool, error_kind, payload from events where kind = 'tool_result' "
        f"and persona = '{persona}' order by seq"
    ).rows
    return [(r[0], r[1], json.loads(r[2])["result"]) for r in rows]


def test_on_ray_a_shared_server_serves_two_personas_from_one_actor(
    ray_home: tuple[Any, Path],
) -> None:
    rt, _ = ray_home
    for name in ("alice", "bob"):
        reply = rt.ask(name, "what time is it?")
        assert reply.status == "ok", reply.error
        [(tool, error, result)] = tool_results(rt, name)
        assert tool == "time__get_current_time" and error is None
        assert json.loads(result)["timezone"] == "UTC"
    # One session for both personas, owned by the router.
    [shared] = mcp_actors()
    import ray

    table = ray._private.state.actors().values()
    [router] = [
        a for a in table if a["Name"] == f"coterie:{rt.id}:router" and a["State"] == "ALIVE"
    ]
    where = (router["Address"]["IPAddress"], router["Address"]["Port"])
    assert (shared["OwnerAddress"]["IPAddress"], shared["OwnerAddress"]["Port"]) == where


def test_on_ray_a_persona_server_runs_in_its_own_actor(ray_home: tuple[Any, Path]) -> None:
    import ray

    rt, _ = ray_home
    before = {a["ActorID"] for a in mcp_actors()}
    reply = rt.ask("carol", "go")
    assert reply.status == "ok", reply.error
    [(tool, error, result)] = tool_results(rt, "carol")
    assert tool == "bad__pid" and error is None
    server_pid = int(result)
    new = [a for a in mcp_actors() if a["ActorID"] not in before]
    assert len(new) == 1
    carol = ray.get_actor(f"coterie:{rt.id}:persona:carol", namespace=rt.namespace)
    persona_pid = ray.get(carol.stats.remote())["pid"]
    # The server is a child of the McpServer actor's process, not of the persona's.
    import psutil

    parent = psutil.Process(server_pid).parent()
    assert parent is not None and parent.pid == new[0]["Pid"] and parent.pid != persona_pid
    assert "mcp" not in ray.get(carol.stats.remote())["sdks_loaded"]


def test_on_ray_a_wrong_mcp_json_is_a_clear_error(ray_home: tuple[Any, Path]) -> None:
    from coterie.runtime.errors import PersonaConfigError

    rt, home = ray_home
    with pytest.raises(PersonaConfigError) as info:
        rt.ask("dave", "hello")
    message = str(info.value)
    assert str(home / "personas" / "dave" / "mcp.json") in message
    assert "server 'x', field 'colour': unknown field" in message


async def test_an_mcp_call_is_a_client_span_and_the_server_gets_its_context(
    tmp_path: Path, spans: Any
) -> None:
    write_persona(
        tmp_path,
        "p",
        persona_calling(call("bad__trace_meta"), call("bad__fail"), call("bad__hang")),
    )
    (tmp_path / "personas" / "p" / "mcp.json").write_text(
        json.dumps(servers(bad=MISBEHAVE)), encoding="utf-8"
    )
    reply, audit, rt = await run_once(tmp_path, "p")
    await rt.aclose()
    assert reply.status == "ok"
    tracing.tracer().flush()
    finished = spans.get_finished_spans()
    by_name = {s.name: s for s in finished}
    for tool in ("trace_meta", "fail", "hang"):
        request, parent = by_name[f"tools/call {tool}"], by_name[f"execute_tool bad__{tool}"]
        # A child of the persona's tool call, in the same trace.
        assert request.parent is not None and request.parent.span_id == parent.context.span_id
        assert request.attributes["mcp.method.name"] == "tools/call"
        assert request.attributes["gen_ai.tool.name"] == tool
        assert request.attributes["coterie.mcp.server"] == "bad"
    traced = by_name["tools/call trace_meta"]
    # The server received the MCP request's own context in _meta.
    trace_id = format(traced.context.trace_id, "032x")
    span_id = format(traced.context.span_id, "016x")
    received = results(audit)["bad__trace_meta"].result
    assert received.startswith(f"00-{trace_id}-{span_id}-"), received
    assert traced.status.is_ok
    assert by_name["tools/call fail"].attributes["error.type"] == "tool_error"
    assert by_name["tools/call hang"].attributes["error.type"] == "timeout"
    assert by_name["tools/call hang"].status.is_ok is False
