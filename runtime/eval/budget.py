"""An eval run's spending cap (``coterie eval --max-cost USD``).

:class:`RunBudget` is the :class:`~runtime.services.BudgetService` of every
persona an eval run builds (the solver's and the graders'): each model call
reserves its worst-case cost before it is sent and settles the real one
after, like a persona's budget (:mod:`runtime.usage.budget`), so samples
running at once cannot pass the cap together. The cap counts the whole run:
a resumed run starts from what its earlier passes spent (read from the audit
log, :func:`spent_sql`). Once a call is refused the run stops starting
samples; the samples it cut off are not recorded, so ``--resume`` (with a
higher ``--max-cost``) runs them again.

On Ray the budget lives in one small actor (``actors.eval``) that every
eval worker reserves through; :class:`~runtime.usage.budget.RouterBudget`
is the workers' client of it.
"""

from __future__ import annotations

import asyncio
import itertools
import re

from coterie.runtime.errors import BudgetExceededError, ConfigError
from coterie.runtime.eval.worker import SolverSetup
from coterie.runtime.messages import BudgetWarning
from coterie.runtime.services import Reservation
from coterie.runtime.usage.prices import PriceTable

#: The share of the cap at which a warning event is recorded.
WARN_AT = 0.8


def run_scope(run_id: str) -> str:
    """How an eval run's budget is named in errors and warning events."""
    return f"eval run {run_id!r}"


class RunBudget:
    """``limit`` US dollars for one eval run, ``base`` of them already spent."""

    def __init__(self, run_id: str, limit: float, *, base: float = 0.0) -> None:
        if limit <= 0:
            raise ValueError("an eval run's budget must be more than $0")
        self.run_id = run_id
        self.limit = limit
        self.base = base
        self.settled = 0.0
        self.reserved = 0.0
        self._warned = False
        self._tickets: dict[str, tuple[float, str, str]] = {}
        self._ids = itertools.count(1)
        self._lock = asyncio.Lock()

    @property
    def spent(self) -> float:
        """What the run spent (its earlier passes included)."""
        return self.base + self.settled

    async def reserve(
        self,
        payer: str,
        amount: float | None,
        *,
        model: str,
        persona: str,
        conversation_id: str,
    ) -> Reservation:
        scope = run_scope(self.run_id)
        async with self._lock:
            if amount is None:
                # Refused up front by check_priced; a model named later (a
                # grader's) still cannot be run uncounted.
                raise BudgetExceededError(scope, "unpriced", self.limit, 0.0, model=model)
            if self.spent + self.reserved + amount > self.limit:
                raise BudgetExceededError(scope, "run", self.limit, self.spent + self.reserved)
            self.reserved += amount
            ticket = f"e{next(self._ids)}"
            self._tickets[ticket] = (amount, persona, conversation_id)
            return Reservation(ticket=ticket)

    async def settle(self, ticket: str, cost: float | None) -> list[BudgetWarning]:
        held = self._tickets.pop(ticket, None)
        if held is None:
            return []
        amount, persona, conversation_id = held
        self.reserved = max(0.0, self.reserved - amount)
        self.settled += cost or 0.0
        if self._warned or self.spent < self.limit * WARN_AT:
            return []
        self._warned = True
        return [
            BudgetWarning(
                persona=persona,
                conversation_id=conversation_id,
                turn_id="",  # the caller's turn fills it in
                scope=run_scope(self.run_id),
                period="run",
                limit_usd=self.limit,
                spent_usd=round(self.spent, 6),
            )
        ]

    async def charge(
        self, payer: str, cost: float, *, persona: str, conversation_id: str
    ) -> list[BudgetWarning]:
        async with self._lock:
            self.settled += cost
        return []


def check_priced(solvers: dict[str, SolverSetup], prices: PriceTable) -> None:
    """Refuse a capped run whose solver or grader has no price: its cost
    could not be counted against the cap."""
    for setup in solvers.values():
        model = setup.config.model
        if prices.price(model.provider, model.name) is None:
            raise ConfigError(
                f"--max-cost: {setup.name}'s model {model.provider}:{model.name} has no price, "
                "so what the run spends cannot be counted; give it one under prices: in "
                "runtime.yaml"
            )


_UNSAFE = re.compile(r"[^A-Za-z0-9_-]")


def spent_sql(run_id: str) -> str:
    """The audit query of what a run's samples and their grading cost so far
    (conversations ``eval:<run>:…`` and ``eval:grade:eval_<run>_…``)."""

    def like(prefix: str) -> str:
        escaped = prefix.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
        return escaped.replace("'", "''") + "%"

    own = like(f"eval:{run_id}:")
    graded = like(f"eval:grade:{_UNSAFE.sub('_', f'eval:{run_id}:')}")
    return (
        "SELECT COALESCE(SUM(cost_usd), 0) FROM events WHERE kind = 'model_call' AND "
        f"(conversation_id LIKE '{own}' ESCAPE '\\' OR conversation_id LIKE '{graded}' "
        "ESCAPE '\\')"
    )


__all__ = ["WARN_AT", "RunBudget", "check_priced", "run_scope", "spent_sql"]
