"""A persona's requests keep their cached prefix byte-stable from turn to turn."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from coterie.runtime.config import AnthropicModelConfig, load_persona
from coterie.runtime.messages import MessageEnvelope, ModelCalled
from coterie.runtime.models.anthropic_messages import AnthropicModel
from coterie.runtime.persona import PersonaRuntime
from coterie.runtime.services import NullAudit, Services
from coterie.tools import builtin_registry
from tests.fakes import FakeAnthropicServer
from tests.helpers import scripted, write_persona


def unmarked(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: unmarked(v) for k, v in value.items() if k != "cache_control"}
    if isinstance(value, list):
        return [unmarked(v) for v in value]
    return value


async def test_turns_of_a_persona_keep_the_cached_prefix_byte_stable(tmp_path: Path) -> None:
    write_persona(tmp_path, "solo", scripted(), soul="You are solo, a careful assistant.")
    persona = load_persona(tmp_path, "solo")
    audit = NullAudit()
    with FakeAnthropicServer() as server:
        config = AnthropicModelConfig.model_validate(
            {"provider": "anthropic", "name": "claude-sonnet-4-5", "base_url": server.base_url}
        )
        model = AnthropicModel(config, api_key="sk-ant-test")
        rt = PersonaRuntime(
            persona, model=model, registry=builtin_registry(), services=Services(audit=audit)
        )
        server.enqueue_text("first answer", usage=(1200, 5), cache_write=0)
        server.enqueue_text("second answer", usage=(40, 5), cache_read=1150, cache_write=60)
        try:
            for text in ("hello", "and again"):
                await rt.handle(
                    MessageEnvelope(recipient="solo", conversation_id="solo:c", text=text)
                )
        finally:
            await model.aclose()
        first, second = server.requests[-2:]
    # The system prompt and the tools are the same bytes, markers included.
    assert json.dumps(first["system"]) == json.dumps(second["system"])
    assert json.dumps(first["tools"]) == json.dumps(second["tools"])
    assert first["system"][-1]["cache_control"] == {"type": "ephemeral"}
    assert first["tools"][-1]["cache_control"] == {"type": "ephemeral"}
    # The history the first call sent is the start of the second, unchanged.
    n = len(first["messages"])
    assert unmarked(second["messages"][:n]) == unmarked(first["messages"])
    # The cache figures reach the audit log, with a cost (Sonnet has a price).
    calls = [e for e in audit.events if isinstance(e, ModelCalled)]
    assert [(c.input_tokens, c.cache_read_tokens, c.cache_write_tokens) for c in calls] == [
        (1200, 0, 0),
        (1250, 1150, 60),
    ]
    assert calls[1].cost_usd is not None and calls[1].cost_usd < calls[0].cost_usd  # type: ignore[operator]
