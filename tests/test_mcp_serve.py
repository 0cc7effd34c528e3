"""``coterie mcp-serve`` as an editor runs it: a real subprocess, driven by the
official ``mcp`` client (``ClientSession``) over stdio and over streamable
HTTP, with scripted personas; in-process, and through a running ``coterie
serve`` (which it must use instead of starting a Ray of its own). The HTTP
processes require their bearer token (a generated one, and one from
``--token-file``); the refusals that start nothing run as quick processes.

Each class shares one mcp-serve process (and at most one Ray start) between
its tests; class scope stops it before the next class starts its own.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from email.message import Message
from pathlib import Path
from typing import Any, TypeVar

import httpx2
import psutil
import pytest
import yaml
from mcp.client.session import ClientSession
from mcp.client.stdio import StdioServerParameters, stdio_client
from mcp.client.streamable_http import streamable_http_client
from mcp.types import CallToolResult, TextContent, Tool

from coterie.runtime.audit import read_only_query
from coterie.runtime.errors import CoterieError
from coterie.runtime.serve.client import ServerClient, ServerError
from coterie.runtime.serve.discovery import ServerState
from coterie.runtime.serve.mcp_transport import TOKEN_ENV, TOKEN_FILE, BearerAuth, http_auth
from tests.helpers import asker, scripted, write_persona
from tests.serving import running_server

T = TypeVar("T")
ROOT = Path(__file__).resolve().parent.parent
ENV = {k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS", TOKEN_ENV)}
#: Seconds for an mcp-serve process to come up, or a call to answer (Ray starts).
STARTUP = 180.0

BASE_TOOLS = {"list_personas", "ask_persona", "send_to_persona"}
NOTE = "remember: the spare key is under the blue pot"
KEEPER = scripted(
    [
        {
            "when": {"turn": 1, "contains": "remember"},
            "tool_calls": [
                {
                    "name": "memory",
                    "arguments": {"action": "write", "category": "notes", "content": "{input}"},
                }
            ],
        },
        {"when": {"turn": 2}, "text": "noted"},
    ],
    description="keeps notes",
)
# Its model answers after 5 s but times out after 0.5 s: every turn fails.
SLOWPOKE = {
    "model": {"provider": "scripted", "default": "too late", "latency_ms": 5000, "timeout": 0.5},
    "description": "never in time",
}
DESCRIPTIONS = {"echo": "asks back", "keeper": "keeps notes", "slowpoke": "never in time"}


def make_home(tmp_path_factory: pytest.TempPathFactory, name: str) -> Path:
    home = tmp_path_factory.mktemp(name)
    write_persona(home, "echo", asker("asks back"))
    write_persona(home, "keeper", KEEPER)
    write_persona(home, "slowpoke", SLOWPOKE)
    # The tiny test embedder, and frequent index maintenance so recall sees writes soon.
    (home / "runtime.yaml").write_text(
        yaml.safe_dump({"memory": {"embedder": "hashing", "optimize_interval": 0.5}})
    )
    return home


class McpClient:
    """An MCP ``ClientSession`` held open on an event loop of its own, in a
    thread, and called synchronously: the tests of a class share it (and its
    mcp-serve process), and the transport is entered and left in one task."""

    def __init__(self, transport: Callable[[], AbstractAsyncContextManager[Any]]) -> None:
        #: Lines of the server's output that were not MCP messages.
        self.stream_errors: list[Exception] = []
        self._transport = transport
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._closing = asyncio.Event()
        self._failure: list[BaseException] = []
        self._session: ClientSession | None = None
        self._thread = threading.Thread(target=self._run, name="mcp-test-client", daemon=True)
        self._thread.start()
        if not self._ready.wait(STARTUP) or self._failure or self._session is None:
            self.close()
            raise RuntimeError(f"the MCP session did not open: {self._failure}")

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        self._loop.run_until_complete(self._main())
        self._loop.close()

    async def _main(self) -> None:
        try:
            async with (
                self._transport() as (read, write),
                ClientSession(read, write, message_handler=self._on_message) as session,
            ):
                await session.initialize()
                self._session = session
                self._ready.set()
                await self._closing.wait()
        except BaseException as exc:  # reported by __init__ / close
            self._failure.append(exc)
        finally:
            self._ready.set()

    async def _on_message(self, message: Any) -> None:
        if isinstance(message, Exception):
            self.stream_errors.append(message)

    def run(self, call: Callable[[ClientSession], Awaitable[T]], timeout: float = STARTUP) -> T:
        assert self._session is not None
        session = self._session
        return asyncio.run_coroutine_threadsafe(_awaited(call(session)), self._loop).result(timeout)

    def tools(self) -> list[Tool]:
        return self.run(lambda s: s.list_tools()).tools

    def call(self, tool: str, **arguments: Any) -> CallToolResult:
        return self.run(lambda s: s.call_tool(tool, arguments))

    def close(self) -> None:
        if self._thread.is_alive():
            try:
                self._loop.call_soon_threadsafe(self._closing.set)
            except RuntimeError:  # the loop just closed: the session ended by itself
                pass
            self._thread.join(60)


async def _awaited(awaitable: Awaitable[T]) -> T:
    return await awaitable


def text_of(result: CallToolResult) -> str:
    return "\n".join(c.text for c in result.content if isinstance(c, TextContent))


def ok(result: CallToolResult) -> dict[str, Any]:
    """The structured content of a successful call."""
    assert not result.is_error, text_of(result)
    assert result.structured_content is not None
    return result.structured_content


def wait_for(check: Callable[[], T | None], *, timeout: float = 60.0, what: str = "") -> T:
    """Poll ``check`` until it returns something (no timing asserted)."""
    deadline = time.monotonic() + timeout
    while True:
        found = check()
        if found:
            return found
        if time.monotonic() > deadline:
            raise AssertionError(f"gave up waiting for {what}")
        time.sleep(0.3)


def ray_processes(pid: int) -> list[str]:
    """Names of the Ray processes under ``pid`` (raylet, gcs_server, workers)."""
    try:
        children = psutil.Process(pid).children(recursive=True)
    except psutil.NoSuchProcess:
        return []
    names = []
    for child in children:
        try:
            names.append(" ".join(child.cmdline()) or child.name())
        except psutil.Error:
            continue
    return [n for n in names if "raylet" in n or "gcs_server" in n or "ray::" in n]


@asynccontextmanager
async def http_transport(url: str, token: str | None) -> AsyncIterator[Any]:
    """The official streamable HTTP client, sending ``token`` as its bearer."""
    headers = {"Authorization": f"Bearer {token}"} if token is not None else {}
    timeout = httpx2.Timeout(30.0, read=300.0)  # the SDK's own defaults
    async with (
        httpx2.AsyncClient(headers=headers, timeout=timeout) as client,
        streamable_http_client(url, http_client=client) as streams,
    ):
        yield streams


INITIALIZE = {
    "jsonrpc": "2.0",
    "id": 1,
    "method": "initialize",
    "params": {
        "protocolVersion": "2025-06-18",
        "capabilities": {},
        "clientInfo": {"name": "plain-http", "version": "0"},
    },
}


def post_mcp(url: str, *, headers: dict[str, str]) -> tuple[int, Message, bytes]:
    """A plain POST of ``initialize`` to the endpoint: status, headers (any
    case), body."""
    request = urllib.request.Request(
        url,
        data=json.dumps(INITIALIZE).encode(),
        method="POST",
        headers={
            "Content-Type": "application/json",
            "Accept": "application/json, text/event-stream",
            **headers,
        },
    )
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            return response.status, response.headers, response.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.headers, exc.read()


def unauthorized(status: int, headers: Message, body: bytes) -> bool:
    return (
        status == 401
        and headers.get("WWW-Authenticate") == "Bearer"
        and json.loads(body)["error"]["type"] == "unauthorized"
    )


class HttpServe:
    """``coterie mcp-serve --http 0`` in a subprocess; its URL from its stderr,
    its bearer token from ``token`` or else the file it generated."""

    def __init__(self, home: Path, *args: str, token: str | None = None) -> None:
        self.home = home
        self.stderr_path = home / "mcp-serve.stderr"
        with self.stderr_path.open("w") as stderr:
            command = [sys.executable, "-m", "coterie", "mcp-serve", "--http", "0"]
            self.proc = subprocess.Popen(
                [*command, "--home", str(home), *args],
                cwd=ROOT,
                env=ENV,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=stderr,
                text=True,
            )
        self.url = wait_for(self._url, timeout=STARTUP, what="mcp-serve to print its URL")
        # Written before the URL is announced.
        self.token = token or (home / TOKEN_FILE).read_text().strip()

    def _url(self) -> str | None:
        if self.proc.poll() is not None:
            raise AssertionError(f"mcp-serve exited: {self.stderr()}")
        match = re.search(r"http://127\.0\.0\.1:\d+/mcp", self.stderr())
        return match.group(0) if match else None

    def stderr(self) -> str:
        return self.stderr_path.read_text(encoding="utf-8", errors="replace")

    def stop(self) -> int:
        """SIGTERM, then its exit status."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(120)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(30)
            raise AssertionError(f"mcp-serve ignored SIGTERM: {self.stderr()}") from None


