"""Usage reports: what the model calls of the audit log consumed and cost.

A report sums the ``model_call`` rows of the ``events`` table since an
instant, grouped one way:

- ``persona``: by the persona that pays, ``COALESCE(billed_to, persona)`` —
  the start of an ``ask_persona`` chain, a subagent's parent (rows written
  before ``billed_to`` existed count for the persona that made the call);
  it also lists each *calling* persona's own calls (``by_caller``), since a
  prompt cache belongs to whoever sends the prompt;
- ``model``: by ``provider/model``;
- ``day``: by calendar day in the runtime's zone (``$COTERIE_TIMEZONE``);
- ``context``: by the kind of turn (user, heartbeat, cron, subagent, eval,
  coding_agent; ``unknown`` for rows written before the column existed).

Each row counts calls, input tokens (the whole input, cached included),
output, cache-read and cache-write tokens, the cost of its *priced* calls
and how many calls had no price (``cost_usd`` NULL: a model ``prices:`` in
``runtime.yaml`` does not cover). An unpriced call is never counted as 0:
its row says how many there were and :attr:`UsageReport.unpriced_models`
names the models, so a total is never silently too low.

:func:`usage_query` parses ``--since``/``--by`` (raising
:class:`~coterie.runtime.errors.AuditQueryError` naming the bad value),
:meth:`UsageQuery.sql` is one read-only statement (one snapshot of the log),
and :func:`usage_report` runs it through any door's ``query_async``.
"""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime, timedelta, tzinfo
from typing import Literal, assert_never, get_args
from zoneinfo import ZoneInfo

from pydantic import BaseModel, ConfigDict

from coterie.runtime.audit.query import QueryResult
from coterie.runtime.config import runtime_timezone
from coterie.runtime.errors import AuditQueryError

#: How a report groups its calls (``--by``).
UsageGrouping = Literal["persona", "model", "day", "context"]
USAGE_GROUPINGS: tuple[UsageGrouping, ...] = get_args(UsageGrouping)

#: What each grouping's key is, as a report's header says it.
GROUP_LABELS: dict[UsageGrouping, str] = {
    "persona": "the persona that pays (billed_to: the start of an ask_persona chain, "
    "a subagent's parent)",
    "model": "provider/model",
    "day": "calendar day in the runtime's zone",
    "context": "the kind of turn that made the call",
}

#: The context of a row written before the ``context`` column existed.
UNKNOWN_CONTEXT = "unknown"

_DURATION = re.compile(r"^\s*(\d+)\s*([mhdw])\s*$")
_UNITS = {"m": "minutes", "h": "hours", "d": "days", "w": "weeks"}
SINCE_HELP = (
    "a duration back from now (90m, 24h, 7d, 2w) or an ISO date or date-time "
    "(2026-03-01, 2026-03-01T09:00, 2026-03-01T09:00+01:00; without an offset: "
    "in the runtime's zone)"
)

QueryFn = Callable[[str], Awaitable[QueryResult]]


class UsageRow(BaseModel):
    """The calls of one group (or all of them: the total)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    #: The group: a persona, ``provider/model``, a ``YYYY-MM-DD`` day or a
    #: context; ``total`` for the total row.
    key: str
    calls: int
    #: The whole input, cached tokens included.
    input_tokens: int
    output_tokens: int
    cache_read_tokens: int
    cache_write_tokens: int
    #: US dollars of the priced calls only (see ``unpriced_calls``).
    cost_usd: float
    #: Calls of models without a price: their cost is not in ``cost_usd``.
    unpriced_calls: int
    #: Cache-read tokens / input tokens (None: no input).
    cache_hit_rate: float | None

    @classmethod
    def of(
        cls,
        key: str,
        *,
        calls: int,
        input_tokens: int,
        output_tokens: int,
        cache_read_tokens: int,
        cache_write_tokens: int,
        cost_usd: float,
        unpriced_calls: int,
    ) -> UsageRow:
        """The row of these sums, with its cache hit rate."""
        return cls(
            key=key,
            calls=calls,
            input_tokens=input_tokens,
            output_tokens=output_tokens,
            cache_read_tokens=cache_read_tokens,
            cache_write_tokens=cache_write_tokens,
            # Sums of doubles: 0.1 + 0.2 is 0.30000000000000004, not a price.
            cost_usd=round(cost_usd, 9),
            unpriced_calls=unpriced_calls,
            cache_hit_rate=round(cache_read_tokens / input_tokens, 4) if input_tokens else None,
        )

    @property
    def cost_complete(self) -> bool:
        """Whether ``cost_usd`` is the whole cost (every call was priced)."""
        return self.unpriced_calls == 0


class UnpricedModel(BaseModel):
    """A model whose calls had no price, and how many it made."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    provider: str
    model: str
    calls: int


