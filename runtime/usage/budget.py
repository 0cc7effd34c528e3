"""Budgets: what model calls may cost, kept before each call is sent.

A model call first *reserves* the most it can cost (every input token at
the dearest input price, every output token it may produce: see
:meth:`~coterie.runtime.usage.prices.PriceTable.worst_case`) with the
:class:`BudgetLedger`, and *settles* the real cost once answered (or
releases the reservation when it failed). A reservation is refused with
:class:`~coterie.runtime.errors.BudgetExceededError` when what was spent
plus what running calls still hold plus this call's worst case would pass a
limit; so turns running at once, in one persona or many, cannot overrun a
budget together.

Each call counts against its *payer* (the persona that started the work:
the first of an ``ask_persona`` chain, a subagent's parent) and against the
runtime's budget. Budgets are per day and per calendar month in the
runtime's time zone. What was spent before the ledger started is read once
per period from the audit log (the sum of ``cost_usd`` of the payer's
``model_call`` rows); from then on the ledger counts. A warning event is
recorded once per period when spending passes ``warn_at`` of a limit, and
when a limit refuses a call.

A payer without a budget in a runtime without one is never held up: the
ledger answers ``None`` (nothing to keep) and the persona's
:class:`BudgetGuard` remembers that for :data:`UNLIMITED_TTL` seconds, so an
unbudgeted persona asks once a minute, not once a call. A budgeted payer's
call to a model without a price is refused: its cost could not be counted.
"""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import datetime, tzinfo
from pathlib import Path
from typing import Any, Literal

from coterie.runtime.config import BudgetSettings, load_persona
from coterie.runtime.errors import BudgetExceededError, CoterieError
from coterie.runtime.messages import BudgetWarning
from coterie.runtime.services import BudgetService, Reservation
from coterie.runtime.usage.prices import PriceTable

#: Seconds a persona trusts "this payer has no budget" before asking again.
UNLIMITED_TTL = 60.0

#: The scope name of the runtime-wide budget.
RUNTIME_SCOPE = "the runtime"

Period = Literal["day", "month"]
#: Reads what ``payer`` (None: everyone) spent since a moment, from the log.
SpentSince = Callable[[str | None, datetime], Awaitable[float]]
#: The budget of one persona (its persona.yaml's ``budget:``).
LimitsOf = Callable[[str], Awaitable[BudgetSettings]]


def period_start(now: datetime, period: Period) -> datetime:
    """The start of the day or month holding ``now`` (in ``now``'s zone)."""
    day = now.replace(hour=0, minute=0, second=0, microsecond=0)
    return day if period == "day" else day.replace(day=1)


@dataclass
class _Account:
    """One scope's spending in one period."""

    limit: float
    warn_at: float
    base: float  # spent before the ledger counted (from the log)
    settled: float = 0.0
    reserved: float = 0.0
    warned: bool = False

    @property
    def spent(self) -> float:
        return self.base + self.settled


@dataclass
class _Ticket:
    amount: float
    accounts: list[tuple[str, Period, _Account]]
    persona: str
    conversation_id: str