# -- stdio, in-process runtime, --allow-recall ------------------------------------------------


class Stdio:
    def __init__(self, home: Path, client: McpClient, stderr: Path) -> None:
        self.home = home
        self.client = client
        self.stderr = stderr


@pytest.fixture(scope="class")
def stdio(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stdio]:
    home = make_home(tmp_path_factory, "mcp-stdio")
    stderr_path = home / "mcp-serve.stderr"
    params = StdioServerParameters(
        command=sys.executable,
        args=["-m", "coterie", "mcp-serve", "--stdio", "--allow-recall", "--home", str(home)],
        env=ENV,
        cwd=ROOT,
    )
    with stderr_path.open("w") as errlog:
        client = McpClient(lambda: stdio_client(params, errlog=errlog))
        try:
            yield Stdio(home, client, stderr_path)
        finally:
            client.close()


class TestStdio:
    def test_allow_recall_adds_the_recall_tool(self, stdio: Stdio) -> None:
        tools = {t.name: t for t in stdio.client.tools()}
        assert set(tools) == BASE_TOOLS | {"recall"}
        ask = tools["ask_persona"].input_schema
        assert set(ask["required"]) == {"persona", "text"}
        assert "conversation_id" in ask["properties"]
        assert tools["ask_persona"].output_schema is not None
        assert set(tools["recall"].input_schema["required"]) == {"persona"}

    def test_list_personas_lists_them_all(self, stdio: Stdio) -> None:
        data = ok(stdio.client.call("list_personas"))
        listed = {p["name"]: p for p in data["personas"]}
        assert {n: p["description"] for n, p in listed.items()} == DESCRIPTIONS
        assert all(isinstance(p["active"], bool) for p in listed.values())

    def test_a_second_ask_continues_the_conversation(self, stdio: Stdio) -> None:
        first = stdio.client.call("ask_persona", persona="echo", text="plan a trip")
        data = ok(first)
        assert data["text"] == "Which city?" and data["choices"] == ["Paris", "Oslo"]
        assert data["conversation_id"] == "echo:mcp"
        assert "Choices: Paris, Oslo" in text_of(first)
        # The answer lands in the same conversation, where the question waits.
        second = ok(stdio.client.call("ask_persona", persona="echo", text="Oslo"))
        assert second["text"] == 'you said: [answer to your question "Which city?"] Oslo'
        assert second["conversation_id"] == "echo:mcp"
        # A caller's own conversation is another one: no question waits there.
        mine = stdio.client.call("ask_persona", persona="echo", text="Oslo", conversation_id="ed-1")
        assert ok(mine)["conversation_id"] == "ed-1"
        assert text_of(mine) == "you said: Oslo"

    def test_an_unknown_persona_is_a_tool_error_naming_the_known_ones(self, stdio: Stdio) -> None:
        for tool in ("ask_persona", "send_to_persona"):
            result = stdio.client.call(tool, persona="nobody", text="hi")
            assert result.is_error, tool
            message = text_of(result)
            assert "unknown persona 'nobody'" in message and "echo" in message, message

    def test_a_failed_turn_is_a_tool_error_with_the_reason(self, stdio: Stdio) -> None:
        result = stdio.client.call("ask_persona", persona="slowpoke", text="quick!")
        assert result.is_error
        message = text_of(result)
        assert "slowpoke's turn failed" in message and "did not answer within" in message

    def test_bad_arguments_are_refused(self, stdio: Stdio) -> None:
        result = stdio.client.call(
            "ask_persona", persona="echo", text="hi", conversation_id="has spaces"
        )
        assert result.is_error and "conversation_id" in text_of(result)

    def test_send_then_the_memory_it_wrote_is_recalled(self, stdio: Stdio) -> None:
        sent = ok(stdio.client.call("send_to_persona", persona="keeper", text=NOTE))
        assert sent == {"persona": "keeper", "conversation_id": "keeper:mcp", "queued": True}

        def recalled() -> dict[str, Any] | None:
            data = ok(stdio.client.call("recall", persona="keeper", query="spare key blue pot"))
            return data if data["hits"] else None

        # The sent message's turn ran in the background and wrote the memory.
        data = wait_for(recalled, what="keeper's memory of the sent note")
        assert data["hits"][0]["content"] == NOTE and data["hits"][0]["kind"] == "memory"
        # Another persona's memory holds none of it; a nonsense persona errors.
        echo = ok(stdio.client.call("recall", persona="echo", query="spare key blue pot"))
        assert echo["hits"] == []
        nonsense = stdio.client.call("recall", persona="no-such-one", query="key")
        assert nonsense.is_error and "unknown persona 'no-such-one'" in text_of(nonsense)

    def test_stdout_carried_nothing_but_the_protocol(self, stdio: Stdio) -> None:
        assert stdio.client.stream_errors == []
        stderr = stdio.stderr.read_text()
        assert "personas served by an in-process runtime" in stderr
        assert not (stdio.home / TOKEN_FILE).exists()  # stdio has no token


