"""The hub, the ``<server>__<tool>`` specs, the gateway and result rendering.

The sessions here are an in-test stand-in (the hub's logic only); the real
servers are in tests/test_mcp_session.py and tests/test_mcp_persona.py.
"""

from __future__ import annotations

import ast
import base64
import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest

from coterie.runtime.config import ToolFilter
from coterie.runtime.context import TurnSettings
from coterie.runtime.errors import ToolError
from coterie.runtime.mcp import hub as hub_module
from coterie.runtime.mcp.hub import McpHub
from coterie.runtime.mcp.records import (
    McpCallResult,
    McpContent,
    McpLaunch,
    McpPromptInfo,
    McpPromptResult,
    McpResourceInfo,
    McpServerStatus,
    McpToolInfo,
)
from coterie.runtime.mcp_source import McpToolSource, render_result, tool_name
from coterie.runtime.messages import ToolCall
from coterie.runtime.runner import ToolRunner
from coterie.runtime.services import Services
from coterie.tools import builtin_registry
from tests.helpers import make_ctx, scripted, write_persona

PIXEL = base64.b64encode(b"\x89PNG\r\n\x1a\nfake").decode()


class StandIn:
    """A session that answers from a script (per server name)."""

    started: list[str] = []

    def __init__(self, launch: McpLaunch, shared: bool) -> None:
        self.launch, self.shared = launch, shared
        self.version = 1
        self.closed = False
        self.calls: list[tuple[str, dict[str, Any]]] = []
        self.fail_start = launch.env.get("FAIL") == "1"
        self.tool_list = [
            McpToolInfo(
                name="get_time",
                description="The time.",
                input_schema={"type": "object", "properties": {"tz": {"type": "string"}}},
                annotations={"read_only_hint": True},
            ),
            McpToolInfo(name="odd.name", description="A dotted name."),
        ]

    async def start(self) -> McpServerStatus:
        StandIn.started.append(self.launch.name)
        if self.fail_start:
            return McpServerStatus(name=self.launch.name, state="failed", error="no such program")
        return await self.status()

    async def status(self) -> McpServerStatus:
        return McpServerStatus(
            name=self.launch.name,
            state="ready",
            tools_version=self.version,
            has_resources=True,
            has_prompts=True,
        )

    async def tools(self) -> list[McpToolInfo]:
        return list(self.tool_list)

    async def call_tool(
        self,
        name: str,
        arguments: dict[str, Any],
        timeout: float | None = None,
        trace: dict[str, str] | None = None,
    ) -> McpCallResult:
        self.calls.append((name, arguments))
        if name == "odd.name":
            return McpCallResult(content=[McpContent(type="text", text="bad")], is_error=True)
        return McpCallResult(
            content=[
                McpContent(type="text", text=f"12:00 in {arguments.get('tz')}"),
                McpContent(type="image", data=PIXEL, mime_type="image/png"),
            ]
        )

    async def list_resources(self) -> list[McpResourceInfo]:
        return [McpResourceInfo(uri="file:///a.txt", name="a")]

    async def read_resource(self, uri: str) -> list[McpContent]:
        return [McpContent(type="resource", uri=uri, text="contents of a")]

    async def list_prompts(self) -> list[McpPromptInfo]:
        return [McpPromptInfo(name="greet")]

    async def get_prompt(self, name: str, arguments: dict[str, str]) -> McpPromptResult:
        return McpPromptResult.model_validate(
            {"messages": [{"role": "user", "content": {"type": "text", "text": f"hi {arguments}"}}]}
        )

    async def close(self) -> None:
        self.closed = True


@pytest.fixture
def clients() -> list[StandIn]:
    StandIn.started = []
    return []


def make_hub(home: Path, made: list[StandIn], servers: dict[str, Any], **kw: Any) -> McpHub:
    persona_dir = write_persona(home, "p", scripted())
    (persona_dir / "mcp.json").write_text(json.dumps({"mcpServers": servers}), encoding="utf-8")

    def factory(launch: McpLaunch, shared: bool) -> StandIn:
        made.append(StandIn(launch, shared))
        return made[-1]

    return McpHub(
        persona="p",
        home=home,
        persona_dir=persona_dir,
        workspace=persona_dir / "workspace",
        factory=factory,
        **kw,
    )


def ctx_for(hub: McpHub, tmp_path: Path, **filters: list[str]) -> Any:
    services = Services(mcp=hub)
    return make_ctx(
        services=services,
        settings=TurnSettings(
            tool_filter=ToolFilter(**filters) if filters else ToolFilter(),
            spill_dir=tmp_path / "spill",
        ),
    )


def offer(hub: McpHub, ctx: Any) -> dict[str, Any]:
    """What a turn's loop offers: the registry's tools and the hub's."""
    return builtin_registry().visible(ctx, McpToolSource(hub).specs())