@dataclass
class BudgetLedger:
    """The runtime's budgets (plain logic; on Ray the router hosts it)."""

    runtime: BudgetSettings
    limits_of: LimitsOf
    spent_since: SpentSince
    tz: tzinfo
    clock: Callable[[], float] = time.time
    _accounts: dict[tuple[str, Period, datetime], _Account] = field(default_factory=dict)
    _tickets: dict[str, _Ticket] = field(default_factory=dict)
    _ids: itertools.count[int] = field(default_factory=lambda: itertools.count(1))
    _lock: asyncio.Lock = field(default_factory=asyncio.Lock)

    async def reserve(
        self,
        payer: str,
        amount: float | None,
        *,
        model: str,
        persona: str,
        conversation_id: str,
    ) -> Reservation:
        """Hold ``amount`` (a call's worst case; None: the model has no
        price) for ``payer``; see the module's docstring."""
        async with self._lock:
            scopes: list[tuple[str, str | None, BudgetSettings]] = []
            if self.runtime.limited:
                scopes.append((RUNTIME_SCOPE, None, self.runtime))
            own = await self.limits_of(payer)
            if own.limited:
                scopes.append((f"persona {payer!r}", payer, own))
            if not scopes:
                return Reservation(ticket=None)
            if amount is None:
                raise BudgetExceededError(scopes[-1][0], "unpriced", 0.0, 0.0, model=model)
            now = datetime.fromtimestamp(self.clock(), self.tz)
            accounts: list[tuple[str, Period, _Account]] = []
            for scope, who, settings in scopes:
                periods: tuple[tuple[Period, float | None], ...] = (
                    ("day", settings.daily_usd),
                    ("month", settings.monthly_usd),
                )
                for period, limit in periods:
                    if limit is not None:
                        account = await self._account(scope, who, period, limit, settings, now)
                        accounts.append((scope, period, account))
            for scope, period, account in accounts:
                if account.spent + account.reserved + amount > account.limit:
                    raise BudgetExceededError(
                        scope,
                        "daily" if period == "day" else "monthly",
                        account.limit,
                        account.spent + account.reserved,
                    )
            for _, _, account in accounts:
                account.reserved += amount
            ticket = f"b{next(self._ids)}"
            self._tickets[ticket] = _Ticket(amount, accounts, persona, conversation_id)
            return Reservation(ticket=ticket)

    async def settle(self, ticket: str, cost: float | None) -> list[BudgetWarning]:
        """Replace ``ticket``'s hold by the call's real ``cost`` (None: the
        call failed before any cost); the warnings it crossed."""
        held = self._tickets.pop(ticket, None)
        if held is None:
            return []
        warnings: list[BudgetWarning] = []
        for scope, period, account in held.accounts:
            account.reserved = max(0.0, account.reserved - held.amount)
            account.settled += cost or 0.0
            if not account.warned and account.spent >= account.limit * account.warn_at:
                account.warned = True
                warnings.append(
                    self._warning(scope, period, account, held.persona, held.conversation_id, False)
                )
        return warnings

    async def charge(
        self, payer: str, cost: float, *, persona: str, conversation_id: str
    ) -> list[BudgetWarning]:
        """Count ``cost`` (already spent) against ``payer`` and the runtime.

        Only periods the ledger already counts are touched: a period it
        starts counting later reads what was spent, this too, from the log
        (where the call's ``model_call`` row already is)."""
        async with self._lock:
            now = datetime.fromtimestamp(self.clock(), self.tz)
            warnings: list[BudgetWarning] = []
            periods: tuple[Period, ...] = ("day", "month")
            for scope in (RUNTIME_SCOPE, f"persona {payer!r}"):
                for period in periods:
                    account = self._accounts.get((scope, period, period_start(now, period)))
                    if account is None:
                        continue
                    account.settled += cost
                    if not account.warned and account.spent >= account.limit * account.warn_at:
                        account.warned = True
                        warnings.append(
                            self._warning(scope, period, account, persona, conversation_id, False)
                        )
            return warnings

    def held(self) -> float:
        """Dollars held by running calls (all scopes)."""
        return sum(t.amount for t in self._tickets.values())

    async def _account(
        self,
        scope: str,
        who: str | None,
        period: Period,
        limit: float,
        settings: BudgetSettings,
        now: datetime,
    ) -> _Account:
        start = period_start(now, period)
        key = (scope, period, start)
        account = self._accounts.get(key)
        if account is None:
            base = await self.spent_since(who, start)
            account = _Account(limit=limit, warn_at=settings.warn_at, base=base)
            self._accounts[key] = account
            # Older periods are done with.
            done = [k for k in self._accounts if k[:2] == (scope, period) and k[2] < start]
            for old in done:
                del self._accounts[old]
        account.limit = limit  # an edited budget applies to the period running
        account.warn_at = settings.warn_at
        return account

    def _warning(
        self,
        scope: str,
        period: Period,
        account: _Account,
        persona: str,
        conversation_id: str,
        exceeded: bool,
    ) -> BudgetWarning:
        return BudgetWarning(
            persona=persona,
            conversation_id=conversation_id,
            turn_id="",  # the caller's turn fills it in
            scope=scope,
            period=period,
            limit_usd=account.limit,
            spent_usd=round(account.spent, 6),
            exceeded=exceeded,
        )