# -- streamable HTTP, in-process runtime, no recall ----------------------------------------------


class Http:
    def __init__(self, serve: HttpServe, client: McpClient) -> None:
        self.serve = serve
        self.client = client


@pytest.fixture(scope="class")
def http(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Http]:
    serve = HttpServe(make_home(tmp_path_factory, "mcp-http"))  # generates its token
    try:
        client = McpClient(lambda: http_transport(serve.url, serve.token))
        try:
            yield Http(serve, client)
        finally:
            client.close()
    finally:
        serve.stop()


class TestHttp:
    def test_without_the_flag_there_is_no_recall_tool(self, http: Http) -> None:
        assert {t.name for t in http.client.tools()} == BASE_TOOLS
        result = http.client.call("recall", persona="keeper", query="anything")
        assert result.is_error and "Unknown tool: recall" in text_of(result)

    def test_ask_and_send(self, http: Http) -> None:
        listed = ok(http.client.call("list_personas"))["personas"]
        assert {p["name"] for p in listed} == set(DESCRIPTIONS)
        reply = ok(http.client.call("ask_persona", persona="echo", text="hello over http"))
        assert reply["text"] == "you said: hello over http" and reply["status"] == "ok"
        sent = ok(http.client.call("send_to_persona", persona="keeper", text=NOTE))
        assert sent["conversation_id"] == "keeper:mcp"
        missing = http.client.call("ask_persona", persona="ghost", text="boo")
        assert missing.is_error and "unknown persona 'ghost'" in text_of(missing)

    def test_only_the_right_token_opens_the_door(self, http: Http) -> None:
        url = http.serve.url
        assert unauthorized(*post_mcp(url, headers={}))
        for wrong in (f"Bearer {http.serve.token}x", f"Basic {http.serve.token}", "Bearer"):
            assert unauthorized(*post_mcp(url, headers={"Authorization": wrong})), wrong
        # The official client with a wrong token gets no session.
        with pytest.raises(RuntimeError, match="did not open"):
            McpClient(lambda: http_transport(url, "not-the-token-at-all"))
        # The right one opens a session; its id alone does not let a request in.
        status, headers, _ = post_mcp(url, headers={"Authorization": f"bearer {http.serve.token}"})
        assert status == 200 and headers["mcp-session-id"]
        session = {"mcp-session-id": headers["mcp-session-id"]}
        assert unauthorized(*post_mcp(url, headers=session))

    def test_the_generated_token_is_in_a_file_of_this_user_only(self, http: Http) -> None:
        path = http.serve.home / TOKEN_FILE
        assert path.stat().st_mode & 0o777 == 0o600
        assert len(http.serve.token) >= 32
        # The announcement names the file, never the token.
        assert f"(bearer token in {path})" in http.serve.stderr()

    def test_sigterm_stops_it_cleanly_with_the_audit_flushed(self, http: Http) -> None:
        rays = ray_processes(http.serve.proc.pid)
        assert rays, "an in-process runtime runs Ray under mcp-serve"
        http.client.close()
        assert http.serve.stop() == 0, http.serve.stderr()
        assert "coterie mcp-serve: stopping" in http.serve.stderr()
        assert http.serve.proc.stdout is not None and http.serve.proc.stdout.read() == ""
        # Nothing it printed in its whole life holds the token.
        assert http.serve.token not in http.serve.stderr()
        # The runtime's audit reached DuckDB: the message sent without waiting
        # was delivered into keeper's conversation.
        result = read_only_query(
            str(http.serve.home / "audit.duckdb"),
            "select count(*) from events where persona = 'keeper' "
            "and conversation_id = 'keeper:mcp' and kind = 'chat_message'",
        )
        assert result.rows[0][0] >= 1


