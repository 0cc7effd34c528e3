"""Delegating a coding task to an external agent over the Agent Client Protocol.

One :class:`AcpSession` is one agent process (a roster entry of
:mod:`runtime.delegation.acp.roster`) speaking ACP over stdio through the
official SDK (``agent-client-protocol``, imported as ``acp``), with one ACP
session rooted in a workspace::

    async with AcpSession(spec, name="claude", workspace=ws, log_path=log) as session:
        await session.start()                      # raises AcpError
        result = await session.prompt("Add a test for foo()")   # never raises AcpError

or, never raising for anything the agent does, :func:`run_coding_task`.

The process runs in its own session and process group (so an npm wrapper's
native child cannot outlive it); :meth:`AcpSession.cancel` and
:meth:`AcpSession.close` stop the whole group. Its stderr goes to
``log_path`` (never a pipe nobody drains). Its environment is
:func:`runtime.shell.scrubbed_env` plus the roster entry's ``env``: none of
the runtime's API keys unless the entry passes them. Its ``HOME`` is
``agent_home`` (default: a temporary folder removed on close), not the
workspace, so the agent's own state files do not count as changed files.

What the agent may do is decided here, inside the rails:

- ``session/request_permission`` by the roster entry's policy
  (:func:`decide_permission`): ``workspace`` allows once when every path the
  request touches resolves (symlinks followed) inside the workspace and is
  not a ``.env`` file, and denies everything else (commands, fetches, paths
  outside); ``deny`` denies; ``allow`` allows once. Each decision is logged,
  kept on the result and streamed as an event.
- ``fs/read_text_file`` and ``fs/write_text_file`` (advertised) only inside
  the workspace; outside, a JSON-RPC error saying so.
- ``terminal/*`` (advertised only when the session is given a confining
  sandbox: bubblewrap) run commands under that sandbox, in the workspace or
  below (:mod:`runtime.delegation.acp.terminals`); each is logged.

Errors (:class:`AcpError` and its subclasses), events and the result are
in :mod:`runtime.delegation.acp.records`; the rails —
permission decisions, paths, changed files — in
:mod:`runtime.delegation.acp.rails`.

:meth:`AcpSession.prompt` turns every failure of a running agent (``crashed``,
``protocol_error``, ``timeout``) into a :class:`CodingResult` with ``error`` and
``error_kind`` set; :func:`run_coding_task` does the same for start-up
failures. Nothing waits without a bound: start-up has ``startup_timeout``, a
prompt ``prompt_timeout``, and a dead process ends every wait at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
import os
import shutil
import signal
import tempfile
import time
from collections.abc import Awaitable, Mapping
from pathlib import Path
from typing import Any, Literal, TypeVar, cast

import acp
from acp.client.connection import ClientSideConnection
from acp.schema import (
    AgentMessageChunk,
    AgentPlanUpdate,
    AgentThoughtChunk,
    ClientCapabilities,
    CreateTerminalResponse,
    DeniedOutcome,
    EnvVariable,
    FileSystemCapabilities,
    Implementation,
    KillTerminalResponse,
    PermissionOption,
    ReadTextFileResponse,
    ReleaseTerminalResponse,
    RequestPermissionResponse,
    TerminalOutputResponse,
    TextContentBlock,
    ToolCallProgress,
    ToolCallStart,
    ToolCallUpdate,
    UsageUpdate,
    WaitForTerminalExitResponse,
    WriteTextFileResponse,
)
from pydantic import ValidationError

from coterie.runtime.delegation.acp.rails import (
    answer_permission,
    changed_files,
    decide_permission,
    inside_root,
    read_text,
    request_paths,
    snapshot_tree,
    write_text,
)
from coterie.runtime.delegation.acp.records import (
    AcpError,
    AcpProtocolError,
    AcpStartError,
    AcpStartupTimeoutError,
    AgentPermission,
    AgentUsage,
    AnyEvent,
    AskPermission,
    CodingResult,
    FileAccessEvent,
    MessageEvent,
    PermissionDecision,
    PermissionEvent,
    PlanEvent,
    PlanStep,
    TerminalEvent,
    ThoughtEvent,
    ToolCallEvent,
    UpdateCallback,
)
from coterie.runtime.delegation.acp.roster import AgentSpec, resolve_agent_env
from coterie.runtime.delegation.acp.terminals import Terminal, Terminals
from coterie.runtime.errors import ToolError
from coterie.runtime.shell.env import scrubbed_env
from coterie.runtime.shell.handle import group_members
from coterie.runtime.shell.sandbox import Sandbox

log = logging.getLogger(__name__)

T = TypeVar("T")

#: Newline-delimited JSON frames may be large (file contents, diffs).
STDIO_LIMIT_BYTES = 50 * 1024 * 1024
#: Characters of one agent message kept (in ``events`` and the result's ``text``).
MAX_MESSAGE_CHARS = 200_000
#: Seconds between looks at whether the agent process has exited.
EXIT_POLL_S = 0.1
#: Seconds a TERMed group gets before KILL.
KILL_GRACE_S = 2.0
#: Seconds cancel() waits for the agent to end the prompt with ``cancelled``.
CANCEL_GRACE_S = 5.0
#: Characters of stderr quoted in an error.
STDERR_TAIL_CHARS = 1500


def _live_group_members(pgid: int) -> list[int]:
    """Pids in process group ``pgid`` that are not zombies (blocking)."""
    return group_members(pgid, zombies=False) or []


def _read_tail(path: Path, start: int, chars: int) -> str:
    try:
        with open(path, "rb") as f:
            size = f.seek(0, os.SEEK_END)
            f.seek(max(start, size - chars * 2))
            data = f.read()
    except OSError:
        return ""
    return data.decode("utf-8", errors="replace").strip()[-chars:]


# -- the session -------------------------------------------------------------


class _Exited(Exception):
    def __init__(self, code: int | None) -> None:
        self.code = code


class _Timeout(Exception):
    pass


class _AcpClient:
    """The ``acp.Client`` side the agent calls; everything goes to the session."""

    def __init__(self, session: AcpSession) -> None:
        self._session = session

    async def session_update(self, session_id: str, update: Any, **kwargs: Any) -> None:
        await self._session._on_session_update(update)

    async def request_permission(
        self,
        session_id: str,
        tool_call: ToolCallUpdate,
        options: list[PermissionOption],
        **kwargs: Any,
    ) -> RequestPermissionResponse:
        return await self._session._on_permission(tool_call, options)

    async def read_text_file(
        self,
        session_id: str,
        path: str,
        line: int | None = None,
        limit: int | None = None,
        **kwargs: Any,
    ) -> ReadTextFileResponse:
        return await self._session._on_read(path, line, limit)

    async def write_text_file(
        self, session_id: str, path: str, content: str, **kwargs: Any
    ) -> WriteTextFileResponse:
        return await self._session._on_write(path, content)

    async def create_terminal(
        self,
        session_id: str,
        command: str,
        args: list[str] | None = None,
        env: list[EnvVariable] | None = None,
        cwd: str | None = None,
        output_byte_limit: int | None = None,
        **kwargs: Any,
    ) -> CreateTerminalResponse:
        return await self._session._on_terminal_create(command, args, env, cwd, output_byte_limit)

    async def terminal_output(
        self, session_id: str, terminal_id: str, **kwargs: Any
    ) -> TerminalOutputResponse:
        term = self._session._terminals_or_refuse().output(terminal_id)
        return TerminalOutputResponse(
            output=term.text(), truncated=term.truncated, exit_status=term.exit_status
        )

    async def wait_for_terminal_exit(
        self, session_id: str, terminal_id: str, **kwargs: Any
    ) -> WaitForTerminalExitResponse:
        term, status = await self._session._terminals_or_refuse().wait(terminal_id)
        await self._session._terminal_event("exit", term)
        return WaitForTerminalExitResponse(exit_code=status.exit_code, signal=status.signal)

    async def kill_terminal(
        self, session_id: str, terminal_id: str, **kwargs: Any
    ) -> KillTerminalResponse:
        term = await self._session._terminals_or_refuse().kill(terminal_id)
        await self._session._terminal_event("kill", term)
        return KillTerminalResponse()

    async def release_terminal(
        self, session_id: str, terminal_id: str, **kwargs: Any
    ) -> ReleaseTerminalResponse:
        term = await self._session._terminals_or_refuse().release(terminal_id)
        await self._session._terminal_event("release", term)
        return ReleaseTerminalResponse()


class AcpSession:
    """One agent process and one ACP session rooted in ``workspace``.

    ``env`` is the roster entry's environment already resolved
    (:func:`runtime.delegation.acp.roster.resolve_agent_env`); ``None``
    resolves it without persona secrets. ``on_update`` is called (sync or
    async) with every event as it arrives; ``events`` and ``permissions``
    keep at most ``max_events`` each (message chunks merged). ``agent_home``
    is the agent's ``HOME`` (default: a temporary folder removed on close).
    ``terminals`` confines the client terminals offered to the agent (its
    ``workspace`` should be this session's); ``None``, or a sandbox without
    bubblewrap, offers none. Always ``close()`` it (or use ``async with``):
    that stops the group and every terminal.
    """

    def __init__(
        self,
        spec: AgentSpec,
        *,
        name: str,
        workspace: Path,
        log_path: Path,
        env: Mapping[str, str] | None = None,
        agent_home: Path | None = None,
        on_update: UpdateCallback | None = None,
        max_events: int = 1000,
        snapshot_limit: int = 20000,
        terminals: Sandbox | None = None,
        ask: AskPermission | None = None,
    ) -> None:
        """``ask``: where a request goes under ``permissions: ask`` (the
        delegating persona's rules and a person); without it such a request
        is denied."""
        self.spec = spec
        self._ask = ask
        self.name = name
        self.workspace = Path(os.path.realpath(workspace))
        self.log_path = log_path
        self._env = dict(env) if env is not None else None
        self._agent_home = agent_home
        self._own_home: Path | None = None
        self._on_update = on_update
        self.max_events = max_events
        self.snapshot_limit = snapshot_limit
        self.events: list[AnyEvent] = []
        self.events_dropped = 0
        self.permissions: list[PermissionDecision] = []
        self.files_written: set[str] = set()
        self.session_id: str | None = None
        self.agent_info: Implementation | None = None
        self._proc: asyncio.subprocess.Process | None = None
        self._conn: ClientSideConnection | None = None
        self._exit_task: asyncio.Task[int] | None = None
        self._prompt_task: asyncio.Task[Any] | None = None
        self._log_start = 0
        # The agent's message being streamed, and the last finished one.
        self._current: list[str] = []
        self._current_chars = 0
        self._last_message = ""
        self._message_id: str | None = None
        self._tool_calls = 0
        # The session's cumulative cost (amount, currency) as the agent last reported it.
        self._cost: tuple[float, str] | None = None
        self._cancelling = False
        # Set when the group was stopped while a prompt was still running.
        self._killed = False
        self._closed = False
        self.terminals: Terminals | None = (
            Terminals(terminals, self.workspace)
            if terminals is not None and terminals.bwrap is not None
            else None
        )

    # -- lifecycle -----------------------------------------------------------

    @property
    def pid(self) -> int | None:
        """The agent's pid, which is also its process group id."""
        return self._proc.pid if self._proc is not None else None

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.returncode is None

    async def __aenter__(self) -> AcpSession:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    async def start(self) -> None:
        """Spawn the agent, ``initialize`` and open the session; raises :class:`AcpError`.

        On failure the process group is already stopped.
        """
        if self._proc is not None or self._closed:
            raise RuntimeError("an AcpSession starts once")
        deadline = asyncio.get_running_loop().time() + self.spec.startup_timeout
        try:
            await self._spawn()
            await self._handshake(deadline)
        except BaseException:
            await self._stop_group()
            raise

    def _resolve_command(self, path_var: str) -> str:
        command = self.spec.command
        found = shutil.which(command, path=path_var) if "/" not in command else command
        if found is None or not os.path.isfile(found) or not os.access(found, os.X_OK):
            raise AcpStartError(
                f"coding agent {self.name!r}: command {command!r} not found"
                + (f" on PATH {path_var}" if "/" not in command else " or not executable"),
                "missing_binary",
            )
        return found

    async def _spawn(self) -> None:
        extra = self._env
        if extra is None:
            try:
                extra = await asyncio.to_thread(
                    resolve_agent_env, self.spec, persona_dir=None, agent=self.name
                )
            except ToolError as exc:
                raise AcpStartError(exc.detail, "missing_secret") from None
        home = self._agent_home
        if home is None:
            home = self._own_home = Path(
                await asyncio.to_thread(tempfile.mkdtemp, prefix="coterie-acp-home-")
            )
        env = scrubbed_env(home=home, extra=extra)
        exe = self._resolve_command(env["PATH"])
        # A wrapper script's "#!/usr/bin/env node" finds the node beside it.
        exe_dir = os.path.dirname(os.path.realpath(exe))
        if exe_dir not in env["PATH"].split(":"):
            env["PATH"] = f"{exe_dir}:{env['PATH']}"
        log_file = await asyncio.to_thread(self._open_log, exe)
        try:
            self._proc = await asyncio.create_subprocess_exec(
                exe,
                *self.spec.args,
                stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.PIPE,
                stderr=log_file,
                cwd=str(self.workspace),
                env=env,
                start_new_session=True,
                limit=STDIO_LIMIT_BYTES,
            )
        except OSError as exc:
            raise AcpStartError(
                f"coding agent {self.name!r}: cannot run {exe}: {exc.strerror or exc}",
                "missing_binary",
            ) from None
        finally:
            log_file.close()
        self._exit_task = asyncio.create_task(_watch_exit(self._proc))
        assert self._proc.stdin is not None and self._proc.stdout is not None
        # The SDK routes only the methods a client has; terminal calls are
        # refused unless terminals were advertised.
        client = cast(acp.Client, _AcpClient(self))
        self._conn = acp.connect_to_agent(client, self._proc.stdin, self._proc.stdout)
        log.info("coding agent %s started: pid %s in %s", self.name, self._proc.pid, self.workspace)

    def _open_log(self, exe: str) -> Any:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        f = open(self.log_path, "ab")  # noqa: SIM115 - handed to the child, closed after spawn
        self._log_start = f.seek(0, os.SEEK_END)
        stamp = time.strftime("%Y-%m-%d %H:%M:%S")
        argv = " ".join([exe, *self.spec.args])
        f.write(f"--- coterie {stamp}: agent {self.name}: {argv} (cwd {self.workspace})\n".encode())
        f.flush()
        return f

    async def _handshake(self, deadline: float) -> None:
        assert self._conn is not None
        loop = asyncio.get_running_loop()
        capabilities = ClientCapabilities(
            fs=FileSystemCapabilities(read_text_file=True, write_text_file=True),
            terminal=self.terminals is not None,
        )
        info = Implementation(name="coterie", title="coterie", version="0.1.0")
        conn = self._conn
        init = await self._startup_step(
            "initialize",
            conn.initialize(
                protocol_version=acp.PROTOCOL_VERSION,
                client_capabilities=capabilities,
                client_info=info,
            ),
            deadline - loop.time(),
        )
        if init.protocol_version != acp.PROTOCOL_VERSION:
            raise AcpProtocolError(
                f"coding agent {self.name!r} speaks ACP version {init.protocol_version}; "
                f"coterie speaks {acp.PROTOCOL_VERSION}"
            )
        self.agent_info = init.agent_info
        session = await self._startup_step(
            "session/new", conn.new_session(cwd=str(self.workspace)), deadline - loop.time()
        )
        self.session_id = session.session_id

    async def _startup_step(self, what: str, call: Awaitable[T], timeout: float) -> T:
        try:
            return await self._call(call, timeout=max(timeout, 0.0))
        except _Timeout:
            raise AcpStartupTimeoutError(
                f"coding agent {self.name!r} did not answer {what} within "
                f"{self.spec.startup_timeout:g} s{await self._stderr_hint()}"
            ) from None
        except _Exited as exc:
            raise AcpStartError(
                f"coding agent {self.name!r} exited (status {exc.code}) before answering "
                f"{what}{await self._stderr_hint()}",
                "exited",
            ) from None
        except acp.RequestError as exc:
            raise AcpProtocolError(
                f"coding agent {self.name!r} refused {what}: {_request_error_text(exc)}"
                f"{_root_hint(exc)}{await self._stderr_hint()}"
            ) from None
        except ValidationError as exc:
            raise AcpProtocolError(
                f"coding agent {self.name!r} answered {what} with an unreadable reply: "
                f"{exc.errors()[:3]}"
            ) from None

    async def _call(
        self, call: Awaitable[T], *, timeout: float | None, keep_on_timeout: bool = False
    ) -> T:
        """``call``, unless the process exits first (``_Exited``) or ``timeout`` passes
        (``_Timeout``; the call is cancelled unless ``keep_on_timeout``)."""
        assert self._exit_task is not None
        task = asyncio.ensure_future(call)
        try:
            done, _ = await asyncio.wait(
                {task, self._exit_task}, timeout=timeout, return_when=asyncio.FIRST_COMPLETED
            )
        except asyncio.CancelledError:
            task.cancel()
            raise
        if task in done:
            try:
                return task.result()
            except ConnectionError:
                # stdout closed: the process is exiting; say so once it has.
                await asyncio.wait({self._exit_task}, timeout=2.0)
                raise _Exited(self._proc.returncode if self._proc else None) from None
        if self._exit_task in done:
            # The answer may still be in the pipe.
            await asyncio.wait({task}, timeout=0.5)
            if task.done() and not task.cancelled() and task.exception() is None:
                return task.result()
            task.cancel()
            raise _Exited(self._exit_task.result())
        if not keep_on_timeout:
            task.cancel()
        raise _Timeout

    async def _stderr_hint(self) -> str:
        tail = await asyncio.to_thread(
            _read_tail, self.log_path, self._log_start, STDERR_TAIL_CHARS
        )
        lines = [ln for ln in tail.splitlines() if not ln.startswith("--- coterie ")]
        text = "\n".join(lines).strip()
        return f"; stderr ({self.log_path}): {text}" if text else f"; log: {self.log_path}"

    # -- prompting -----------------------------------------------------------

    async def prompt(self, task: str, *, timeout: float | None = None) -> CodingResult:
        """Send ``task`` and wait for the turn to end; never raises :class:`AcpError`.

        ``timeout`` defaults to the roster entry's ``prompt_timeout``; past
        it the session is cancelled and the result says ``timeout``.
        """
        if self._conn is None or self.session_id is None or self._closed:
            raise RuntimeError("start() the session first (and do not close it)")
        if self._prompt_task is not None and not self._prompt_task.done():
            raise RuntimeError("a prompt is already running in this session")
        started = time.monotonic()
        before, complete_before = await asyncio.to_thread(
            snapshot_tree, self.workspace, limit=self.snapshot_limit
        )
        self._current, self._current_chars, self._last_message = [], 0, ""
        self._killed = False
        permissions_before = len(self.permissions)
        calls_before = self._tool_calls
        cost_before = self._cost
        tokens: Any = None
        result = CodingResult(agent=self.name, session_id=self.session_id)
        self._prompt_task = asyncio.ensure_future(
            self._conn.prompt(
                session_id=self.session_id, prompt=[TextContentBlock(type="text", text=task)]
            )
        )
        limit = self.spec.prompt_timeout if timeout is None else timeout
        try:
            response = await self._call(self._prompt_task, timeout=limit, keep_on_timeout=True)
            result.stop_reason = response.stop_reason
            tokens = response.usage
        except _Timeout:
            await self.cancel()
            await _settle(self._prompt_task)
            result.stop_reason = "cancelled"
            result.error_kind = "timeout"
            result.error = f"coding agent {self.name!r} did not finish within {limit:g} s"
        except _Exited as exc:
            if self._cancelling:
                result.stop_reason = "cancelled"
            else:
                result.error_kind = "crashed"
                result.error = (
                    f"coding agent {self.name!r} died mid-task (status {exc.code})"
                    f"{await self._stderr_hint()}"
                )
            await self._stop_group()
        except acp.RequestError as exc:
            result.error_kind = "protocol_error"
            result.error = f"coding agent {self.name!r} failed the task: {_request_error_text(exc)}"
        except ValidationError as exc:
            result.error_kind = "protocol_error"
            result.error = (
                f"coding agent {self.name!r} sent an unreadable reply: {exc.errors()[:3]}"
            )
        result.killed = self._killed
        after, complete_after = await asyncio.to_thread(
            snapshot_tree, self.workspace, limit=self.snapshot_limit
        )
        result.files_changed = sorted(set(changed_files(before, after)) | self.files_written)
        result.files_changed_complete = complete_before and complete_after
        result.permissions = self.permissions[permissions_before:]
        result.tool_calls = self._tool_calls - calls_before
        result.text = self._final_text()
        result.duration_s = round(time.monotonic() - started, 3)
        result.usage = _usage_of(tokens, cost_before, self._cost)
        self.files_written = set()
        return result

    def _final_text(self) -> str:
        return "".join(self._current).strip() or self._last_message

    def _new_message(self) -> None:
        text = "".join(self._current).strip()
        if text:
            self._last_message = text
        self._current, self._current_chars = [], 0

    def _add_text(self, text: str) -> None:
        room = MAX_MESSAGE_CHARS - self._current_chars
        if room <= 0:
            return
        if len(text) > room:
            text = text[:room] + f"\n[… cut at {MAX_MESSAGE_CHARS} characters]"
        self._current.append(text)
        self._current_chars += len(text)

    async def cancel(self, *, grace: float = CANCEL_GRACE_S) -> None:
        """``session/cancel``, up to ``grace`` s for the turn to end, then stop the group."""
        if self._proc is None or self._closed:
            return
        self._cancelling = True
        prompt = self._prompt_task
        if self._conn is not None and self.session_id and prompt is not None and not prompt.done():
            with contextlib.suppress(ConnectionError, OSError, asyncio.TimeoutError):
                await asyncio.wait_for(self._conn.cancel(session_id=self.session_id), 1.0)
            assert self._exit_task is not None
            await asyncio.wait(
                {prompt, self._exit_task}, timeout=grace, return_when=asyncio.FIRST_COMPLETED
            )
        await self._stop_group()

    async def close(self) -> None:
        """Stop the whole process group and release everything; idempotent."""
        if self._closed:
            return
        self._closed = True
        if self.terminals is not None:
            await self.terminals.close()
        await self._stop_group()
        if self._conn is not None:
            with contextlib.suppress(Exception):  # boundary: the connection is gone anyway
                await asyncio.wait_for(self._conn.close(), 2.0)
        if self._prompt_task is not None:
            await _settle(self._prompt_task)
        if self._proc is not None:
            if self._proc.stdin is not None:
                self._proc.stdin.close()
            # With the group gone the pipes close and the transport finishes.
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._proc.wait(), 2.0)
        if self._own_home is not None:
            await asyncio.to_thread(shutil.rmtree, self._own_home, True)

    async def _stop_group(self) -> None:
        """TERM the group, KILL what is left after a grace, wait until it is gone."""
        proc = self._proc
        if proc is None:
            return
        pgid = proc.pid
        members = await asyncio.to_thread(_live_group_members, pgid)
        if members or proc.returncode is None:
            prompt = self._prompt_task
            if proc.returncode is None and prompt is not None and not prompt.done():
                self._killed = True
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pgid, signal.SIGTERM)
            assert self._exit_task is not None
            await asyncio.wait({self._exit_task}, timeout=KILL_GRACE_S)
        deadline = time.monotonic() + 5.0
        while await asyncio.to_thread(_live_group_members, pgid):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pgid, signal.SIGKILL)
            if time.monotonic() > deadline:
                log.warning("coding agent %s: process group %s survives SIGKILL", self.name, pgid)
                break
            await asyncio.sleep(0.05)
        if self._exit_task is not None:
            await asyncio.wait({self._exit_task}, timeout=2.0)

    # -- what the agent calls ------------------------------------------------

    async def _emit(self, event: AnyEvent) -> None:
        last = self.events[-1] if self.events else None
        if isinstance(event, MessageEvent) and isinstance(last, MessageEvent):
            if len(last.text) < MAX_MESSAGE_CHARS:
                last.text += event.text[: MAX_MESSAGE_CHARS - len(last.text)]
        elif len(self.events) < self.max_events:
            # A copy: merging later chunks must not change what the hook was given.
            self.events.append(event.model_copy())
        else:
            self.events_dropped += 1
        if self._on_update is None:
            return
        try:
            outcome = self._on_update(event)
            if inspect.isawaitable(outcome):
                await outcome
        except Exception:  # boundary: a caller's hook must not break the session
            log.exception("coding agent %s: on_update hook failed", self.name)

    async def _on_session_update(self, update: Any) -> None:
        if isinstance(update, AgentMessageChunk):
            if isinstance(update.content, TextContentBlock) and update.content.text:
                if update.message_id is not None and update.message_id != self._message_id:
                    self._new_message()
                    self._message_id = update.message_id
                self._add_text(update.content.text)
                await self._emit(MessageEvent(text=update.content.text))
        elif isinstance(update, AgentThoughtChunk):
            if isinstance(update.content, TextContentBlock) and update.content.text:
                await self._emit(ThoughtEvent(text=update.content.text))
        elif isinstance(update, ToolCallStart | ToolCallProgress):
            start = isinstance(update, ToolCallStart)
            if start:
                self._tool_calls += 1
                self._new_message()  # text after a tool call is a new message
            elif update.title is None and update.status is None and not update.locations:
                return  # content or raw output only: not part of the record
            await self._emit(
                ToolCallEvent(
                    tool_call_id=update.tool_call_id,
                    update=not start,
                    title=update.title,
                    tool_kind=update.kind,
                    status=update.status,
                    paths=[loc.path for loc in update.locations or []],
                )
            )
        elif isinstance(update, AgentPlanUpdate):
            steps = [
                PlanStep(content=e.content, status=e.status, priority=e.priority)
                for e in update.entries
            ]
            await self._emit(PlanEvent(steps=steps))
        elif isinstance(update, UsageUpdate) and update.cost is not None:
            # The context's fill is not kept; the cost is (cumulative for the session).
            self._cost = (update.cost.amount, update.cost.currency)
        # Commands, modes and session info are not part of the task's record.

    async def _on_permission(
        self, tool_call: ToolCallUpdate, options: list[PermissionOption]
    ) -> RequestPermissionResponse:
        if self._cancelling:
            decision = PermissionDecision(
                tool_call_id=tool_call.tool_call_id,
                title=tool_call.title,
                tool_kind=tool_call.kind,
                paths=request_paths(tool_call),
                decision="deny",
                reason="the task is being cancelled",
            )
            response = RequestPermissionResponse(outcome=DeniedOutcome(outcome="cancelled"))
        elif self.spec.permissions == "ask":
            decision, response = await self._asked(tool_call, options)
        else:
            decision, response = await asyncio.to_thread(
                decide_permission,
                self.spec.permissions,
                root=self.workspace,
                tool_call=tool_call,
                options=options,
            )
        log.info(
            "coding agent %s: %s %s (%s): %s",
            self.name,
            decision.decision,
            decision.title or decision.tool_call_id,
            ", ".join(decision.paths) or "no path",
            decision.reason,
        )
        if len(self.permissions) < self.max_events:
            self.permissions.append(decision)
        await self._emit(PermissionEvent(decision=decision))
        return response

    async def _asked(
        self, tool_call: ToolCallUpdate, options: list[PermissionOption]
    ) -> tuple[PermissionDecision, RequestPermissionResponse]:
        """Under ``permissions: ask``: the persona's rules and a person decide."""
        raw = tool_call.raw_input
        command = raw.get("command") if isinstance(raw, dict) else None
        question = AgentPermission(
            agent=self.name,
            tool_call_id=tool_call.tool_call_id,
            title=tool_call.title,
            tool_kind=tool_call.kind,
            paths=request_paths(tool_call),
            command=command if isinstance(command, str) else None,
        )
        if self._ask is None:
            allow, reason = False, "permissions: ask, and nobody to ask here"
        else:
            allow, reason = await self._ask(question)
        return answer_permission(tool_call, options, allow=allow, reason=reason)

    async def _checked_path(self, op: Literal["read", "write"], raw: str) -> Path:
        path = await asyncio.to_thread(inside_root, self.workspace, raw)
        problem = ""
        if not os.path.isabs(raw):
            problem = f"{raw} is not an absolute path"
        elif path is None:
            problem = f"{raw} is outside the workspace {self.workspace}"
        elif path.name == ".env":
            problem = f"{raw}: .env files are off limits"
        if problem or path is None:
            await self._emit(FileAccessEvent(op=op, path=raw, allowed=False, detail=problem))
            log.info("coding agent %s: refused fs %s: %s", self.name, op, problem)
            raise acp.RequestError(-32602, problem, {"path": raw})
        return path

    async def _on_read(self, raw: str, line: int | None, limit: int | None) -> ReadTextFileResponse:
        path = await self._checked_path("read", raw)
        try:
            content = await asyncio.to_thread(read_text, path, line, limit)
        except FileNotFoundError:
            raise acp.RequestError(-32002, f"{raw} does not exist", {"path": raw}) from None
        except IsADirectoryError:
            raise acp.RequestError(-32602, f"{raw} is a directory", {"path": raw}) from None
        await self._emit(FileAccessEvent(op="read", path=raw, allowed=True))
        return ReadTextFileResponse(content=content)

    async def _on_write(self, raw: str, content: str) -> WriteTextFileResponse:
        path = await self._checked_path("write", raw)
        try:
            await asyncio.to_thread(write_text, self.workspace, path, content)
        except OSError as exc:
            detail = f"cannot write {raw}: {exc.strerror or exc}"
            await self._emit(FileAccessEvent(op="write", path=raw, allowed=False, detail=detail))
            raise acp.RequestError(-32603, detail, {"path": raw}) from None
        self.files_written.add(os.path.relpath(path, self.workspace))
        await self._emit(FileAccessEvent(op="write", path=raw, allowed=True))
        return WriteTextFileResponse()

    def _terminals_or_refuse(self) -> Terminals:
        if self.terminals is None:
            raise acp.RequestError(-32601, "this client offers no terminals")
        return self.terminals

    async def _terminal_event(self, op: Literal["exit", "kill", "release"], term: Terminal) -> None:
        status = term.exit_status
        await self._emit(
            TerminalEvent(
                op=op,
                terminal_id=term.id,
                command=term.command,
                cwd=str(term.cwd),
                exit_code=status.exit_code if status else None,
                signal=status.signal if status else None,
            )
        )

    async def _on_terminal_create(
        self,
        command: str,
        args: list[str] | None,
        env: list[EnvVariable] | None,
        cwd: str | None,
        output_byte_limit: int | None,
    ) -> CreateTerminalResponse:
        shown = " ".join([command, *(args or [])])
        try:
            term = await self._terminals_or_refuse().create(
                command, args, env, cwd, output_byte_limit
            )
        except acp.RequestError as exc:
            detail = str(exc)
            log.info("coding agent %s: refused terminal %s: %s", self.name, shown, detail)
            await self._emit(
                TerminalEvent(op="create", command=shown, cwd=cwd, allowed=False, detail=detail)
            )
            raise
        log.info("coding agent %s: terminal %s: %s in %s", self.name, term.id, shown, term.cwd)
        await self._emit(
            TerminalEvent(op="create", terminal_id=term.id, command=term.command, cwd=str(term.cwd))
        )
        return CreateTerminalResponse(terminal_id=term.id)


