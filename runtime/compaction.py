"""Compaction: a conversation made to fit its model's context window again.

The loop calls :meth:`Compactor.compact` when a request would pass
``compaction.threshold`` of the window (or the provider said it was too
long). What the model sees afterwards, oldest first:

1. a summary of the older turns (a ``UserMessage`` from ``compaction``,
   with the todo list as it stands), or, when summarizing failed, was off or
   could not fit, a marker saying how many messages were dropped;
2. the last ``keep_turns`` turns, verbatim but for their old, long tool
   results, which may be cut to a stub naming their size;
3. the current turn, verbatim: its request and everything since.

Kept messages are never replaced by a placeholder, and a tool call is never
separated from its result: the history is cut only where a turn starts (at
a person's, a persona's or a wake's message; a tool result never comes
right after one). Steps, cheapest first, until the estimate is under the
target: cut old tool results to stubs; summarize the turns before the kept
ones; summarize the kept ones too, oldest first; cut the current turn's
older tool results. If that is still not enough the request would overflow
and :class:`~runtime.errors.ContextOverflowError` says so: it is never sent.

The summarizer reads the turns in chunks of at most ``chunk_tokens`` (so it
never needs more than its own window), each chunk with the summary so far:
a rolling summary.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Literal

from coterie.runtime.config import CompactionSettings
from coterie.runtime.errors import ContextOverflowError
from coterie.runtime.messages import (
    AssistantMessage,
    ChatMessage,
    TodoItem,
    ToolResultMessage,
    UserMessage,
    render_todos,
)

#: The ``source`` of a summary or drop marker in the history.
COMPACTION_SOURCE = "compaction"

SUMMARY_SYSTEM = (
    "You write the running summary of a conversation between an assistant "
    "persona and the people and tools it works with. The summary replaces "
    "the turns it covers: the assistant will only see the summary and the "
    "latest turns. Keep every fact, decision, name, number, path, commitment "
    "and open question the assistant may need later, and what the person "
    "asked for and was answered. Drop pleasantries and repetition. Write "
    "plain prose and short lists, in the conversation's language."
)
SUMMARY_REQUEST = (
    "Summary so far:\n{previous}\n\n"
    "The next part of the conversation:\n{transcript}\n\n"
    "Write the updated summary of everything above (at most about {words} words)."
)
SUMMARY_HEADER = (
    "[harness] Summary of the earlier part of this conversation ({count} messages, "
    "summarized to fit the context window; the messages after this one are verbatim):"
)
DROP_MARKER = (
    "[harness] {count} earlier messages of this conversation were dropped to fit the "
    "context window{why}. They are kept in the audit log, but you no longer see them."
)
TODO_NOTE = "Todo list when this was written (todo_read gives the current one):"
ELIDED_STUB = "[tool result elided to fit the context window: {size} characters; {head}…]"

#: Characters of a long tool result kept at the start of its stub.
STUB_HEAD = 200

#: Writes one step of the rolling summary: (system, request text) -> text.
Summarize = Callable[[str, str], Awaitable[str]]
#: Input tokens of a request of these messages (the rest of it is fixed).
Estimate = Callable[[Sequence[ChatMessage]], int]


@dataclass
class Compaction:
    """What one compaction did."""

    messages: list[ChatMessage]
    #: Where the current turn's own messages start in ``messages``.
    turn_start: int
    method: Literal["summarized", "dropped", "elided"]
    summary: str | None
    replaced: int
    elided: int
    tokens_before: int
    tokens_after: int
    #: Why summarizing failed (it fell back to dropping), if it did.
    error: str | None = None
    summarizer_calls: int = 0


@dataclass
class _Parts:
    """A history cut where turns start: a leading summary, turns, the current turn."""

    head: UserMessage | None
    turns: list[list[ChatMessage]]
    current: list[ChatMessage]
    previous_summary: str = ""

    def flat(
        self, head: UserMessage | None, turns: Sequence[list[ChatMessage]]
    ) -> list[ChatMessage]:
        out: list[ChatMessage] = [head] if head is not None else []
        for turn in turns:
            out.extend(turn)
        return out


def starts_turn(message: ChatMessage) -> bool:
    """Whether the history may be cut before ``message``: a message from a
    person, a persona or a wake (not the harness's notes inside a turn)."""
    return isinstance(message, UserMessage) and message.source not in ("harness",)


def split(history: Sequence[ChatMessage], turn_start: int) -> _Parts:
    """``history`` as a leading summary (if any), whole turns, and the current turn."""
    older = list(history[:turn_start])
    head: UserMessage | None = None
    previous = ""
    first = older[0] if older else None
    if isinstance(first, UserMessage) and first.source == COMPACTION_SOURCE:
        head = first
        older.pop(0)
        previous = _summary_text(first.text)
    turns: list[list[ChatMessage]] = []
    for message in older:
        if not turns or starts_turn(message):
            turns.append([message])
        else:
            turns[-1].append(message)
    return _Parts(
        head=head, turns=turns, current=list(history[turn_start:]), previous_summary=previous
    )


def _summary_text(text: str) -> str:
    """The summary inside a summary message (without header and todo list)."""
    if not text.startswith("[harness] Summary"):
        return ""  # a drop marker: nothing summarized
    body = text.split("\n", 1)[1] if "\n" in text else ""
    return body.split("\n\n" + TODO_NOTE, 1)[0].strip()


def elide(messages: Sequence[ChatMessage], over: int) -> tuple[list[ChatMessage], int]:
    """``messages`` with each tool result longer than ``over`` characters cut
    to a stub naming its size (0: none); how many were cut."""
    if over <= 0:
        return list(messages), 0
    out: list[ChatMessage] = []
    cut = 0
    for message in messages:
        if isinstance(message, ToolResultMessage) and len(message.content) > over:
            head = " ".join(message.content[:STUB_HEAD].split())
            stub = ELIDED_STUB.format(size=len(message.content), head=head)
            out.append(message.model_copy(update={"content": stub}))
            cut += 1
        else:
            out.append(message)
    return out, cut


def transcript(messages: Sequence[ChatMessage], *, max_chars: int) -> list[str]:
    """``messages`` as plain text lines for the summarizer, each at most ``max_chars``."""
    lines: list[str] = []
    for message in messages:
        if isinstance(message, UserMessage):
            line = f"[{message.source}] {message.text}"
        elif isinstance(message, ToolResultMessage):
            line = f"[result of {message.name}] {message.content}"
        else:
            assert isinstance(message, AssistantMessage)
            parts = [message.text] if message.text else []
            parts += [f"(calls {c.name} with {c.arguments})" for c in message.tool_calls]
            line = "[assistant] " + " ".join(parts)
        if len(line) > max_chars:
            line = line[: max_chars - 40] + f" …[{len(line) - max_chars + 40} characters cut]"
        lines.append(line)
    return lines


def chunks(lines: Sequence[str], max_chars: int) -> list[str]:
    """``lines`` joined into pieces of at most ``max_chars`` characters."""
    out: list[str] = []
    current: list[str] = []
    size = 0
    for line in lines:
        if current and size + len(line) + 1 > max_chars:
            out.append("\n".join(current))
            current, size = [], 0
        current.append(line)
        size += len(line) + 1
    if current:
        out.append("\n".join(current))
    return out


@dataclass
class Compactor:
    """Compacts one persona's conversations (see the module's docstring)."""

    settings: CompactionSettings
    #: Writes the summary (None: summarizing is off, older turns are dropped).
    summarize: Summarize | None
    #: Tokens of conversation one summarizer call may read.
    chunk_tokens: int
    #: Seconds one summarizer call may take before the fallback.
    timeout: float = 120.0
    chars_per_token: Callable[[], float] = field(default=lambda: 3.5)

    async def compact(
        self,
        history: Sequence[ChatMessage],
        *,
        turn_start: int,
        todos: Sequence[TodoItem],
        estimate: Estimate,
        target: int,
        limit: int,
        force: bool = False,
    ) -> Compaction:
        """``history`` made to fit: under ``target`` tokens if it can be, and
        under ``limit`` (the window less the reply) or raise
        :class:`ContextOverflowError`. ``force``: the provider refused the
        request, so at least the older turns go even if the estimate says
        it fits."""
        before = estimate(history)
        parts = split(history, turn_start)
        keep = min(self.settings.keep_turns, len(parts.turns))
        over = self.settings.elide_tool_results_over

        # 1. Old tool results to stubs (all but the newest kept turn's).
        cut_turns = [elide(t, over) for t in parts.turns[:-1]]
        elided = sum(n for _, n in cut_turns)
        turns = [t for t, _ in cut_turns] + parts.turns[-1:]
        candidate = parts.flat(parts.head, turns) + parts.current
        if elided and not force and estimate(candidate) <= target:
            return Compaction(
                messages=candidate,
                turn_start=len(candidate) - len(parts.current),
                method="elided",
                summary=None,
                replaced=0,
                elided=elided,
                tokens_before=before,
                tokens_after=estimate(candidate),
            )

        # 2. Summarize the turns before the kept ones, then the kept ones too.
        error: str | None = None
        calls = 0
        summary = parts.previous_summary
        covered = 0  # turns summarized so far (from the oldest)
        head: UserMessage | None
        while True:
            kept = turns[len(turns) - keep :] if keep else []
            covered_goal = len(turns) - keep
            if covered_goal > covered and error is None and self.summarize is not None:
                try:
                    summary, n = await self._summarize(summary, turns[covered:covered_goal])
                    calls += n
                    covered = covered_goal
                except Exception as exc:  # the summarizer failed or hung: drop instead
                    error = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
            if error is None and self.summarize is not None and (covered or summary):
                head = self._summary_message(summary, todos, parts, turns[:covered])
                method: Literal["summarized", "dropped", "elided"] = "summarized"
            else:
                covered = covered_goal
                head = self._drop_marker(parts, turns[:covered], todos, error)
                method = "dropped"
            candidate = parts.flat(head, kept) + parts.current
            tokens = estimate(candidate)
            if tokens <= target or keep == 0:
                break
            keep -= 1

        if tokens > limit:
            # 3. The current turn's own older tool results, as a last resort.
            current, n = elide(parts.current[:-1], over or STUB_HEAD * 2)
            current.extend(parts.current[-1:])
            elided += n
            candidate = parts.flat(head, []) + current
            tokens = estimate(candidate)
            if tokens > limit:
                raise ContextOverflowError(
                    f"the current turn alone needs about {tokens} tokens, more than the "
                    f"{limit} the model's context window leaves for it; the request was not "
                    "sent (shorten the input, or use a model with a larger window)"
                )
            parts.current = current
        replaced = sum(len(t) for t in turns[:covered]) + (1 if parts.head is not None else 0)
        return Compaction(
            messages=candidate,
            turn_start=len(candidate) - len(parts.current),
            method=method,
            summary=summary if method == "summarized" else None,
            replaced=replaced,
            elided=elided,
            tokens_before=before,
            tokens_after=tokens,
            error=error,
            summarizer_calls=calls,
        )

    async def _summarize(
        self, previous: str, turns: Sequence[list[ChatMessage]]
    ) -> tuple[str, int]:
        """The rolling summary of ``previous`` and ``turns``; calls made."""
        assert self.summarize is not None
        ratio = self.chars_per_token()
        budget = int(self.chunk_tokens * ratio)
        words = max(50, int(self.settings.summary_max_tokens * 0.7))
        messages = [m for t in turns for m in t]
        room = max(1000, budget - int(self.settings.summary_max_tokens * ratio) - 500)
        pieces = chunks(transcript(messages, max_chars=room), room)
        summary = previous
        for piece in pieces:
            request = SUMMARY_REQUEST.format(
                previous=summary or "(nothing yet)", transcript=piece, words=words
            )
            text = await asyncio.wait_for(self.summarize(SUMMARY_SYSTEM, request), self.timeout)
            if not text.strip():
                raise ValueError("the summarizer returned an empty summary")
            summary = text.strip()
        return summary, len(pieces)

    def _summary_message(
        self,
        summary: str,
        todos: Sequence[TodoItem],
        parts: _Parts,
        covered: Sequence[list[ChatMessage]],
    ) -> UserMessage:
        count = sum(len(t) for t in covered) + _count_of(parts.head)
        text = SUMMARY_HEADER.format(count=count) + "\n" + summary
        if todos:
            text += "\n\n" + TODO_NOTE + "\n" + render_todos(todos)
        return UserMessage(text=text, source=COMPACTION_SOURCE)

    def _drop_marker(
        self,
        parts: _Parts,
        dropped: Sequence[list[ChatMessage]],
        todos: Sequence[TodoItem],
        error: str | None,
    ) -> UserMessage | None:
        count = sum(len(t) for t in dropped) + _count_of(parts.head)
        if count == 0:
            return parts.head
        why = f" (summarizing them failed: {error})" if error else ""
        text = DROP_MARKER.format(count=count, why=why)
        if parts.previous_summary:
            text += "\n\nThe summary of what came before them:\n" + parts.previous_summary
        if todos:
            text += "\n\n" + TODO_NOTE + "\n" + render_todos(todos)
        return UserMessage(text=text, source=COMPACTION_SOURCE)


_COUNT = re.compile(r"\((\d+) messages, summarized|\] (\d+) earlier messages")


def _count_of(head: UserMessage | None) -> int:
    """Messages an earlier summary or marker stood for (from its header)."""
    if head is None:
        return 0
    found = _COUNT.search(head.text)
    if found is None:
        return 1
    return int(found.group(1) or found.group(2))


__all__ = [
    "COMPACTION_SOURCE",
    "DROP_MARKER",
    "SUMMARY_SYSTEM",
    "Compaction",
    "Compactor",
    "Estimate",
    "Summarize",
    "chunks",
    "elide",
    "split",
    "starts_turn",
    "transcript",
]
