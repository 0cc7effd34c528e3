"""``coterie demo``: the bundled personas through one scripted scenario.

Act 1: three personas answer at the same time on their own actors: one makes
two tool calls in one reply (they run concurrently), one sends malformed
arguments and recovers from the error result, one closes its turn with
``end_task``. Act 2: a coordinator asks two specialists at once with
``ask_persona`` and combines their answers. Act 3: the coordinator spawns
two subagents in one message (``spawn_subagent``, each on its own actor with
only the clock); its turn ends at once, and both reports come back in one
grouped wake, which it answers. Act 4: time of its own — the concierge adds
itself a heartbeat every 2 seconds (``remind``), which is skipped before any
model call while its ``HEARTBEAT.md`` holds nothing to do, and sets a
reminder that fires 3 seconds later (its turn is in the audit log; asked
from a chat or the web page it would be delivered there); then it removes
the heartbeat. The demo's runtime takes the home's settings with
``schedule.min_interval`` and ``schedule.reload_interval`` at 1 s (the
home's ``runtime.yaml`` is left as it is). Then the transcripts and an audit
summary are printed.
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
from coterie.runtime.config import RuntimeSettings, load_settings
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
#: Act 4: what the concierge is asked, in order.
HEARTBEAT_ON = "Please add a heartbeat every 2 seconds."
REMIND = "Please remind me to stretch in a few seconds."
HEARTBEAT_OFF = "Please stop the heartbeat."
#: Seconds act 4 waits for its heartbeats and its reminder.
SCHEDULE_WAIT = 60.0


def demo_settings(home: Path) -> RuntimeSettings:
    """The home's runtime settings with the scheduler's shortest interval and
    its look at the files at 1 s (act 4's heartbeat is every 2 s); the
    home's ``runtime.yaml`` is not changed."""
    settings = load_settings(home)
    schedule = settings.schedule.model_copy(
        update={
            "min_interval": min(settings.schedule.min_interval, 1.0),
            "reload_interval": min(settings.schedule.reload_interval, 1.0),
        }
    )
    return settings.model_copy(update={"schedule": schedule})


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


def _schedule_events(rt: Runtime, since: float) -> list[tuple[str, ...]]:
    """The concierge's ``schedule`` events since ``since``: (time, entry kind,
    name, outcome, reason, conversation)."""
    result = rt.query(
        "select strftime(ts, '%H:%M:%S'), payload->>'entry_kind', payload->>'name', status, "
        "coalesce(payload->>'reason', ''), conversation_id from events "
        "where kind = 'schedule' and persona = 'concierge' "
        f"and ts >= to_timestamp({since:.6f})::timestamp order by ts, seq"
    )
    return [tuple(str(v) for v in row) for row in result.rows]


def _act4(rt: Runtime, console: Console, run_id: str) -> list[ReplyEnvelope]:
    """A heartbeat skipped before any model call, and a reminder that fires."""
    console.rule("Act 4 · time of its own: a heartbeat skipped for free, a reminder that fires")
    since = time.time()
    conversation = f"demo:{run_id}:schedule"
    replies = []
    for text in (HEARTBEAT_ON, REMIND):
        reply = rt.ask("concierge", text, conversation_id=conversation)
        replies.append(reply)
        console.print(f"you → concierge: {text}", style="bold cyan", markup=False)
        console.print(f"concierge: {reply.text}", markup=False, highlight=False)

    def seen() -> tuple[int, bool]:
        events = _schedule_events(rt, since)
        skips = sum(e[1] == "heartbeat" and e[3] == "skipped" for e in events)
        done = any(e[1] == "reminder" and e[3] == "done" for e in events)
        return skips, done

    deadline = time.monotonic() + SCHEDULE_WAIT
    with console.status("Waiting for two heartbeats and the reminder…"):
        while seen() < (2, True) and time.monotonic() < deadline:
            time.sleep(0.5)
        skips, done = seen()
    off = rt.ask("concierge", HEARTBEAT_OFF, conversation_id=conversation)
    replies.append(off)
    console.print(f"you → concierge: {HEARTBEAT_OFF}", style="bold cyan", markup=False)
    console.print(f"concierge: {off.text}", markup=False, highlight=False)
    if skips < 2 or not done:
        raise CoterieError(
            f"act 4: within {SCHEDULE_WAIT:g} s, {skips} heartbeat(s) skipped and the "
            f"reminder {'ran' if done else 'did not run'}"
        )
    events = _schedule_events(rt, since)
    table = Table(title="the scheduler's audit events (kind = 'schedule')")
    for column in ("time", "entry", "name", "outcome", "reason"):
        table.add_column(column)
    for at, kind, name, outcome, reason, _ in events:
        table.add_row(at, kind, name, outcome, reason)
    console.print(table)
    calls = rt.query(
        "select count(*) from events where kind = 'model_call' and persona = 'concierge' "
        f"and conversation_id like 'concierge:heartbeat%' and ts >= to_timestamp({since:.6f})"
        "::timestamp"
    ).rows[0][0]
    console.print(
        f"model calls for the concierge's {skips} heartbeats: {calls} (HEARTBEAT.md holds "
        "nothing to do: each was skipped before any model call, and no turn started)",
        markup=False,
        highlight=False,
    )
    fired = next(e[5] for e in events if e[1] == "reminder" and e[3] == "accepted")
    console.print(_panel(rt, "concierge", fired, since, f"concierge · {fired} · the reminder"))
    console.print("Every entry, its next fire and last outcome: `coterie schedules`.")
    return replies


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

    replies.extend(_act4(rt, console, run_id))

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


__all__ = [
    "BUNDLED_PERSONAS",
    "DEMO_PERSONAS",
    "SCENARIO",
    "demo_settings",
    "render_transcript",
    "run_demo",
]
