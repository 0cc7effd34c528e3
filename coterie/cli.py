"""The ``coterie`` command line."""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from collections.abc import Sequence
from typing import Any

from rich.console import Console
from rich.table import Table

from coterie import eval_cli
from runtime.config import install_personas, load_persona_dir, persona_names, resolve_home
from runtime.errors import CoterieError, PersonaConfigError

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


def cmd_personas(args: argparse.Namespace) -> int:
    home = resolve_home(args.home)
    names = persona_names(home)
    if not names:
        console.print(f"No personas in {home / 'personas'} — run `coterie demo` to install some.")
        return 0
    rows: list[tuple[str, ...]] = []
    for name in names:
        try:
            p = load_persona_dir(home / "personas" / name, name)
            model = p.config.model
            rows.append((name, model.provider, model.name, p.config.description))
        except PersonaConfigError as exc:
            rows.append((name, "invalid", "", str(exc).splitlines()[1].strip()))
    print_table(["persona", "provider", "model", "description"], rows, title=f"personas in {home}")
    return 0


def cmd_ask(args: argparse.Namespace) -> int:
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


def cmd_chat(args: argparse.Namespace) -> int:
    rt = _start(args)
    conversation = args.conversation or f"{args.persona}:cli"
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
            reply = rt.ask(args.persona, text, conversation_id=conversation)
            if reply.status == "error":
                err_console.print(
                    f"error: {reply.error}", style="red", markup=False, highlight=False
                )
            else:
                console.print(f"[bold]{args.persona}>[/bold] ", end="")
                console.print(reply.text, markup=False, highlight=False)
    finally:
        rt.shutdown()
    return 0


def cmd_audit(args: argparse.Namespace) -> int:
    from runtime.audit import read_only_query

    address = args.address or os.environ.get("RAY_ADDRESS")
    if address:
        rt = _start(args)
        try:
            result = rt.query(args.sql)
        finally:
            rt.shutdown()
    else:
        result = read_only_query(str(resolve_home(args.home) / "audit.duckdb"), args.sql)
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
    from coterie.demo import BUNDLED_PERSONAS, run_demo

    home = resolve_home(args.home)
    installed = install_personas(home, BUNDLED_PERSONAS)
    if installed:
        console.print(f"Installed demo personas into {home / 'personas'}: {', '.join(installed)}")
    rt = _start(args)
    try:
        run_demo(rt, console)
    finally:
        rt.shutdown()
    return 0


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

    eval_cli.add_parser(sub)
    return parser


COMMANDS = {
    "demo": cmd_demo,
    "personas": cmd_personas,
    "ask": cmd_ask,
    "chat": cmd_chat,
    "audit": cmd_audit,
    "eval": eval_cli.cmd_eval,
}


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING)
    try:
        return COMMANDS[args.command](args)
    except CoterieError as exc:
        err_console.print(f"error: {exc}", style="red", markup=False, highlight=False)
        return 1
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
