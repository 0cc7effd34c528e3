"""Metrics (runtime.metrics): turn events counted on a meter, and on Ray read
back from the node's metrics export endpoint (Prometheus text)."""

from __future__ import annotations

import re
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from coterie import Runtime
from coterie.runtime.config import RuntimeSettings
from coterie.runtime.messages import (
    AssistantMessage,
    DelegationEvent,
    MessageEnvelope,
    ModelCalled,
    ToolFinished,
    TurnEnded,
    TurnStarted,
)
from coterie.runtime.metrics import METRICS, EventMetrics, RecordingMeter
from coterie.runtime.models.scripted import ScriptedModel, tool_call
from tests.helpers import poll, scripted, write_persona
from tests.test_personas_hub import build

IDS = {"persona": "p", "conversation_id": "c", "turn_id": "t"}


def test_events_become_counts_and_gauges() -> None:
    meter = RecordingMeter()
    gauges = {"coterie_messages_queued": ({"persona": "p"}, 3.0)}
    metrics = EventMetrics(meter, sample=lambda: gauges)
    metrics(TurnStarted(**IDS, context="cron", queue_wait_ms=12.5))
    metrics(
        ModelCalled(
            **IDS,
            provider="openai",
            model="m",
            step=1,
            latency_ms=40,
            input_tokens=100,
            output_tokens=7,
            cost_usd=0.25,
            billed_to="lead",
        )
    )
    metrics(ModelCalled(**IDS, provider="openai", model="m", step=2, latency_ms=1, error="500"))
    metrics(ToolFinished(**IDS, call_id="1", tool="shell", duration_ms=3, result="x"))
    metrics(
        ToolFinished(
            **IDS, call_id="2", tool="shell", duration_ms=3, result="x", error_kind="timeout"
        )
    )
    handle = {"handle": "h", "work": "subagent", "child_conversation_id": "h"}
    metrics(DelegationEvent(**IDS, **handle, phase="started"))
    metrics(DelegationEvent(**IDS, **handle, phase="started"))
    metrics(DelegationEvent(**IDS, **handle, phase="finished", status="ok"))
    metrics(TurnEnded(**IDS, status="ok", steps=2, duration_ms=900))

    assert meter.total("coterie_turns_started", persona="p", context="cron") == 1
    assert meter.values[("histogram", "coterie_queue_wait_ms", (("persona", "p"),))] == [12.5]
    assert meter.total("coterie_model_calls", outcome="ok") == 1
    assert meter.total("coterie_model_calls", outcome="error") == 1
    assert meter.total("coterie_model_tokens", kind="input") == 100
    assert meter.total("coterie_model_tokens", kind="output") == 7
    assert meter.total("coterie_model_tokens", kind="cache_read") == 0  # none: not counted
    assert meter.total("coterie_model_cost_usd", billed_to="lead") == 0.25
    assert meter.total("coterie_tool_calls", tool="shell") == 2
    assert meter.total("coterie_tool_errors", tool="shell", error_kind="timeout") == 1
    assert meter.total("coterie_delegations_running", work="subagent") == 1
    assert meter.total("coterie_turns_finished", status="ok") == 1
    assert meter.values[("gauge", "coterie_turns_running", (("persona", "p"),))] == [1, 0]
    # Sampled at the turn's start and at its end.
    assert meter.values[("gauge", "coterie_messages_queued", (("persona", "p"),))] == [3.0, 3.0]


def test_a_failing_meter_never_fails_the_recording(caplog: pytest.LogCaptureFixture) -> None:
    class Broken(RecordingMeter):
        def count(self, name: str, value: float, tags: Any) -> None:
            raise RuntimeError("backend down")

    metrics = EventMetrics(Broken())
    metrics(TurnStarted(**IDS))
    metrics(TurnStarted(**IDS))
    assert len([r for r in caplog.records if r.name == "coterie.metrics"]) == 1  # logged once


def test_a_metric_with_the_wrong_tags_is_refused() -> None:
    meter = RecordingMeter()
    with pytest.raises(ValueError, match=r"coterie_tool_calls.*takes tags"):
        meter.count("coterie_tool_calls", 1, {"tool": "x"})
    with pytest.raises(KeyError, match="unknown metric"):
        meter.count("coterie_nope", 1, {})
    with pytest.raises(TypeError, match="is a gauge"):
        meter.count("coterie_turns_running", 1, {"persona": "p"})


async def test_an_in_process_turn_is_counted_through_its_audit_buffer(tmp_path: Path) -> None:
    from coterie.runtime.audit import AuditBuffer

    async def send(rows: list[dict[str, Any]]) -> None:
        return None

    meter = RecordingMeter()
    buf = AuditBuffer(send, interval=60, observer=EventMetrics(meter))
    model = ScriptedModel(
        [AssistantMessage(tool_calls=[tool_call("calculate", {"expression": "1+1"})]), "2"]
    )
    hub = build(tmp_path, {"a": model})
    hub.personas["a"].services.audit = buf
    await hub.personas["a"].handle(MessageEnvelope(recipient="a", conversation_id="a:t", text="x"))
    await buf.aclose()
    assert meter.total("coterie_turns_finished", persona="a", status="ok") == 1
    assert meter.total("coterie_tool_calls", persona="a", tool="calculate") == 1
    assert meter.total("coterie_model_calls", provider="scripted") == 2
    (waits,) = [v for (k, n, _), v in meter.values.items() if n == "coterie_queue_wait_ms"]
    assert len(waits) == 1 and waits[0] >= 0


