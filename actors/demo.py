"""``coterie demo``: the bundled personas through one scripted scenario.

Three personas answer at the same time on their own actors: one makes two
tool calls in one reply (they run concurrently), one sends malformed
arguments and recovers from the error result, one closes its turn with
``end_task``. Then the transcripts and an audit summary are printed.
"""

from __future__ import annotations

import asyncio
import json

import ray
from rich.console import Console
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from actors.api import Runtime
from runtime.errors import CoterieError
from runtime.messages import (
    AssistantMessage,
    ChatMessage,
    ReplyEnvelope,
    ToolResultMessage,
    UserMessage,
    new_id,
)

SCENARIO = [
    ("concierge", "What time is it right now?"),
    ("researcher", "Double-check the current time for me, please."),
    ("planner", "Please plan the product launch."),
]


def _args(arguments: dict[str, object] | str) -> str:
    return json.dumps(arguments) if isinstance(arguments, dict) else arguments


def render_transcript(persona: str, history: list[ChatMessage]) -> Text:
    """A readable transcript: messages, tool calls and their results."""
    out = Text()
    for message in history:
        if isinstance(message, UserMessage):
            out.append(f"{message.source} → {persona}: ", style="bold cyan")
            out.append(message.text + "\n")
        elif isinstance(message, AssistantMessage):
            if message.tool_calls:
                calls = ", ".join(f"{c.name}({_args(c.arguments)})" for c in message.tool_calls)
                label = "concurrent tool calls" if len(message.tool_calls) > 1 else "tool call"
                out.append(f"{persona} {label}: ", style="bold yellow")
                out.append(calls + "\n")
            if message.text:
                out.append(f"{persona}: ", style="bold green")
                out.append(message.text + "\n")
        elif isinstance(message, ToolResultMessage):
            style = "red" if message.error_kind else "dim"
            tag = f" [{message.error_kind}]" if message.error_kind else ""
            out.append(f"  ← {message.name}{tag}: ", style=style)
            out.append(message.content.replace("\n", "\n    ") + "\n", style=style)
    return out


async def _ask_all(rt: Runtime, run_id: str) -> list[ReplyEnvelope]:
    return await asyncio.gather(
        *(
            rt.ask_async(persona, text, conversation_id=f"demo:{run_id}:{persona}")
            for persona, text in SCENARIO
        )
    )


def run_demo(rt: Runtime, console: Console) -> list[ReplyEnvelope]:
    """Run the scenario on ``rt`` and print transcripts and the audit summary."""
    run_id = new_id()
    with console.status("Three personas answering concurrently…"):
        replies = asyncio.run(_ask_all(rt, run_id))
    rt.flush()
    for (persona, _), reply in zip(SCENARIO, replies, strict=True):
        history: list[ChatMessage] = ray.get(
            rt.audit.history.remote(persona, reply.conversation_id)
        )
        title = (
            f"{persona} · {reply.conversation_id} · status {reply.status} · "
            f"{reply.steps} model calls"
        )
        console.print(Panel(render_transcript(persona, history), title=title, expand=False))
    summary = rt.query(
        "select persona, "
        "count(*) filter (where kind = 'model_call') as model_calls, "
        "count(*) filter (where kind = 'tool_call') as tool_calls, "
        "count(*) filter (where kind = 'tool_result' and error_kind is not null) as tool_errors, "
        "sum(input_tokens) as input_tokens, sum(output_tokens) as output_tokens, "
        "round(max(duration_ms) filter (where kind = 'turn_ended'), 1) as turn_ms, "
        "count(*) as events "
        f"from events where conversation_id like 'demo:{run_id}:%' "
        "group by persona order by persona"
    )
    table = Table(title="audit summary (this run)")
    for col in summary.columns:
        table.add_column(col)
    for row in summary.rows:
        table.add_row(*(str(v) for v in row))
    console.print(table)
    console.print(
        'Ask your own questions: `coterie ask concierge "what time is it?"`; '
        'query the audit log: `coterie audit "select kind, count(*) from events group by 1"`.'
    )
    failed = [r for r in replies if r.status == "error"]
    if failed:
        raise CoterieError(f"demo turns failed: {[r.error for r in failed]}")
    return replies


__all__ = ["SCENARIO", "render_transcript", "run_demo"]
