"""The ``coterie`` command line."""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from coterie import eval_cli, schedules_cli, usage_cli
from coterie.runtime.config import install_personas, load_persona_dir, persona_names, resolve_home
from coterie.runtime.errors import AuditQueryError, CoterieError, PersonaConfigError
from coterie.runtime.serve.client import ServerClient, ServerError, find_server
from coterie.runtime.serve.discovery import read_state

console = Console()
err_console = Console(stderr=True)


def print_table(columns: Sequence[str], rows: Sequence[Sequence[Any]], *, title: str = "") -> None:
    """Print rows as a rich table."""
    table = Table(title=title or None, show_lines=False)
    for col in columns:
        table.add_column(str(col))
    for row in rows:
        table.add_row(*("" if v is None else str(v) for v in row))
    console.print(table)


def _start(args: argparse.Namespace) -> Any:
    from coterie.api import Runtime  # imports Ray: only for commands that need it

    with console.status("Starting Ray and the runtime actors…"):
        return Runtime.start(home=args.home, address=args.address)


def _server(args: argparse.Namespace) -> ServerClient | None:
    """The running ``coterie serve`` of this home, unless --address names a cluster."""
    if args.address or getattr(args, "no_server", False):
        return None
    return find_server(resolve_home(args.home))


def _print_error(message: str) -> None:
    err_console.print(f"error: {message}", style="red", markup=False, highlight=False)


def _local_plugins(home: Path) -> Any:
    """The plugins a runtime started from here would load, loaded in this
    process (what ``/v1/status`` reports of a running one): persona files
    naming their providers read only once they are."""
    from coterie.runtime.config import load_settings
    from coterie.runtime.plugins import plugin_set
    from coterie.tools import builtin_registry

    described, _, _ = plugin_set(
        home, load_settings(home).plugins, taken=builtin_registry().names()
    )
    return described


def _plugin_column(home: Path, name: str, plugins: Any) -> str:
    """A persona's plugin tools (tool (plugin)) and the tools it misses."""
    from coterie.runtime.plugins.report import tools_of_persona

    try:
        persona = load_persona_dir(home / "personas" / name, name)
    except PersonaConfigError:
        return ""
    found = tools_of_persona(
        persona.config.tools,
        persona.path,
        builtin=plugins.builtin_tools,
        plugin_tools=plugins.tool_plugins,
        problems=plugins.problems,
    )
    parts = [f"{tool} ({plugin})" for tool, plugin in found.plugin_tools.items()]
    parts += [f"missing: {tool}" for tool in found.missing]
    return ", ".join(parts)


def _print_plugin_problems(plugins: Any) -> None:
    for problem in plugins.problems:
        err_console.print(
            f"plugin problem: {problem}", style="yellow", markup=False, highlight=False
        )


def cmd_personas(args: argparse.Namespace) -> int:
    from coterie.runtime.plugins import PluginSet

    home = resolve_home(args.home)
    server = _server(args)
    if server is not None:
        listed: list[dict[str, Any]] = []
        while True:
            page = server.get(f"/v1/personas?offset={len(listed)}")
            listed += page["personas"]
            if not page["personas"] or len(listed) >= page["total"]:
                break
        status = server.get("/v1/status")
        plugins = PluginSet.model_validate(status.get("plugins", {}))
        print_table(
            ["persona", "active", "description", "plugin tools"],
            [
                (
                    p["name"],
                    "yes" if p["active"] else "",
                    p["description"],
                    _plugin_column(home, p["name"], plugins),
                )
                for p in listed
            ],
            title=f"personas in {home} (served at {server.state.url})",
        )
        _print_plugin_problems(plugins)
        _print_memory_line(status.get("memory", {}))
        return 0
    names = persona_names(home)
    if not names:
        console.print(f"No personas in {home / 'personas'} — run `coterie demo` to install some.")
        _print_memory_line(_local_memory_status(home))
        return 0
    plugins = _local_plugins(home)
    rows: list[tuple[str, ...]] = []
    for name in names:
        try:
            p = load_persona_dir(home / "personas" / name, name)
            model = p.config.model
            rows.append(
                (
                    name,
                    model.provider,
                    model.name,
                    p.config.description,
                    _plugin_column(home, name, plugins),
                )
            )
        except PersonaConfigError as exc:
            rows.append((name, "invalid", "", str(exc).splitlines()[1].strip(), ""))
    print_table(
        ["persona", "provider", "model", "description", "plugin tools"],
        rows,
        title=f"personas in {home}",
    )
    _print_plugin_problems(plugins)
    _print_memory_line(_local_memory_status(home))
    return 0