def _usage_of(
    tokens: Any, before: tuple[float, str] | None, after: tuple[float, str] | None
) -> AgentUsage | None:
    """A task's :class:`AgentUsage` from its reply's ``usage`` (an ACP
    ``Usage`` or None) and the session's cumulative cost before and after."""
    usage = AgentUsage()
    if tokens is not None:
        # ACP's totalTokens is the sum of every kind: its inputTokens are the
        # uncached part (as Claude's), made whole here like a provider's.
        usage.cache_read_tokens = tokens.cached_read_tokens or 0
        usage.cache_write_tokens = tokens.cached_write_tokens or 0
        usage.input_tokens = (
            tokens.input_tokens + usage.cache_read_tokens + usage.cache_write_tokens
        )
        usage.output_tokens = tokens.output_tokens
        usage.thought_tokens = tokens.thought_tokens or 0
        usage.tokens_reported = True
    if after is not None and after != before:
        amount, currency = after
        # What the task added; the whole amount when the currency changed.
        spent = amount - before[0] if before is not None and before[1] == currency else amount
        usage.cost, usage.currency = max(0.0, spent), currency
    if not usage.tokens_reported and usage.cost is None:
        return None
    return usage


async def _watch_exit(proc: asyncio.subprocess.Process) -> int:
    """The exit status, as soon as the child watcher has it.

    Not ``proc.wait()``: that also waits for every pipe to close, which a
    grandchild holding stdout (an npm wrapper's native binary) may never do.
    """
    while proc.returncode is None:
        await asyncio.sleep(EXIT_POLL_S)
    return proc.returncode


