"""A tiny ACP agent built on the SDK's agent side, for the failure modes and the
fs callbacks that a real coding agent does not show on demand.

``python fake_agent.py MODE``; the prompt's text is a JSON object of
instructions for the ``fs`` mode. Modes:

- ``fs``: for each ``{"op": "read"|"write", "path", "content"?}`` of the
  prompt's ``"ops"`` list, call the client's fs method and reply one line per
  call (``ok <content>`` or ``error <message>``).
- ``terminal``: for each op of the prompt's ``"ops"`` list, use the client's
  terminals and reply one line per op: ``{"op": "caps"}`` -> ``terminal
  True|False`` (was it advertised); ``{"op": "run", "command", "args"?,
  "env"?, "cwd"?, "limit"?}`` -> create, wait for exit, read the output,
  release: ``exit <code> <signal> truncated=<bool> <output as JSON>``;
  ``{"op": "kill", "command"}`` -> create, kill, read the exit status:
  ``killed <code> <signal>``; ``{"op": "leave", "command"}`` -> create and
  never release: ``left <terminal id>``. A refused call: ``error <message>``.
- ``env``: reply with the environment as JSON.
- ``usage``: the prompt is ``{"costs": [[amount, currency], ...], "usage":
  {Usage fields} | null}``: send one ``usage_update`` per cost (the
  session's cumulative cost), reply ``done``, and end the turn with that
  ``usage`` on the PromptResponse.
- ``permission``: the prompt is ``{"requests": [{"title", "kind", "command"?,
  "paths"?}]}``: ask ``session/request_permission`` for each (options
  allow_once and reject_once; a command goes in ``raw_input``, paths in
  ``locations``) and reply one line per request: ``allowed <title>`` or
  ``denied <title>``.
- ``crash``: say something on stderr and in a message, then exit with 3.
- ``orphan``: on the prompt, start ``sleep 300`` in the same process group
  (holding stdout open), then exit with 4: the child is left behind, like an
  npm wrapper's native binary.
- ``refuse-init``: answer ``initialize`` with a JSON-RPC error.
- ``chatty``: write 2 MB to stderr before answering ``initialize``.
- ``stall``: never end a prompt until cancelled; then answer ``cancelled``.
- ``deaf``: never end a prompt and ignore ``session/cancel``.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from typing import Any, cast

import acp
from acp.schema import (
    AgentCapabilities,
    Cost,
    EnvVariable,
    Implementation,
    InitializeResponse,
    NewSessionResponse,
    PermissionOption,
    PromptResponse,
    ToolCallLocation,
    ToolCallUpdate,
    Usage,
    UsageUpdate,
)

MODE = sys.argv[1] if len(sys.argv) > 1 else "fs"


class FakeAgent:
    def __init__(self) -> None:
        self.conn: Any = None
        self.cancelled = asyncio.Event()

    def on_connect(self, conn: Any) -> None:
        self.conn = conn

    async def initialize(self, protocol_version: int, **kwargs: Any) -> InitializeResponse:
        self.capabilities = kwargs.get("client_capabilities")
        if MODE == "refuse-init":
            raise acp.RequestError(-32603, "fake agent refuses to initialize", {"details": "nope"})
        if MODE == "chatty":
            for _ in range(2048):
                sys.stderr.write("x" * 1023 + "\n")
            sys.stderr.flush()
        return InitializeResponse(
            protocol_version=acp.PROTOCOL_VERSION,
            agent_capabilities=AgentCapabilities(),
            agent_info=Implementation(name="fake-agent", version="0.0.1"),
        )

    async def new_session(self, cwd: str, **kwargs: Any) -> NewSessionResponse:
        return NewSessionResponse(session_id="fake-session")

    async def cancel(self, session_id: str, **kwargs: Any) -> None:
        if MODE != "deaf":
            self.cancelled.set()

    async def say(self, session_id: str, text: str) -> None:
        await self.conn.session_update(session_id, acp.update_agent_message_text(text))

    async def prompt(self, prompt: list[Any], session_id: str, **kwargs: Any) -> PromptResponse:
        text = "".join(getattr(block, "text", "") for block in prompt)
        if MODE == "env":
            await self.say(session_id, json.dumps(dict(os.environ)))
        elif MODE == "usage":
            order = json.loads(text)
            for amount, currency in order["costs"]:
                update = UsageUpdate(
                    session_update="usage_update",
                    used=1000,
                    size=200000,
                    cost=Cost(amount=amount, currency=currency),
                )
                await self.conn.session_update(session_id, update)
            await self.say(session_id, "done")
            usage = order.get("usage")
            return PromptResponse(
                stop_reason="end_turn",
                usage=Usage.model_validate(usage) if usage is not None else None,
            )
        elif MODE == "crash":
            await self.say(session_id, "about to crash")
            sys.stderr.write("fake agent: boom\n")
            sys.stderr.flush()
            os._exit(3)
        elif MODE == "orphan":
            # It inherits stdout: the pipe stays open after this process is gone.
            subprocess.Popen(["sleep", "300"])
            await asyncio.sleep(0.2)
            os._exit(4)
        elif MODE == "terminal":
            lines = []
            for op in json.loads(text)["ops"]:
                try:
                    lines.append(await self.terminal_op(session_id, op))
                except acp.RequestError as exc:
                    lines.append(f"error {exc}")
            await self.say(session_id, "\n".join(lines))
        elif MODE == "permission":
            lines = []
            for i, req in enumerate(json.loads(text)["requests"]):
                raw = {"command": req["command"]} if "command" in req else None
                answer = await self.conn.request_permission(
                    session_id=session_id,
                    tool_call=ToolCallUpdate(
                        tool_call_id=f"tc-{i}",
                        title=req["title"],
                        kind=req["kind"],
                        raw_input=raw,
                        locations=[ToolCallLocation(path=p) for p in req.get("paths", [])],
                    ),
                    options=[
                        PermissionOption(option_id="yes", name="Allow", kind="allow_once"),
                        PermissionOption(option_id="no", name="Reject", kind="reject_once"),
                    ],
                )
                chosen = getattr(answer.outcome, "option_id", None)
                lines.append(f"{'allowed' if chosen == 'yes' else 'denied'} {req['title']}")
            await self.say(session_id, "\n".join(lines))
        elif MODE in ("stall", "deaf"):
            await self.say(session_id, "working…")
            await self.cancelled.wait()
            return PromptResponse(stop_reason="cancelled")
        else:
            lines = []
            for op in json.loads(text)["ops"]:
                try:
                    if op["op"] == "read":
                        got = await self.conn.read_text_file(session_id=session_id, path=op["path"])
                        lines.append(f"ok {got.content}")
                    else:
                        await self.conn.write_text_file(
                            session_id=session_id, path=op["path"], content=op["content"]
                        )
                        lines.append("ok written")
                except acp.RequestError as exc:
                    lines.append(f"error {exc}")
            await self.say(session_id, "\n".join(lines))
        return PromptResponse(stop_reason="end_turn")

    async def terminal_op(self, session_id: str, op: dict[str, Any]) -> str:
        conn = self.conn
        if op["op"] == "caps":
            caps = self.capabilities
            return f"terminal {bool(caps and caps.terminal)}"
        env = [EnvVariable(name=k, value=v) for k, v in op.get("env", {}).items()]
        created = await conn.create_terminal(
            session_id=session_id,
            command=op["command"],
            args=op.get("args"),
            env=env or None,
            cwd=op.get("cwd"),
            output_byte_limit=op.get("limit"),
        )
        tid = created.terminal_id
        if op["op"] == "leave":
            return f"left {tid}"
        if op["op"] == "kill":
            await conn.kill_terminal(session_id=session_id, terminal_id=tid)
            out = await conn.terminal_output(session_id=session_id, terminal_id=tid)
            await conn.release_terminal(session_id=session_id, terminal_id=tid)
            status = out.exit_status
            return f"killed {status and status.exit_code} {status and status.signal}"
        exited = await conn.wait_for_terminal_exit(session_id=session_id, terminal_id=tid)
        out = await conn.terminal_output(session_id=session_id, terminal_id=tid)
        await conn.release_terminal(session_id=session_id, terminal_id=tid)
        return (
            f"exit {exited.exit_code} {exited.signal} truncated={out.truncated} "
            f"{json.dumps(out.output)}"
        )


if __name__ == "__main__":
    asyncio.run(acp.run_agent(cast(acp.Agent, FakeAgent())))