def _local_memory_status(home: Path) -> dict[str, Any]:
    """The embedder a runtime started from here would give the memory store
    (what ``/v1/status`` reports of a running one), decided in this process."""
    from coterie.runtime.config import load_settings
    from coterie.runtime.memory.choice import choose_embedder

    try:
        settings = load_settings(home).memory
        uri = settings.uri or str(home / "memory")
        recorded = None
        if "://" in uri or Path(uri).exists():  # only an existing store has an embedder
            from coterie.runtime.memory.server import recorded_embedder

            recorded = recorded_embedder(uri, storage_options=settings.storage_options or None)
        choice = choose_embedder(settings, recorded=recorded)
    except CoterieError as exc:  # e.g. minilm asked for but not installed
        return {"embedder": None, "error": str(exc)}
    return {"embedder": choice.model_dump(), "description": choice.describe()}


def _print_memory_line(memory: dict[str, Any]) -> None:
    if memory.get("error"):
        err_console.print(f"memory: {memory['error']}", style="red", markup=False, highlight=False)
    elif memory.get("description"):
        console.print(f"memory: {memory['description']}", markup=False, highlight=False)


def _ask_server(server: ServerClient, persona: str, text: str, conversation: str | None) -> Any:
    from coterie.runtime.messages import ReplyEnvelope

    body: dict[str, Any] = {"text": text}
    if conversation:
        body["conversation_id"] = conversation
    data = server.post(f"/v1/personas/{persona}/messages", body)
    return ReplyEnvelope.model_validate(data["reply"])


def cmd_ask(args: argparse.Namespace) -> int:
    server = _server(args)
    if server is not None:
        reply = _ask_server(server, args.persona, args.text, args.conversation)
    else:
        rt = _start(args)
        try:
            reply = rt.ask(args.persona, args.text, conversation_id=args.conversation)
        finally:
            rt.shutdown()
    if reply.status == "error":
        err_console.print(f"error: {reply.error}", style="red", markup=False, highlight=False)
        return 1
    console.print(reply.text, markup=False, highlight=False)
    return 0 if reply.status != "failed" else 1


#: What a person may type at an approval prompt, and the answer it gives.
_ANSWERS = {"y": "approve", "yes": "approve", "n": "deny", "no": "deny", "a": "always"}


def _ask_approval(data: dict[str, Any]) -> str:
    """Prompt for an approval inline; the answer (``deny`` at end of input)."""
    console.print(
        f"\n  [yellow]⚠ {data['tool']} needs your approval:[/yellow] ",
        end="",
    )
    console.print(data["summary"], markup=False, highlight=False)
    if data.get("rule"):
        console.print(f"    ({data['rule']})", markup=False, highlight=False, style="dim")
    while True:
        try:
            typed = console.input(r"  approve? \[y]es / \[n]o / \[a]lways: ").strip().lower()
        except EOFError:
            return "deny"
        answer = _ANSWERS.get(typed)
        if answer is not None:
            return answer
        console.print("  type y, n or a", style="dim")


