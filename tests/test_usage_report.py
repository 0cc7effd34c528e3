"""Usage reports over a real DuckDB audit log, without Ray: the sums and
groupings (the persona that pays, model, day in the runtime's zone, context),
calls without a price flagged and never counted as 0, rows written before
the usage columns, ``--since``, bad ``--since``/``--by``, ``GET /v1/usage``
(through the app with a door onto the file) and ``coterie usage``."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any
from zoneinfo import ZoneInfo

import pytest
from aiohttp.test_utils import TestClient, TestServer

from coterie.cli import main
from coterie.runtime.audit import AuditWriter, QueryResult, event_to_row
from coterie.runtime.config import ServeSettings
from coterie.runtime.errors import AuditQueryError
from coterie.runtime.messages import ModelCalled, ToolCalled, UsageContext
from coterie.runtime.serve.app import build_app, set_backend
from coterie.runtime.usage.report import (
    UsageQuery,
    UsageReport,
    parse_grouping,
    parse_since,
    usage_query,
    usage_report,
)
from coterie.usage_cli import cost_cell

HOUR = 3600.0
PARIS = ZoneInfo("Europe/Paris")
SONNET = ("anthropic", "claude-sonnet-4-5")
MYSTERY = ("openai", "mystery-1")


def called(
    persona: str,
    *,
    context: UsageContext = "user",
    billed_to: str | None = None,
    model: tuple[str, str] = SONNET,
    cost: float | None = 0.0,
    tokens: tuple[int, int, int, int] = (1000, 50, 0, 0),
    ts: float | None = None,
) -> ModelCalled:
    """A model call; tokens: input (cached included), output, cache read, cache write."""
    return ModelCalled(
        persona=persona,
        conversation_id=f"{persona}:c",
        turn_id=f"turn-{persona}",
        ts=time.time() - HOUR if ts is None else ts,
        provider=model[0],
        model=model[1],
        step=1,
        latency_ms=5.0,
        input_tokens=tokens[0],
        output_tokens=tokens[1],
        cache_read_tokens=tokens[2],
        cache_write_tokens=tokens[3],
        cost_usd=cost,
        priced=cost is not None,
        context=context,
        billed_to=billed_to,
    )


def calls() -> list[ModelCalled]:
    """ada's own calls of every kind, bob's subagent calls (unpriced) and
    dora's answers to carl's ask_persona, both billed to who started them."""
    return [
        called("ada", cost=0.5, tokens=(1000, 50, 600, 100)),
        called("ada", context="heartbeat", cost=0.25, tokens=(2000, 10, 1500, 0)),
        called("ada", context="cron", cost=0.125, tokens=(400, 20, 0, 400)),
        called("ada", context="eval", cost=0.1, tokens=(100, 5, 0, 0)),
        called("bob", context="subagent", billed_to="ada", model=MYSTERY, cost=None),
        called("bob", context="subagent", billed_to="ada", model=MYSTERY, cost=None),
        called("carl", context="coding_agent", cost=1.0, tokens=(3000, 300, 0, 0)),
        called("dora", billed_to="carl", cost=0.2, tokens=(500, 40, 250, 0)),
    ]


def old_row() -> dict[str, Any]:
    """A model_call row of a file written before cost, context and billed_to."""
    row = event_to_row(called("otto", model=("openai", "gpt-4o"), tokens=(300, 30, 0, 0)))
    row.update(cost_usd=None, context=None, billed_to=None)
    row.update(cache_read_tokens=None, cache_write_tokens=None)
    return row


def write(path: Path, events: list[ModelCalled], *extra: dict[str, Any]) -> None:
    writer = AuditWriter(path)
    try:
        noise = ToolCalled(
            persona="ada",
            conversation_id="ada:c",
            turn_id="t",
            call_id="c1",
            tool="x",
            arguments={},
        )
        rows = [event_to_row(e) for e in events] + list(extra) + [event_to_row(noise)]
        assert writer.write_rows(rows) == len(rows)
    finally:
        writer.close()


@pytest.fixture
def home(tmp_path: Path) -> Path:
    write(tmp_path / "audit.duckdb", calls(), old_row())
    return tmp_path


def report(home: Path, **kwargs: Any) -> UsageReport:
    from coterie.runtime.audit import read_only_query

    spec = usage_query(zone=kwargs.pop("zone", PARIS), **kwargs)
    return spec.report(read_only_query(home / "audit.duckdb", spec.sql()))


def by_key(rep: UsageReport) -> dict[str, Any]:
    return {r.key: r for r in rep.rows}


# -- the report -------------------------------------------------------------------------


def test_by_persona_sums_what_each_payer_pays_and_flags_the_unpriced(home: Path) -> None:
    rep = report(home, by="persona")
    rows = by_key(rep)
    assert set(rows) == {"ada", "carl", "otto"}  # bob and dora are paid for
    ada = rows["ada"]
    assert (ada.calls, ada.input_tokens, ada.output_tokens) == (6, 5500, 2 * 50 + 85)
    assert (ada.cache_read_tokens, ada.cache_write_tokens) == (2100, 500)
    assert ada.cost_usd == pytest.approx(0.975)  # bob's two calls have no price: not 0, counted
    assert ada.unpriced_calls == 2 and not ada.cost_complete
    assert ada.cache_hit_rate == pytest.approx(2100 / 5500, abs=1e-4)
    carl = rows["carl"]
    assert (carl.calls, carl.cost_usd, carl.unpriced_calls) == (2, pytest.approx(1.2), 0)
    otto = rows["otto"]  # an old row: billed to its own persona, its cost unknown
    assert (otto.calls, otto.cost_usd, otto.unpriced_calls, otto.cache_read_tokens) == (1, 0, 1, 0)
    total = rep.total
    assert (total.key, total.calls, total.unpriced_calls) == ("total", 9, 3)
    assert total.input_tokens == 5500 + 3500 + 300
    assert total.cost_usd == pytest.approx(0.975 + 1.2)
    assert [(m.provider, m.model, m.calls) for m in rep.unpriced_models] == [
        ("openai", "mystery-1", 2),
        ("openai", "gpt-4o", 1),
    ]
    assert "pays" in rep.group_label and "subagent" in rep.group_label
    assert [r.key for r in rep.rows] == ["carl", "ada", "otto"]  # the costliest first


def test_by_persona_also_gives_each_calling_personas_own_cache_hit_rate(home: Path) -> None:
    callers = {r.key: r for r in report(home, by="persona").by_caller}
    assert set(callers) == {"ada", "bob", "carl", "dora", "otto"}
    assert callers["ada"].calls == 4 and callers["bob"].calls == 2
    assert callers["ada"].cache_hit_rate == pytest.approx(2100 / 3500, abs=1e-4)
    assert callers["dora"].cache_hit_rate == 0.5 and callers["bob"].cache_hit_rate == 0.0
    assert report(home, by="model").by_caller == []


def test_every_context_is_counted_and_old_rows_are_unknown(home: Path) -> None:
    rows = by_key(report(home, by="context"))
    assert {k: r.calls for k, r in rows.items()} == {
        "user": 2,
        "heartbeat": 1,
        "cron": 1,
        "eval": 1,
        "subagent": 2,
        "coding_agent": 1,
        "unknown": 1,
    }
    assert rows["subagent"].unpriced_calls == 2 and rows["subagent"].cost_usd == 0
    assert rows["heartbeat"].cost_usd == 0.25 and rows["coding_agent"].cost_usd == 1.0


def test_by_model(home: Path) -> None:
    rows = by_key(report(home, by="model"))
    assert set(rows) == {"anthropic/claude-sonnet-4-5", "openai/mystery-1", "openai/gpt-4o"}
    assert rows["anthropic/claude-sonnet-4-5"].calls == 6
    assert rows["openai/mystery-1"].unpriced_calls == rows["openai/mystery-1"].calls == 2


def test_by_day_is_in_the_runtimes_zone(tmp_path: Path) -> None:
    # 23:30 UTC on 1 March is 00:30 on 2 March in Paris.
    late = datetime(2026, 3, 1, 23, 30, tzinfo=UTC).timestamp()
    early = datetime(2026, 3, 1, 8, 0, tzinfo=UTC).timestamp()
    write(tmp_path / "audit.duckdb", [called("ada", ts=late), called("ada", ts=early, cost=1.0)])
    paris = report(tmp_path, by="day", zone=PARIS)
    assert [(r.key, r.calls) for r in paris.rows] == [("2026-03-01", 1), ("2026-03-02", 1)]
    assert paris.timezone == "Europe/Paris"
    utc = report(tmp_path, by="day", zone=ZoneInfo("UTC"))
    assert [(r.key, r.calls) for r in utc.rows] == [("2026-03-01", 2)]


def test_since_counts_from_then(tmp_path: Path) -> None:
    now = datetime(2026, 3, 10, 12, 0, tzinfo=UTC)
    events = [
        called("ada", ts=(now - timedelta(days=9)).timestamp(), cost=1.0),
        called("ada", ts=(now - timedelta(days=2)).timestamp(), cost=2.0),
        called("ada", ts=(now - timedelta(hours=1)).timestamp(), cost=4.0),
    ]
    write(tmp_path / "audit.duckdb", events)

    def cost(since: str | None) -> float:
        return report(tmp_path, since=since, now=now).total.cost_usd

    assert cost(None) == 7.0
    assert cost("7d") == 6.0 and cost("1w") == 6.0 and cost("2w") == 7.0
    assert cost("24h") == 4.0 and cost("90m") == 4.0 and cost("30m") == 0.0
    assert cost("2026-03-05") == 6.0  # midnight in the runtime's zone
    assert cost("2026-03-10T11:30+01:00") == 4.0  # 10:30 UTC: the call at 11:00 counts
    assert cost("2026-03-10T11:30") == 4.0  # on Paris's wall clock: 10:30 UTC as well
    assert cost("2026-03-10T11:30Z") == 0.0
    rep = report(tmp_path, since="2026-03-05", now=now)
    assert rep.since == datetime(2026, 3, 4, 23, 0, tzinfo=UTC)


@pytest.mark.parametrize(
    "bad", ["yesterday", "7x", "0d", "-3d", "2026-13-01", "7 days", "99999999999d"]
)
def test_a_bad_since_names_the_value(bad: str) -> None:
    with pytest.raises(AuditQueryError) as caught:
        parse_since(bad, name="--since")
    assert str(caught.value).startswith(f"--since {bad!r}")


def test_a_bad_by_names_the_value_and_the_choices() -> None:
    with pytest.raises(AuditQueryError, match=r"by 'week': group by one of persona, model, day"):
        parse_grouping("week")
    assert parse_grouping(None) == "persona" and parse_grouping("context") == "context"


def test_an_empty_log_is_an_empty_report(tmp_path: Path) -> None:
    write(tmp_path / "audit.duckdb", [])
    rep = report(tmp_path)
    assert rep.rows == [] and rep.total.calls == 0 and rep.total.cache_hit_rate is None


def test_the_report_round_trips_as_json(home: Path) -> None:
    rep = report(home, by="persona", since="30d")
    again = UsageReport.model_validate(json.loads(json.dumps(rep.model_dump(mode="json"))))
    assert again == rep


def test_cost_cells_never_show_an_unknown_cost_as_zero(home: Path) -> None:
    rows = by_key(report(home, by="model"))
    assert cost_cell(rows["openai/mystery-1"]) == "?"
    assert cost_cell(rows["anthropic/claude-sonnet-4-5"]) == "$2.1750"
    assert cost_cell(report(home).total) == "$2.1750 + ?"


# -- GET /v1/usage ----------------------------------------------------------------------

TOKEN = "u" * 32
AUTH = {"Authorization": f"Bearer {TOKEN}"}


class FileDoor:
    """The one part of a front door the route uses, onto the audit file."""

    def __init__(self, path: Path) -> None:
        self.writer = AuditWriter(path)
        self.queries: list[str] = []

    async def query_async(self, sql: str) -> QueryResult:
        self.queries.append(sql)
        return await asyncio.to_thread(self.writer.query, sql)


@pytest.fixture
async def served(home: Path) -> AsyncIterator[tuple[TestClient, FileDoor]]:
    app = build_app(home, ServeSettings(), token=TOKEN)
    door = FileDoor(home / "audit.duckdb")
    set_backend(app, door)  # type: ignore[arg-type]  # only query_async is reached
    client = TestClient(TestServer(app))
    await client.start_server()
    yield client, door
    await client.close()
    door.writer.close()


async def test_the_route_answers_the_report(
    served: tuple[TestClient, FileDoor], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("COTERIE_TIMEZONE", "Europe/Paris")
    client, door = served
    response = await client.get("/v1/usage", headers=AUTH)
    assert response.status == 200
    rep = UsageReport.model_validate(await response.json())
    assert rep.by == "persona" and rep.since is None and rep.timezone == "Europe/Paris"
    assert by_key(rep)["ada"].unpriced_calls == 2 and rep.total.calls == 9
    assert len(door.queries) == 1  # one statement: one snapshot of the log
    response = await client.get("/v1/usage?by=context&since=7d", headers=AUTH)
    rep = UsageReport.model_validate(await response.json())
    assert rep.by == "context" and "coding_agent" in by_key(rep) and rep.since is not None
    assert (await response.json())["rows"][0]["cache_hit_rate"] is not None


@pytest.mark.parametrize(
    ("query", "field", "value"),
    [("since=lately", "since", "lately"), ("by=week", "by", "week"), ("since=0h", "since", "0h")],
)
async def test_the_route_names_a_bad_parameter(
    served: tuple[TestClient, FileDoor], query: str, field: str, value: str
) -> None:
    client, door = served
    response = await client.get(f"/v1/usage?{query}", headers=AUTH)
    assert response.status == 400
    error = (await response.json())["error"]
    assert error["type"] == "invalid_query" and error["field"] == field
    assert f"{field} {value!r}" in error["message"]
    assert door.queries == []


# -- coterie usage ----------------------------------------------------------------------


def run(home: Path, *args: str, capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    code = main(["--home", str(home), "usage", *args])
    out, err = capsys.readouterr()
    return code, " ".join(out.split()), " ".join(err.split())


@pytest.fixture(autouse=True)
def no_cluster(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("RAY_ADDRESS", raising=False)


def test_the_command_prints_the_table_the_total_and_the_unpriced_footnote(
    home: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = run(home, capsys=capsys)
    assert code == 0, err
    assert "usage by persona: the persona that pays (billed_to: the start of an ask_persona" in out
    assert "all time" in out
    assert "read from the audit log" in out
    assert "ada │ 6 │ 5,500 │ 185 │ 2,100 │ 500 │ 38.2% │ $0.9750 + ? │ 2" in out
    assert "carl │ 2 │ 3,500 │ 340 │ 250 │ 0 │ 7.1% │ $1.2000 │" in out
    assert "otto │ 1 │ 300 │ 30 │ 0 │ 0 │ 0.0% │ ? │ 1" in out
    assert "total │ 9 │ 9,300 │" in out and "$2.1750 + ? │ 3" in out
    assert "each calling persona's own calls" in out and "dora │ 1 │ 500 │" in out
    assert (
        "?: 3 call(s) of models without a price, not in the costs: openai/mystery-1 (2), "
        "openai/gpt-4o (1). Give them one under prices: in runtime.yaml."
    ) in out


def test_the_command_groups_filters_and_prints_json(
    home: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("COTERIE_TIMEZONE", "UTC")
    code, out, _ = run(home, "--by", "context", "--json", capsys=capsys)
    assert code == 0
    rep = UsageReport.model_validate(json.loads(out))
    assert rep.by == "context" and by_key(rep)["unknown"].calls == 1
    code, out, _ = run(home, "--by", "day", "--since", "30m", capsys=capsys)
    assert code == 0 and "No model calls (since" in out  # every call was an hour ago
    code, out, _ = run(home, "--by", "day", "--since", "2h", capsys=capsys)
    assert (
        code == 0
        and "usage by day: calendar day in the runtime's zone (UTC); since" in out
        and "total │ 9 │" in out
    )


def test_the_command_names_a_bad_option_value(
    home: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, _, err = run(home, "--since", "last week", capsys=capsys)
    assert code == 2 and "error: --since 'last week' is not a duration back from now" in err
    code, _, err = run(home, "--by", "person", capsys=capsys)
    assert code == 2
    assert "error: --by 'person': group by one of persona, model, day, context" in err


def test_a_home_without_an_audit_log_has_nothing_to_report(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, _ = run(tmp_path, capsys=capsys)
    assert code == 0 and "No model calls (all time; no audit log at" in out


HOLD = """
import sys, time
from coterie.runtime.audit import AuditWriter
writer = AuditWriter(sys.argv[1])
print("held", flush=True)
time.sleep(60)
"""


@pytest.fixture
def held(home: Path) -> Iterator[None]:
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLD, str(home / "audit.duckdb")], stdout=subprocess.PIPE, text=True
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        yield
    finally:
        holder.kill()
        holder.wait(10)


def test_a_log_another_process_holds_is_the_held_home_message(
    home: Path, held: None, capsys: pytest.CaptureFixture[str]
) -> None:
    code, _, err = run(home, capsys=capsys)
    assert code == 1
    assert f"{home} is in use by another coterie runtime" in err
    assert "holds its audit log" in err and "coterie --home" in err


def test_the_query_is_one_read_only_statement() -> None:
    sql = UsageQuery(by="day", timezone="Europe/Paris").sql()
    assert sql.count("FROM events") == 1 and "'Europe/Paris'" in sql
    quoted = UsageQuery(by="day", timezone="x'); DROP TABLE events; --").sql()
    assert "'x''); DROP TABLE events; --'" in quoted


async def test_usage_report_runs_through_any_query_function(home: Path) -> None:
    door = FileDoor(home / "audit.duckdb")
    try:
        rep = await usage_report(door.query_async, usage_query(by="model"))
    finally:
        door.writer.close()
    assert rep.total.calls == 9 and len(door.queries) == 1
