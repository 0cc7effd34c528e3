"""MCP tools beyond each server's own: the gateway, resources and prompts.

Each server tool is offered as ``<server>__<tool>`` by
:class:`runtime.mcp_source.McpToolSource` (the persona's allow/deny patterns
apply to those names: ``time__*``). Servers with resources or prompts add
``mcp_resources`` and ``mcp_prompts`` here.

With ``mcp_gateway: true`` in persona.yaml, instead: one ``mcp`` tool with
actions ``servers``, ``tools``, ``describe``, ``call`` (and ``resources``,
``read``, ``prompts``, ``prompt``), so that a persona with many servers does
not send every schema in every request. The same allow/deny patterns decide
which ``<server>__<tool>`` it may list and call.
"""

from __future__ import annotations

import json
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from coterie.runtime.context import TurnContext
from coterie.runtime.errors import ToolError
from coterie.runtime.mcp.hub import McpHub
from coterie.runtime.mcp.records import McpToolInfo
from coterie.runtime.mcp_source import render_blocks, render_result, tool_name
from coterie.runtime.tool import matches_any, tool


def _hub(ctx: TurnContext) -> McpHub | None:
    found = ctx.services.mcp
    return found if isinstance(found, McpHub) else None


# -- resources and prompts ---------------------------------------------------------


def _has_resources(ctx: TurnContext) -> bool:
    hub = _hub(ctx)
    return hub is not None and not hub.gateway and hub.has_resources()


def _has_prompts(ctx: TurnContext) -> bool:
    hub = _hub(ctx)
    return hub is not None and not hub.gateway and hub.has_prompts()


def _need_hub(ctx: TurnContext) -> McpHub:
    hub = _hub(ctx)
    if hub is None:
        raise ToolError("unavailable", "this persona has no MCP servers")
    return hub


class ResourcesArgs(BaseModel):
    model_config = ConfigDict(extra="forbid")

    server: str = Field(description="the MCP server's name")
    uri: str | None = Field(default=None, description="a resource to read; omit to list them")


@tool(name="mcp_resources", available=_has_resources, timeout=90.0)
async def mcp_resources(args: ResourcesArgs, ctx: TurnContext) -> str:
    """List the resources an MCP server offers, or read one by its URI."""
    return await _resources(_need_hub(ctx), ctx, args.server, args.uri)


async def _resources(hub: McpHub, ctx: TurnContext, server: str, uri: str | None) -> str:
    if uri is None:
        listed = await hub.list_resources(server)
        return json.dumps([r.model_dump(exclude_none=True) for r in listed], ensure_ascii=False)
    return "\n".join(render_blocks(ctx, await hub.read_resource(server, uri))) or "(empty)"


class PromptsArgs(BaseModel):
    model_config = ConfigDict(extra="forbid")

    server: str = Field(description="the MCP server's name")
    name: str | None = Field(default=None, description="a prompt to get; omit to list them")
    arguments: dict[str, str] = Field(default_factory=dict, description="the prompt's arguments")


@tool(name="mcp_prompts", available=_has_prompts, timeout=90.0)
async def mcp_prompts(args: PromptsArgs, ctx: TurnContext) -> str:
    """List the prompt templates an MCP server offers, or get one filled in."""
    return await _prompts(_need_hub(ctx), ctx, args.server, args.name, args.arguments)


async def _prompts(
    hub: McpHub, ctx: TurnContext, server: str, name: str | None, arguments: dict[str, str]
) -> str:
    if name is None:
        listed = await hub.list_prompts(server)
        return json.dumps([p.model_dump(exclude_none=True) for p in listed], ensure_ascii=False)
    got = await hub.get_prompt(server, name, arguments)
    lines = [got.description] if got.description else []
    for message in got.messages:
        lines.append(f"[{message.role}] " + "\n".join(render_blocks(ctx, [message.content])))
    return "\n".join(lines)


# -- the gateway ------------------------------------------------------------------------


def _gateway_on(ctx: TurnContext) -> bool:
    hub = _hub(ctx)
    return hub is not None and hub.gateway and bool(hub.servers())


GatewayAction = Literal[
    "servers", "tools", "describe", "call", "resources", "read", "prompts", "prompt"
]