async def test_each_server_tool_is_offered_with_its_schema(
    tmp_path: Path, clients: list[StandIn]
) -> None:
    hub = make_hub(tmp_path, clients, {"clock": {"command": "x"}})
    ctx = ctx_for(hub, tmp_path)
    source = McpToolSource(hub)
    await source.refresh()
    offered = builtin_registry().visible(ctx, source.specs())
    spec = offered["clock__get_time"]
    assert spec.schema() == {"type": "object", "properties": {"tz": {"type": "string"}}}
    assert spec.annotations == {"read_only_hint": True}
    assert spec.description.startswith("[MCP clock; read-only] The time.")
    # A name no provider accepts is made safe.
    assert "clock__odd_name" in offered
    # With resources and prompts, their two tools; never the gateway.
    assert {"mcp_resources", "mcp_prompts"} <= set(offered) and "mcp" not in offered


async def test_calls_render_text_and_save_images(tmp_path: Path, clients: list[StandIn]) -> None:
    hub = make_hub(tmp_path, clients, {"clock": {"command": "x"}})
    ctx = ctx_for(hub, tmp_path)
    await hub.refresh()
    tools = offer(hub, ctx)
    [ok, bad] = await ToolRunner().run_calls(
        [
            ToolCall(id="c1", name="clock__get_time", arguments={"tz": "UTC"}),
            ToolCall(id="c2", name="clock__odd_name", arguments={}),
        ],
        ctx,
        tools,
    )
    assert clients[0].calls[0] == ("get_time", {"tz": "UTC"})
    assert ok.error_kind is None and ok.content.startswith(
        "12:00 in UTC\n[image image/png, 12 bytes: "
    )
    saved = Path(ok.content.split("bytes: ")[1].rstrip("]"))
    assert saved.read_bytes() == base64.b64decode(PIXEL) and saved.is_relative_to(
        tmp_path / "spill"
    )
    # isError from the server is a tool_error with the server's text; the original name was used.
    assert bad.error_kind == "tool_error" and json.loads(bad.content)["detail"] == "bad"
    assert clients[0].calls[1][0] == "odd.name"


async def test_allow_and_deny_patterns_apply_to_server_tools(
    tmp_path: Path, clients: list[StandIn]
) -> None:
    hub = make_hub(tmp_path, clients, {"clock": {"command": "x"}, "git": {"command": "y"}})
    await hub.refresh()
    only_clock = offer(hub, ctx_for(hub, tmp_path, allow=["clock__*"]))
    assert set(only_clock) == {"clock__get_time", "clock__odd_name"}
    no_git = offer(hub, ctx_for(hub, tmp_path, deny=["git__*"]))
    assert "git__get_time" not in no_git and "clock__get_time" in no_git


async def test_subagents_get_no_server_tools(tmp_path: Path, clients: list[StandIn]) -> None:
    hub = make_hub(tmp_path, clients, {"clock": {"command": "x"}})
    await hub.refresh()
    ctx = dataclasses.replace(ctx_for(hub, tmp_path), depth=1)
    assert not any("__" in n for n in offer(hub, ctx))


async def test_a_changed_tool_list_is_picked_up(tmp_path: Path, clients: list[StandIn]) -> None:
    hub = make_hub(tmp_path, clients, {"clock": {"command": "x"}})
    source = McpToolSource(hub)
    await source.refresh()
    assert {s.name for s in source.specs()} == {"clock__get_time", "clock__odd_name"}
    clients[0].tool_list.append(McpToolInfo(name="alarm", description="Set an alarm."))
    await source.refresh()
    assert "clock__alarm" not in {s.name for s in source.specs()}  # same version: cached
    clients[0].version += 1  # what a list_changed notification does
    await source.refresh()
    assert "clock__alarm" in {s.name for s in source.specs()}
    assert len(clients) == 1  # no restart


async def test_a_failed_start_is_reported_and_retried_later(
    tmp_path: Path, clients: list[StandIn], monkeypatch: pytest.MonkeyPatch
) -> None:
    hub = make_hub(tmp_path, clients, {"broken": {"command": "x", "env": {"FAIL": "1"}}})
    await hub.refresh()
    [view] = hub.servers()
    assert view.status.state == "failed" and view.status.error == "no such program"
    assert clients[0].closed
    with pytest.raises(ToolError) as info:
        await hub.call("broken", "get_time", {})
    assert info.value.kind == "server_unavailable" and "no such program" in info.value.detail
    await hub.refresh()
    assert len(StandIn.started) == 1  # not before the backoff
    monkeypatch.setattr(hub_module.time, "monotonic", lambda: 10**9)
    await hub.refresh()
    assert len(StandIn.started) == 2


async def test_an_unknown_server_is_named(tmp_path: Path, clients: list[StandIn]) -> None:
    hub = make_hub(tmp_path, clients, {"clock": {"command": "x"}})
    await hub.refresh()
    with pytest.raises(ToolError, match="no MCP server named 'nope'; configured: clock"):
        await hub.call("nope", "x", {})


