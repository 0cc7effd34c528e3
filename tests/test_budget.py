"""Money: prices, costs on model_call events, and budgets kept before each call."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from coterie.runtime.config import BudgetSettings, ModelPrice, RuntimeSettings, load_persona
from coterie.runtime.errors import BudgetExceededError
from coterie.runtime.hub import LocalHub
from coterie.runtime.messages import (
    BudgetWarning,
    MessageEnvelope,
    ModelCalled,
    ModelRequest,
    Usage,
)
from coterie.runtime.models.scripted import FunctionModel, latest_user_text, tool_call
from coterie.runtime.persona import PersonaHost, PersonaRuntime
from coterie.runtime.services import NullAudit, Services
from coterie.runtime.usage import prices as prices_module
from coterie.runtime.usage.budget import BudgetLedger, PersonaBudgets, period_start, spent_sql
from coterie.runtime.usage.prices import PriceTable, cost_of
from coterie.tools import builtin_registry
from tests.helpers import scripted, write_persona

#: $1 per thousand tokens, in and out: easy sums.
PRICE = ModelPrice(input=1000, output=1000)


def ledger(
    *, runtime: BudgetSettings | None = None, spent: float = 0.0, **personas: BudgetSettings
) -> BudgetLedger:
    async def limits_of(name: str) -> BudgetSettings:
        return personas.get(name, BudgetSettings())

    async def spent_since(payer: str | None, since: datetime) -> float:
        return spent

    return BudgetLedger(
        runtime=runtime or BudgetSettings(),
        limits_of=limits_of,
        spent_since=spent_since,
        tz=UTC,
    )


def test_costs_from_the_price_table() -> None:
    table = PriceTable.from_settings({"my-model*": PRICE})
    usage = Usage(
        input_tokens=1000, output_tokens=100, cache_read_tokens=600, cache_write_tokens=100
    )
    # Sonnet: 300 uncached at $3, 600 read at $0.30, 100 written at $3.75, 100 out at $15.
    sonnet = table.cost("anthropic", "claude-sonnet-4-5", usage)
    assert sonnet == pytest.approx((300 * 3 + 600 * 0.3 + 100 * 3.75 + 100 * 15) / 1e6)
    # Longest pattern wins: gpt-4o-mini is not priced as gpt-4o.
    assert table.price("openai", "gpt-4o-mini-2024") == table.price("openai", "gpt-4o-mini")
    assert table.price("openai", "gpt-4o-mini").input == 0.15  # type: ignore[union-attr]
    # An override applies to any provider; an unknown model has no price, never 0.
    assert table.cost("function", "my-model-2", usage) == pytest.approx(cost_of(PRICE, usage))
    assert table.cost("openai", "some-local-llama", usage) is None
    assert table.cost("anthropic", "gpt-4o", usage) is None  # defaults are per provider
    assert table.cost("scripted", "anything", usage) == 0.0


def test_a_table_matches_a_models_patterns_once_and_keeps_few(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Every model call asks for its price: the patterns are matched once per
    model, answers (an unknown model's None too) stay the same, and a table
    asked about ever new names keeps at most a few hundred."""
    matched: list[str] = []
    best = prices_module._best

    def counting(patterns: Any, name: str) -> Any:
        matched.append(name)
        return best(patterns, name)

    monkeypatch.setattr(prices_module, "_best", counting)
    table = PriceTable.from_settings({"my-model*": PRICE})
    first = [table.price("openai", "gpt-4o-mini"), table.price("openai", "local-llama")]
    calls = len(matched)
    for _ in range(3):
        assert [table.price("openai", "gpt-4o-mini"), table.price("openai", "local-llama")] == first
    assert len(matched) == calls
    assert first[0] is not None and first[0].input == 0.15 and first[1] is None
    # Another table (runtime.yaml's prices changed) matches afresh.
    assert PriceTable.from_settings({"gpt-4o-mini": PRICE}).price("openai", "gpt-4o-mini") == PRICE
    for i in range(1000):
        table.price("openai", f"made-up-{i}")
    assert len(table._found) <= prices_module._KEPT_PRICES


async def test_an_unknown_model_costs_null_on_its_model_call(tmp_path: Path) -> None:
    write_persona(tmp_path, "solo", scripted())
    audit = NullAudit()
    rt = PersonaRuntime(
        load_persona(tmp_path, "solo"),
        model=FunctionModel(lambda r: "hi", name="mystery-7b"),
        registry=builtin_registry(),
        services=Services(audit=audit),
    )
    await rt.handle(MessageEnvelope(recipient="solo", conversation_id="solo:c", text="hello"))
    (call,) = [e for e in audit.events if isinstance(e, ModelCalled)]
    assert call.cost_usd is None and call.priced is False
    assert call.input_tokens > 0 and call.billed_to == "solo" and call.context == "user"


