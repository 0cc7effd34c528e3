"""``coterie demo``: the bundled personas through one scripted scenario.

Act 1: three personas answer at the same time on their own actors: one makes
two tool calls in one reply (they run concurrently), one sends malformed
arguments and recovers from the error result, one closes its turn with
``end_task``. Act 2: a coordinator asks two specialists at once with
``ask_persona`` and combines their answers. Act 3: the coordinator spawns
two subagents in one message (``spawn_subagent``, each on its own actor with
only the clock); its turn ends at once, and both reports come back in one
grouped wake, which it answers. Then the transcripts and an audit summary
are printed.
"""

from __future__ import annotations

import asyncio
import json
import time
from importlib import resources
from pathlib import Path

from rich.console import Console
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from coterie.api import Runtime
from coterie.runtime.errors import CoterieError
from coterie.runtime.messages import (
    AssistantMessage,
    ChatMessage,
    ReplyEnvelope,
    ToolResultMessage,
    UserMessage,
    inbox_id,
    new_id,
)

#: The demo's personas, shipped inside the package (``configs/personas`` in
#: the repository).
BUNDLED_PERSONAS = Path(str(resources.files("coterie.configs") / "personas"))

DELEGATION = "Coordinate the product launch, please."
SUBAGENTS = "Split the research between two subagents, please."
SCENARIO = [
    ("concierge", "What time is it right now?"),
    ("researcher", "Double-check the current time for me, please."),
    ("planner", "Please plan the product launch."),
]
#: Every persona the demo talks to: the three of act 1, and the coordinator.
DEMO_PERSONAS = (*(persona for persona, _ in SCENARIO), "coordinator")


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


def _panel(rt: Runtime, persona: str, conversation_id: str, since: float, title: str) -> Panel:
    history = rt.history(persona, conversation_id)
    recent = [m for m in history if m.ts >= since]
    return Panel(render_transcript(persona, recent), title=title, expand=False)


def run_demo(rt: Runtime, console: Console) -> list[ReplyEnvelope]:
    """Run the scenario on ``rt`` and print transcripts and the audit summary."""
    run_id = new_id()
    started = time.time()
    console.rule("Act 1 · three personas answer at the same time")
    with console.status("Three personas answering concurrently…"):
        replies = asyncio.run(_ask_all(rt, run_id))
    rt.flush()
    for (persona, _), reply in zip(SCENARIO, replies, strict=True):
        title = (
            f"{persona} · {reply.conversation_id} · status {reply.status} · "
            f"{reply.steps} model calls"
        )
        console.print(_panel(rt, persona, reply.conversation_id, started, title))

    console.rule("Act 2 · a coordinator asks two specialists concurrently")
    act2 = time.time()
    with console.status("coordinator → researcher + planner…"):
        delegated = rt.ask("coordinator", DELEGATION, conversation_id=f"demo:{run_id}:coordinator")
    rt.flush()
    console.print(
        _panel(
            rt,
            "coordinator",
            delegated.conversation_id,
            act2,
            f"coordinator · {delegated.conversation_id} · status {delegated.status}",
        )
    )
    for specialist in ("researcher", "planner"):
        inbox = inbox_id(specialist, "coordinator")
        console.print(_panel(rt, specialist, inbox, act2, f"{specialist} · {inbox}"))
    replies.append(delegated)

    console.rule("Act 3 · the coordinator spawns two subagents; one grouped result")
    act3 = time.time()
    conversation = f"demo:{run_id}:subagents"
    with console.status("coordinator → two subagents…"):
        spawned = rt.ask("coordinator", SUBAGENTS, conversation_id=conversation)
        # The turn ended on the spawns; wait for the wake turn that answers them.
        rt.wait_settled("coordinator", conversation)
    console.print(
        _panel(
            rt,
            "coordinator",
            conversation,
            act3,
            f"coordinator · {conversation} · first turn {spawned.steps} model call, "
            "then the grouped wake",
        )
    )
    history = rt.history("coordinator", conversation)
    handles = [
        json.loads(m.content).get("handle", "")
        for m in history
        if isinstance(m, ToolResultMessage) and m.name == "spawn_subagent"
    ]
    for handle in handles:
        console.print(_panel(rt, "coordinator", handle, act3, f"subagent · {handle}"))
    replies.append(spawned)
    if len(handles) != 2 or not any(
        isinstance(m, UserMessage) and m.source == "delegation" for m in history
    ):
        raise CoterieError("act 3: the two subagents did not report back")

    summary = rt.query(
        "select persona, "
        "count(*) filter (where kind = 'model_call') as model_calls, "
        "count(*) filter (where kind = 'tool_call') as tool_calls, "
        "count(*) filter (where kind = 'tool_result' and error_kind is not null) as tool_errors, "
        "sum(input_tokens) as input_tokens, sum(output_tokens) as output_tokens, "
        "count(*) filter (where kind = 'turn_ended') as turns, "
        "count(*) as events "
        f"from events where ts >= to_timestamp({started:.6f})::timestamp "
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


__all__ = ["BUNDLED_PERSONAS", "DEMO_PERSONAS", "SCENARIO", "render_transcript", "run_demo"]
