"""Retrieval-quality datasets for the memory store's recall, written as code.

- :mod:`~tests.recall.recall_eval`: seventy memories of a personal assistant and
  thirty-two queries labelled lexical, semantic or mixed (the older benchmark);
- :mod:`~tests.recall.recall_sets`: the paraphrase and exact-term sets (and
  that older one in the same form) with their metrics, recall@k and MRR.

They are test data, not product: they live in tests/, outside the wheel.
tests/test_recall_quality.py and benchmarks/recall.py both read them; like
:mod:`tests.fakes` this package imports nothing else of tests/ and no pytest.
"""

from __future__ import annotations

from tests.recall import recall_eval, recall_sets

__all__ = ["recall_eval", "recall_sets"]