class UsageReport(BaseModel):
    """A usage report: one row per group, their total, the unpriced models."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    by: UsageGrouping
    #: What the rows' ``key`` is (``persona``: the persona that pays).
    group_label: str
    #: The first instant counted (UTC); None: the whole log.
    since: datetime | None
    #: The zone ``day`` groups in (the runtime's).
    timezone: str
    rows: list[UsageRow]
    total: UsageRow
    #: ``by == "persona"`` only: each calling persona's own calls, whoever
    #: pays for them (its cache hit rate is its own prompts').
    by_caller: list[UsageRow]
    #: Models with calls that had no price (``prices:`` in runtime.yaml).
    unpriced_models: list[UnpricedModel]


def parse_grouping(text: str | None, *, name: str = "by") -> UsageGrouping:
    """``--by``'s value (default ``persona``)."""
    if text is None or text == "":
        return "persona"
    for grouping in USAGE_GROUPINGS:
        if text == grouping:
            return grouping
    raise AuditQueryError(f"{name} {text!r}: group by one of {', '.join(USAGE_GROUPINGS)}")


def parse_since(
    text: str | None,
    *,
    name: str = "since",
    now: datetime | None = None,
    zone: tzinfo | None = None,
) -> datetime | None:
    """``--since``'s first instant, in UTC; None (no value): the whole log.

    A duration (``90m``, ``24h``, ``7d``, ``2w``) counts back from ``now``;
    an ISO date or date-time without an offset is in ``zone`` (default the
    runtime's).
    """
    if text is None or not text.strip():
        return None
    duration = _DURATION.match(text)
    if duration is not None:
        amount, unit = int(duration.group(1)), duration.group(2)
        if amount == 0:
            raise AuditQueryError(f"{name} {text!r}: a duration must be at least 1{unit}")
        try:
            start = (now or datetime.now(UTC)) - timedelta(**{_UNITS[unit]: amount})
        except OverflowError:
            raise AuditQueryError(f"{name} {text!r}: that is before the year 1") from None
        return start.astimezone(UTC)
    try:
        moment = datetime.fromisoformat(text.strip())
    except ValueError:
        raise AuditQueryError(f"{name} {text!r} is not {SINCE_HELP}") from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=zone or runtime_timezone())
    return moment.astimezone(UTC)


def _literal(value: str) -> str:
    return "'" + value.replace("'", "''") + "'"