async def _settle(task: asyncio.Future[Any]) -> None:
    """Wait briefly for ``task`` to end and retrieve its outcome (no stray warnings)."""
    await asyncio.wait({task}, timeout=1.0)
    if not task.done():
        task.cancel()
    with contextlib.suppress(BaseException):  # boundary: only settling a dead call
        await task


def _request_error_text(exc: acp.RequestError) -> str:
    text = str(exc)
    data = exc.data
    if isinstance(data, dict):
        detail = data.get("details") or data.get("message") or data.get("detail")
        if detail:
            text = f"{text}: {detail}"
    elif data:
        text = f"{text}: {data}"
    return f"{text} (code {exc.code})"


def _root_hint(exc: acp.RequestError) -> str:
    if "Query closed before response received" in _request_error_text(exc) and (
        hasattr(os, "geteuid") and os.geteuid() == 0
    ):
        return " (claude-agent-acp running as root needs IS_SANDBOX=1 in the agent's env)"
    return ""


async def run_coding_task(
    spec: AgentSpec,
    task: str,
    *,
    name: str,
    workspace: Path,
    log_path: Path,
    persona_dir: Path | None = None,
    environ: Mapping[str, str] | None = None,
    agent_home: Path | None = None,
    on_update: UpdateCallback | None = None,
    timeout: float | None = None,
) -> CodingResult:
    """Start the agent, run ``task``, stop the agent; every failure is in the result."""
    started = time.monotonic()
    try:
        env = await asyncio.to_thread(
            resolve_agent_env, spec, persona_dir=persona_dir, environ=environ, agent=name
        )
    except ToolError as exc:
        return CodingResult(agent=name, error=exc.detail, error_kind="missing_secret")
    async with AcpSession(
        spec,
        name=name,
        workspace=workspace,
        log_path=log_path,
        env=env,
        agent_home=agent_home,
        on_update=on_update,
    ) as session:
        try:
            await session.start()
        except AcpError as exc:
            return CodingResult(
                agent=name,
                error=str(exc),
                error_kind=exc.kind,
                duration_s=round(time.monotonic() - started, 3),
            )
        return await session.prompt(task, timeout=timeout)


__all__ = ["AcpSession", "run_coding_task"]
