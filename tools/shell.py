"""Shell tools: shell_exec and process (task_status / task_cancel: tools.tasks).

Every command starts in the persona's :class:`~runtime.services.ProcessService`
(a Ray actor per command in a cluster). ``shell_exec`` waits up to
``yield_ms``; a command still running then keeps running — it is never
started twice — and the model gets a ``bg_<hex>`` handle instead. The
environment is scrubbed; secrets come from the persona's ``.env`` by name
only, and every value of it (and the runtime's provider keys) is redacted
from every output. Without bubblewrap, readonly personas get no shell tools
and workspace personas are refused unless runtime.yaml allows it.
"""

from __future__ import annotations

import logging
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from coterie.runtime.context import TurnContext
from coterie.runtime.errors import CoterieError, ToolError
from coterie.runtime.messages import MessageEnvelope
from coterie.runtime.services import ProcessService
from coterie.runtime.shell import SIGNALS, ProcessOutput, StartSpec, load_secrets, scrubbed_env
from coterie.runtime.tool import tool
from coterie.tools._effects import shell_effect
from coterie.tools._paths import workspace_path

log = logging.getLogger("coterie.tools.shell")

OUTPUT_CAP = 16_000  # characters of output shown for a finished command
NOTIFY_TAIL = 2_000


def shell_available(ctx: TurnContext) -> bool:
    """Shell tools need a process service and a workspace; readonly needs bwrap.

    A ``workspace`` persona without bubblewrap is offered the tools, but every
    call is refused with how to enable it (see :func:`unsandboxed_refusal`).
    """
    service = ctx.services.processes
    if service is None or ctx.settings.workspace is None:
        return False
    return ctx.settings.access != "readonly" or bool(service.sandboxed)


def unsandboxed_refusal(ctx: TurnContext) -> str | None:
    """Why this persona may not run commands here, if it may not.

    Unconfined, a command could read the persona's ``.env`` and the runtime's
    environment: only ``full`` personas, or ``unsandboxed_shell: allow`` in
    runtime.yaml, run without bubblewrap.
    """
    service = ctx.services.processes
    if service is None or service.sandboxed or ctx.settings.access == "full":
        return None
    if ctx.settings.runtime.unsandboxed_shell == "allow" and ctx.settings.access != "readonly":
        return None
    return (
        f"shell commands of a '{ctx.settings.access}' persona run inside bubblewrap, which is not "
        "available on this machine: install it (Debian/Ubuntu: apt-get install bubblewrap; "
        "it must be /usr/bin/bwrap), or set `unsandboxed_shell: allow` in runtime.yaml to run "
        "them unconfined"
    )


def _service(ctx: TurnContext) -> ProcessService:
    if not shell_available(ctx):
        raise ToolError("unavailable", "shell tools are not available to this persona")
    refusal = unsandboxed_refusal(ctx)
    if refusal is not None:
        raise ToolError("unavailable", refusal)
    service = ctx.services.processes
    assert service is not None
    return service


def _cap(text: str, cap: int = OUTPUT_CAP) -> str:
    if len(text) <= cap:
        return text
    head, tail = cap // 4, cap - cap // 4
    cut = len(text) - head - tail
    return f"{text[:head]}\n[… {cut} characters cut …]\n{text[-tail:]}"


class ShellExecArgs(BaseModel):
    model_config = ConfigDict(extra="forbid")

    command: str = Field(min_length=1, max_length=20_000, description="run by /bin/sh -c")
    yield_ms: int = Field(
        default=5_000,
        ge=0,
        le=120_000,
        description="wait this long; a command still running then continues in the background",
    )
    background: bool = Field(default=False, description="return a bg_ handle at once")
    timeout_s: float | None = Field(
        default=None, gt=0, le=86_400, description="kill the command after this many seconds"
    )
    env: dict[str, str] | None = Field(
        default=None, description="extra variables (PATH, LD_*, DYLD_* are ignored)"
    )
    secrets: list[str] | None = Field(
        default=None, max_length=32, description="names from the persona's .env to set"
    )
    cwd: str | None = Field(default=None, description="inside the workspace (the default)")
    notify: bool = Field(
        default=False, description="when it runs in the background, wake me when it ends"
    )

    @field_validator("command")
    @classmethod
    def _no_nul(cls, value: str) -> str:
        if "\x00" in value:
            raise ValueError("command contains a NUL byte")
        return value


def _finished_text(result: ProcessOutput) -> str:
    head = f"exit={result.exit_code}"
    if result.timed_out:
        head += f" (killed: timed out after {result.runtime_s}s)"
    if result.dropped_bytes:
        head += f" (first {result.dropped_bytes} bytes of output dropped)"
    return f"{head}\n{_cap(result.chunk)}"