async def test_an_edited_file_is_reloaded(tmp_path: Path, clients: list[StandIn]) -> None:
    hub = make_hub(tmp_path, clients, {"clock": {"command": "x"}})
    await hub.refresh()
    path = tmp_path / "personas" / "p" / "mcp.json"
    path.write_text(json.dumps({"mcpServers": {"other": {"command": "z", "args": ["1"]}}}))
    await hub.refresh()
    assert [v.name for v in hub.servers()] == ["other"] and clients[0].closed
    path.write_text(json.dumps({"mcpServers": {"x": {"bogus": 1}}}))
    with pytest.raises(Exception, match="server 'x', field 'bogus': unknown field"):
        await hub.refresh()


async def test_the_gateway_lists_describes_and_calls(
    tmp_path: Path, clients: list[StandIn]
) -> None:
    hub = make_hub(
        tmp_path,
        clients,
        {"clock": {"command": "x", "description": "Time things"}, "git": {"command": "y"}},
        gateway=True,
    )
    ctx = ctx_for(hub, tmp_path, deny=["git__odd*"])
    await hub.refresh()
    offered = offer(hub, ctx)
    assert "mcp" in offered and not any("__" in n for n in offered)
    assert "mcp_resources" not in offered  # the gateway has actions for them
    gateway = offered["mcp"]

    async def run(**arguments: Any) -> str:
        [out] = await ToolRunner().run_calls(
            [ToolCall(id="g", name="mcp", arguments=arguments)], ctx, {"mcp": gateway}
        )
        return out.content

    servers = json.loads(await run(action="servers"))
    assert servers[0] == {
        "server": "clock",
        "description": "Time things",
        "state": "ready",
        "tools": 2,
        "resources": True,
        "prompts": True,
    }
    assert servers[1]["tools"] == 1  # git__odd.name is denied
    assert [t["tool"] for t in json.loads(await run(action="tools", server="git"))] == ["get_time"]
    described = json.loads(await run(action="describe", server="clock", tool="get_time"))
    assert described["input_schema"]["properties"] == {"tz": {"type": "string"}}
    called = await run(action="call", server="clock", tool="get_time", arguments={"tz": "Oslo"})
    assert called.startswith("12:00 in Oslo")
    denied = json.loads(await run(action="call", server="git", tool="odd.name"))
    assert denied["error"] == "not_found" and "it has: get_time" in denied["detail"]
    missing = json.loads(await run(action="call", server="clock"))
    assert missing["error"] == "invalid_arguments" and "needs 'tool'" in missing["detail"]
    assert "contents of a" in await run(action="read", server="clock", uri="file:///a.txt")
    assert json.loads(await run(action="resources", server="clock"))[0]["uri"] == "file:///a.txt"
    assert "[user] hi {'who': 'you'}" in await run(
        action="prompt", server="clock", name="greet", arguments={"who": "you"}
    )


def test_tool_names_are_safe_and_bounded() -> None:
    assert tool_name("git", "git_status") == "git__git_status"
    assert tool_name("a", "b.c/d e") == "a__b_c_d_e"
    assert len(tool_name("s" * 40, "t" * 40)) == 64


def test_structured_content_is_shown_once(tmp_path: Path) -> None:
    ctx = make_ctx(settings=TurnSettings(spill_dir=tmp_path))
    both = McpCallResult(content=[McpContent(type="text", text='{"t": 1}')], structured={"t": 1})
    assert render_result(ctx, both) == '{"t": 1}'
    wrapped = McpCallResult(content=[McpContent(type="text", text="7")], structured={"result": 7})
    assert render_result(ctx, wrapped) == "7"
    other = McpCallResult(content=[McpContent(type="text", text="7")], structured={"n": 7})
    assert render_result(ctx, other) == '7\n{"n": 7}'
    only = McpCallResult(structured={"t": 2})
    assert render_result(ctx, only) == '{"t": 2}'
    link = McpCallResult(
        content=[
            McpContent(type="resource_link", uri="file:///x", name="x", mime_type="text/plain")
        ]
    )
    assert render_result(ctx, link) == "[resource file:///x (x, text/plain)]"


def test_no_mcp_json_costs_nothing(tmp_path: Path) -> None:
    persona_dir = write_persona(tmp_path, "p", scripted())
    hub = McpHub(
        persona="p", home=tmp_path, persona_dir=persona_dir, workspace=persona_dir / "workspace"
    )
    assert not hub.configured and hub.servers() == []
    offered = offer(hub, make_ctx(services=Services(mcp=hub)))
    assert not {"mcp", "mcp_resources", "mcp_prompts"} & set(offered)


def test_the_mcp_client_side_imports_nothing_of_turns() -> None:
    """runtime/mcp/ (sessions, the hub, their records) is a client of MCP
    servers; the tools made of it live beside the loop (runtime/mcp_source.py).
    Importing the turn core from there tied runtime/mcp into a folder cycle."""
    turn_core = {"context", "runner", "tool", "loop", "persona", "prompt", "mcp_source"}
    folder = Path(__file__).resolve().parent.parent / "runtime" / "mcp"
    reached: set[str] = set()
    for path in folder.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and node.module:
                parts = node.module.split(".")
                if parts[:2] == ["coterie", "runtime"] and len(parts) > 2:
                    reached.add(parts[2])
    assert reached and not reached & turn_core, sorted(reached)