class GatewayArgs(BaseModel):
    model_config = ConfigDict(extra="forbid")

    action: GatewayAction = Field(
        description="servers: list the servers; tools: a server's tools; describe: one "
        "tool's schema; call: run a tool; resources/read: list or read a server's "
        "resources; prompts/prompt: list or get its prompts"
    )
    server: str | None = Field(default=None, description="the server (all but 'servers')")
    tool: str | None = Field(default=None, description="the tool (describe, call)")
    arguments: dict[str, Any] = Field(
        default_factory=dict, description="call: the tool's arguments; prompt: the prompt's"
    )
    uri: str | None = Field(default=None, description="read: the resource's URI")
    name: str | None = Field(default=None, description="prompt: the prompt's name")


def _allowed(ctx: TurnContext, server: str, tool_: str) -> bool:
    name = tool_name(server, tool_)
    tool_filter = ctx.settings.tool_filter
    return matches_any(name, tool_filter.allow) and not matches_any(name, tool_filter.deny)


def _find_tool(hub: McpHub, ctx: TurnContext, server: str, tool_: str) -> McpToolInfo:
    view = next((v for v in hub.servers() if v.name == server), None)
    if view is None:
        known = ", ".join(v.name for v in hub.servers()) or "none"
        raise ToolError("not_found", f"no MCP server named {server!r}; configured: {known}")
    if view.status.state != "ready" and not view.tools:
        raise ToolError(
            "server_unavailable",
            f"MCP server {server!r} is unavailable: {view.status.error or view.status.state}",
        )
    info = next((t for t in view.tools if t.name == tool_), None)
    if info is None or not _allowed(ctx, server, tool_):
        names = ", ".join(t.name for t in view.tools if _allowed(ctx, server, t.name))
        raise ToolError("not_found", f"server {server!r} has no tool {tool_!r}; it has: {names}")
    return info


def _required(value: str | None, field: str, action: str) -> str:
    if not value:
        raise ToolError("invalid_arguments", f"action {action!r} needs {field!r}")
    return value


@tool(name="mcp", available=_gateway_on, timeout=3700.0)
async def mcp_gateway(args: GatewayArgs, ctx: TurnContext) -> str:
    """Use the MCP servers configured for you: list them, list or describe their
    tools, call a tool, read their resources and prompts. Start with
    action 'servers', then 'tools' for a server, then 'call'."""
    hub = _need_hub(ctx)
    if args.action == "servers":
        return json.dumps(
            [
                {
                    "server": v.name,
                    "description": v.description,
                    "state": v.status.state,
                    **({"error": v.status.error} if v.status.error else {}),
                    "tools": sum(_allowed(ctx, v.name, t.name) for t in v.tools),
                    "resources": v.status.has_resources,
                    "prompts": v.status.has_prompts,
                }
                for v in hub.servers()
            ],
            ensure_ascii=False,
        )
    server = _required(args.server, "server", args.action)
    if args.action == "tools":
        view = next((v for v in hub.servers() if v.name == server), None)
        if view is None:
            _find_tool(hub, ctx, server, "")  # raises not_found naming the servers
        assert view is not None
        return json.dumps(
            [
                {"tool": t.name, "title": t.title, "description": t.description}
                for t in view.tools
                if _allowed(ctx, server, t.name)
            ],
            ensure_ascii=False,
        )
    if args.action in ("describe", "call"):
        info = _find_tool(hub, ctx, server, _required(args.tool, "tool", args.action))
        if args.action == "describe":
            return json.dumps(
                {
                    "tool": info.name,
                    "description": info.description,
                    "input_schema": info.input_schema,
                    "annotations": info.annotations,
                },
                ensure_ascii=False,
            )
        return render_result(ctx, await hub.call(server, info.name, args.arguments))
    if args.action in ("resources", "read"):
        uri = _required(args.uri, "uri", args.action) if args.action == "read" else None
        return await _resources(hub, ctx, server, uri)
    name = _required(args.name, "name", args.action) if args.action == "prompt" else None
    prompt_args = {k: str(v) for k, v in args.arguments.items()}
    return await _prompts(hub, ctx, server, name, prompt_args)


MCP_TOOLS = [mcp_gateway, mcp_resources, mcp_prompts]

__all__ = ["MCP_TOOLS", "mcp_gateway", "mcp_prompts", "mcp_resources"]
