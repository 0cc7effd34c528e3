"""What a conversation may hold and what its model calls may cost: the
``compaction:``, ``budget:`` and ``prices:`` sections.

``compaction:`` and ``budget:`` are sections of ``persona.yaml``;
``runtime.yaml`` has them too, ``compaction:`` as the default of every persona
(a persona's own fields win, field by field) and ``budget:`` as the budget of
the whole runtime (counted beside each persona's own). ``prices:`` is
``runtime.yaml``'s only (see :mod:`coterie.runtime.usage.prices`). The guide's
"Long conversations and cost" page says what each field does.
"""

from __future__ import annotations

from pydantic import Field

from coterie.runtime.config._strict import Strict
from coterie.runtime.config.models import ModelConfig


class CompactionSettings(Strict):
    """When and how a conversation that nears its model's context window is
    summarized (``compaction:``)."""

    enabled: bool = Field(
        default=True,
        description="summarize older turns when a request nears the window (false: only drop "
        "the oldest turns, with a marker, when a request would not fit)",
    )
    threshold: float = Field(
        default=0.8,
        gt=0.1,
        lt=1.0,
        description="share of the model's context window a request may reach before the "
        "conversation is compacted",
    )
    model: ModelConfig | None = Field(
        default=None,
        description="the model that writes summaries (default: the persona's own)",
    )
    keep_turns: int = Field(
        default=3,
        ge=0,
        le=100,
        description="latest turns kept verbatim (besides the current one, always kept)",
    )
    elide_tool_results_over: int = Field(
        default=2000,
        ge=0,
        description="characters: older tool results longer than this are first cut to a "
        "stub naming their size (0: never)",
    )
    memory_flush: bool = Field(
        default=False,
        description="before summarizing, give the persona one model call with the memory "
        "tool to save durable facts",
    )
    summary_max_tokens: int = Field(
        default=1024, ge=64, le=32_000, description="output tokens of one summary"
    )
    timeout: float = Field(
        default=120.0,
        gt=0,
        description="seconds one summarizer call may take; past it the older turns are "
        "dropped (with a marker) instead",
    )
    max_per_turn: int = Field(
        default=3,
        ge=1,
        le=20,
        description="compactions one turn may make; a turn that would need more ends with "
        "a context_overflow error",
    )


class BudgetSettings(Strict):
    """What model calls may cost (``budget:``), in US dollars: per day and
    per calendar month in the runtime's time zone. A model call is refused
    (``budget_exceeded``) once what was spent plus what running calls may
    still cost would pass a limit."""

    daily_usd: float | None = Field(default=None, gt=0)
    monthly_usd: float | None = Field(default=None, gt=0)
    warn_at: float = Field(
        default=0.8,
        gt=0,
        le=1,
        description="share of a limit at which a warning is logged and audited (once a period)",
    )

    @property
    def limited(self) -> bool:
        return self.daily_usd is not None or self.monthly_usd is not None


class ModelPrice(Strict):
    """One model's price in US dollars per million tokens (``prices:``).
    ``cache_read`` and ``cache_write`` default to ``input``."""

    input: float = Field(ge=0)
    output: float = Field(ge=0)
    cache_read: float | None = Field(default=None, ge=0)
    cache_write: float | None = Field(default=None, ge=0)


def merged_compaction(
    runtime: CompactionSettings, persona: CompactionSettings | None
) -> CompactionSettings:
    """The persona's compaction settings: ``runtime.yaml``'s, with each field
    the persona's file sets in its place."""
    if persona is None:
        return runtime
    return runtime.model_copy(update={k: getattr(persona, k) for k in persona.model_fields_set})


__all__ = ["BudgetSettings", "CompactionSettings", "ModelPrice", "merged_compaction"]
