"""The models that need no network: persona.yaml rules, and the stand-in for a
model that could not be built."""

from __future__ import annotations

import pytest

from coterie.runtime.config import ScriptedModelConfig
from coterie.runtime.errors import MissingAPIKeyError, ModelTimeoutError
from coterie.runtime.messages import (
    AssistantMessage,
    ModelRequest,
    ToolChoiceNamed,
    ToolChoiceNone,
    ToolResultMessage,
    TurnContextKind,
    UserMessage,
)
from coterie.runtime.models import (
    RulesModel,
    UnavailableModel,
    build_model,
    build_model_or_unavailable,
)
from coterie.runtime.models.openai_chat import OpenAIChatModel


def rules(*rules: dict[str, object], **config: object) -> RulesModel:
    return RulesModel(
        ScriptedModelConfig.model_validate({"provider": "scripted", "rules": rules, **config})
    )


def request(
    text: str = "hello",
    *,
    step: int = 1,
    context: TurnContextKind = "user",
    results: tuple[str, ...] = (),
    **fields: object,
) -> ModelRequest:
    messages: list[UserMessage | AssistantMessage | ToolResultMessage] = [UserMessage(text=text)]
    if results:
        messages.append(AssistantMessage(text=""))
        messages += [
            ToolResultMessage(call_id=f"c{i}", name="t", content=r) for i, r in enumerate(results)
        ]
    return ModelRequest(
        system="s",
        messages=messages,  # type: ignore[arg-type]
        step=step,
        context=context,
        **fields,  # type: ignore[arg-type]
    )


async def text_of(model: RulesModel, req: ModelRequest) -> str:
    return (await model.request(req)).message.text


async def test_rules_match_on_turn_contains_and_context() -> None:
    model = rules(
        {"when": {"context": "cron"}, "text": "cron work"},
        {"when": {"turn": 1, "contains": "TIME"}, "text": "first step about time"},
        {"when": {"turn": 2}, "text": "second step"},
        default="nothing matched",
    )
    assert await text_of(model, request("what time is it")) == "first step about time"
    assert await text_of(model, request("hello")) == "nothing matched"
    assert await text_of(model, request("hello", step=2)) == "second step"
    # when.context: only turns of that kind match.
    assert await text_of(model, request("what time is it", context="cron")) == "cron work"
    assert await text_of(model, request("hello", context="heartbeat")) == "nothing matched"


async def test_rule_templates_and_tool_calls() -> None:
    model = rules(
        {"when": {"turn": 1}, "tool_calls": [{"name": "clock", "arguments": {}}]},
        {
            "when": {"turn": 2},
            "text": "last={last_tool_result} 1={tool_result_1} all={tool_results}",
        },
    )
    first = (await model.request(request())).message
    assert [c.name for c in first.tool_calls] == ["clock"] and first.tool_calls[0].id
    second = await text_of(model, request(step=2, results=("a", "b")))
    assert second == "last=b 1=a all=a\nb"


async def test_tool_choice_is_obeyed() -> None:
    model = rules({"when": {"turn": 1}, "text": "hi", "tool_calls": [{"name": "clock"}]})
    withdrawn = (await model.request(request(tool_choice=ToolChoiceNone()))).message
    assert withdrawn.tool_calls == [] and withdrawn.text == "hi"
    forced = rules().answer(request(step=3, tool_choice=ToolChoiceNamed(name="end_task")))
    assert [(c.name, c.arguments) for c in forced.tool_calls] == [("end_task", {"status": "ok"})]


async def test_max_tokens_cuts_a_long_text() -> None:
    model = rules({"text": "x" * 100})
    response = await model.request(request(max_tokens=5))
    assert response.message.text == "x" * 20 and response.stop_reason == "max_tokens"
    full = await model.request(request())
    assert len(full.message.text) == 100 and full.stop_reason == "end_turn"


async def test_latency_beyond_the_timeout_times_out() -> None:
    slow = rules(default="late", latency_ms=300, timeout=0.05)
    with pytest.raises(ModelTimeoutError, match=r"within 0\.05s"):
        await slow.request(request())
    assert await text_of(rules(default="in time", latency_ms=10, timeout=1), request()) == (
        "in time"
    )


def test_scripted_config_refuses_what_it_would_ignore() -> None:
    with pytest.raises(ValueError, match="max_retries"):
        ScriptedModelConfig.model_validate({"provider": "scripted", "max_retries": 2})
    with pytest.raises(ValueError, match="context"):
        ScriptedModelConfig.model_validate(
            {"provider": "scripted", "rules": [{"when": {"context": "crn"}, "text": "x"}]}
        )


async def test_unbuildable_model_fails_each_request_with_the_reason(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from coterie.runtime.config import OpenAIModelConfig

    monkeypatch.delenv("NO_SUCH_TEST_KEY", raising=False)
    config = OpenAIModelConfig(provider="openai", name="gpt-x", api_key_env="NO_SUCH_TEST_KEY")
    with pytest.raises(MissingAPIKeyError):
        build_model(config)
    model = build_model_or_unavailable(config)
    assert isinstance(model, UnavailableModel)
    assert (model.provider, model.name) == ("openai", "gpt-x")
    for _ in range(2):
        with pytest.raises(MissingAPIKeyError, match="NO_SUCH_TEST_KEY"):
            await model.request(request())
    monkeypatch.setenv("NO_SUCH_TEST_KEY", "sk-test")
    assert isinstance(build_model_or_unavailable(config), OpenAIChatModel)
