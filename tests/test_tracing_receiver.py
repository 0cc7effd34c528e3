"""Traces sent to a real OTLP receiver: Arize Phoenix (the session's
``phoenix`` fixture, tests/phoenix.py), read back from its REST API.

One ``ask_persona`` chain across two personas on Ray, the callee calling a
tool and spawning a subagent, must arrive as one trace: the right spans, the
right parents, the token counts the audit log has for the same span ids. So
must an eval run's samples, requests through the HTTP door with and without
a caller's ``traceparent``, and a reminder's fire with its turn.
"""

from __future__ import annotations

import asyncio
import json
import secrets
from collections.abc import Iterator
from typing import Any

import aiohttp
import pytest
import yaml
from aiohttp.test_utils import TestServer

from coterie import Runtime
from coterie.runtime import tracing
from coterie.runtime.config import RuntimeSettings, ServeSettings, TracingSettings
from coterie.runtime.serve.app import build_app, set_backend
from tests.helpers import poll, scripted, write_persona
from tests.phoenix import Span, all_spans

pytestmark = pytest.mark.usefixtures("ray_session")


def spawn(task: str) -> dict[str, Any]:
    return {"name": "spawn_subagent", "arguments": {"task": task}}


@pytest.fixture(scope="module")
def rt(tmp_path_factory: pytest.TempPathFactory, phoenix: str) -> Iterator[Runtime]:
    home = tmp_path_factory.mktemp("traced")
    ask = {"persona": "tr-back", "text": "what is 2+3? check the logs too"}
    write_persona(
        home,
        "tr-front",
        scripted(
            [
                {"when": {"turn": 1}, "tool_calls": [{"name": "ask_persona", "arguments": ask}]},
                {"when": {"tool_result": True}, "text": "front heard: {tool_results}"},
            ],
        ),
    )
    write_persona(home, "tr-plain", scripted(default="plain answer"))
    remind = {"action": "remind", "prompt": "tea", "in_seconds": 1}
    write_persona(
        home,
        "tr-remind",
        scripted(
            [
                {
                    "when": {"turn": 1, "contains": "remind me"},
                    "tool_calls": [{"name": "remind", "arguments": remind}],
                },
                {"when": {"turn": 2, "contains": "remind me"}, "text": "Set."},
            ],
            default="tea time",
        ),
    )
    write_persona(
        home,
        "tr-back",
        scripted(
            [
                {"when": {"context": "subagent"}, "text": "the logs are clean"},
                {"when": {"contains": "finished"}, "text": "noted the subagent"},
                {
                    "when": {"turn": 1},
                    "tool_calls": [
                        {"name": "calculate", "arguments": {"expression": "2+3"}},
                        spawn("check the logs"),
                    ],
                },
            ],
            default="five, and a subagent checks the logs",
        ),
    )
    settings = RuntimeSettings(
        idle_timeout=None,
        tracing=TracingSettings(
            enabled=True, endpoint=f"{phoenix}/v1/traces", service_name="coterie-tests"
        ),
    )
    runtime = Runtime.start(home=home, settings=settings)
    try:
        yield runtime
    finally:
        runtime.shutdown()
        # The driver's tracer goes with its runtime: later tests trace nothing.
        tracing.install(tracing.Tracer()).shutdown()