class UsageQuery(BaseModel):
    """What to report: since when, grouped how, days in which zone."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    by: UsageGrouping = "persona"
    #: UTC; None: the whole log.
    since: datetime | None = None
    timezone: str = "UTC"

    def _key(self) -> str:
        if self.by == "persona":
            return "COALESCE(billed_to, persona)"
        if self.by == "model":
            return "COALESCE(provider, '?') || '/' || COALESCE(model, '?')"
        if self.by == "day":
            zone = _literal(self.timezone)
            # ts is UTC without a zone: read it as UTC, then as the zone's wall clock.
            return f"CAST(CAST(timezone({zone}, timezone('UTC', ts)) AS DATE) AS VARCHAR)"
        if self.by == "context":
            return f"COALESCE(context, '{UNKNOWN_CONTEXT}')"
        assert_never(self.by)

    def sql(self) -> str:
        """One read-only statement: a ``section`` column (``group``,
        ``caller``, ``unpriced``), then the key and the sums."""
        where = "kind = 'model_call'"
        if self.since is not None:
            utc = self.since.astimezone(UTC).replace(tzinfo=None)
            where += f" AND ts >= TIMESTAMP '{utc.isoformat(sep=' ')}'"
        sums = (
            "count(*) AS calls, "
            "CAST(COALESCE(sum(input_tokens), 0) AS BIGINT) AS input_tokens, "
            "CAST(COALESCE(sum(output_tokens), 0) AS BIGINT) AS output_tokens, "
            "CAST(COALESCE(sum(cache_read_tokens), 0) AS BIGINT) AS cache_read_tokens, "
            "CAST(COALESCE(sum(cache_write_tokens), 0) AS BIGINT) AS cache_write_tokens, "
            "COALESCE(sum(cost_usd), 0.0) AS cost_usd, "
            "count(*) FILTER (WHERE cost_usd IS NULL) AS unpriced_calls"
        )
        parts = [
            f"SELECT 'group' AS section, key, NULL AS provider, {sums} FROM calls GROUP BY key"
        ]
        if self.by == "persona":
            parts.append(f"SELECT 'caller', persona, NULL, {sums} FROM calls GROUP BY persona")
        parts.append(
            f"SELECT 'unpriced', COALESCE(model, '?'), COALESCE(provider, '?'), {sums} "
            "FROM calls WHERE cost_usd IS NULL GROUP BY provider, model"
        )
        return (
            f"WITH calls AS (SELECT {self._key()} AS key, * FROM events WHERE {where})\n"
            + "\nUNION ALL\n".join(parts)
        )

    def report(self, result: QueryResult) -> UsageReport:
        """The report from the result of :meth:`sql`."""
        groups: list[UsageRow] = []
        callers: list[UsageRow] = []
        unpriced: list[UnpricedModel] = []
        for record in result.as_dicts():
            section = record.pop("section")
            provider = record.pop("provider")
            row = UsageRow.of(str(record.pop("key")), **record)
            if section == "group":
                groups.append(row)
            elif section == "caller":
                callers.append(row)
            else:
                unpriced.append(UnpricedModel(provider=provider, model=row.key, calls=row.calls))
        return UsageReport(
            by=self.by,
            group_label=GROUP_LABELS[self.by],
            since=self.since,
            timezone=self.timezone,
            # Days in order; anything else the costliest first.
            rows=_ordered(groups, by_key=self.by == "day"),
            total=_total(groups),
            by_caller=_ordered(callers),
            unpriced_models=sorted(unpriced, key=lambda m: (-m.calls, m.provider, m.model)),
        )


def _ordered(rows: list[UsageRow], *, by_key: bool = False) -> list[UsageRow]:
    if by_key:
        return sorted(rows, key=lambda r: r.key)
    return sorted(rows, key=lambda r: (-r.cost_usd, -r.calls, r.key))


def _total(rows: list[UsageRow]) -> UsageRow:
    return UsageRow.of(
        "total",
        calls=sum(r.calls for r in rows),
        input_tokens=sum(r.input_tokens for r in rows),
        output_tokens=sum(r.output_tokens for r in rows),
        cache_read_tokens=sum(r.cache_read_tokens for r in rows),
        cache_write_tokens=sum(r.cache_write_tokens for r in rows),
        cost_usd=sum(r.cost_usd for r in rows),
        unpriced_calls=sum(r.unpriced_calls for r in rows),
    )


def usage_query(
    *,
    since: str | None = None,
    by: str | None = None,
    zone: ZoneInfo | None = None,
    now: datetime | None = None,
    names: tuple[str, str] = ("since", "by"),
) -> UsageQuery:
    """Parse ``since`` and ``by`` (errors say ``names[0]``/``names[1]`` and
    the bad value); days in ``zone``, default the runtime's."""
    zone = zone or runtime_timezone()
    return UsageQuery(
        by=parse_grouping(by, name=names[1]),
        since=parse_since(since, name=names[0], now=now, zone=zone),
        timezone=zone.key,
    )


async def usage_report(query: QueryFn, spec: UsageQuery) -> UsageReport:
    """Run ``spec`` through a door's ``query_async`` (or any such function)."""
    return spec.report(await query(spec.sql()))


__all__ = [
    "GROUP_LABELS",
    "SINCE_HELP",
    "UNKNOWN_CONTEXT",
    "USAGE_GROUPINGS",
    "QueryFn",
    "UnpricedModel",
    "UsageGrouping",
    "UsageQuery",
    "UsageReport",
    "UsageRow",
    "parse_grouping",
    "parse_since",
    "usage_query",
    "usage_report",
]
