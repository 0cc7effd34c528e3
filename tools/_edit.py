"""The find-and-replace engine behind ``file_edit``.

An exact match is tried first and must be unique unless ``replace_all``.
When the exact text is absent, a chain of tolerant matchers is tried in
order; the first matcher that finds anything decides: exactly one candidate
is edited, more than one is refused as ambiguous. A candidate that spans far
more lines than ``old_text`` is refused as disproportionate.

The engine works on LF text; :func:`edit_text` strips and restores a UTF-8
BOM and CRLF line endings around it.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass

from coterie.runtime.errors import ToolError

BLOCK_SIMILARITY = 0.7
# A tolerant match may span at most this many times the lines of old_text.
MAX_SPAN_RATIO = 2


@dataclass(frozen=True)
class Candidate:
    """A span of the content a matcher found, and the text to put there."""

    start: int
    end: int
    replacement: str


@dataclass(frozen=True)
class EditResult:
    """The edited text and how it was found."""

    text: str
    matcher: str
    start_line: int
    end_line: int
    count: int


Matcher = Callable[[str, str, str], list[Candidate]]


# --- helpers -------------------------------------------------------------


def _line_starts(content: str) -> list[int]:
    starts = [0]
    for m in re.finditer("\n", content):
        starts.append(m.end())
    return starts


def _line_of(starts: list[int], offset: int) -> int:
    """1-based line number of ``offset``."""
    lo, hi = 0, len(starts) - 1
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if starts[mid] <= offset:
            lo = mid
        else:
            hi = mid - 1
    return lo + 1


def _old_lines(old: str) -> tuple[list[str], bool]:
    """The lines of ``old`` and whether it ended with a newline."""
    trailing = old.endswith("\n")
    lines = old.split("\n")
    if trailing:
        lines.pop()
    return lines, trailing


def _window_span(
    content: str, starts: list[int], first: int, count: int, trailing: bool
) -> tuple[int, int]:
    """Offsets covering ``count`` lines from line index ``first``."""
    start = starts[first]
    last = first + count - 1
    end = starts[last + 1] - 1 if last + 1 < len(starts) else len(content)
    if trailing and end < len(content):
        end += 1
    return start, end


def _indent(line: str) -> str:
    return line[: len(line) - len(line.lstrip(" \t"))]


def _common_indent(lines: list[str]) -> str:
    indents = [_indent(line) for line in lines if line.strip()]
    if not indents:
        return ""
    common = indents[0]
    for ind in indents[1:]:
        while not ind.startswith(common):
            common = common[:-1]
    return common


def _dedent(lines: list[str], indent: str) -> list[str]:
    return [line[len(indent) :] if line.startswith(indent) else line.lstrip() for line in lines]


# --- matchers ------------------------------------------------------------


def match_indentation(content: str, old: str, new: str) -> list[Candidate]:
    """Same lines once the common leading indentation is removed; the
    replacement is re-indented to the indentation found in the file."""
    old_lines, trailing = _old_lines(old)
    old_indent = _common_indent(old_lines)
    target = _dedent(old_lines, old_indent)
    if not any(line.strip() for line in target):
        return []
    lines = content.split("\n")
    starts = _line_starts(content)
    n = len(old_lines)
    out: list[Candidate] = []
    for i in range(len(lines) - n + 1):
        window = lines[i : i + n]
        indent = _common_indent(window)
        if indent == old_indent or _dedent(window, indent) != target:
            continue
        new_lines = new.split("\n")
        shifted = [
            (indent + line[len(old_indent) :] if line.startswith(old_indent) else indent + line)
            if line.strip()
            else line
            for line in new_lines
        ]
        start, end = _window_span(content, starts, i, n, trailing)
        out.append(Candidate(start, end, "\n".join(shifted)))
    return out


def match_line_trimmed(content: str, old: str, new: str) -> list[Candidate]:
    """Whole lines equal once each is stripped of surrounding whitespace."""
    old_lines, trailing = _old_lines(old)
    target = [line.strip() for line in old_lines]
    if not any(target):
        return []
    lines = content.split("\n")
    starts = _line_starts(content)
    n = len(target)
    out: list[Candidate] = []
    for i in range(len(lines) - n + 1):
        if all(lines[i + k].strip() == target[k] for k in range(n)):
            start, end = _window_span(content, starts, i, n, trailing)
            # old_text copied from mid-line (first indent dropped): keep the
            # file's indentation in front of an unindented replacement.
            indent = _indent(lines[i])
            lead = indent if indent and not _indent(old_lines[0]) and new[:1] not in " \t" else ""
            out.append(Candidate(start, end, lead + new))
    return out


def match_block_anchor(content: str, old: str, new: str) -> list[Candidate]:
    """First and last lines equal (trimmed), the lines between similar."""
    old_lines, trailing = _old_lines(old)
    if len(old_lines) < 3:
        return []
    first, last = old_lines[0].strip(), old_lines[-1].strip()
    if not first or not last:
        return []
    middle = "\n".join(line.strip() for line in old_lines[1:-1])
    lines = content.split("\n")
    starts = _line_starts(content)
    import difflib  # the edit tool's fuzzy step, rare: not loaded with every persona

    out: list[Candidate] = []
    for i, line in enumerate(lines):
        if line.strip() != first:
            continue
        for j in range(i + 2, len(lines)):
            if lines[j].strip() != last:
                continue
            found = "\n".join(x.strip() for x in lines[i + 1 : j])
            ratio = difflib.SequenceMatcher(None, middle, found, autojunk=False).ratio()
            if ratio >= BLOCK_SIMILARITY:
                start, end = _window_span(content, starts, i, j - i + 1, trailing)
                out.append(Candidate(start, end, new))
            break
    return out


def match_whitespace(content: str, old: str, new: str) -> list[Candidate]:
    """Equal once every run of whitespace is collapsed to one space."""
    target = re.sub(r"\s+", " ", old)
    if not target.strip():
        return []
    chars: list[str] = []
    origin: list[int] = []  # offset in content of each normalized char
    ends: list[int] = []  # offset just past the content run it stands for
    i = 0
    while i < len(content):
        if content[i].isspace():
            j = i
            while j < len(content) and content[j].isspace():
                j += 1
            chars.append(" ")
            origin.append(i)
            ends.append(j)
            i = j
        else:
            chars.append(content[i])
            origin.append(i)
            ends.append(i + 1)
            i += 1
    norm = "".join(chars)
    out: list[Candidate] = []
    pos = norm.find(target)
    while pos != -1:
        last = pos + len(target) - 1
        out.append(Candidate(origin[pos], ends[last], new))
        pos = norm.find(target, pos + len(target))
    return out


_ESCAPES = {"n": "\n", "t": "\t", "r": "\r", '"': '"', "'": "'", "\\": "\\", "`": "`", "$": "$"}
_ESCAPE_RE = re.compile(r"\\([nrt\"'`$\\])")


def unescape(text: str) -> str:
    return _ESCAPE_RE.sub(lambda m: _ESCAPES[m.group(1)], text)


def match_escapes(content: str, old: str, new: str) -> list[Candidate]:
    """``old_text`` with escape sequences (``\\n``, ``\\t``, ``\\"``…) unescaped."""
    target = unescape(old)
    if target == old or not target:
        return []
    replacement = unescape(new)
    return [Candidate(s, s + len(target), replacement) for s in _find_all(content, target)]


def match_trimmed_boundary(content: str, old: str, new: str) -> list[Candidate]:
    """``old_text`` without its leading and trailing whitespace."""
    target = old.strip()
    if target == old or not target:
        return []
    replacement = new
    if old[:1].isspace():
        replacement = replacement.lstrip()
    if old[-1:].isspace():
        replacement = replacement.rstrip()
    return [Candidate(s, s + len(target), replacement) for s in _find_all(content, target)]


# Indentation-flexible runs before line-trimmed: every indentation-flexible
# match is also a line-trimmed match, and only the former re-indents the
# replacement, so the other order would never reach it.
MATCHERS: list[tuple[str, Matcher]] = [
    ("indentation-flexible", match_indentation),
    ("line-trimmed", match_line_trimmed),
    ("block-anchor", match_block_anchor),
    ("whitespace-normalized", match_whitespace),
    ("escape-normalized", match_escapes),
    ("trimmed-boundary", match_trimmed_boundary),
]


def _find_all(content: str, target: str) -> list[int]:
    found: list[int] = []
    pos = content.find(target)
    while pos != -1:
        found.append(pos)
        pos = content.find(target, pos + len(target))
    return found


# --- the engine ----------------------------------------------------------


def replace(content: str, old: str, new: str, *, replace_all: bool = False) -> EditResult:
    """Apply one edit to LF text; ToolError when it cannot be done safely."""
    if not old:
        raise ToolError("invalid_arguments", "old_text must not be empty")
    if old == new:
        raise ToolError("invalid_arguments", "old_text and new_text are identical: nothing to do")
    starts = _line_starts(content)
    exact = _find_all(content, old)
    if exact:
        if len(exact) > 1 and not replace_all:
            raise ToolError(
                "ambiguous_match",
                f"old_text matches {len(exact)} times; add surrounding lines to make it "
                "unique, or set replace_all to change every occurrence",
            )
        text = content.replace(old, new) if replace_all else content.replace(old, new, 1)
        return EditResult(
            text=text,
            matcher="exact",
            start_line=_line_of(starts, exact[0]),
            end_line=_line_of(starts, exact[0] + len(old) - 1),
            count=len(exact) if replace_all else 1,
        )
    old_line_count = len(_old_lines(old)[0])
    for name, matcher in MATCHERS:
        candidates = matcher(content, old, new)
        if not candidates:
            continue
        if len(candidates) > 1:
            raise ToolError(
                "ambiguous_match",
                f"old_text was not found exactly; the {name} match found {len(candidates)} "
                "candidates, so nothing was changed; copy the text exactly from the file, "
                "with enough surrounding lines to be unique",
            )
        found = candidates[0]
        first = _line_of(starts, found.start)
        last = _line_of(starts, max(found.start, found.end - 1))
        span = last - first + 1
        if span > MAX_SPAN_RATIO * old_line_count:
            raise ToolError(
                "disproportionate_match",
                f"the {name} match spans lines {first}–{last} ({span} lines) for an old_text "
                f"of {old_line_count} line(s); refusing to replace that much — copy the text "
                "exactly from the file",
            )
        text = content[: found.start] + found.replacement + content[found.end :]
        if text == content:
            raise ToolError("no_change", f"the {name} match would leave the file unchanged")
        return EditResult(text=text, matcher=name, start_line=first, end_line=last, count=1)
    raise ToolError(
        "not_found",
        "old_text was not found in the file (exact and tolerant matching failed); read the "
        "file again and copy the text to replace exactly",
    )


def edit_text(raw: str, old: str, new: str, *, replace_all: bool = False) -> EditResult:
    """:func:`replace` on file text, keeping its BOM and CRLF line endings."""
    bom = raw.startswith("\ufeff")
    body = raw[1:] if bom else raw
    crlf_count = body.count("\r\n")
    crlf = crlf_count > 0 and crlf_count >= body.count("\n") - crlf_count
    if crlf:
        body = body.replace("\r\n", "\n")
    old = old.replace("\r\n", "\n")
    new = new.replace("\r\n", "\n")
    result = replace(body, old, new, replace_all=replace_all)
    text = result.text
    if crlf:
        text = text.replace("\n", "\r\n")
    if bom:
        text = "\ufeff" + text
    return EditResult(text, result.matcher, result.start_line, result.end_line, result.count)


__all__ = ["MATCHERS", "Candidate", "EditResult", "edit_text", "replace", "unescape"]