def test_an_ask_chain_with_a_tool_and_a_subagent_is_one_trace_in_phoenix(
    rt: Runtime, phoenix: str
) -> None:
    reply = rt.ask("tr-front", "go")
    assert "five" in reply.text

    def woken() -> bool:
        # The subagent finished and its report woke tr-back: a second turn there.
        return rt.query(
            "select count(*) from events where kind = 'turn_ended' "
            "and conversation_id = 'tr-back:inbox:tr-front'"
        ).rows == [(2,)]

    poll(woken, 90, "the subagent's report woke tr-back")
    rt.flush()  # every persona actor exports what it has batched

    # The audit log names the trace: its rows carry the span ids.
    (trace_id,) = {
        row[0]
        for row in rt.query(
            "select trace_id from events where persona = 'tr-front' and kind = 'turn_started'"
        ).rows
    }
    assert trace_id and len(trace_id) == 32

    # What the audit log has of the trace: its model calls and turns.
    calls = {
        span_id: (inp, out)
        for span_id, inp, out in rt.query(
            "select span_id, input_tokens, output_tokens from events "
            f"where kind = 'model_call' and trace_id = '{trace_id}'"
        ).rows
    }
    turns = rt.query(
        f"select count(*) from events where kind = 'turn_started' and trace_id = '{trace_id}'"
    ).rows[0][0]
    # tr-front's turn, tr-back's, the subagent's run and the turn its report woke.
    assert (len(calls), turns) == (6, 4)

    def arrived() -> list[Span] | None:
        spans = all_spans(phoenix, trace_id)
        chats = sum(s["name"] == "chat scripted" for s in spans)
        agents = sum(s["name"].startswith("invoke_agent ") for s in spans)
        started = sum(s["name"] == "activate_persona tr-back" for s in spans)
        return spans if (chats, agents, started) == (len(calls), turns, 1) else None

    spans = poll(arrived, 60, "the chain's spans in Phoenix")
    by_id = {s["context"]["span_id"]: s for s in spans}

    def one(name: str, **attrs: Any) -> Span:
        (span,) = [
            s
            for s in spans
            if s["name"] == name and all(s["attributes"].get(k) == v for k, v in attrs.items())
        ]
        return span

    def parent(span: Span) -> Span | None:
        return by_id.get(span["parent_id"]) if span["parent_id"] else None

    front = one("invoke_agent tr-front")
    asked = one("execute_tool ask_persona")
    calc = one("execute_tool calculate")
    spawned = one("execute_tool spawn_subagent")
    sub = one("invoke_agent tr-back", **{"coterie.turn.context": "subagent"})
    back, wake = sorted(
        (s for s in spans if s["name"] == "invoke_agent tr-back" and s is not sub),
        key=lambda s: str(s["start_time"]),
    )

    assert front["parent_id"] is None
    assert parent(asked) is front
    # The router, in its own actor, started tr-back's actor for the call that asked.
    activated = one("activate_persona tr-back")
    assert parent(activated) is asked
    # The callee's turn, in another actor's process, is a child of the call that asked.
    assert parent(back) is asked
    assert parent(calc) is back and parent(spawned) is back
    # The subagent, in an actor of its own, is a child of the call that spawned it.
    assert parent(sub) is spawned
    # So is the turn its report woke: the work it started, then what came of it.
    assert parent(wake) is spawned
    assert sub["attributes"]["gen_ai.agent.id"]
    assert front["attributes"]["gen_ai.agent.name"] == "tr-front"
    assert back["attributes"]["coterie.sender"] == "tr-front"
    assert calc["attributes"]["gen_ai.tool.name"] == "calculate"
    assert "error.type" not in calc["attributes"]

    chats = [s for s in spans if s["name"] == "chat scripted"]
    # Each model call is a child of its turn: two each in tr-front's and
    # tr-back's (a tool batch between), one in the subagent's and the wake's.
    per_turn = [sum(parent(c) is t for c in chats) for t in (front, back, sub, wake)]
    assert per_turn == [2, 2, 1, 1]
    # The tokens Phoenix received are the audit log's, row for span.
    for chat in chats:
        attrs = chat["attributes"]
        assert attrs["gen_ai.provider.name"] == "scripted"
        assert attrs["gen_ai.usage.input_tokens"] > 0
        tokens = (attrs["gen_ai.usage.input_tokens"], attrs["gen_ai.usage.output_tokens"])
        assert calls[chat["context"]["span_id"]] == tokens