async def _notify_when_done(service: ProcessService, pid: str, ctx: TurnContext) -> None:
    messenger = ctx.services.messenger
    if messenger is None:
        return
    try:
        await service.wait(pid, None)
        result = await service.read(pid, None)
    except ToolError:  # removed meanwhile (task_cancel, process remove): nothing to report
        return
    tail = result.chunk[-NOTIFY_TAIL:]
    text = f"[process {pid} finished: exit {result.exit_code}] {tail}"
    envelope = MessageEnvelope(
        recipient=ctx.persona,
        sender="process",
        conversation_id=ctx.conversation_id,
        source_kind="wake",
        reply_mode="none",
        text=text,
    )
    try:
        await messenger.post(envelope)
    except CoterieError as exc:  # the persona is closing, its queue is full…
        log.warning("completion of %s not delivered: %s", pid, exc)


@tool(name="shell_exec", timeout=150, available=shell_available, effect=shell_effect)
async def shell_exec(args: ShellExecArgs, ctx: TurnContext) -> Any:
    """Run a shell command in the workspace (merged stdout+stderr, clean environment).
    Finishing within yield_ms returns exit=N and the output; otherwise the same
    process keeps running and you get a bg_ id for the process tool.
    secrets: names from your .env to pass as variables; values are never shown."""
    service = _service(ctx)
    settings = ctx.settings
    assert settings.workspace is not None
    workspace = settings.workspace.resolve()
    cwd = workspace_path(ctx, args.cwd or ".")
    if not cwd.is_dir():
        raise ToolError("invalid_path", f"cwd {args.cwd or '.'!r} is not a directory")
    secret_values = load_secrets(settings.persona_dir, args.secrets or [], ctx.persona)
    env = scrubbed_env(home=workspace, extra=args.env, secrets=secret_values)
    sandbox = service.sandbox(
        workspace,
        settings.access,
        settings.persona_dir,
        settings.home,
        network=settings.network.shell,
    )
    spec = StartSpec(
        command=args.command,
        argv=sandbox.argv(args.command, cwd),
        cwd=str(cwd),
        env=env,
        secrets=secret_values,
        # Every other secret too, requested or not: the command could read it.
        redact=dict(settings.secrets),
        timeout_s=args.timeout_s,
    )
    pid = await service.start(spec)
    if not args.background and await service.wait(pid, args.yield_ms / 1000):
        result = await service.read(pid, None)
        await service.remove(pid)
        return _finished_text(result)
    result = await service.read(pid, None)
    if args.notify:
        ctx.services.background.spawn(_notify_when_done(service, pid, ctx), name=f"notify-{pid}")
    reason = "background requested" if args.background else f"still running after {args.yield_ms}ms"
    return {
        "backgrounded": True,
        "id": pid,
        "reason": reason,
        "running": result.running,
        "exit_code": result.exit_code,
        "output_so_far": _cap(result.chunk),
        "next_offset": result.next_offset,
        "next": (
            "completion will be pushed to this conversation; do not poll"
            if args.notify
            else "use process action=read with since=next_offset; remove it when done"
        ),
    }


class ProcessArgs(BaseModel):
    model_config = ConfigDict(extra="forbid")

    action: Literal["status", "read", "write", "signal", "list", "remove"]
    id: str | None = Field(default=None, description="the bg_ id (all actions but list)")
    since: int | None = Field(default=None, ge=0, description="read: next_offset from before")
    data: str | None = Field(
        default=None, max_length=100_000, description="write: stdin text (newline added)"
    )
    signal: Literal["term", "kill", "int", "hup"] = "term"


@tool(name="process", timeout=30, allow_repeat=True, available=shell_available)
async def process(args: ProcessArgs, ctx: TurnContext) -> Any:
    """Control background shell processes: status, read output from a byte offset
    (dropped_bytes says how much rolled out of the 64 KiB buffer), write stdin,
    signal (term, kill, int, hup; the whole process group), list, remove."""
    service = _service(ctx)
    if args.action == "list":
        return {"processes": [p.model_dump() for p in await service.list()]}
    if not args.id:
        raise ToolError("invalid_arguments", f"{args.action} needs the process id")
    if args.action == "status":
        return (await service.status(args.id)).model_dump()
    if args.action == "read":
        return (await service.read(args.id, args.since)).model_dump()
    if args.action == "write":
        data = args.data or ""
        if not data.endswith("\n"):
            data += "\n"
        written = await service.write(args.id, data.encode())
        return {"id": args.id, "written_bytes": written}
    if args.action == "signal":
        assert args.signal in SIGNALS
        return (await service.signal(args.id, args.signal)).model_dump()
    return {"removed": args.id, **(await service.remove(args.id)).model_dump()}


SHELL_TOOLS = [shell_exec, process]

__all__ = ["NOTIFY_TAIL", "SHELL_TOOLS", "shell_available", "unsandboxed_refusal"]