async def test_reservations_hold_until_settled() -> None:
    books = ledger(solo=BudgetSettings(daily_usd=1.0))
    first = await books.reserve("solo", 0.6, model="m", persona="solo", conversation_id="c")
    assert first.ticket is not None
    # 0.6 held + 0.5 > 1.0: refused while the first runs.
    with pytest.raises(BudgetExceededError, match=r"persona 'solo'.*daily budget of \$1\.00"):
        await books.reserve("solo", 0.5, model="m", persona="solo", conversation_id="c")
    # The first cost less than it held: the second fits now.
    await books.settle(first.ticket, 0.2)
    second = await books.reserve("solo", 0.5, model="m", persona="solo", conversation_id="c")
    assert second.ticket is not None and books.held() == pytest.approx(0.5)


async def test_a_charge_counts_what_was_spent_without_a_reservation() -> None:
    # What a coding agent reported it spent: it cannot be refused, but it counts.
    books = ledger(solo=BudgetSettings(daily_usd=1.0, warn_at=0.5))
    first = await books.reserve("solo", 0.1, model="m", persona="solo", conversation_id="c")
    assert first.ticket is not None
    await books.settle(first.ticket, 0.1)
    (warning,) = await books.charge("solo", 0.7, persona="solo", conversation_id="c")
    assert warning.scope == "persona 'solo'" and warning.spent_usd == pytest.approx(0.8)
    with pytest.raises(BudgetExceededError, match=r"spent \$0\.8000"):
        await books.reserve("solo", 0.3, model="m", persona="solo", conversation_id="c")
    # A period not counted yet is left to the log (which holds the call's row).
    assert await books.charge("other", 5.0, persona="other", conversation_id="c") == []
    assert await books.reserve("other", 1.0, model="m", persona="other", conversation_id="c")


async def test_a_payer_without_a_budget_is_never_held() -> None:
    books = ledger(other=BudgetSettings(daily_usd=0.01))
    reservation = await books.reserve("solo", 100.0, model="m", persona="solo", conversation_id="c")
    assert reservation.ticket is None


async def test_a_warning_once_a_period_past_warn_at() -> None:
    books = ledger(solo=BudgetSettings(monthly_usd=10.0, warn_at=0.5))
    warnings: list[BudgetWarning] = []
    for _ in range(4):
        r = await books.reserve("solo", 2.0, model="m", persona="solo", conversation_id="c")
        assert r.ticket is not None
        warnings += await books.settle(r.ticket, 2.0)
    assert [(w.period, w.spent_usd, w.exceeded) for w in warnings] == [("month", 6.0, False)]


async def test_what_was_spent_before_counts() -> None:
    books = ledger(runtime=BudgetSettings(daily_usd=1.0), spent=0.9)
    with pytest.raises(BudgetExceededError, match="the runtime has spent"):
        await books.reserve("anyone", 0.2, model="m", persona="anyone", conversation_id="c")


async def test_a_budgeted_payer_cannot_use_a_model_without_a_price() -> None:
    books = ledger(solo=BudgetSettings(daily_usd=1.0))
    with pytest.raises(BudgetExceededError, match=r"'mystery' has no price.*prices:"):
        await books.reserve("solo", None, model="mystery", persona="solo", conversation_id="c")


def test_budget_errors_survive_pickling() -> None:
    import pickle

    exc = BudgetExceededError("persona 'a'", "daily", 1.0, 0.5)
    again = pickle.loads(pickle.dumps(exc))
    assert str(again) == str(exc) and again.scope == "persona 'a'"


def test_periods_start_in_the_runtime_zone() -> None:
    from zoneinfo import ZoneInfo

    now = datetime(2026, 3, 15, 1, 30, tzinfo=ZoneInfo("Pacific/Auckland"))
    assert period_start(now, "day") == datetime(2026, 3, 15, tzinfo=ZoneInfo("Pacific/Auckland"))
    assert period_start(now, "month").day == 1
    assert "COALESCE(billed_to, persona) = 'o''brien'" in spent_sql("o'brien", now)


def priced_runtime(
    tmp_path: Path,
    name: str,
    model: FunctionModel,
    audit: NullAudit,
    books: BudgetLedger,
    launchers: object = None,
    **config: object,
) -> PersonaRuntime:
    persona_config = scripted(**config)
    persona_config["model"]["max_tokens"] = 1000
    write_persona(tmp_path, name, persona_config)
    return PersonaRuntime(
        load_persona(tmp_path, name),
        model=model,
        registry=builtin_registry(),
        services=Services(audit=audit, budget=books),
        host=PersonaHost(
            settings=RuntimeSettings(prices={"priced-*": PRICE}),
            roster=[("lead", "leads"), ("helper", "helps"), ("solo", "alone")],
        ),
        launchers=launchers,  # type: ignore[arg-type]
    )


