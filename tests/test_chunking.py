"""Paragraph-aligned chunking: sizes, alignment, overlap, and no lost text."""

from __future__ import annotations

import itertools
import random
import re

import pytest

from coterie.runtime.memory.chunking import chunk_spans, chunk_text


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
    # A paragraph is 216 or 217 characters and the separator 2: four make at
    # most 4 * 217 + 3 * 2 = 874 <= 1000, a fifth makes over 1,080. Greedy
    # packing therefore puts exactly four whole paragraphs in every chunk.
    assert chunk_text(text, size=1000, overlap=0) == [
        "\n\n".join(paras[i : i + 4]) for i in range(0, 20, 4)
    ]


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
    assert len(spans) > len(text) // 600  # many chunks, so many overlaps checked
    for (_, prev_end), (start, _) in itertools.pairwise(spans):
        assert start < prev_end
        assert text[start:].startswith("Sentence number")


def test_long_paragraph_splits_on_lines_then_sentences() -> None:
    # Lines 0-9 are 57 characters, lines 10-29 are 58.
    lines = [f"line {i} " + "x" * 50 for i in range(30)]
    # One line longer than ``size``, made of twelve 53-character sentences.
    sentences = [f"Sentence {k:02} " + "y" * 40 + "." for k in range(12)]
    long_line = " ".join(sentences)
    assert len(long_line) == 647
    text = "\n".join([*lines, long_line])  # one paragraph of ~2,400 chars
    chunks = chunk_text(text, size=500, overlap=0)
    # The paragraph is cut into lines; the long line is cut into sentences.
    # Greedy packing: 8 lines of 57 take 8 * 57 + 7 = 463 (a ninth: 521);
    # lines 8-15 take 2 * 57 + 6 * 58 + 7 = 469; lines 16-23 take 471; lines
    # 24-29 take 353, and the first two sentences fit after them (461, a third
    # makes 515). Nine sentences take 9 * 53 + 8 = 485 (ten: 539); one is left.
    assert chunks == [
        "\n".join(lines[0:8]),
        "\n".join(lines[8:16]),
        "\n".join(lines[16:24]),
        "\n".join([*lines[24:30], " ".join(sentences[0:2])]),
        " ".join(sentences[2:11]),
        sentences[11],
    ]


def test_unbreakable_token_is_hard_sliced() -> None:
    text = "start\n\n" + "x" * 2500 + "\n\nend"
    spans = chunk_spans(text, size=1000, overlap=100)
    # "start" is 0-5 and "end" 2509-2512; the run of x is 7-2507 and has no
    # line, sentence or word break, so it is sliced every 1,000 characters:
    # 7-1007, 1007-2007, 2007-2507. Overlap may not push a chunk past 1,000,
    # so the two full slices get none; the last slice (500) starts 100
    # characters back, at 1907, and "end" (605 from there) is packed with it.
    assert spans == [(0, 5), (7, 1007), (1007, 2007), (1907, 2512)]
    assert [text[s:e] for s, e in spans] == [
        "start",
        "x" * 1000,
        "x" * 1000,
        "x" * 600 + "\n\nend",
    ]
    _assert_covers(text, spans)


def test_windows_line_endings_are_paragraph_breaks() -> None:
    text = "one two three.\r\n\r\nfour five six."
    assert chunk_text(text, size=16, overlap=0) == ["one two three.", "four five six."]


@pytest.mark.parametrize(("size", "overlap"), [(0, 0), (100, 100), (100, -1)])
def test_bad_parameters(size: int, overlap: int) -> None:
    with pytest.raises(ValueError):
        chunk_text("text", size=size, overlap=overlap)