# -- through a running coterie serve ----------------------------------------------------------


class Served:
    def __init__(self, state: ServerState, serve: HttpServe, client: McpClient) -> None:
        self.state = state
        self.serve = serve
        self.client = client
        self.api = ServerClient(state)


@pytest.fixture(scope="class")
def served(tmp_path_factory: pytest.TempPathFactory, ray_session: None) -> Iterator[Served]:
    home = make_home(tmp_path_factory, "mcp-served")
    token_file = home / "editor.token"
    token_file.write_text("  a-token-the-editor-was-given-0123\n")
    token_file.chmod(0o600)
    with running_server(home) as state:
        serve = HttpServe(
            home,
            "--allow-recall",
            "--token-file",
            str(token_file),
            token="a-token-the-editor-was-given-0123",
        )
        try:
            client = McpClient(lambda: http_transport(serve.url, serve.token))
            try:
                yield Served(state, serve, client)
            finally:
                client.close()
        finally:
            assert serve.stop() == 0, serve.stderr()


def api_call(state: ServerState, path: str, *, token: str | None = "") -> tuple[int, Any]:
    request = urllib.request.Request(state.url + path)
    if token is not None:
        request.add_header("Authorization", f"Bearer {token or state.token}")
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


@pytest.mark.ray
class TestThroughServe:
    def test_it_goes_through_the_server_without_a_ray_of_its_own(self, served: Served) -> None:
        assert {t.name for t in served.client.tools()} == BASE_TOOLS | {"recall"}
        # The token of --token-file; no token file generated, and coterie serve's does not open it.
        assert "bearer token from --token-file" in served.serve.stderr()
        assert not (served.serve.home / TOKEN_FILE).exists()
        assert unauthorized(
            *post_mcp(served.serve.url, headers={"Authorization": f"Bearer {served.state.token}"})
        )
        reply = ok(served.client.call("ask_persona", persona="echo", text="via the server"))
        assert reply["text"] == "you said: via the server"
        assert f"personas served by coterie serve at {served.state.url}" in served.serve.stderr()
        assert ray_processes(served.serve.proc.pid) == []
        # The turn ran in the server's runtime: its history holds the conversation.
        history = served.api.get("/v1/personas/echo/conversations/echo:mcp")
        assert [m["text"] for m in history["messages"] if m["kind"] == "user"] == ["via the server"]

    def test_send_and_recall_through_the_server(self, served: Served) -> None:
        sent = ok(served.client.call("send_to_persona", persona="keeper", text=NOTE))
        assert sent["conversation_id"] == "keeper:mcp"

        def in_history() -> list[str] | None:
            try:
                data = served.api.get("/v1/personas/keeper/conversations/keeper:mcp")
            except ServerError as exc:  # 404 until the turn's messages are in the audit log
                assert exc.status == 404, exc
                return None
            texts = [m["text"] for m in data["messages"] if m["kind"] == "user"]
            return texts or None

        assert wait_for(in_history, what="the sent message in the server's history") == [NOTE]

        def recalled() -> list[Any] | None:
            hits = ok(served.client.call("recall", persona="keeper", query="spare key"))["hits"]
            return hits or None

        assert wait_for(recalled, what="keeper's memory")[0]["content"] == NOTE
        for tool in ("recall", "ask_persona"):
            args = {"query": "x"} if tool == "recall" else {"text": "x"}
            result = served.client.call(tool, persona="ghost", **args)
            assert result.is_error and "unknown persona 'ghost'" in text_of(result), tool
            assert "keeper" in text_of(result)

    def test_the_recall_endpoint(self, served: Served) -> None:
        served.client.call("ask_persona", persona="keeper", text="remember: oars are in the shed")

        def hits() -> list[Any] | None:
            status, body = api_call(served.state, "/v1/personas/keeper/recall?query=oars+shed")
            assert status == 200, body
            assert body["persona"] == "keeper" and body["query"] == "oars shed"
            return body["hits"] or None

        assert any("oars" in h["content"] for h in wait_for(hits, what="the oars memory"))
        status, body = api_call(served.state, "/v1/personas/keeper/recall?limit=1")
        assert status == 200 and len(body["hits"]) == 1
        status, body = api_call(served.state, "/v1/personas/ghost/recall?query=x")
        assert status == 404 and body["error"]["type"] == "unknown_persona"
        assert "keeper" in body["error"]["message"]
        for limit in ("0", "51", "many"):
            status, body = api_call(served.state, f"/v1/personas/keeper/recall?limit={limit}")
            assert status == 400 and body["error"]["field"] == "limit", limit
        status, body = api_call(served.state, f"/v1/personas/keeper/recall?query={'q' * 2001}")
        assert status == 400 and body["error"]["field"] == "query"
        status, body = api_call(served.state, "/v1/personas/keeper/recall", token=None)
        assert status == 401

    def test_posting_without_waiting_answers_202(self, served: Served) -> None:
        body = {"text": "no wait", "conversation_id": "c-nowait", "wait": False}
        request = urllib.request.Request(
            served.state.url + "/v1/personas/echo/messages",
            data=json.dumps(body).encode(),
            method="POST",
            headers={"Authorization": f"Bearer {served.state.token}"},
        )
        with urllib.request.urlopen(request, timeout=60) as response:
            assert response.status == 202
            queued = json.loads(response.read())["queued"]
        assert queued["conversation_id"] == "c-nowait" and queued["id"].startswith("msg_")
        with pytest.raises(ServerError) as refused:
            served.api.post(
                "/v1/personas/echo/messages", {"text": "x", "wait": False, "stream": True}
            )
        assert refused.value.status == 400 and refused.value.kind == "invalid_body"


