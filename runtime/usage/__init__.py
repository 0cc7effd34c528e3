"""What model calls cost and who pays: the price table
(:mod:`~coterie.runtime.usage.prices`), token estimates
(:mod:`~coterie.runtime.usage.tokens`), budgets
(:mod:`~coterie.runtime.usage.budget`) and usage reports over the audit log
(:mod:`~coterie.runtime.usage.report`: ``coterie usage``, ``GET /v1/usage``)."""