def _chat_server(server: ServerClient, args: argparse.Namespace, conversation: str) -> int:
    """Chat through the server: the reply streams in, tool calls show as they
    run, and what the persona sends to this session (``cli``) is printed."""
    import secrets

    session = f"cli-{secrets.token_hex(6)}"
    choices: list[str] = []
    console.print(
        f"Chatting with {args.persona} through {server.state.url} (conversation "
        f"{conversation}); Ctrl-D to quit."
    )
    while True:
        try:
            text = console.input("[bold]you>[/bold] ")
        except EOFError:
            console.print()
            return 0
        if not text.strip():
            continue
        if text.strip().isdigit() and 0 < int(text) <= len(choices):
            text = choices[int(text) - 1]  # a numbered choice of the last question
        choices = []
        body = {
            "text": text,
            "conversation_id": conversation,
            "session": session,
            "connector": "cli",
            "stream": True,
        }
        console.print(f"[bold]{args.persona}>[/bold] ", end="")
        streamed = False
        for event, data in server.stream(f"/v1/personas/{args.persona}/messages", body):
            if event == "text_delta":
                streamed = True
                console.print(data["text"], end="", markup=False, highlight=False)
            elif event == "tool_call":
                console.print(f"\n  [dim]⚙ {data['tool']}…[/dim]", end="")
            elif event == "tool_result":
                mark = "✗ " + data["error_kind"] if data.get("error_kind") else "✓"
                console.print(f" [dim]{mark} ({data['duration_ms']:.0f} ms)[/dim]")
            elif event == "approval" and data["phase"] == "requested":
                answer = _ask_approval(data)
                path = f"/v1/approvals/{data['approval_id']}"
                try:
                    server.post(path, {"decision": answer, "via": "cli", "by": _person()})
                except ServerError as exc:  # answered elsewhere meanwhile, or expired
                    _print_error(str(exc))
            elif event == "reply":
                if data["status"] == "error":
                    _print_error(str(data["error"]))
                elif not streamed:  # a model that does not stream, or a question
                    console.print(data["text"], markup=False, highlight=False)
                question = data.get("question")
                if question and question.get("buttons"):
                    choices = list(question["buttons"])
                    for i, label in enumerate(choices, 1):
                        console.print(f"  {i}. {label}", markup=False, highlight=False)
            elif event == "error":
                _print_error(str(data["error"]["message"]))
        console.print()
        for message in server.get(f"/v1/connectors/cli/messages?destination={session}")["messages"]:
            console.print(f"[bold]{message['persona']} (message)>[/bold] {message['text']}")


def _local_turn(rt: Any, persona: str, text: str, conversation: str) -> Any:
    """One turn on this process's runtime: its reply, after asking this
    terminal about every approval the turn needs."""
    reply = None
    for item in rt.stream(rt.envelope(persona, text, conversation_id=conversation)):
        if item.kind == "approval" and item.phase == "requested":
            answer = _ask_approval(item.model_dump(mode="json"))
            try:
                rt.decide_approval(item.approval_id, answer, by=_person(), via="cli")
            except CoterieError as exc:  # answered elsewhere meanwhile, or expired
                _print_error(str(exc))
        elif item.kind == "reply":
            reply = item
    return reply


def _person() -> str:
    """Who answers at this terminal (the audit log's ``decided_by``)."""
    import getpass

    try:
        return getpass.getuser()
    except (KeyError, OSError):
        return "cli"


def cmd_chat(args: argparse.Namespace) -> int:
    conversation = args.conversation or f"{args.persona}:cli"
    server = _server(args)
    if server is not None:
        return _chat_server(server, args, conversation)
    rt = _start(args)
    console.print(f"Chatting with {args.persona} (conversation {conversation}); Ctrl-D to quit.")
    try:
        while True:
            try:
                text = console.input("[bold]you>[/bold] ")
            except EOFError:
                console.print()
                break
            if not text.strip():
                continue
            reply = _local_turn(rt, args.persona, text, conversation)
            if reply is None or reply.status == "error":
                error = reply.error if reply is not None else "no reply"
                err_console.print(f"error: {error}", style="red", markup=False, highlight=False)
            else:
                console.print(f"[bold]{args.persona}>[/bold] ", end="")
                console.print(reply.text, markup=False, highlight=False)
    finally:
        rt.shutdown()
    return 0