class BudgetGuard:
    """A persona's side of the budgets: reserve before a call, settle after."""

    def __init__(self, prices: PriceTable) -> None:
        self.prices = prices
        self._unlimited: dict[str, float] = {}

    async def reserve(
        self,
        service: BudgetService | None,
        *,
        payer: str,
        provider: str,
        model: str,
        input_tokens: int,
        max_output_tokens: int,
        persona: str,
        conversation_id: str,
    ) -> str | None:
        """A ticket for one call (None: no budget applies); raises
        :class:`BudgetExceededError`."""
        if service is None:
            return None
        until = self._unlimited.get(payer)
        if until is not None and until > time.monotonic():
            return None
        amount = self.prices.worst_case(
            provider, model, input_tokens=input_tokens, max_output_tokens=max_output_tokens
        )
        reservation = await service.reserve(
            payer, amount, model=model, persona=persona, conversation_id=conversation_id
        )
        if reservation.ticket is None:
            self._unlimited[payer] = time.monotonic() + UNLIMITED_TTL
        return reservation.ticket

    async def settle(
        self, service: BudgetService | None, ticket: str | None, cost: float | None
    ) -> list[BudgetWarning]:
        if ticket is None or service is None:
            return []
        return await service.settle(ticket, cost)


def spent_sql(payer: str | None, since: datetime) -> str:
    """The audit query of what ``payer`` (None: everyone) spent since ``since``."""
    sql = (
        "SELECT COALESCE(SUM(cost_usd), 0) FROM events WHERE kind = 'model_call' "
        f"AND epoch(ts) >= {since.timestamp():.6f}"
    )
    if payer is not None:
        quoted = payer.replace("'", "''")
        sql += f" AND COALESCE(billed_to, persona) = '{quoted}'"
    return sql


class PersonaBudgets:
    """The ``budget:`` of each persona of a home, read from its persona.yaml
    (again when the file changes); a persona that does not load (unknown,
    or a broken file) has none."""

    def __init__(self, home: Path) -> None:
        self.home = home
        self._cache: dict[str, tuple[float, BudgetSettings]] = {}

    async def __call__(self, name: str) -> BudgetSettings:
        path = self.home / "personas" / name / "persona.yaml"
        try:
            mtime = path.stat().st_mtime
        except OSError:
            return BudgetSettings()
        cached = self._cache.get(name)
        if cached is not None and cached[0] == mtime:
            return cached[1]
        try:
            budget = load_persona(self.home, name).config.budget
        except CoterieError:
            budget = BudgetSettings()
        self._cache[name] = (mtime, budget)
        return budget


class RouterBudget:
    """:class:`~runtime.services.BudgetService` through the process that
    hosts the runtime's ledger (on Ray the router: ``call`` is a persona's
    ``call_router``)."""

    def __init__(self, call: Callable[..., Awaitable[Any]]) -> None:
        self.call = call

    async def reserve(
        self,
        payer: str,
        amount: float | None,
        *,
        model: str,
        persona: str,
        conversation_id: str,
    ) -> Reservation:
        ticket: str | None = await self.call(
            "budget_reserve", payer, amount, model, persona, conversation_id
        )
        return Reservation(ticket=ticket)

    async def settle(self, ticket: str, cost: float | None) -> list[BudgetWarning]:
        data: list[str] = await self.call("budget_settle", ticket, cost)
        return [BudgetWarning.model_validate_json(w) for w in data]

    async def charge(
        self, payer: str, cost: float, *, persona: str, conversation_id: str
    ) -> list[BudgetWarning]:
        data: list[str] = await self.call("budget_charge", payer, cost, persona, conversation_id)
        return [BudgetWarning.model_validate_json(w) for w in data]


__all__ = [
    "RUNTIME_SCOPE",
    "UNLIMITED_TTL",
    "BudgetGuard",
    "BudgetLedger",
    "LimitsOf",
    "PersonaBudgets",
    "RouterBudget",
    "SpentSince",
    "period_start",
    "spent_sql",
]