# -- refusals, and the token's sources -----------------------------------------------------------


def mcp_serve_refusal(home: Path, *args: str) -> str:
    """Run ``coterie mcp-serve`` expecting a refusal before anything starts;
    its error, on one line."""
    done = subprocess.run(
        [sys.executable, "-m", "coterie", "mcp-serve", "--home", str(home), *args],
        cwd=ROOT,
        env=ENV,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 1 and done.stdout == "", done
    return " ".join(done.stderr.split())


def test_no_auth_on_a_non_loopback_host_is_refused(tmp_path: Path) -> None:
    error = mcp_serve_refusal(tmp_path, "--http", "0", "--host", "0.0.0.0", "--no-auth")
    assert error.startswith("error: --no-auth is refused on --host 0.0.0.0"), error
    assert "loopback" in error and "Ray" not in error
    assert list(tmp_path.iterdir()) == []  # no token, no runtime: nothing started


def test_a_token_file_others_can_read_is_refused(tmp_path: Path) -> None:
    token_file = tmp_path / "shared.token"
    token_file.write_text("a-perfectly-good-token-0123456789")
    token_file.chmod(0o644)
    error = mcp_serve_refusal(tmp_path, "--http", "0", "--token-file", str(token_file))
    assert error == (
        f"error: --token-file {token_file} is open to other users (mode 0644); "
        f"make it yours alone: chmod 600 {token_file}"
    )


def test_where_the_token_comes_from(tmp_path: Path) -> None:
    token_file = tmp_path / "given.token"
    token_file.write_text("from-the-file-0123456789\n")
    token_file.chmod(0o600)
    env = {TOKEN_ENV: "  from-the-environment-0123  "}
    # --token-file first, then $COTERIE_MCP_TOKEN, then <home>/mcp-serve.token (kept or new).
    from_file = http_auth(tmp_path, host="0.0.0.0", token_file=token_file, environ=env)
    assert from_file.token == "from-the-file-0123456789" and from_file.write_to is None
    from_env = http_auth(tmp_path, host="0.0.0.0", environ=env)
    assert from_env.token == "from-the-environment-0123" and from_env.write_to is None
    assert from_env.source == f"bearer token from ${TOKEN_ENV}"
    # An old file that others could read is not trusted: a new token replaces it.
    kept_path = tmp_path / TOKEN_FILE
    kept_path.write_text("old-and-readable-0123456789")
    kept_path.chmod(0o644)
    generated = http_auth(tmp_path, host="127.0.0.1", environ={})
    assert generated.write_to == kept_path and generated.token
    assert generated.token != "old-and-readable-0123456789"
    assert generated.token not in repr(generated)
    generated.publish()
    assert kept_path.read_text() == generated.token + "\n"
    assert kept_path.stat().st_mode & 0o777 == 0o600
    # The next start keeps it: a client configured once goes on working.
    again = http_auth(tmp_path, host="127.0.0.1", environ={})
    assert again.token == generated.token and again.write_to is None
    assert again.source == f"bearer token in {kept_path} (kept from an earlier start)"
    # A kept file without a usable token is replaced too.
    kept_path.write_text("short")
    assert http_auth(tmp_path, host="127.0.0.1", environ={}).write_to == kept_path
    # --no-auth on loopback: no token; too short a token, or group access, is refused.
    assert http_auth(tmp_path, host="::1", no_auth=True).token is None
    with pytest.raises(CoterieError, match=r"\$COTERIE_MCP_TOKEN does not hold a usable token"):
        http_auth(tmp_path, host="127.0.0.1", environ={TOKEN_ENV: "short"})
    token_file.chmod(0o640)
    with pytest.raises(CoterieError, match="open to other users"):
        http_auth(tmp_path, host="127.0.0.1", token_file=token_file)


async def test_the_middleware_passes_the_lifespan_and_checks_every_request() -> None:
    seen: list[str] = []

    async def app(scope: Any, _receive: Any, _send: Any) -> None:
        seen.append(scope["type"])

    sent: list[dict[str, Any]] = []

    async def send(message: Any) -> None:
        sent.append(message)

    async def receive() -> Any:
        return {"type": "http.request"}

    gate = BearerAuth(app, "the-token-0123456789")
    await gate({"type": "lifespan"}, receive, send)
    ok_headers = [(b"authorization", b"BEARER  the-token-0123456789 ")]
    await gate({"type": "http", "headers": ok_headers}, receive, send)
    assert seen == ["lifespan", "http"] and sent == []
    await gate(
        {"type": "http", "headers": [(b"authorization", b"Bearer the-token")]}, receive, send
    )
    assert seen == ["lifespan", "http"] and sent[0]["status"] == 401