def cmd_audit(args: argparse.Namespace) -> int:
    from coterie.runtime.audit import read_only_query

    address = args.address or os.environ.get("RAY_ADDRESS")
    server = _server(args)
    if server is not None:
        from coterie.runtime.audit import QueryResult

        data = server.post("/v1/audit/query", {"sql": args.sql})
        result = QueryResult(columns=data["columns"], rows=[tuple(r) for r in data["rows"]])
    elif address:
        rt = _start(args)
        try:
            result = rt.query(args.sql)
        finally:
            rt.shutdown()
    else:
        home = resolve_home(args.home)
        try:
            result = read_only_query(str(home / "audit.duckdb"), args.sql)
        except AuditQueryError as exc:
            from coterie.holder import home_in_use, is_lock_conflict

            if is_lock_conflict(exc):  # a runtime holds the file: say which
                raise home_in_use(home, exc) from None
            raise
    if args.json:
        print(
            json.dumps(
                [dict(zip(result.columns, r, strict=True)) for r in result.rows], default=str
            )
        )
    else:
        print_table(result.columns, result.rows)
    return 0


def cmd_demo(args: argparse.Namespace) -> int:
    from coterie.api import Runtime  # imports Ray
    from coterie.demo import BUNDLED_PERSONAS, demo_settings, run_demo

    home = resolve_home(args.home)
    installed = install_personas(home, BUNDLED_PERSONAS)
    if installed:
        console.print(f"Installed demo personas into {home / 'personas'}: {', '.join(installed)}")
    with console.status("Starting Ray and the runtime actors…"):
        rt = Runtime.start(home=args.home, address=args.address, settings=demo_settings(home))
    try:
        run_demo(rt, console)
    finally:
        rt.shutdown()
    return 0


def cmd_serve(args: argparse.Namespace) -> int:
    from coterie.serve import run_serve

    home = resolve_home(args.home)
    running = find_server(home)
    if running is not None:
        _print_error(f"coterie serve already runs for {home} at {running.state.url}")
        return 1
    return run_serve(
        args.home,
        host=args.host,
        port=args.port,
        address=args.address,
        token_file=args.token_file,
    )


def cmd_mcp_serve(args: argparse.Namespace) -> int:
    if args.host is not None and args.http is None:
        _print_error("--host needs --http PORT (stdio binds nothing)")
        return 2
    if args.http is not None and not 0 <= args.http <= 65535:
        _print_error(f"--http {args.http}: a port is 0-65535 (0: any free one)")
        return 2
    from coterie.mcp_serve import run_mcp_serve  # imports the MCP SDK

    return run_mcp_serve(
        resolve_home(args.home),
        address=args.address,
        http_port=args.http,
        host=args.host or "127.0.0.1",
        allow_recall=args.allow_recall,
        token_file=args.token_file,
        no_auth=args.no_auth,
    )


def cmd_status(args: argparse.Namespace) -> int:
    home = resolve_home(args.home)
    left = read_state(home)
    server = find_server(home)  # removes a state file a dead server left
    if server is None:
        note = ""
        if left is not None:
            gone = read_state(home) is None
            note = " (a stale serve.json was left by a server that died" + (
                "; removed)" if gone else ")"
            )
        console.print(f"No coterie serve runs for {home}{note}. Start one: coterie serve")
        return 1
    if args.page_url:
        print(server.state.page_url())
        return 0
    data = server.get("/v1/status")
    if args.json:
        print(json.dumps(data, indent=2, default=str))
        return 0
    personas, audit = data["personas"], data["audit"]
    console.print(
        f"coterie serve at {server.state.url} (pid {server.state.pid}), up "
        f"{data['server']['uptime_s']:.0f} s; Ray {data['ray']['address']}, "
        f"{data['ray']['nodes']} node(s)"
    )
    starting, waiting = personas["activating"], personas["waiting_to_start"]
    console.print(
        f"personas: {personas['registered']} registered, {len(personas['active'])} active"
        + (
            f", not answering: {', '.join(personas['unresponsive'])}"
            if personas["unresponsive"]
            else ""
        )
        + (
            f", starting: {len(starting)} ({len(waiting)} waiting their turn, "
            f"{personas['start_limit'] or 'any number'} at a time)"
            if starting
            else ""
        )
    )
    print_table(
        [
            "persona",
            "conversations",
            "turns running",
            "queued",
            "delegations",
            "waiting approval",
            "turns run",
        ],
        [
            (
                p["name"],
                p["conversations"],
                p["turns_running"],
                p["queued"],
                p["delegations_running"],
                p.get("waiting_approval", 0),
                p["turns_run"],
            )
            for p in personas["active"]
        ],
    )
    console.print(
        f"audit: {audit['rows_written']} rows written, {audit['pending']} pending, "
        f"{audit['write_errors']} write errors"
        + (f" (last: {audit['last_error']})" if audit["last_error"] else "")
    )
    connectors = ", ".join(c["id"] for c in data["connectors"]) or "none"
    console.print(f"connectors: {connectors}; waiting to send: {data['outbound_waiting']}")
    _print_memory_line(data.get("memory", {}))
    _print_scheduler_line(data.get("scheduler", {}))
    return 0