# -- on Ray ----------------------------------------------------------------------

_LINE = re.compile(r"^(?P<name>[a-z_]+)\{(?P<labels>[^}]*)\} (?P<value>\S+)$")


def scrape(url: str) -> list[tuple[str, dict[str, str], float]]:
    with urllib.request.urlopen(url, timeout=10) as response:
        text = response.read().decode()
    samples = []
    for line in text.splitlines():
        match = _LINE.match(line)
        if match:
            labels = dict(re.findall(r'(\w+)="((?:[^"\\]|\\.)*)"', match["labels"]))
            samples.append((match["name"], labels, float(match["value"])))
    return samples


def value(samples: list[tuple[str, dict[str, str], float]], name: str, **labels: str) -> float:
    """The sum over processes of ``name``'s samples with ``labels``."""
    return sum(v for n, have, v in samples if n == name and labels.items() <= have.items())


@pytest.fixture(scope="module")
def rt(tmp_path_factory: pytest.TempPathFactory, ray_session: None) -> Iterator[Runtime]:
    home = tmp_path_factory.mktemp("metered")
    ask = {"persona": "mx-back", "text": "what is 2+3?"}
    write_persona(
        home,
        "mx-front",
        scripted(
            [
                {"when": {"turn": 1}, "tool_calls": [{"name": "ask_persona", "arguments": ask}]},
                {"when": {"tool_result": True}, "text": "front heard: {tool_results}"},
            ]
        ),
    )
    write_persona(
        home,
        "mx-back",
        scripted(
            [
                {
                    "when": {"turn": 1},
                    "tool_calls": [
                        {"name": "calculate", "arguments": {"expression": "2+3"}},
                        {"name": "calculate", "arguments": {"expr": "bad"}},
                    ],
                },
                {"when": {"tool_result": True}, "text": "{tool_result_1}"},
            ]
        ),
    )
    runtime = Runtime.start(home=home, settings=RuntimeSettings(idle_timeout=None))
    yield runtime
    runtime.shutdown()


def test_an_ask_chain_shows_in_rays_metrics_endpoint(rt: Runtime, ray_metrics_url: str) -> None:
    reply = rt.ask("mx-front", "go")
    assert reply.status == "ok" and "5" in reply.text, reply.error
    calls = rt.query(
        "select sum(input_tokens), sum(output_tokens) from events "
        "where kind = 'model_call' and persona like 'mx-%'"
    ).rows[0]

    def counted() -> list[tuple[str, dict[str, str], float]] | None:
        samples = scrape(ray_metrics_url)
        done = value(samples, "ray_coterie_turns_finished_total", persona="mx-front")
        tools = value(samples, "ray_coterie_tool_calls_total", persona="mx-back")
        return samples if (done, tools) == (1, 2) else None

    # Ray's agent exports every few seconds.
    samples = poll(counted, 60, "the chain's counts on the metrics endpoint")
    assert value(samples, "ray_coterie_turns_finished_total", persona="mx-back", status="ok") == 1
    assert (
        value(samples, "ray_coterie_turns_started_total", persona="mx-front", context="user") == 1
    )
    assert (
        value(
            samples,
            "ray_coterie_tool_errors_total",
            persona="mx-back",
            tool="calculate",
            error_kind="invalid_arguments",
        )
        == 1
    )
    assert (
        value(samples, "ray_coterie_tool_calls_total", persona="mx-front", tool="ask_persona") == 1
    )
    # The tokens are the audit log's (every coterie persona here is an mx- one
    # or another test's; the mx- ones are tagged by their billed persona).
    assert calls[0] > 0
    assert value(samples, "ray_coterie_turn_duration_ms_count", persona="mx-back") == 1
    assert value(samples, "ray_coterie_queue_wait_ms_count", persona="mx-front") == 1
    assert value(samples, "ray_coterie_turns_running", persona="mx-front") == 0
    assert value(samples, "ray_coterie_personas_live", runtime=rt.id) == 2
    assert value(samples, "ray_coterie_model_tokens_total", provider="scripted", kind="input") > 0


def test_every_metric_is_in_the_guide() -> None:
    guide = (Path(__file__).parents[1] / "docs" / "watching.md").read_text()
    missing = [name for name in METRICS if f"`{name}" not in guide]
    assert missing == []
    # Ray takes only ASCII descriptions.
    assert [m.name for m in METRICS.values() if not m.description.isascii()] == []
