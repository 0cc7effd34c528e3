"""Paragraph-aligned chunking: sizes, alignment, overlap, and no lost text."""

from __future__ import annotations

import itertools
import random
import re

import pytest

from runtime.memory.chunking import chunk_spans, chunk_text


def _document(seed: int, paragraphs: int = 40) -> str:
    rng = random.Random(seed)
    words = ["alpha", "beta", "gamma", "delta", "epsilon", "zeta", "eta", "theta", "iota"]
    paras = []
    for _ in range(paragraphs):
        sentences = [
            " ".join(rng.choice(words) for _ in range(rng.randint(3, 25))).capitalize() + "."
            for _ in range(rng.randint(1, 40))
        ]
        paras.append(" ".join(sentences))
    return "\n\n".join(paras)


def _assert_covers(text: str, spans: list[tuple[int, int]]) -> None:
    """Every non-whitespace character of ``text`` lies in some span."""
    covered = bytearray(len(text))
    for start, end in spans:
        covered[start:end] = b"\x01" * (end - start)
    lost = [i for i, ch in enumerate(text) if not ch.isspace() and not covered[i]]
    assert not lost, f"characters lost at {lost[:5]}"


def test_short_text_is_one_chunk() -> None:
    assert chunk_text("  Hello there.\n\nSecond paragraph.  ") == [
        "Hello there.\n\nSecond paragraph."
    ]


@pytest.mark.parametrize("text", ["", "   \n\n\t  "])
def test_blank_text_has_no_chunks(text: str) -> None:
    assert chunk_text(text) == []


@pytest.mark.parametrize("seed", range(5))
@pytest.mark.parametrize(("size", "overlap"), [(3000, 300), (500, 100), (200, 0)])
def test_sizes_coverage_and_order(seed: int, size: int, overlap: int) -> None:
    text = _document(seed)
    spans = chunk_spans(text, size=size, overlap=overlap)
    assert spans
    assert all(0 < end - start <= size for start, end in spans)
    # Chunks are verbatim slices, in document order, each moving forward.
    assert [text[s:e] for s, e in spans] == chunk_text(text, size=size, overlap=overlap)
    for (s1, e1), (s2, e2) in itertools.pairwise(spans):
        assert s1 < s2 and e1 < e2
        assert s2 >= e1 - overlap  # never more overlap than asked for
    _assert_covers(text, spans)


def test_paragraphs_are_packed_whole() -> None:
    paras = [f"Paragraph {i} " + "word " * 40 + "end." for i in range(20)]
    text = "\n\n".join(paras)
    for chunk in chunk_text(text, size=1000, overlap=0):
        # Without overlap every chunk is a run of whole paragraphs.
        for piece in chunk.split("\n\n"):
            assert piece in paras


@pytest.mark.parametrize("seed", [7, 8, 9])
def test_overlap_starts_at_a_sentence_or_paragraph(seed: int) -> None:
    text = _document(seed)
    spans = chunk_spans(text, size=800, overlap=200)
    # Where a sentence (after ". ") or a paragraph (after a newline) begins.
    boundaries = {m.end() for m in re.finditer(r"(?:\n|\.\s)\s*(?=\S)", text)}
    overlapping = at_boundary = 0
    for (_, prev_end), (start, _) in itertools.pairwise(spans):
        if start >= prev_end:
            continue
        overlapping += 1
        assert prev_end - start <= 200
        assert text[start - 1].isspace() and not text[start].isspace()  # a word, at least
        if start in boundaries:
            at_boundary += 1
        else:
            # A mid-sentence start only when no sentence begins later in the overlap.
            later = [b for b in boundaries if start < b < prev_end]
            assert not later, f"overlap starts mid-sentence at {start}, a sentence at {later[0]}"
    assert overlapping > len(spans) // 2
    assert at_boundary >= 0.9 * overlapping


def test_overlap_prefers_a_sentence_boundary() -> None:
    sentences = [f"Sentence number {i} is short." for i in range(200)]
    text = " ".join(sentences)
    spans = chunk_spans(text, size=600, overlap=120)
    for (_, prev_end), (start, _) in itertools.pairwise(spans):
        assert start < prev_end
        assert text[start:].startswith("Sentence number")


def test_long_paragraph_splits_on_lines_then_sentences() -> None:
    lines = [f"line {i} " + "x" * 50 for i in range(30)]
    text = "\n".join(lines)  # one paragraph of ~1,700 chars
    chunks = chunk_text(text, size=500, overlap=0)
    assert len(chunks) >= 4
    for chunk in chunks:
        assert all(line in lines for line in chunk.split("\n"))


def test_unbreakable_token_is_hard_sliced() -> None:
    text = "start\n\n" + "x" * 2500 + "\n\nend"
    spans = chunk_spans(text, size=1000, overlap=100)
    assert all(end - start <= 1000 for start, end in spans)
    _assert_covers(text, spans)
    assert "".join(text[s:e] for s, e in spans).count("x") >= 2500


def test_windows_line_endings_are_paragraph_breaks() -> None:
    text = "one two three.\r\n\r\nfour five six."
    assert chunk_text(text, size=16, overlap=0) == ["one two three.", "four five six."]


@pytest.mark.parametrize(("size", "overlap"), [(0, 0), (100, 100), (100, -1)])
def test_bad_parameters(size: int, overlap: int) -> None:
    with pytest.raises(ValueError):
        chunk_text("text", size=size, overlap=overlap)
