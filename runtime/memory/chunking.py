"""Paragraph-aligned chunking of documents for the knowledge base.

The text is cut into *units* that never straddle a paragraph: whole
paragraphs, or — for a paragraph longer than ``size`` — its lines, then its
sentences, then its words, and as a last resort hard slices. Units are packed
greedily into chunks of at most ``size`` characters. Each chunk after the
first starts with up to ``overlap`` characters from the end of the previous
one, beginning at a paragraph, line or sentence start when one is close
enough (else a word start), so a fact cut in two is whole in one chunk.

Every chunk is a verbatim slice of the input (:func:`chunk_spans` gives the
offsets), and together the chunks cover every non-whitespace character.
"""

from __future__ import annotations

import bisect
import re

__all__ = ["chunk_spans", "chunk_text"]

Span = tuple[int, int]

# A blank line (whitespace-only lines count as blank) separates paragraphs.
_PARAGRAPH_BREAK = re.compile(r"\n[^\S\n]*\n\s*")
# Finer cuts for an over-long paragraph, coarsest first.
_LINE_BREAK = re.compile(r"\n\s*")
_SENTENCE_BREAK = re.compile(r"(?<=[.!?…])[\"'”’)\]]*\s+")
_WORD_BREAK = re.compile(r"\s+")
_FINER = (_LINE_BREAK, _SENTENCE_BREAK, _WORD_BREAK)
# Where an overlap may begin: after a line break or a sentence end.
_BOUNDARY = re.compile(r"(?:\n|[.!?…][\"'”’)\]]*[^\S\n])\s*(?=\S)")
_WORD_START = re.compile(r"(?<=\s)(?=\S)")


def chunk_text(text: str, *, size: int = 3000, overlap: int = 300) -> list[str]:
    """Split ``text`` into chunks of at most ``size`` characters (see module doc)."""
    return [text[start:end] for start, end in chunk_spans(text, size=size, overlap=overlap)]


def chunk_spans(text: str, *, size: int = 3000, overlap: int = 300) -> list[Span]:
    """``(start, end)`` offsets into ``text`` of each chunk :func:`chunk_text` returns."""
    if size < 1:
        raise ValueError("size must be positive")
    if not 0 <= overlap < size:
        raise ValueError("overlap must be at least 0 and less than size")
    units = _units(text, size)
    boundaries = [m.end() for m in _BOUNDARY.finditer(text)]
    spans: list[Span] = []
    i = 0
    while i < len(units):
        start, end = units[i]
        if spans and overlap:
            # The overlap may not push this chunk's first unit past ``size``.
            earliest = max(spans[-1][1] - overlap, end - size)
            start = _overlap_start(text, boundaries, spans[-1], earliest) or start
        i += 1
        while i < len(units) and units[i][1] - start <= size:
            end = units[i][1]
            i += 1
        spans.append((start, end))
    return spans


def _units(text: str, size: int) -> list[Span]:
    """Trimmed paragraph spans, with paragraphs over ``size`` cut finer."""
    units: list[Span] = []
    for start, end in _split(text, 0, len(text), _PARAGRAPH_BREAK):
        _cut(text, start, end, size, 0, units)
    return units


def _cut(text: str, start: int, end: int, size: int, level: int, out: list[Span]) -> None:
    if end - start <= size:
        out.append((start, end))
        return
    if level == len(_FINER):
        # Nothing left to cut on (e.g. one giant token): hard slices.
        for piece in range(start, end, size):
            out.extend(_split(text, piece, min(piece + size, end), None))
        return
    for sub_start, sub_end in _split(text, start, end, _FINER[level]):
        _cut(text, sub_start, sub_end, size, level + 1, out)


def _split(text: str, start: int, end: int, sep: re.Pattern[str] | None) -> list[Span]:
    """Non-empty spans of ``text[start:end]`` between ``sep`` matches, trimmed of whitespace."""
    spans: list[Span] = []
    pos = start
    cuts = list(sep.finditer(text, start, end)) if sep is not None else []
    for cut in [*cuts, None]:
        piece_end = cut.start() if cut is not None else end
        s, e = pos, piece_end
        while s < e and text[s].isspace():
            s += 1
        while e > s and text[e - 1].isspace():
            e -= 1
        if s < e:
            spans.append((s, e))
        if cut is not None:
            pos = cut.end()
    return spans


def _overlap_start(text: str, boundaries: list[int], prev: Span, earliest: int) -> int | None:
    """Earliest good start in ``[earliest, prev_end)``, inside the previous chunk."""
    prev_start, prev_end = prev
    lo = max(earliest, prev_start + 1)
    if lo >= prev_end:
        return None
    k = bisect.bisect_left(boundaries, lo)
    if k < len(boundaries) and boundaries[k] < prev_end:
        return boundaries[k]
    word = _WORD_START.search(text, lo, prev_end)
    if word is not None:
        return word.start()
    # The tail is one unbroken token: overlap by a plain slice.
    return lo
