"""``coterie usage [--since] [--by persona|model|day|context] [--json]``: what
the model calls of the audit log consumed and cost (see
:mod:`coterie.runtime.usage.report`).

Through the running ``coterie serve`` of the home when there is one
(``GET /v1/usage``); with ``--address`` (or ``$RAY_ADDRESS``), through a
runtime joined to that cluster; else from the audit log opened read-only (no
Ray started). A log another process holds is the held-home message, as for
``coterie audit``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

from rich.console import Console
from rich.table import Table

from coterie.runtime.audit import QueryResult, read_only_query
from coterie.runtime.config import resolve_home
from coterie.runtime.errors import AuditQueryError
from coterie.runtime.serve.client import find_server
from coterie.runtime.usage.report import (
    SINCE_HELP,
    USAGE_GROUPINGS,
    UsageQuery,
    UsageReport,
    UsageRow,
    usage_query,
)

console = Console(width=None if sys.stdout.isatty() else 160)
err_console = Console(stderr=True)

#: How the footnote marks a cost that leaves out calls without a price.
UNPRICED_MARK = "?"


def add_parser(sub: Any) -> None:
    p = sub.add_parser(
        "usage",
        help="tokens, cache hits and cost of the model calls, by persona, model, day or context",
        description="Sum the model calls of the audit log: calls, input (cached included), "
        "output, cache-read and cache-write tokens, cache hit rate and cost in US dollars. "
        "--by persona groups by the persona that pays (the start of an ask_persona chain, a "
        "subagent's parent). Calls of models without a price are counted apart and flagged, "
        "never as 0. Through the running coterie serve if there is one, else from the audit "
        "log.",
    )
    p.add_argument("--since", help=f"only calls since then: {SINCE_HELP} (default: all)")
    p.add_argument(
        "--by",
        default="persona",
        help=f"group by {', '.join(USAGE_GROUPINGS)} (default persona; day: in the "
        "runtime's zone, $COTERIE_TIMEZONE)",
    )
    p.add_argument("--json", action="store_true", help="print the report as JSON")


def read(args: argparse.Namespace, spec: UsageQuery) -> tuple[UsageReport, str]:
    """The report, and where it came from (a home without an audit log yet
    has an empty one)."""
    home = resolve_home(args.home)
    address = args.address or os.environ.get("RAY_ADDRESS")
    if not args.address:
        server = find_server(home)
        if server is not None:
            query = {k: v for k, v in (("since", args.since), ("by", args.by)) if v}
            data = server.get("/v1/usage" + (f"?{urlencode(query)}" if query else ""))
            return UsageReport.model_validate(data), f"served at {server.state.url}"
    if address:
        from coterie.api import Runtime  # imports Ray

        with console.status("Joining the cluster…"):
            rt = Runtime.start(home=args.home, address=address)
        try:
            return spec.report(rt.query(spec.sql())), f"runtime on {rt.address}"
        finally:
            rt.shutdown()
    path = home / "audit.duckdb"
    if not path.exists():
        return spec.report(QueryResult(columns=[])), f"no audit log at {path} yet"
    return _read_file(home, path, spec), "no runtime running: read from the audit log"


def _read_file(home: Path, path: Path, spec: UsageQuery) -> UsageReport:
    try:
        return spec.report(read_only_query(path, spec.sql()))
    except AuditQueryError as exc:
        from coterie.holder import home_in_use, is_lock_conflict

        if is_lock_conflict(exc):  # a runtime holds the file: say which, and what to do
            raise home_in_use(home, exc) from None
        raise


def cost_cell(row: UsageRow) -> str:
    """``$1.2345``; with calls of unpriced models ``$1.2345 + ?`` (only
    those: ``?``): their cost is unknown, not 0."""
    if row.unpriced_calls == 0:
        return f"${row.cost_usd:.4f}"
    if row.unpriced_calls == row.calls:
        return UNPRICED_MARK
    return f"${row.cost_usd:.4f} + {UNPRICED_MARK}"


def _rate(row: UsageRow) -> str:
    return "" if row.cache_hit_rate is None else f"{row.cache_hit_rate:.1%}"


COLUMNS = (
    "calls",
    "input tokens",
    "output tokens",
    "cache read",
    "cache write",
    "cache hit",
    "cost (USD)",
    "unpriced calls",
)


def cells(row: UsageRow) -> tuple[str, ...]:
    """A row as the table shows it: the key, then :data:`COLUMNS`."""
    return (
        row.key,
        f"{row.calls:,}",
        f"{row.input_tokens:,}",
        f"{row.output_tokens:,}",
        f"{row.cache_read_tokens:,}",
        f"{row.cache_write_tokens:,}",
        _rate(row),
        cost_cell(row),
        f"{row.unpriced_calls:,}" if row.unpriced_calls else "",
    )


def _table(title: str, key: str, rows: list[UsageRow], total: UsageRow | None) -> Table:
    table = Table(title=title, title_justify="left")
    table.add_column(key)
    for column in COLUMNS:
        table.add_column(column, justify="right")
    for row in rows:
        table.add_row(*cells(row), end_section=total is not None and row is rows[-1])
    if total is not None:
        table.add_row(*cells(total), style="bold")
    return table


def footnote(report: UsageReport) -> str:
    """What the ``?`` means: the models without a price, and where to give one."""
    named = ", ".join(f"{m.provider}/{m.model} ({m.calls:,})" for m in report.unpriced_models)
    return (
        f"{UNPRICED_MARK}: {report.total.unpriced_calls:,} call(s) of models without a price, "
        f"not in the costs: {named}. Give them one under prices: in runtime.yaml."
    )


def since_text(report: UsageReport) -> str:
    if report.since is None:
        return "all time"
    return f"since {report.since.strftime('%Y-%m-%d %H:%M')} UTC"


def cmd_usage(args: argparse.Namespace) -> int:
    try:
        spec = usage_query(since=args.since, by=args.by, names=("--since", "--by"))
    except AuditQueryError as exc:
        err_console.print(f"error: {exc}", style="red", markup=False, highlight=False)
        return 2
    report, where = read(args, spec)
    if args.json:
        print(json.dumps(report.model_dump(mode="json"), indent=2))
        return 0
    home = resolve_home(args.home)
    key = "billed to" if report.by == "persona" else report.by
    title = f"usage by {report.by}: {report.group_label}"
    if report.by == "day":
        title += f" ({report.timezone})"
    title += f"; {since_text(report)}; {home}, {where}"
    if not report.rows:
        console.print(
            f"No model calls ({since_text(report)}; {where}).", markup=False, highlight=False
        )
        return 0
    console.print(_table(title, key, report.rows, report.total))
    if report.by_caller:
        console.print(
            _table(
                "each calling persona's own calls (its cache hit rate, whoever pays)",
                "persona",
                report.by_caller,
                None,
            )
        )
    if report.unpriced_models:
        console.print(footnote(report), style="yellow", markup=False, highlight=False)
    return 0


__all__ = ["add_parser", "cells", "cmd_usage", "cost_cell", "footnote", "read"]
