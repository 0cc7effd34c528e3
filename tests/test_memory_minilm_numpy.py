"""The numpy all-MiniLM-L6-v2 against its references: the ``tokenizers``
package for the word pieces, sentence-transformers (torch) for the vectors."""

from __future__ import annotations

import random
import re
from pathlib import Path

import numpy as np
import pytest

from coterie.runtime.memory._minilm import MAX_TOKENS, WordPiece, read_safetensors
from coterie.runtime.memory.embedders import MiniLMEmbedder, NumpyMiniLMEmbedder, local_model_dir

ROOT = Path(__file__).resolve().parent.parent

EDGE_CASES = [
    "",
    " ",
    "\t\n",
    "a",
    "hello [MASK] world [cls] [SEP][PAD][UNK] [MASK]x[CLS]",
    "ΟΔΟΣ ΣΊΣΥΦΟΣ σίσυφος",  # a final capital sigma lower-cases to σ, not ς
    "Café naïve façade ÀÉÎÕÜ àéîõü ÇçÑñ İstanbul ǅungla ﬁne ß straße",
    "中文字 日本語のテキストと한국어 텍스트",
    "Привет, как дела? Всё хорошо. مرحبا بالعالم",
    "emoji 🙂🎉 test 👍🏽 — “quotes” … ½ ² ™ €100",
    "\x00null\x07bell\u200bzero\u00adsoft\ufeffbom\ufffd tab\tsep\u3000ideo\u00a0nbsp",
    "def f(x):\n    return x**2  # square; SELECT * FROM t WHERE a<>b AND c>=1;",
    "https://example.invalid/a?b=c&d=e#f ~user/$HOME|pipe^caret`tick",
    "Dr. Smith's appointment is at 3:45pm on 2025-03-10 (Mon).",
    "supercalifragilisticexpialidocious" * 5,  # over 100 characters: one [UNK]
    "x" * 99,
    "word " * 400,  # truncated to 256 word pieces
]


def corpus(n: int = 300, seed: int = 7) -> list[str]:
    """Paragraphs and sentences of the README and the guide, the edge cases and
    random strings."""
    rng = random.Random(seed)
    pages = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    text = "\n\n".join(page.read_text(encoding="utf-8") for page in pages)
    paragraphs = [p.strip() for p in text.split("\n\n") if p.strip()]
    sentences = [s for p in paragraphs for s in re.split(r"(?<=[.!?])\s+", p) if 3 < len(s) < 200]
    texts = [*EDGE_CASES, *rng.sample(paragraphs, 60), *rng.sample(sentences, 120)]
    alphabet = (
        "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789 .,;:!?'\"()-–—"
        "éüßçøåñ中日한🙂\n\t$%&*+/<=>@[]^_`{|}~"
    )
    while len(texts) < n:
        size = rng.choice([5, 20, 60, 200, 1200])
        texts.append("".join(rng.choice(alphabet) for _ in range(size)))
    return texts


@pytest.fixture(scope="module")
def model_dir() -> Path:
    found = local_model_dir()
    assert found is not None, "the dev install has the local model"
    return found


def test_word_pieces_are_the_tokenizers_package_ones(model_dir: Path) -> None:
    from tokenizers import Tokenizer

    reference = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
    reference.no_padding()
    reference.enable_truncation(MAX_TOKENS)
    ours = WordPiece.from_vocab_file(model_dir / "vocab.txt")
    for text in corpus(600, seed=11):
        expected = reference.encode(text).ids
        assert [ours.cls, *ours.encode(text)[: MAX_TOKENS - 2], ours.sep] == expected, text


def test_safetensors_are_read_as_they_are(model_dir: Path) -> None:
    tensors = read_safetensors(model_dir / "model.safetensors")
    word = tensors["embeddings.word_embeddings.weight"]
    assert word.shape == (30522, 384) and word.dtype == np.float32
    assert tensors["embeddings.position_ids"].dtype == np.int64
    assert tensors["embeddings.position_ids"][0, :4].tolist() == [0, 1, 2, 3]


def test_vectors_match_sentence_transformers(model_dir: Path) -> None:
    texts = corpus()
    ours = np.asarray(NumpyMiniLMEmbedder(model_dir).embed(texts), dtype=np.float32)
    reference = np.asarray(MiniLMEmbedder().embed(texts), dtype=np.float32)
    assert ours.shape == reference.shape == (len(texts), 384)
    cosine = (ours * reference).sum(axis=1)
    # Measured: ≥ 0.9999998, elements within 3e-7 (float32 rounding).
    assert cosine.min() >= 0.9999, [texts[i] for i in np.argsort(cosine)[:3]]
    assert np.abs(ours - reference).max() < 1e-4
    assert np.allclose(np.linalg.norm(ours, axis=1), 1.0, atol=1e-5)


def test_batches_do_not_change_vectors(model_dir: Path) -> None:
    embedder = NumpyMiniLMEmbedder(model_dir, batch_size=3)
    texts = ["short", "a somewhat longer sentence about valves", "mid length text", "x"]
    together = np.asarray(embedder.embed(texts))
    alone = np.asarray([embedder.embed([t])[0] for t in texts])
    assert np.abs(together - alone).max() < 1e-5
    assert embedder.embed([]) == []


def test_meaning_survives(model_dir: Path) -> None:
    a, b, c = NumpyMiniLMEmbedder(model_dir).embed(
        ["a cat sat on the mat", "a kitten rested on a rug", "tax law"]
    )
    assert np.dot(a, b) > np.dot(a, c) + 0.2
