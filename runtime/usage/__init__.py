"""What model calls cost and who pays: the price table
(:mod:`~coterie.runtime.usage.prices`), token estimates
(:mod:`~coterie.runtime.usage.tokens`) and budgets
(:mod:`~coterie.runtime.usage.budget`)."""