def test_an_eval_run_on_ray_sends_one_trace_per_sample(
    rt: Runtime, phoenix: str, tmp_path: Any
) -> None:
    (tmp_path / "data.jsonl").write_text(
        "".join(
            json.dumps({"id": f"s{n}", "input": f"question {n}", "target": "plain"}) + "\n"
            for n in (1, 2)
        )
    )
    task = {
        "name": "traced-eval",
        "dataset": {"path": "data.jsonl"},
        "solver": {"persona": "tr-plain"},
        "scorers": [{"type": "includes"}],
    }
    (tmp_path / "task.yaml").write_text(yaml.safe_dump(task))
    report = rt.eval(tmp_path / "task.yaml", workers=1)
    rt.flush()
    tracing.tracer().flush()  # the driver's: the samples' spans are its own
    run_id = report.run.run_id

    def arrived() -> list[Span] | None:
        spans = all_spans(phoenix)
        samples = [
            s
            for s in spans
            if s["name"] == "eval_sample traced-eval"
            and s["attributes"].get("coterie.eval.run") == run_id
        ]
        traces = {s["context"]["trace_id"] for s in samples}
        turns = [
            s
            for s in spans
            if s["context"]["trace_id"] in traces and s["name"] == "invoke_agent tr-plain"
        ]
        return spans if (len(samples), len(turns)) == (2, 2) else None

    spans = poll(arrived, 60, "the eval samples' spans in Phoenix")
    samples = [s for s in spans if s["attributes"].get("coterie.eval.run") == run_id]
    by_id = {s["context"]["span_id"]: s for s in spans}
    assert sorted(s["attributes"]["coterie.eval.sample"] for s in samples) == ["s1", "s2"]
    assert len({s["context"]["trace_id"] for s in samples}) == 2
    for sample in samples:
        assert sample["parent_id"] is None
        assert sample["attributes"]["coterie.eval.status"] == "ok"
        assert sample["attributes"]["coterie.eval.score"] == 1.0
        (turn,) = [
            s
            for s in spans
            if s["name"] == "invoke_agent tr-plain"
            and s["context"]["trace_id"] == sample["context"]["trace_id"]
        ]
        # The turn ran in an eval worker actor, under the driver's sample span.
        assert by_id[turn["parent_id"]] is sample
        assert turn["attributes"]["coterie.turn.context"] == "eval"