def _print_scheduler_line(scheduler: dict[str, Any]) -> None:
    if scheduler.get("error"):
        err_console.print(
            f"scheduler: {scheduler['error']}", style="red", markup=False, highlight=False
        )
        return
    if not scheduler:
        return
    outcomes = ", ".join(f"{k} {v}" for k, v in sorted(scheduler["outcomes"].items())) or "none"
    broken = scheduler["file_errors"]
    console.print(
        f"scheduler: {scheduler['entries']} entries, {scheduler['reminders']} reminders, "
        f"next wake {scheduler['next_wake'] or 'none'}; since start: {outcomes}"
        + (f"; {broken} schedule file(s) do not load" if broken else "")
        + " (coterie schedules for each)",
        markup=False,
        highlight=False,
    )


def cmd_stop(args: argparse.Namespace) -> int:
    from coterie.holder import read_holder

    home = resolve_home(args.home)
    server = find_server(home)
    if server is not None:
        _print_error(
            f"coterie serve runs for {home} at {server.state.url} (pid {server.state.pid}): "
            "stop that (Ctrl-C or SIGTERM); its runtime stops with it"
        )
        return 1
    holder = read_holder(home)
    address = args.address or os.environ.get("RAY_ADDRESS") or None
    if address is None and holder is not None and holder.detached:
        address = holder.address
    if address is None:
        why = (
            f"its runtime was started by process {holder.pid} on its own Ray, and stops "
            "when that command ends"
            if holder is not None
            else "no runtime of it is recorded as left running on a Ray cluster"
        )
        _print_error(
            f"nothing to stop for {home}: {why}; name a cluster: coterie stop --address ADDRESS"
        )
        return 1
    from coterie.stop import stop_runtime  # imports Ray

    with console.status(f"Stopping the runtime of {home} on the Ray cluster at {address}…"):
        stopped = stop_runtime(home, address)
    if not stopped.found:
        _print_error(f"no runtime of {home} runs on the Ray cluster at {stopped.address}")
        return 1
    unwritten = (
        f"; {stopped.audit_pending} audit rows could not be written"
        if stopped.audit_pending
        else ""
    )
    console.print(
        f"Stopped the runtime of {home} on the Ray cluster at {stopped.address}: "
        f"{stopped.personas} persona actor(s), the audit log flushed and closed{unwritten}.",
        markup=False,
        highlight=False,
    )
    return 0 if not stopped.audit_pending else 1


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="coterie", description=__doc__)
    parser.add_argument("--home", help="runtime home (default $COTERIE_HOME or ~/.coterie)")
    parser.add_argument("--address", help="join this Ray cluster (default $RAY_ADDRESS)")
    parser.add_argument("-v", "--verbose", action="store_true", help="log to stderr")
    sub = parser.add_subparsers(dest="command", required=True)

    sub.add_parser("demo", help="run the bundled personas through a scripted scenario")
    sub.add_parser("personas", help="list the personas in the home")

    p = sub.add_parser("ask", help="ask a persona one question and print the reply")
    p.add_argument("persona")
    p.add_argument("text")
    p.add_argument("--conversation", help="conversation id (default <persona>:api)")

    p = sub.add_parser("chat", help="talk to a persona interactively")
    p.add_argument("persona")
    p.add_argument("--conversation", help="conversation id (default <persona>:cli)")

    p = sub.add_parser("audit", help="run a read-only SQL query on the audit store")
    p.add_argument("sql")
    p.add_argument("--json", action="store_true", help="print rows as JSON")

    p = sub.add_parser("serve", help="keep the runtime up behind the HTTP API and chat page")
    p.add_argument("--host", help="address to bind (default serve.host, 127.0.0.1)")
    p.add_argument("--port", type=int, help="port (default serve.port, 8765; 0: any free)")
    p.add_argument(
        "--token-file",
        metavar="PATH",
        help="the bearer token, read from PATH (mode 0600); default $COTERIE_SERVE_TOKEN "
        "(serve.token_env), else the one kept in <home>/serve.token (made at the first start)",
    )

    p = sub.add_parser(
        "mcp-serve",
        help="serve the personas to editors and agents over MCP (stdio by default)",
        description="Serve the personas over the Model Context Protocol: through the running "
        "coterie serve of the home if there is one, else with a runtime of its own.",
    )
    mode = p.add_mutually_exclusive_group()
    mode.add_argument("--stdio", action="store_true", help="MCP on stdin/stdout (the default)")
    mode.add_argument(
        "--http",
        type=int,
        metavar="PORT",
        help="MCP over streamable HTTP on PORT, path /mcp (0: any free port)",
    )
    p.add_argument("--host", help="address --http binds (default 127.0.0.1)")
    auth = p.add_mutually_exclusive_group()
    auth.add_argument(
        "--token-file",
        metavar="PATH",
        help="--http's bearer token, read from PATH (mode 0600); default $COTERIE_MCP_TOKEN, "
        "else the one kept in <home>/mcp-serve.token (made at the first start)",
    )
    auth.add_argument(
        "--no-auth",
        action="store_true",
        help="--http without a token: only on a loopback --host (127.0.0.1, ::1, localhost)",
    )
    p.add_argument(
        "--allow-recall",
        action="store_true",
        help="offer the recall tool too (it reads the personas' long-term memories)",
    )
    # Also after the subcommand, where an editor's "args" list puts them.
    p.add_argument(
        "--home",
        default=argparse.SUPPRESS,
        help="runtime home (default $COTERIE_HOME or ~/.coterie)",
    )
    p.add_argument(
        "--address",
        default=argparse.SUPPRESS,
        help="join this Ray cluster rather than go through a running coterie serve",
    )

    p = sub.add_parser("status", help="what a running coterie serve runs")
    p.add_argument("--json", action="store_true", help="print the whole status as JSON")
    p.add_argument(
        "--page-url", action="store_true", help="print the chat page's address with its token"
    )

    p = sub.add_parser(
        "stop",
        help="stop this home's runtime left running on a Ray cluster",
        description="Stop the runtime of the home that a command joined to a Ray cluster "
        "(--address) left running there: the personas stop, the audit log is flushed and "
        "lets go of the home. Without --address: $RAY_ADDRESS, else the cluster the home's "
        "record names.",
    )
    p.add_argument(
        "--address",
        default=argparse.SUPPRESS,
        help="the Ray cluster it runs on (default $RAY_ADDRESS, else the recorded one)",
    )
    p.add_argument(
        "--home",
        default=argparse.SUPPRESS,
        help="runtime home (default $COTERIE_HOME or ~/.coterie)",
    )

    eval_cli.add_parser(sub)
    schedules_cli.add_parser(sub)
    usage_cli.add_parser(sub)
    return parser


COMMANDS = {
    "demo": cmd_demo,
    "personas": cmd_personas,
    "ask": cmd_ask,
    "chat": cmd_chat,
    "audit": cmd_audit,
    "eval": eval_cli.cmd_eval,
    "schedules": schedules_cli.cmd_schedules,
    "usage": usage_cli.cmd_usage,
    "serve": cmd_serve,
    "mcp-serve": cmd_mcp_serve,
    "status": cmd_status,
    "stop": cmd_stop,
}


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING)
    try:
        return COMMANDS[args.command](args)
    except ServerError as exc:  # before its base, CoterieError: the status says more
        _print_error(f"coterie serve answered {exc.status} ({exc.kind}): {exc}")
        return 1
    except CoterieError as exc:
        _print_error(str(exc))
        return 1
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
