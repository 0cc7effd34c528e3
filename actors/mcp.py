"""MCP servers on Ray: one McpServer actor per server session.

Each actor holds one :class:`runtime.mcp.session.McpSession` — so a server
that hangs, floods or crashes can take down only its own process, never a
persona's turn. A persona's own servers run on the persona's node (a stdio
server works in its workspace), owned by the persona actor, so they stop with
it. A ``shared: true`` server has one actor for the whole runtime, owned by
the router (:meth:`actors.router.RouterActor.mcp_shared`); personas only use it.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from typing import Any

import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from coterie.actors._ray import remote
from coterie.runtime.errors import ActorLostError, ToolError
from coterie.runtime.mcp.hub import McpClient
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


def _dump(items: list[Any]) -> str:
    return json.dumps([i.model_dump(mode="json") for i in items])


class McpServerActor:
    """One MCP session (its records cross as JSON)."""

    def __init__(self, launch: str) -> None:
        self.launch = McpLaunch.model_validate_json(launch)
        self.session = self._new_session()

    def _new_session(self) -> Any:
        # The SDK is imported here, in the server's own actor only: a persona
        # process never loads it.
        from coterie.runtime.mcp.session import McpSession

        return McpSession(self.launch)

    async def start(self) -> str:
        """Start (once; a shared server is started by each persona that uses it)
        and the status (JSON). A session whose start failed is tried anew."""
        if self.session.status().state == "failed":
            await self.session.close()
            self.session = self._new_session()
        elif self.session.status().state != "starting":
            return self.session.status().model_dump_json()
        status = await self.session.start()
        return status.model_dump_json()

    async def status(self) -> str:
        return self.session.status().model_dump_json()

    async def tools(self) -> str:
        return _dump(await self.session.tools())

    async def call_tool(
        self, name: str, arguments: str, timeout: float | None, trace: dict[str, str] | None
    ) -> str:
        result = await self.session.call_tool(name, json.loads(arguments), timeout, trace)
        return result.model_dump_json()

    async def list_resources(self) -> str:
        return _dump(await self.session.list_resources())

    async def read_resource(self, uri: str) -> str:
        return _dump(await self.session.read_resource(uri))

    async def list_prompts(self) -> str:
        return _dump(await self.session.list_prompts())

    async def get_prompt(self, name: str, arguments: dict[str, str]) -> str:
        return (await self.session.get_prompt(name, arguments)).model_dump_json()

    async def close(self) -> None:
        await self.session.close()


McpServerActorRemote = ray.remote(num_cpus=0, max_restarts=0, max_task_retries=0)(McpServerActor)


class RayMcpClient:
    """An :class:`~runtime.mcp.hub.McpClient` whose session is an McpServer actor.

    An actor that is gone (killed, its node lost) is ``server_crashed``; the
    hub then starts the server anew. ``owned=False`` (a shared server): closing
    the client leaves the actor to the router.
    """

    def __init__(self, actor: Any, *, owned: bool = True) -> None:
        self.actor = actor
        self.owned = owned

    async def _call(self, method: str, *args: Any) -> Any:
        try:
            return await remote(getattr(self.actor, method).remote(*args))
        except ActorLostError as exc:
            raise ToolError("server_crashed", f"the MCP server's actor is gone: {exc}") from None

    async def start(self) -> McpServerStatus:
        return McpServerStatus.model_validate_json(await self._call("start"))

    async def status(self) -> McpServerStatus:
        return McpServerStatus.model_validate_json(await self._call("status"))

    async def tools(self) -> list[McpToolInfo]:
        return [McpToolInfo.model_validate(t) for t in json.loads(await self._call("tools"))]

    async def call_tool(
        self,
        name: str,
        arguments: dict[str, Any],
        timeout: float | None = None,
        trace: dict[str, str] | None = None,
    ) -> McpCallResult:
        data = await self._call("call_tool", name, json.dumps(arguments), timeout, trace)
        return McpCallResult.model_validate_json(data)

    async def list_resources(self) -> list[McpResourceInfo]:
        data = json.loads(await self._call("list_resources"))
        return [McpResourceInfo.model_validate(r) for r in data]

    async def read_resource(self, uri: str) -> list[McpContent]:
        return [
            McpContent.model_validate(c) for c in json.loads(await self._call("read_resource", uri))
        ]

    async def list_prompts(self) -> list[McpPromptInfo]:
        return [
            McpPromptInfo.model_validate(p) for p in json.loads(await self._call("list_prompts"))
        ]

    async def get_prompt(self, name: str, arguments: dict[str, str]) -> McpPromptResult:
        return McpPromptResult.model_validate_json(await self._call("get_prompt", name, arguments))

    async def close(self) -> None:
        if not self.owned:
            return
        try:
            await remote(self.actor.close.remote())
        except Exception:
            pass
        ray.kill(self.actor)


def new_server_actor(launch: McpLaunch, *, node_id: str | None = None) -> Any:
    """A fresh McpServer actor for ``launch`` (on ``node_id`` when given)."""
    options: dict[str, Any] = {}
    if node_id is not None:
        options["scheduling_strategy"] = NodeAffinitySchedulingStrategy(node_id=node_id, soft=False)
    remote_class: Any = McpServerActorRemote
    return remote_class.options(**options).remote(launch.model_dump_json())


class RayMcpClients:
    """The persona actor's :data:`~runtime.mcp.hub.ClientFactory`: its own servers
    in actors on its node; shared ones from the router (``shared_actor``)."""

    def __init__(self, shared_actor: Callable[[McpLaunch], Awaitable[Any]]) -> None:
        self.node_id = ray.get_runtime_context().get_node_id()
        self.shared_actor = shared_actor

    def __call__(self, launch: McpLaunch, shared: bool) -> McpClient:
        if shared:
            return _SharedClient(self.shared_actor, launch)
        return RayMcpClient(new_server_actor(launch, node_id=self.node_id))


class _SharedClient(RayMcpClient):
    """A shared server's client: the router hands out the actor on :meth:`start`."""

    def __init__(self, lookup: Callable[[McpLaunch], Awaitable[Any]], launch: McpLaunch) -> None:
        super().__init__(None, owned=False)
        self.lookup = lookup
        self.launch = launch

    async def start(self) -> McpServerStatus:
        self.actor = await self.lookup(self.launch)
        return await super().start()


__all__ = [
    "McpServerActor",
    "McpServerActorRemote",
    "RayMcpClient",
    "RayMcpClients",
    "new_server_actor",
]
