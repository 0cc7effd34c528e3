"""What a model call costs: the price table and the cost of one usage.

Prices are US dollars per million tokens. ``runtime.yaml``'s ``prices:``
(model name or ``*``/``?`` pattern → input, output, cache_read,
cache_write) wins over :data:`DEFAULT_PRICES`, the providers' published list
prices for their common models (standard tier, late 2026), which apply to
their own provider only. Among matching patterns the longest wins, so
``gpt-4o-mini*`` beats ``gpt-4o*``. A model no entry matches has no price:
its calls cost ``None`` (NULL in the audit log, flagged in ``coterie
usage``), never 0. Scripted models run locally and cost 0.

Cost of one call, with :class:`~coterie.runtime.messages.Usage`'s
input counting cached tokens too::

    (input - cache_read - cache_write) × input_price
      + cache_read × cache_read_price + cache_write × cache_write_price
      + output × output_price
"""

from __future__ import annotations

import fnmatch
from collections.abc import Mapping
from dataclasses import dataclass, field

from coterie.runtime.config import ModelPrice
from coterie.runtime.messages import Usage


def _p(i: float, o: float, read: float | None = None, write: float | None = None) -> ModelPrice:
    return ModelPrice(input=i, output=o, cache_read=read, cache_write=write)


#: provider -> {model pattern: price}. Anthropic's cache writes (5-minute
#: cache) cost 1.25× input and its reads 0.1×; OpenAI bills no writes and
#: discounts cached reads.
DEFAULT_PRICES: dict[str, dict[str, ModelPrice]] = {
    "anthropic": {
        "claude-opus-4-5*": _p(5, 25, 0.5, 6.25),
        "claude-opus-4*": _p(15, 75, 1.5, 18.75),
        "claude-3-opus*": _p(15, 75, 1.5, 18.75),
        "claude-sonnet-4*": _p(3, 15, 0.3, 3.75),
        "claude-3-7-sonnet*": _p(3, 15, 0.3, 3.75),
        "claude-3-5-sonnet*": _p(3, 15, 0.3, 3.75),
        "claude-haiku-4-5*": _p(1, 5, 0.1, 1.25),
        "claude-3-5-haiku*": _p(0.8, 4, 0.08, 1.0),
        "claude-3-haiku*": _p(0.25, 1.25, 0.03, 0.3),
    },
    "openai": {
        "gpt-5*": _p(1.25, 10, 0.125),
        "gpt-5-mini*": _p(0.25, 2, 0.025),
        "gpt-5-nano*": _p(0.05, 0.4, 0.005),
        "gpt-4.1*": _p(2, 8, 0.5),
        "gpt-4.1-mini*": _p(0.4, 1.6, 0.1),
        "gpt-4.1-nano*": _p(0.1, 0.4, 0.025),
        "gpt-4o*": _p(2.5, 10, 1.25),
        "gpt-4o-mini*": _p(0.15, 0.6, 0.075),
        "gpt-4-turbo*": _p(10, 30),
        "gpt-3.5-turbo*": _p(0.5, 1.5),
        "o1*": _p(15, 60, 7.5),
        "o1-mini*": _p(1.1, 4.4, 0.55),
        "o3*": _p(2, 8, 0.5),
        "o3-mini*": _p(1.1, 4.4, 0.55),
        "o4-mini*": _p(1.1, 4.4, 0.275),
    },
}

#: Providers whose models run locally for nothing.
FREE_PROVIDERS: frozenset[str] = frozenset({"scripted"})


def cost_of(price: ModelPrice, usage: Usage) -> float:
    """US dollars for ``usage`` at ``price``."""
    read = min(usage.cache_read_tokens, usage.input_tokens)
    written = min(usage.cache_write_tokens, usage.input_tokens - read)
    uncached = usage.input_tokens - read - written
    read_price = price.input if price.cache_read is None else price.cache_read
    write_price = price.input if price.cache_write is None else price.cache_write
    return (
        uncached * price.input
        + read * read_price
        + written * write_price
        + usage.output_tokens * price.output
    ) / 1_000_000


#: (provider, model) pairs whose price a table keeps found.
_KEPT_PRICES = 256


def _best(patterns: Mapping[str, ModelPrice], name: str) -> ModelPrice | None:
    exact = patterns.get(name)
    if exact is not None:
        return exact
    best: tuple[int, ModelPrice] | None = None
    for pattern, price in patterns.items():
        if fnmatch.fnmatchcase(name, pattern) and (best is None or len(pattern) > best[0]):
            best = (len(pattern), price)
    return best[1] if best else None


@dataclass(frozen=True)
class PriceTable:
    """The runtime's prices: ``overrides`` (``runtime.yaml``'s ``prices:``,
    for any provider) over ``defaults`` (by provider)."""

    overrides: Mapping[str, ModelPrice]
    defaults: Mapping[str, Mapping[str, ModelPrice]]
    # Every model call asks for its model's price: the patterns are matched
    # once per (provider, model) a table is asked about.
    _found: dict[tuple[str, str], ModelPrice | None] = field(
        default_factory=dict, init=False, repr=False, compare=False
    )

    @classmethod
    def from_settings(cls, prices: Mapping[str, ModelPrice]) -> PriceTable:
        return cls(overrides=dict(prices), defaults=DEFAULT_PRICES)

    def price(self, provider: str, model: str) -> ModelPrice | None:
        """The price of ``model`` (None: unknown)."""
        key = (provider, model)
        try:
            return self._found[key]
        except KeyError:
            pass
        found = _best(self.overrides, model)
        if found is None and provider in FREE_PROVIDERS:
            found = ModelPrice(input=0, output=0)
        elif found is None:
            found = _best(self.defaults.get(provider, {}), model)
        if len(self._found) >= _KEPT_PRICES:
            self._found.clear()  # names made up per call: keep the cache small
        self._found[key] = found
        return found

    def cost(self, provider: str, model: str, usage: Usage) -> float | None:
        """US dollars for one call (None when the model has no price)."""
        price = self.price(provider, model)
        return None if price is None else cost_of(price, usage)

    def worst_case(
        self, provider: str, model: str, *, input_tokens: int, max_output_tokens: int
    ) -> float | None:
        """The most a call can cost: all input uncached (or written to the
        cache, when that costs more) and every output token used."""
        price = self.price(provider, model)
        if price is None:
            return None
        per_input = max(price.input, price.cache_write or 0.0)
        return (input_tokens * per_input + max_output_tokens * price.output) / 1_000_000


__all__ = ["DEFAULT_PRICES", "FREE_PROVIDERS", "PriceTable", "cost_of"]
