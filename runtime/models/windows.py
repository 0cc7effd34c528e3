"""Context windows: how many tokens a model reads at most.

A model entry's ``context_window`` wins; else the window is known by the
model's family (the longest matching pattern of :data:`KNOWN_WINDOWS` for its
provider); else :data:`DEFAULT_WINDOW`. Windows as the providers publish them
(late 2026); a model that reads more than its family's figure can say so with
``context_window``.
"""

from __future__ import annotations

import fnmatch
import functools

from coterie.runtime.config import ModelConfig
from coterie.runtime.models.base import Model

#: The window assumed for a model no pattern knows (an OpenAI-compatible
#: server's own model): a provider's context-length error still triggers a
#: compaction and one retry when it is smaller.
DEFAULT_WINDOW = 128_000

#: A scripted model reads anything; a test that wants compaction sets one.
SCRIPTED_WINDOW = 1_000_000

#: (provider, model-name pattern, window).
KNOWN_WINDOWS: tuple[tuple[str, str, int], ...] = (
    ("anthropic", "claude-*", 200_000),
    ("openai", "gpt-5*", 400_000),
    ("openai", "gpt-4.1*", 1_047_576),
    ("openai", "gpt-4o*", 128_000),
    ("openai", "gpt-4-turbo*", 128_000),
    ("openai", "gpt-4", 8_192),
    ("openai", "gpt-4-0*", 8_192),
    ("openai", "gpt-3.5-turbo*", 16_385),
    ("openai", "o1*", 200_000),
    ("openai", "o3*", 200_000),
    ("openai", "o4*", 200_000),
)


@functools.lru_cache(maxsize=256)  # asked at every model call, of a few names
def known_window(provider: str, name: str) -> int | None:
    """The published window of ``name``'s family, if a pattern knows it."""
    best: tuple[int, int] | None = None  # (pattern length, window)
    for prov, pattern, window in KNOWN_WINDOWS:
        if (
            prov == provider
            and fnmatch.fnmatchcase(name, pattern)
            and (best is None or len(pattern) > best[0])
        ):
            best = (len(pattern), window)
    return best[1] if best else None


def window_of(model: Model) -> int:
    """The window of a built model: its entry's (see :func:`context_window`),
    else a ``context_window`` attribute (models made in code), else as
    :func:`context_window` would say for its provider and name."""
    config = getattr(model, "config", None)
    if config is not None and hasattr(config, "context_window") and hasattr(config, "provider"):
        return context_window(config)
    window = getattr(model, "context_window", None)
    if isinstance(window, int) and window > 0:
        return window
    if model.provider in ("scripted", "function"):
        return SCRIPTED_WINDOW
    return known_window(model.provider, model.name) or DEFAULT_WINDOW


def context_window(config: ModelConfig) -> int:
    """The window of a model entry (see the module's docstring)."""
    if config.context_window is not None:
        return config.context_window
    if config.provider == "scripted":
        return SCRIPTED_WINDOW
    return known_window(config.provider, config.name) or DEFAULT_WINDOW


__all__ = [
    "DEFAULT_WINDOW",
    "KNOWN_WINDOWS",
    "SCRIPTED_WINDOW",
    "context_window",
    "known_window",
    "window_of",
]
