"""Traces of turns (runtime.tracing): spans, their structure and attributes,
the trace context an envelope carries, the settings, and tracing off."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any, cast

import pytest
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from coterie.runtime import tracing
from coterie.runtime.audit import AuditBuffer, AuditWriter
from coterie.runtime.audit.spool import read_spool
from coterie.runtime.config import RuntimeSettings, TracingSettings, with_tracing_resolved
from coterie.runtime.errors import ConfigError
from coterie.runtime.eval import RunOptions, open_store, plan_run
from coterie.runtime.messages import AssistantMessage, MessageEnvelope
from coterie.runtime.models.scripted import ScriptedModel, tool_call
from tests.test_eval_runner import flaky, graded_task, make_runner, write_task
from tests.test_personas_hub import build, results


def test_off_by_default_and_nothing_of_the_sdk_is_imported() -> None:
    code = (
        "import sys\n"
        "from coterie.runtime import tracing\n"
        "from coterie.runtime.config import TracingSettings\n"
        "import coterie.runtime.persona, coterie.runtime.loop\n"
        "t = tracing.setup(TracingSettings().resolved({}), process='x')\n"
        "assert not t.enabled\n"
        "assert tracing.tracer().start('a') is tracing.NOOP\n"
        "print(sorted(m for m in sys.modules if m.startswith('opentelemetry.sdk')))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_settings_from_the_standard_variables() -> None:
    off = TracingSettings().resolved({})
    assert off.enabled is False
    on = TracingSettings().resolved(
        {
            "OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318/",
            "OTEL_SERVICE_NAME": "ops",
            "OTEL_EXPORTER_OTLP_HEADERS": "Authorization=Bearer%20k,x-team=a",
        }
    )
    assert on.enabled is True
    assert on.endpoint == "http://collector:4318/v1/traces"
    assert on.service_name == "ops"
    assert on.headers == {"authorization": "Bearer k", "x-team": "a"}
    # The traces variable is taken as it is; the file's own values win.
    mine = TracingSettings(endpoint="https://mine:4318/v1/traces", service_name="me").resolved(
        {"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://other:1/v1/traces"}
    )
    assert (mine.endpoint, mine.service_name) == ("https://mine:4318/v1/traces", "me")
    # enabled: false and OTEL_SDK_DISABLED win over an endpoint.
    env = {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318"}
    assert TracingSettings(enabled=False).resolved(env).enabled is False
    assert (
        TracingSettings(enabled=True).resolved({**env, "OTEL_SDK_DISABLED": "true"}).enabled
        is False
    )
    # Enabled without an endpoint anywhere: a receiver on this machine.
    assert TracingSettings(enabled=True).resolved({}).endpoint == "http://localhost:4318/v1/traces"


def test_bad_settings_name_what_is_wrong() -> None:
    with pytest.raises(ValueError, match="endpoint: 'collector:4318' is not an http"):
        TracingSettings(endpoint="collector:4318")
    with pytest.raises(ValueError, match="is not a header name"):
        TracingSettings(headers={"bad name": "x"})
    with pytest.raises(ConfigError, match="tracing: OTEL_EXPORTER_OTLP_ENDPOINT: 'nope'"):
        with_tracing_resolved(RuntimeSettings(), {"OTEL_EXPORTER_OTLP_ENDPOINT": "nope"})
    with pytest.raises(ValueError, match=r"tracing\.bogus"):
        RuntimeSettings.model_validate({"tracing": {"bogus": 1}})


async def test_an_ask_chain_is_one_trace(tmp_path: Path, spans: InMemorySpanExporter) -> None:
    a = ScriptedModel(
        [
            AssistantMessage(
                tool_calls=[tool_call("ask_persona", {"persona": "b", "text": "sum?"})]
            ),
            "a done",
        ]
    )
    b = ScriptedModel(
        [AssistantMessage(tool_calls=[tool_call("calculate", {"expression": "2+3"})]), "five"]
    )
    hub = build(tmp_path, {"a": a, "b": b})
    reply = await hub.personas["a"].handle(
        MessageEnvelope(recipient="a", conversation_id="a:t", text="go")
    )
    assert reply.text == "a done"
    assert results(a)[-1].content == "five"
    tracing.tracer().flush()
    finished = spans.get_finished_spans()
    by_name = {s.name: s for s in finished}
    assert sorted(by_name) == sorted(
        [
            "invoke_agent a",
            "chat scripted",
            "execute_tool ask_persona",
            "invoke_agent b",
            "execute_tool calculate",
        ]
    )
    assert len({s.context.trace_id for s in finished}) == 1
    parent = {s.name: s.parent.span_id if s.parent else None for s in finished}
    ids = {s.name: s.context.span_id for s in finished}
    assert parent["invoke_agent a"] is None
    assert parent["execute_tool ask_persona"] == ids["invoke_agent a"]
    # The callee's turn is a child of the call that asked.
    assert parent["invoke_agent b"] == ids["execute_tool ask_persona"]
    assert parent["execute_tool calculate"] == ids["invoke_agent b"]
    chats = [s for s in finished if s.name == "chat scripted"]
    assert len(chats) == 4
    assert {c.parent.span_id for c in chats if c.parent} == {
        ids["invoke_agent a"],
        ids["invoke_agent b"],
    }
    turn = by_name["invoke_agent b"].attributes
    assert turn["gen_ai.operation.name"] == "invoke_agent"
    assert turn["gen_ai.agent.name"] == "b"
    assert turn["gen_ai.conversation.id"] == "b:inbox:a"
    assert turn["coterie.turn.status"] == "ok"
    assert turn["coterie.sender"] == "a"
    calc = by_name["execute_tool calculate"].attributes
    assert calc["gen_ai.tool.name"] == "calculate"
    assert '"2+3"' in calc["gen_ai.tool.call.arguments"]
    assert calc["gen_ai.tool.call.result"] == "5"
    chat = chats[0].attributes
    assert chat["gen_ai.operation.name"] == "chat"
    assert chat["gen_ai.provider.name"] == "scripted"
    assert chat["gen_ai.usage.input_tokens"] >= 0
    assert "gen_ai.usage.output_tokens" in chat


async def test_a_failed_tool_marks_its_span(tmp_path: Path, spans: InMemorySpanExporter) -> None:
    a = ScriptedModel([AssistantMessage(tool_calls=[tool_call("calculate", {"expr": "1"})]), "ok"])
    hub = build(tmp_path, {"a": a})
    await hub.personas["a"].handle(MessageEnvelope(recipient="a", conversation_id="a:t", text="x"))
    tracing.tracer().flush()
    (tool,) = [s for s in spans.get_finished_spans() if s.name == "execute_tool calculate"]
    assert tool.status.is_ok is False
    assert tool.attributes["error.type"] == "invalid_arguments"


def test_an_envelope_outside_a_span_carries_nothing() -> None:
    assert MessageEnvelope(recipient="a", conversation_id="c", text="t").trace is None


async def test_an_audit_row_carries_its_spans_ids(
    tmp_path: Path, spans: InMemorySpanExporter
) -> None:
    """A turn's rows name the span they were recorded in, through the spool
    and into DuckDB: one leads to the other."""
    rx: list[dict[str, object]] = []

    async def send(rows: list[dict[str, object]]) -> None:
        rx.extend(rows)

    spool = tmp_path / "spool.jsonl"
    buf = AuditBuffer(send, replay=send, spool_path=spool, interval=60)
    a = ScriptedModel(
        [AssistantMessage(tool_calls=[tool_call("calculate", {"expression": "1+1"})]), "2"]
    )
    hub = build(tmp_path, {"a": a})
    hub.personas["a"].services.audit = buf
    await hub.personas["a"].handle(MessageEnvelope(recipient="a", conversation_id="a:t", text="x"))
    # Written ahead: the spool holds every row with its span's ids.
    spooled, _, bad = read_spool(spool)
    assert bad == 0
    await buf.flush()
    await buf.aclose()
    tracing.tracer().flush()
    by_id = {format(s.context.span_id, "016x"): s for s in spans.get_finished_spans()}
    (trace_id,) = {format(s.context.trace_id, "032x") for s in by_id.values()}
    rows = {r["id"]: r for r in rx}
    assert {r["id"]: (r["trace_id"], r["span_id"]) for r in spooled} == {
        i: (r["trace_id"], r["span_id"]) for i, r in rows.items()
    }
    # Every row of the turn, from its start to its end, is in one of its spans.
    assert rx and all(r["trace_id"] == trace_id for r in rx)
    kinds = {r["kind"]: by_id[str(r["span_id"])].name for r in rx}
    assert kinds["turn_started"] == kinds["turn_ended"] == "invoke_agent a"
    assert kinds["model_call"] == "chat scripted"
    assert kinds["tool_result"] == "execute_tool calculate"
    with AuditWriter(tmp_path / "audit.duckdb") as w:
        w.write_rows(list(rows.values()))
        got = w.query(
            "select trace_id, span_id from events where kind = 'model_call' order by seq"
        ).rows
    assert got and {row[0] for row in got} == {trace_id}
    assert by_id[got[0][1]].name == "chat scripted"


# -- eval samples -------------------------------------------------------------------


def _tree(finished: Any) -> tuple[dict[int, Any], dict[int, int | None]]:
    by_id = {s.context.span_id: s for s in finished}
    return by_id, {s.context.span_id: s.parent.span_id if s.parent else None for s in finished}


async def test_an_eval_sample_and_its_grading_are_one_trace(
    tmp_path: Path, spans: InMemorySpanExporter
) -> None:
    home = tmp_path / "home"
    path = graded_task(
        home,
        tmp_path,
        [
            {"id": "q1", "input": "Capital of France?", "target": "Paris"},
            {"id": "q2", "input": "Capital of France, again?", "target": "Paris"},
        ],
    )
    store = open_store(home)
    plan = plan_run(path, home, store, RunOptions())
    await make_runner(plan, store, tmp_path).run()
    tracing.tracer().flush()
    finished = spans.get_finished_spans()
    by_id, parent = _tree(finished)
    samples = [s for s in finished if s.name == "eval_sample graded"]
    assert sorted(s.attributes["coterie.eval.sample"] for s in samples) == ["q1", "q2"]
    # Each sample is the first span of its own trace.
    assert len({s.context.trace_id for s in samples}) == 2
    for sample in samples:
        attrs = sample.attributes
        assert attrs["gen_ai.operation.name"] == "eval_sample"
        assert attrs["coterie.eval.run"] == plan.run.run_id
        assert attrs["coterie.eval.task"] == "graded"
        assert (attrs["coterie.eval.epoch"], attrs["coterie.eval.attempts"]) == (1, 1)
        assert attrs["coterie.eval.status"] == "ok"
        assert (attrs["coterie.eval.scorer"], attrs["coterie.eval.score"]) == ("model_graded", 1.0)
        assert parent[sample.context.span_id] is None
        turns = sorted(
            by_id[i].name
            for i, p in parent.items()
            if p == sample.context.span_id and by_id[i].name.startswith("invoke_agent")
        )
        # The solver's turn and the grader's turn are both children of the sample.
        assert turns == ["invoke_agent judge", "invoke_agent student"]
        inside = [s for s in finished if s.context.trace_id == sample.context.trace_id]
        assert sum(s.name.startswith("chat ") for s in inside) == 2


async def test_a_retried_sample_s_attempts_are_under_its_span(
    tmp_path: Path, spans: InMemorySpanExporter
) -> None:
    home = tmp_path / "home"
    (home / "personas").mkdir(parents=True)
    model = {"provider": "scripted", "rules": [], "default": "ok"}
    path = write_task(
        tmp_path,
        {
            "name": "retry",
            "solver": {"inline": {"model": model}},
            "scorers": [{"type": "includes"}],
            "retries": 2,
        },
        [
            {"id": "a", "input": "alpha", "target": "alpha"},
            {"id": "c", "input": "gamma", "target": "gamma"},
        ],
    )
    store = open_store(home)
    plan = plan_run(path, home, store, RunOptions())
    await make_runner(plan, store, tmp_path, models=flaky({"alpha": 1, "gamma": 9})).run()
    tracing.tracer().flush()
    finished = spans.get_finished_spans()
    by_id, parent = _tree(finished)
    samples = {
        s.attributes["coterie.eval.sample"]: s for s in finished if s.name == "eval_sample retry"
    }
    ok, failed = samples["a"], samples["c"]
    assert (ok.attributes["coterie.eval.status"], ok.attributes["coterie.eval.attempts"]) == (
        "ok",
        2,
    )
    assert ok.status.is_ok and ok.attributes["coterie.eval.score"] == 1.0
    assert failed.attributes["coterie.eval.status"] == "error"
    assert failed.attributes["coterie.eval.attempts"] == 3
    assert failed.status.is_ok is False
    assert "upstream broke" in (failed.status.description or "")
    assert "coterie.eval.score" not in failed.attributes  # an error is never scored
    for sample, attempts in ((ok, 2), (failed, 3)):
        turns = [
            by_id[i]
            for i, p in parent.items()
            if p == sample.context.span_id and by_id[i].name.startswith("invoke_agent")
        ]
        assert len(turns) == attempts
        # Each attempt is its own conversation, tagged with its number.
        assert sorted(t.attributes["gen_ai.conversation.id"][-1] for t in turns) == [
            str(n) for n in range(1, attempts + 1)
        ]


@pytest.mark.parametrize(
    ("headers", "expected"),
    [
        (
            {"traceparent": f"00-{'a' * 32}-{'b' * 16}-01"},
            {"traceparent": f"00-{'a' * 32}-{'b' * 16}-01"},
        ),
        (
            {"traceparent": f"00-{'a' * 32}-{'b' * 16}-00", "tracestate": "vendor=x"},
            {"traceparent": f"00-{'a' * 32}-{'b' * 16}-00", "tracestate": "vendor=x"},
        ),
        # A tracestate past the W3C length is dropped; the parent is kept.
        (
            {"traceparent": f"00-{'a' * 32}-{'b' * 16}-01", "tracestate": "v=" + "x" * 600},
            {"traceparent": f"00-{'a' * 32}-{'b' * 16}-01"},
        ),
        ({}, None),
        ({"traceparent": f"00-{'A' * 32}-{'b' * 16}-01"}, None),  # upper-case hex
        ({"traceparent": f"ff-{'a' * 32}-{'b' * 16}-01"}, None),  # the forbidden version
        ({"traceparent": f"00-{'0' * 32}-{'b' * 16}-01"}, None),  # an all-zero trace id
        ({"traceparent": f"00-{'a' * 32}-{'0' * 16}-01"}, None),  # an all-zero parent id
        ({"traceparent": f"00-{'a' * 31}-{'b' * 16}-01"}, None),  # too short
        ({"traceparent": "garbage", "tracestate": "v=1"}, None),
    ],
)
def test_an_incoming_traceparent_is_used_only_when_valid(
    headers: dict[str, str], expected: dict[str, str] | None
) -> None:
    assert tracing.incoming(headers) == expected


async def test_a_request_to_no_route_is_a_span_named_by_its_method_alone(spans: Any) -> None:
    from aiohttp import ClientSession
    from aiohttp.test_utils import TestServer

    from coterie.runtime.config import ServeSettings
    from coterie.runtime.serve.app import build_app, set_backend

    app = build_app(Path("."), ServeSettings(), token="t0ken")
    set_backend(app, cast(Any, object()))  # up: no route is answered by the router's 404
    server = TestServer(app)
    await server.start_server()
    try:
        async with ClientSession(headers={"Authorization": "Bearer t0ken"}) as http:
            for path in ("/v1/no/such/route/1", "/v1/no/such/route/2"):
                async with http.post(server.make_url(path), json={}) as response:
                    assert response.status == 404
    finally:
        await server.close()
    tracing.tracer().flush()
    requests = [s for s in spans.get_finished_spans() if s.name.startswith("POST")]
    # One name however many paths callers send; the path is an attribute.
    assert [s.name for s in requests] == ["POST", "POST"]
    assert "http.route" not in requests[0].attributes
    assert requests[0].attributes["url.path"] == "/v1/no/such/route/1"
    assert requests[0].attributes["http.response.status_code"] == 404