async def test_two_concurrent_turns_cannot_pass_a_budget_together(tmp_path: Path) -> None:
    gate = asyncio.Event()

    async def slow(request: ModelRequest) -> str:
        await gate.wait()
        return "done"

    model = FunctionModel(slow, name="priced-model")
    audit = NullAudit()
    # One call's worst case (its input plus 1,000 output tokens at $1/1k) is
    # a little over $1: the limit holds one, not two.
    books = ledger(solo=BudgetSettings(daily_usd=2.0))
    rt = priced_runtime(tmp_path, "solo", model, audit, books, tools={"allow": ["clock"]})

    async def ask(conv: str) -> str:
        reply = await rt.handle(
            MessageEnvelope(recipient="solo", conversation_id=conv, text="hi " * 10)
        )
        return reply.status if reply.status != "error" else f"error: {reply.error}"

    first = asyncio.create_task(ask("solo:a"))
    second = asyncio.create_task(ask("solo:b"))
    await asyncio.sleep(0.2)
    gate.set()
    statuses = sorted(await asyncio.gather(first, second))
    assert statuses[0].startswith("error: ") and "budget_exceeded" in statuses[0]
    assert statuses[1] == "ok"
    assert len(model.requests) == 1  # the refused call was never sent
    refused = [e for e in audit.events if isinstance(e, BudgetWarning) and e.exceeded]
    assert len(refused) == 1 and refused[0].scope == "persona 'solo'"
    spent = sum(e.cost_usd or 0 for e in audit.events if isinstance(e, ModelCalled))
    assert 0 < spent <= 2.0


async def test_an_ask_persona_chain_is_billed_to_the_persona_that_started_it(
    tmp_path: Path,
) -> None:
    audit = NullAudit()
    books = ledger()

    def lead(request: ModelRequest) -> object:
        if "answer from" in latest_user_text(request) or request.messages[-1].kind == "tool_result":
            return "thanks"
        return _ask("helper", "what is 2+2?")

    hub = LocalHub()
    a = priced_runtime(tmp_path, "lead", FunctionModel(lead, name="priced-a"), audit, books)
    b = priced_runtime(
        tmp_path, "helper", FunctionModel(lambda r: "4", name="priced-b"), audit, books
    )
    hub.add(a)
    hub.add(b)
    await a.handle(MessageEnvelope(recipient="lead", conversation_id="lead:c", text="go"))
    calls = [e for e in audit.events if isinstance(e, ModelCalled)]
    helper_calls = [c for c in calls if c.persona == "helper"]
    assert helper_calls and all(c.billed_to == "lead" for c in helper_calls)
    assert all(c.billed_to == "lead" for c in calls)


def _ask(name: str, text: str):  # type: ignore[no-untyped-def]
    from coterie.runtime.messages import AssistantMessage

    return AssistantMessage(tool_calls=[tool_call("ask_persona", {"persona": name, "text": text})])


async def test_a_subagents_cost_lands_on_its_parent(tmp_path: Path) -> None:
    from coterie.runtime.config import ModelConfig  # noqa: F401
    from coterie.runtime.delegation.subagent import LocalSubagents
    from coterie.runtime.messages import AssistantMessage, ToolResultMessage

    audit = NullAudit()
    books = ledger(lead=BudgetSettings(daily_usd=100.0))

    def parent(request: ModelRequest) -> object:
        last = request.messages[-1]
        if isinstance(last, ToolResultMessage) or "finished" in latest_user_text(request):
            return "all done"
        return AssistantMessage(tool_calls=[tool_call("spawn_subagent", {"task": "sum 2 and 2"})])

    from coterie.runtime.persona import Launchers

    subagents = LocalSubagents(
        registry=builtin_registry(),
        model_factory=lambda cfg: FunctionModel(lambda r: "4", name="priced-sub"),
        audit=audit,
        budget=books,
    )
    rt = priced_runtime(
        tmp_path,
        "lead",
        FunctionModel(parent, name="priced-p"),
        audit,
        books,
        launchers=Launchers(subagents=subagents),
    )
    await rt.handle(MessageEnvelope(recipient="lead", conversation_id="lead:c", text="go"))
    for _ in range(100):
        if any(isinstance(e, ModelCalled) and e.context == "subagent" for e in audit.events):
            break
        await asyncio.sleep(0.05)
    sub = [e for e in audit.events if isinstance(e, ModelCalled) and e.context == "subagent"]
    assert sub and all(e.billed_to == "lead" and e.cost_usd and e.cost_usd > 0 for e in sub)


async def test_persona_budgets_are_read_from_persona_yaml(tmp_path: Path) -> None:
    write_persona(tmp_path, "solo", scripted(budget={"daily_usd": 2.5}))
    budgets = PersonaBudgets(tmp_path)
    assert (await budgets("solo")).daily_usd == 2.5
    assert not (await budgets("nobody")).limited