def test_a_request_to_coterie_serve_continues_the_caller_s_trace(
    rt: Runtime, phoenix: str, tmp_path: Any
) -> None:
    caller_trace, caller_span = secrets.token_hex(16), secrets.token_hex(8)

    async def post() -> list[tuple[int, str]]:
        app = build_app(rt.home, ServeSettings(), token="t0ken")
        set_backend(app, rt)
        server = TestServer(app)
        await server.start_server()
        out = []
        try:
            async with aiohttp.ClientSession(headers={"Authorization": "Bearer t0ken"}) as http:
                for conversation, parent in (
                    ("tr-plain:w3c", f"00-{caller_trace}-{caller_span}-01"),
                    # Not W3C (upper-case hex): a new trace, not a refusal.
                    ("tr-plain:bad", f"00-{caller_trace.upper()}-{caller_span}-01"),
                ):
                    async with http.post(
                        server.make_url("/v1/personas/tr-plain/messages"),
                        json={"text": "hello", "conversation_id": conversation},
                        headers={"traceparent": parent},
                    ) as response:
                        out.append((response.status, (await response.json())["reply"]["text"]))
                async with http.post(
                    server.make_url("/v1/chat/completions"),
                    json={"model": "tr-plain", "messages": [{"role": "user", "content": "hi"}]},
                    headers={"traceparent": f"00-{caller_trace}-{caller_span}-01"},
                ) as response:
                    body = await response.json()
                    out.append((response.status, body["choices"][0]["message"]["content"]))
        finally:
            await server.close()
        return out

    assert asyncio.run(post()) == [(200, "plain answer")] * 3
    rt.flush()
    tracing.tracer().flush()  # the server's spans: this process's

    def arrived() -> list[Span] | None:
        spans = all_spans(phoenix)
        posts = {s["context"]["span_id"] for s in spans if s["name"].startswith("POST /v1/")}
        # Ingested one batch at a time: the personas' spans may come after the server's.
        turns = [
            s for s in spans if s["name"].startswith("invoke_agent ") and s["parent_id"] in posts
        ]
        started = [s for s in spans if s["name"] == "activate_persona tr-plain"]
        return spans if (len(posts), len(turns), len(started)) == (3, 3, 1) else None

    spans = poll(arrived, 60, "the requests' spans in Phoenix")
    by_id = {s["context"]["span_id"]: s for s in spans}
    message = "POST /v1/personas/{name}/messages"
    continued = [s for s in spans if s["context"]["trace_id"] == caller_trace]
    names = sorted(s["name"] for s in continued if s["name"].startswith("POST "))
    assert names == ["POST /v1/chat/completions", message]
    for request in (s for s in continued if s["name"].startswith("POST ")):
        # The caller's span is the parent (Phoenix does not hold it: it is the caller's).
        assert request["parent_id"] == caller_span
        assert request["attributes"]["http.route"] == request["name"].removeprefix("POST ")
        assert request["attributes"]["http.request.method"] == "POST"
        assert request["attributes"]["http.response.status_code"] == 200
        children = [s for s in continued if s["parent_id"] == request["context"]["span_id"]]
        (turn,) = [s for s in children if s["name"].startswith("invoke_agent ")]
        assert turn["name"] == "invoke_agent tr-plain"
        assert by_id[turn["parent_id"]] is request
    # The first request found tr-plain's actor down: the router's start is under it.
    (activated,) = [s for s in spans if s["name"] == "activate_persona tr-plain"]
    assert by_id[activated["parent_id"]]["attributes"]["url.path"] == (
        "/v1/personas/tr-plain/messages"
    )
    (fresh,) = [
        s
        for s in spans
        if s["name"] == message
        and s["attributes"].get("url.path") == "/v1/personas/tr-plain/messages"
        and s["context"]["trace_id"] != caller_trace
    ]
    assert fresh["parent_id"] is None
    (turn,) = [
        s
        for s in spans
        if s["parent_id"] == fresh["context"]["span_id"] and s["name"].startswith("invoke_agent")
    ]
    assert turn["attributes"]["gen_ai.conversation.id"] == "tr-plain:bad"


def test_a_reminder_s_fire_and_its_turn_are_one_trace(rt: Runtime, phoenix: str) -> None:
    assert rt.ask("tr-remind", "remind me about tea").text == "Set."

    def fired() -> bool:
        return bool(
            rt.query(
                "select count(*) from events where kind = 'turn_ended' "
                "and conversation_id like 'tr-remind:job:%'"
            ).rows[0][0]
        )

    poll(fired, 60, "the reminder's turn")
    rt.flush()  # the scheduler's spans and the persona's

    def arrived() -> list[Span] | None:
        spans = all_spans(phoenix)
        fires = [
            s
            for s in spans
            if s["name"].startswith("schedule_fire ")
            and s["attributes"].get("gen_ai.agent.name") == "tr-remind"
        ]
        traces = {s["context"]["trace_id"] for s in fires}
        turns = [
            s
            for s in spans
            if s["name"] == "invoke_agent tr-remind" and s["context"]["trace_id"] in traces
        ]
        return spans if (len(fires), len(turns)) == (1, 1) else None

    spans = poll(arrived, 60, "the reminder's spans in Phoenix")
    (fire,) = [s for s in spans if s["name"].startswith("schedule_fire ")]
    (turn,) = [
        s
        for s in spans
        if s["name"] == "invoke_agent tr-remind"
        and s["context"]["trace_id"] == fire["context"]["trace_id"]
    ]
    # Sent by the scheduler's actor, the first span of its trace; the turn in
    # the persona's actor is its child.
    assert fire["parent_id"] is None
    assert fire["attributes"]["coterie.schedule.kind"] == "reminder"
    assert turn["parent_id"] == fire["context"]["span_id"]
    assert turn["attributes"]["coterie.schedule.kind"] == "reminder"
    assert turn["attributes"]["gen_ai.conversation.id"].startswith("tr-remind:job:")
