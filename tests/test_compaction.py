"""Long conversations: token estimates, compaction and its fallbacks, the
compacted conversation after a rebuild (runtime.compaction, runtime.loop)."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from coterie.runtime.audit.rows import event_to_row
from coterie.runtime.audit.writer import AuditWriter
from coterie.runtime.compaction import COMPACTION_SOURCE, SUMMARY_SYSTEM, split
from coterie.runtime.config import CompactionSettings, ToolFilter, load_persona
from coterie.runtime.context import Conversation, TurnSettings
from coterie.runtime.errors import ContextLengthError, ContextOverflowError, ModelError
from coterie.runtime.loop import TurnLoop
from coterie.runtime.messages import (
    AssistantMessage,
    ChatMessage,
    Compacted,
    ConversationRecord,
    MessageEnvelope,
    ModelCalled,
    ModelRequest,
    ModelResponse,
    ToolCall,
    ToolResultMessage,
    Usage,
    UserMessage,
)
from coterie.runtime.models.scripted import latest_user_text
from coterie.runtime.persona import PersonaHost, PersonaRuntime
from coterie.runtime.services import NullAudit, Services
from coterie.runtime.testing.context import turn_context
from coterie.runtime.usage.tokens import TokenEstimator, definition_chars
from coterie.tools import builtin_registry
from tests.helpers import scripted, write_persona

CHARS_PER_TOKEN = 4


def count_tokens(request: ModelRequest) -> int:
    """What the test provider counts: every character the request carries, / 4."""
    chars = len(request.system) + sum(definition_chars(t) for t in request.tools)
    for m in request.messages:
        if isinstance(m, UserMessage):
            chars += len(m.text)
        elif isinstance(m, ToolResultMessage):
            chars += len(m.content) + len(m.name) + len(m.call_id)
        else:
            assert isinstance(m, AssistantMessage)
            chars += len(m.text)
            chars += sum(
                len(c.name) + len(c.id) + len(json.dumps(c.arguments)) for c in m.tool_calls
            )
    return chars // CHARS_PER_TOKEN + 4 * len(request.messages)


Answer = Callable[[ModelRequest], AssistantMessage | str]


class WindowedModel:
    """A model with a real window: it counts each request as a provider
    would and refuses one that does not fit (with the reply) as too long."""

    provider = "function"

    def __init__(self, window: int, answer: Answer, *, summarize: Answer | None = None) -> None:
        self.name = "windowed"
        self.context_window = window
        self.answer = answer
        self.summarize = summarize or keep_facts
        self.requests: list[ModelRequest] = []
        self.sizes: list[int] = []
        self.refused = 0

    async def request(self, request: ModelRequest) -> ModelResponse:
        self.requests.append(request)
        tokens = count_tokens(request)
        self.sizes.append(tokens)
        if tokens + request.max_tokens > self.context_window:
            self.refused += 1
            raise ContextLengthError(400, f"prompt is too long: {tokens} tokens")
        fn = self.summarize if request.system == SUMMARY_SYSTEM else self.answer
        reply = fn(request)
        message = AssistantMessage(text=reply) if isinstance(reply, str) else reply
        return ModelResponse(
            message=message,
            usage=Usage(input_tokens=tokens, output_tokens=10),
            provider=self.provider,
            model=self.name,
        )

    async def aclose(self) -> None:
        return None


def keep_facts(request: ModelRequest) -> str:
    """A summarizer that keeps every FACT line it reads (and the previous summary's)."""
    text = request.messages[-1].text  # type: ignore[union-attr]
    facts = sorted(set(re.findall(r"FACT: [^\n\]]+?(?=[\n\]]|$)", text)))
    return "Earlier: " + ("; ".join(facts) if facts else "small talk")


def requests_keep_pairs(messages: list[ChatMessage]) -> None:
    """Every tool result follows the call it answers; every call but the
    last message's has its result."""
    open_calls: set[str] = set()
    for i, m in enumerate(messages):
        if isinstance(m, AssistantMessage):
            assert not open_calls, f"calls {open_calls} unanswered before message {i}"
            open_calls = {c.id for c in m.tool_calls}
        elif isinstance(m, ToolResultMessage):
            assert m.call_id in open_calls, f"result {m.call_id} without its call at {i}"
            open_calls.discard(m.call_id)
        else:
            assert not open_calls, f"calls {open_calls} cut off by a user message at {i}"


def small_loop(model: Any, **kw: Any) -> TurnLoop:
    return TurnLoop(model=model, registry=builtin_registry(), max_tokens=200, **kw)


def few_tools() -> TurnSettings:
    return TurnSettings(tool_filter=ToolFilter(allow=["clock", "todo_write"]))


async def run_turn(
    loop: TurnLoop, conversation: Conversation, audit: NullAudit, text: str, n: int
) -> str:
    ctx = dataclasses.replace(
        turn_context(settings=few_tools(), services=Services(audit=audit), turn_id=f"t{n}"),
        conversation=conversation,
    )
    conversation.turn_start = len(conversation.history)
    conversation.history.append(UserMessage(text=text))
    result = await loop.run(ctx, system="You are a patient assistant.")
    return result.text


def chatty(request: ModelRequest) -> AssistantMessage | str:
    """Answers at length; every fifth turn looks at the clock first."""
    text = latest_user_text(request)
    if "door code" in text and "?" in text:
        found = re.search(r"door code is (\d+)", " ".join(_texts(request)))
        return f"The door code is {found.group(1)}." if found else "I do not know."
    last = request.messages[-1]
    n = int(re.search(r"turn (\d+)", text).group(1)) if re.search(r"turn (\d+)", text) else 0
    if n % 5 == 0 and not isinstance(last, ToolResultMessage):
        return AssistantMessage(tool_calls=[ToolCall(id=f"c{n}", name="clock", arguments={})])
    return f"Noted for turn {n}. " + "blah " * 40


def _texts(request: ModelRequest) -> list[str]:
    return [m.text for m in request.messages if isinstance(m, UserMessage)]


async def test_a_200_turn_conversation_stays_inside_a_tiny_window() -> None:
    model = WindowedModel(3000, chatty)
    audit = NullAudit()
    loop = small_loop(model, compaction=CompactionSettings(keep_turns=2))
    conversation = Conversation("long")
    await run_turn(loop, conversation, audit, "turn 1: FACT: the door code is 4711", 1)
    for n in range(2, 200):
        await run_turn(loop, conversation, audit, f"turn {n}: " + "chatter " * 30, n)
    answer = await run_turn(loop, conversation, audit, "turn 200: what is the door code?", 200)

    # Nothing was ever refused, and every request fitted (with its reply).
    assert model.refused == 0
    assert max(model.sizes) + 200 <= 3000
    compactions = [e for e in audit.events if isinstance(e, Compacted)]
    assert len(compactions) >= 5
    assert all(c.method == "summarized" and c.tokens_after < c.tokens_before for c in compactions)
    # An answer from turn 1 is still known at turn 200: through the summary.
    assert answer == "The door code is 4711."
    last = model.requests[-1]
    summary = last.messages[0]
    assert isinstance(summary, UserMessage) and summary.source == COMPACTION_SOURCE
    assert "4711" in summary.text
    # The current request is there verbatim, and no pair was ever split.
    assert latest_user_text(last) == "turn 200: what is the door code?"
    for request in model.requests:
        if request.system != SUMMARY_SYSTEM:
            requests_keep_pairs(list(request.messages))
    # Each summary call was itself inside the summarizer's window.
    calls = [e for e in audit.events if isinstance(e, ModelCalled)]
    assert {c.purpose for c in calls} == {"turn", "compaction"}
    # The estimate, anchored on the provider's counts, is close to them.
    turn_calls = [c for c in calls if c.purpose == "turn" and c.estimated_tokens]
    errors = [abs(c.estimated_tokens - c.input_tokens) / c.input_tokens for c in turn_calls[5:]]
    assert sum(errors) / len(errors) < 0.1


async def test_the_kept_turns_and_the_todo_list_are_verbatim_after_a_compaction() -> None:
    from coterie.runtime.messages import TodoItem

    model = WindowedModel(2500, lambda r: "ok " * 30)
    audit = NullAudit()
    loop = small_loop(model, compaction=CompactionSettings(keep_turns=3))
    conversation = Conversation("todo")
    conversation.todos = [TodoItem(content="Ship the release", status="in_progress")]
    n = 0
    while not any(isinstance(e, Compacted) for e in audit.events):
        n += 1
        await run_turn(loop, conversation, audit, f"turn {n}: " + "words " * 40, n)
        assert n < 100
    history = conversation.history
    head = history[0]
    assert isinstance(head, UserMessage) and head.source == COMPACTION_SOURCE
    assert "[~] Ship the release" in head.text
    kept = [m.text for m in history if isinstance(m, UserMessage) and m.source == "user"]
    # The turn that compacted and the three before it, word for word.
    assert kept == [f"turn {i}: " + "words " * 40 for i in range(n - 3, n + 1)]


async def test_a_summarizer_that_fails_falls_back_to_dropping_with_a_marker() -> None:
    def broken(request: ModelRequest) -> str:
        raise ModelError("summarizer is down")

    model = WindowedModel(2500, lambda r: "ok " * 30, summarize=broken)
    audit = NullAudit()
    loop = small_loop(model, compaction=CompactionSettings(keep_turns=2))
    conversation = Conversation("drop")
    for n in range(1, 40):
        await run_turn(loop, conversation, audit, f"turn {n}: " + "words " * 40, n)
    dropped = [e for e in audit.events if isinstance(e, Compacted)]
    assert dropped and all(e.method == "dropped" and e.summary is None for e in dropped)
    assert "summarizer is down" in (dropped[0].error or "")
    marker = conversation.history[0]
    assert isinstance(marker, UserMessage) and marker.source == COMPACTION_SOURCE
    assert re.search(r"\d+ earlier messages of this conversation were dropped", marker.text)
    assert "summarizing them failed" in marker.text
    # What is kept is real messages, never a placeholder standing for them.
    assert all(
        not (isinstance(m, UserMessage) and m.source == COMPACTION_SOURCE)
        for m in conversation.history[1:]
    )
    assert model.refused == 0


async def test_a_summarizer_that_hangs_is_given_up_on() -> None:
    class Slow(WindowedModel):
        async def request(self, request: ModelRequest) -> ModelResponse:
            if request.system == SUMMARY_SYSTEM:
                await asyncio.sleep(30)
            return await super().request(request)

    model = Slow(2500, lambda r: "ok " * 30)
    audit = NullAudit()
    loop = small_loop(model, compaction=CompactionSettings(keep_turns=1, timeout=0.2))
    conversation = Conversation("hang")
    for n in range(1, 25):
        await asyncio.wait_for(
            run_turn(loop, conversation, audit, f"turn {n}: " + "words " * 40, n), 10
        )
    events = [e for e in audit.events if isinstance(e, Compacted)]
    assert events and events[0].method == "dropped" and "Timeout" in (events[0].error or "")


async def test_a_context_length_error_makes_one_compaction_and_one_retry() -> None:
    # The provider's window is smaller than the loop believes: only its
    # error tells.
    model = WindowedModel(2000, lambda r: "ok " * 30)
    audit = NullAudit()
    loop = small_loop(model)
    model.context_window = 2000
    believed = 100_000

    class Liar:
        """The same model, claiming a much larger window."""

        provider = model.provider
        name = model.name
        context_window = believed
        request = model.request
        aclose = model.aclose

    loop.model = Liar()  # type: ignore[assignment]
    conversation = Conversation("overflow")
    n = 0
    while model.refused == 0:
        n += 1
        await run_turn(loop, conversation, audit, f"turn {n}: " + "words " * 40, n)
        assert n < 100
    assert model.refused == 1
    compactions = [e for e in audit.events if isinstance(e, Compacted)]
    assert [c.reason for c in compactions] == ["context_length_error"]
    # The refused request, then the summary, then the retry that was answered.
    failed = [e for e in audit.events if isinstance(e, ModelCalled) and e.error]
    assert len(failed) == 1
    assert model.sizes[-1] + 200 <= 2000


async def test_a_second_context_length_error_ends_the_turn() -> None:
    model = WindowedModel(2000, lambda r: "ok")
    loop = small_loop(model)

    async def always(request: ModelRequest) -> ModelResponse:
        model.requests.append(request)
        if request.system == SUMMARY_SYSTEM:
            return ModelResponse(
                message=AssistantMessage(text="sum"), provider="function", model="m"
            )
        raise ContextLengthError(400, "prompt is too long")

    model.request = always  # type: ignore[method-assign]
    conversation = Conversation("twice")
    conversation.history = [UserMessage(text=f"old {i} " + "w" * 400) for i in range(10)]
    with pytest.raises(ContextLengthError):
        await run_turn(loop, conversation, NullAudit(), "now", 1)
    turn_requests = [r for r in model.requests if r.system != SUMMARY_SYSTEM]
    assert len(turn_requests) == 2  # the request and its one retry


async def test_a_request_known_to_overflow_is_never_sent() -> None:
    model = WindowedModel(2000, lambda r: "ok")
    loop = small_loop(model)
    conversation = Conversation("huge")
    with pytest.raises(ContextOverflowError, match="not sent"):
        await run_turn(loop, conversation, NullAudit(), "x" * 20_000, 1)
    assert model.requests == []


async def test_compactions_are_bounded_per_turn() -> None:
    # One compaction for the threshold, then the provider refuses the
    # request (its window is smaller than believed): with max_per_turn 1
    # there is no second compaction, and the turn ends with a clear error.
    model = WindowedModel(2000, lambda r: "ok")

    class Liar:
        provider = model.provider
        name = model.name
        context_window = 4000
        request = model.request
        aclose = model.aclose

    loop = small_loop(
        Liar(),
        compaction=CompactionSettings(keep_turns=3, max_per_turn=1, elide_tool_results_over=0),
        summarizer=WindowedModel(100_000, lambda r: "unused"),
    )
    conversation = Conversation("bound")
    conversation.history = [UserMessage(text=f"old {i} " + "w" * 2400) for i in range(30)]
    audit = NullAudit()
    with pytest.raises(ContextOverflowError, match=r"max_per_turn.*not sent"):
        await run_turn(loop, conversation, audit, "go", 1)
    assert len([e for e in audit.events if isinstance(e, Compacted)]) == 1
    assert model.refused == 1  # sent once, refused, never sent again


async def test_a_long_turn_that_fits_is_not_stopped_by_the_bound() -> None:
    # The current turn alone passes the threshold but fits the window:
    # nothing older to compact, so each step is sent as it is.
    steps = iter(range(100))

    def busy(request: ModelRequest) -> AssistantMessage | str:
        n = next(steps)
        if n < 6:
            return AssistantMessage(tool_calls=[ToolCall(id=f"c{n}", name="clock")])
        return "done"

    model = WindowedModel(4000, busy)
    loop = small_loop(model, compaction=CompactionSettings(max_per_turn=1))
    conversation = Conversation("busy")
    audit = NullAudit()
    text = await run_turn(loop, conversation, audit, "x" * 12_000, 1)
    assert text == "done" and model.refused == 0
    calls = [e for e in audit.events if isinstance(e, ModelCalled)]
    assert len(calls) == 7
    # Every step past the threshold (0.8 of 4000), none compacted.
    assert all((c.estimated_tokens or 0) > 3200 for c in calls)
    assert not any(isinstance(e, Compacted) for e in audit.events)


def test_old_tool_results_are_cut_to_a_stub_first() -> None:
    from coterie.runtime.compaction import elide

    long = ToolResultMessage(call_id="a", name="file_read", content="x" * 5000)
    short = ToolResultMessage(call_id="b", name="clock", content="12:00")
    out, n = elide([long, short], 2000)
    assert n == 1 and out[1] is short
    assert "5000 characters" in out[0].content and len(out[0].content) < 400  # type: ignore[union-attr]


def test_the_history_is_cut_only_where_turns_start() -> None:
    history: list[ChatMessage] = [
        UserMessage(text="a"),
        AssistantMessage(tool_calls=[ToolCall(id="1", name="clock")]),
        ToolResultMessage(call_id="1", name="clock", content="t"),
        UserMessage(text="[harness] note", source="harness"),
        AssistantMessage(text="done"),
        UserMessage(text="b"),
        AssistantMessage(text="ok"),
        UserMessage(text="c"),
    ]
    parts = split(history, 7)
    assert [len(t) for t in parts.turns] == [5, 2]
    assert parts.current == [history[7]]


def test_the_estimate_learns_the_providers_ratio() -> None:
    estimator = TokenEstimator()
    messages: list[ChatMessage] = [UserMessage(text="word " * 400)]
    first = estimator.estimate(messages, fixed_chars=0, anchor=None)
    anchor = estimator.observe(messages, fixed_chars=0, input_tokens=1000)
    messages.append(AssistantMessage(text="reply " * 100))
    after = estimator.estimate(messages, fixed_chars=0, anchor=anchor)
    assert first != 1000
    # The anchor's count plus what was added at the learned ratio (2 chars/token).
    assert 1000 + 280 <= after <= 1000 + 320


def test_the_anchor_measures_only_what_was_added_since_the_last_one() -> None:
    estimator = TokenEstimator()
    history: list[ChatMessage] = [UserMessage(text="word " * 400)]
    anchor = estimator.observe(history, fixed_chars=10, input_tokens=1000)
    assert anchor is not None and anchor.message_chars == 2000
    history += [AssistantMessage(text="reply " * 100), UserMessage(text="more")]
    # Its own count stands for the prefix: a prefix it measured is not measured again.
    anchor.message_chars = 5000
    grown = estimator.observe(history, fixed_chars=10, input_tokens=1500, anchor=anchor)
    assert grown is not None and grown.message_chars == 5000 + 600 + 4
    assert grown.messages == 3 and grown.last is history[-1]
    # A prefix that no longer holds (the history was rewritten shorter) is measured whole.
    rewritten: list[ChatMessage] = [UserMessage(text="summary"), UserMessage(text="after")]
    whole = estimator.observe(rewritten, fixed_chars=10, input_tokens=800, anchor=grown)
    assert whole is not None and whole.message_chars == 7 + 5
    assert estimator.observe(history, fixed_chars=10, input_tokens=0, anchor=grown) is None


async def test_the_conversation_rebuilt_after_a_restart_is_the_compacted_one(
    tmp_path: Path,
) -> None:
    config = scripted(compaction={"keep_turns": 2}, tools={"allow": ["clock"]})
    config["model"]["max_tokens"] = 200
    write_persona(tmp_path, "solo", config)
    persona = load_persona(tmp_path, "solo")
    audit = NullAudit()
    model = WindowedModel(2500, lambda r: "ok " * 20)
    first = PersonaRuntime(
        persona, model=model, registry=builtin_registry(), services=Services(audit=audit)
    )
    n = 0
    while not any(isinstance(e, Compacted) for e in audit.events):
        n += 1
        envelope = MessageEnvelope(
            recipient="solo", conversation_id="solo:c", text=f"turn {n}: " + "words " * 40
        )
        await first.handle(envelope)
        assert n < 60
    await first.handle(MessageEnvelope(recipient="solo", conversation_id="solo:c", text="after"))
    in_memory = list(first.conversation("solo:c").history)

    # The log as the audit actor writes it, then a new process reading it back.
    with AuditWriter(tmp_path / "audit.duckdb") as writer:
        writer.write_rows([event_to_row(e) for e in audit.events])
        record = writer.conversation("solo", "solo:c")
    assert [m.model_dump() for m in record.messages] == [m.model_dump() for m in in_memory]

    async def loader(conversation_id: str) -> ConversationRecord:
        return record

    model2 = WindowedModel(2500, lambda r: "back")
    second = PersonaRuntime(
        persona, model=model2, registry=builtin_registry(), host=PersonaHost(history=loader)
    )
    await second.handle(MessageEnvelope(recipient="solo", conversation_id="solo:c", text="again"))
    seen = model2.requests[0].messages
    assert isinstance(seen[0], UserMessage) and seen[0].source == COMPACTION_SOURCE
    assert [m.model_dump() for m in seen[:-1]] == [m.model_dump() for m in in_memory]


async def test_an_overflow_from_a_local_openai_server_compacts_once_and_retries_once() -> None:
    from coterie.runtime.config import OpenAIModelConfig
    from coterie.runtime.models.openai_chat import OpenAIChatModel
    from tests.fakes import FakeOpenAIServer

    # The entry says 128k tokens (gpt-4o's); the server takes 9,000 characters.
    # Every request is answered with the same text (summaries included).
    with FakeOpenAIServer(context_limit_chars=9000, default_text="answered") as server:
        config = OpenAIModelConfig.model_validate(
            {"provider": "openai", "name": "gpt-4o", "base_url": server.base_url, "timeout": 5}
        )
        model = OpenAIChatModel(config, api_key="sk-test", retry_base_delay=0.001)
        loop = TurnLoop(
            model=model,
            registry=builtin_registry(),
            max_tokens=200,
            compaction=CompactionSettings(keep_turns=1),
        )
        audit = NullAudit()
        conversation = Conversation("wire")
        conversation.history = [
            m
            for i in range(12)
            for m in (
                UserMessage(text=f"question {i}: " + "w " * 400),
                AssistantMessage(text=f"answer {i}"),
            )
        ]
        try:
            text = await run_turn(loop, conversation, audit, "and now?", 1)
        finally:
            await model.aclose()
        assert text == "answered"
        assert server.context_rejections == 1
        compactions = [e for e in audit.events if isinstance(e, Compacted)]
        assert [(c.reason, c.method) for c in compactions] == [
            ("context_length_error", "summarized")
        ]
        calls = [e for e in audit.events if isinstance(e, ModelCalled)]
        purposes = [(c.purpose, c.error is not None) for c in calls]
        # The refused call, the summary (in chunks), the one retry.
        assert purposes[0] == ("turn", True) and purposes[-1] == ("turn", False)
        assert set(purposes[1:-1]) == {("compaction", False)}
        # The retried request was within what the server takes.
        last = server.requests[-1]
        assert server.context_chars(last) <= 9000
        assert "context_length_exceeded" in (calls[0].error or "") or "maximum context" in (
            calls[0].error or ""
        )


async def test_memory_flush_lets_the_persona_save_facts_before_a_compaction(
    tmp_path: Path,
) -> None:
    from coterie.runtime.loop import MEMORY_FLUSH_NOTE
    from coterie.runtime.memory import HashingEmbedder, MemoryClient, MemoryServer, MemoryStore

    store = MemoryStore(str(tmp_path / "memory"), HashingEmbedder(dim=64))
    memory = MemoryClient(MemoryServer.serving(store), "tester")

    def answer(request: ModelRequest) -> AssistantMessage | str:
        last = request.messages[-1]
        if isinstance(last, UserMessage) and last.text == MEMORY_FLUSH_NOTE:
            # Only the memory tool is offered for this step.
            assert [t.name for t in request.tools] == ["memory"]
            return AssistantMessage(
                tool_calls=[
                    ToolCall(
                        id="m1",
                        name="memory",
                        arguments={"action": "write", "content": "door code 4711"},
                    )
                ]
            )
        return "ok " * 30

    model = WindowedModel(2500, answer)
    audit = NullAudit()
    loop = small_loop(model, compaction=CompactionSettings(keep_turns=1, memory_flush=True))
    conversation = Conversation("flush")
    n = 0
    while not any(isinstance(e, Compacted) for e in audit.events):
        n += 1
        ctx = dataclasses.replace(
            turn_context(
                settings=TurnSettings(tool_filter=ToolFilter(allow=["clock", "memory"])),
                services=Services(audit=audit, memory=memory),
                turn_id=f"t{n}",
            ),
            conversation=conversation,
        )
        conversation.turn_start = len(conversation.history)
        conversation.history.append(UserMessage(text=f"turn {n}: " + "words " * 40))
        await loop.run(ctx, system="s")
        assert n < 60
    rows = await memory.recall(query="door code")
    assert any("4711" in hit.content for hit in rows)
    purposes = [e.purpose for e in audit.events if isinstance(e, ModelCalled)]
    assert purposes.count("memory_flush") == 1
    assert purposes.index("memory_flush") < purposes.index("compaction")
    # The flush's own messages stay out of the conversation.
    assert not any(
        isinstance(m, UserMessage) and m.text == MEMORY_FLUSH_NOTE for m in conversation.history
    )
