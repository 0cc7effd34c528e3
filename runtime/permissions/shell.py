"""What a shell command line runs: the argv of every command in it.

Permission rules on ``shell_exec`` match what the line *does*, not its raw
text, so ``bash -c "rm -rf x"``, ``env X=1 rm x``, ``sudo rm x``, ``find .
-exec rm {} ;`` and ``echo $(rm x)`` all show ``rm`` to the rules.

:func:`commands` reads a line the way ``/bin/sh`` would split it — quotes,
escapes, ``;``, ``&&``, ``||``, ``|``, ``&``, newlines, subshells, command
substitution (``$(…)``, backticks, ``<(…)``) and redirections — and unwraps
the commands that run another command: ``sudo``, ``doas``, ``env``,
``timeout``, ``nice``, ``ionice``, ``nohup``, ``time``, ``command``,
``exec``, ``stdbuf``, ``setsid``, ``busybox``, ``xargs``, ``eval``, a shell
with ``-c`` (its string is read as a line), ``find -exec``/``-execdir``/
``-ok``, and a shell script the line runs (``sh x.sh``, ``./x.sh``) when the
caller can read it. A wrapper is listed too: a rule on ``sudo`` still sees
it.

Text that could be commands is read as commands (a here-document's lines
too): reading too much asks or denies more, never less. What no parser can
see into — an interpreter's own code (``python -c``), a binary — is not
unwrapped; rules that must hold there are allow-lists (see the guide).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass

from coterie.runtime.errors import CoterieError

#: How deep wrappers and scripts are followed.
MAX_DEPTH = 8
#: The most of a script that is read.
MAX_SCRIPT_BYTES = 65_536

_SEPARATORS = {";", "&", "|", "&&", "||", "(", ")", ";;", "|&", "{", "}", "!"}
_REDIRECTS = {"<", ">", ">>", "<<", "<<<", "<>", ">|", "&>", "&>>", ">&", "<&", "<<-"}
_KEYWORDS = {"if", "then", "else", "elif", "fi", "do", "done", "while", "until", "!", "{", "}"}
_SHELLS = {"sh", "bash", "dash", "zsh", "ksh", "ash", "mksh", "busybox-sh"}
_OPERATOR_CHARS = ";&|()<>"

#: Reads a script the line runs (its path as written); None if it cannot.
ReadScript = Callable[[str], "str | None"]


class ShellParseError(CoterieError):
    """The line cannot be read (an unclosed quote or substitution)."""


@dataclass
class _Token:
    text: str
    # An operator (separator or redirection) rather than a word.
    op: bool = False


def _closing(line: str, start: int, open_: str, close: str) -> int:
    """The index of the ``close`` that balances an ``open_`` before ``start``."""
    depth = 1
    i = start
    quote: str | None = None
    while i < len(line):
        c = line[i]
        if quote:
            if c == "\\" and quote == '"':
                i += 2
                continue
            if c == quote:
                quote = None
        elif c in "'\"":
            quote = c
        elif c == "\\":
            i += 2
            continue
        elif c == open_:
            depth += 1
        elif c == close:
            depth -= 1
            if depth == 0:
                return i
        i += 1
    raise ShellParseError(f"no closing {close!r}")


def _tokens(line: str) -> tuple[list[_Token], list[str]]:
    """Words and operators of ``line``, and the text of its command substitutions."""
    out: list[_Token] = []
    subs: list[str] = []
    word: list[str] = []
    in_word = False
    i = 0
    n = len(line)

    def end_word() -> None:
        nonlocal in_word
        if in_word:
            out.append(_Token("".join(word)))
            word.clear()
            in_word = False

    def substitution(i: int, two: bool) -> int:
        """``$(`` (two chars) or ``<(``/``>(`` at ``i``: record it, return the end."""
        body_start = i + 2
        if two and line.startswith("$((", i):  # arithmetic, not a command
            end = _closing(line, i + 3, "(", ")")
            return _closing(line, end + 1, "(", ")") + 1 if end + 1 < n else end + 1
        end = _closing(line, body_start, "(", ")")
        subs.append(line[body_start:end])
        return end + 1

    while i < n:
        c = line[i]
        if c in " \t":
            end_word()
            i += 1
        elif c in "\n\r":
            end_word()
            out.append(_Token(";", op=True))
            i += 1
        elif c == "#" and not in_word:
            while i < n and line[i] != "\n":
                i += 1
        elif c == "\\":
            if i + 1 < n and line[i + 1] == "\n":
                i += 2
                continue
            word.append(line[i + 1] if i + 1 < n else "")
            in_word = True
            i += 2
        elif c == "'":
            end = line.find("'", i + 1)
            if end < 0:
                raise ShellParseError("an unclosed single quote")
            word.append(line[i + 1 : end])
            in_word = True
            i = end + 1
        elif c == '"':
            in_word = True
            i += 1
            while True:
                if i >= n:
                    raise ShellParseError("an unclosed double quote")
                d = line[i]
                if d == '"':
                    i += 1
                    break
                if d == "\\" and i + 1 < n and line[i + 1] in '"\\$`\n':
                    word.append(line[i + 1])
                    i += 2
                elif d == "$" and line.startswith("$(", i):
                    start = i
                    i = substitution(i, True)
                    word.append(line[start:i])
                elif d == "`":
                    end = line.find("`", i + 1)
                    if end < 0:
                        raise ShellParseError("an unclosed backtick")
                    subs.append(line[i + 1 : end])
                    word.append(line[i : end + 1])
                    i = end + 1
                else:
                    word.append(d)
                    i += 1
        elif c == "`":
            end = line.find("`", i + 1)
            if end < 0:
                raise ShellParseError("an unclosed backtick")
            subs.append(line[i + 1 : end])
            word.append(line[i : end + 1])
            in_word = True
            i = end + 1
        elif c == "$" and line.startswith("$(", i):
            start = i
            i = substitution(i, True)
            word.append(line[start:i])
            in_word = True
        elif c in "<>" and i + 1 < n and line[i + 1] == "(":
            end_word()
            i = substitution(i, False)
        elif c in _OPERATOR_CHARS:
            if in_word and all(ch.isdigit() for ch in word) and c in "<>":
                word.clear()  # a file descriptor: 2>
                in_word = False
            end_word()
            op = c
            j = i + 1
            while j < n and (op + line[j]) in _SEPARATORS | _REDIRECTS:
                op += line[j]
                j += 1
            out.append(_Token(op, op=True))
            i = j
        else:
            word.append(c)
            in_word = True
            i += 1
    end_word()
    return out, subs


def _split(tokens: list[_Token]) -> list[list[str]]:
    """The argv of each simple command, redirections' targets left out."""
    commands: list[list[str]] = []
    argv: list[str] = []
    skip_next = False
    for tok in tokens:
        if tok.op:
            if tok.text in _REDIRECTS or tok.text.startswith((">", "<")):
                skip_next = True
                continue
            if argv:
                commands.append(argv)
            argv = []
            continue
        if skip_next:
            skip_next = False
            continue
        if not argv and tok.text in _KEYWORDS:
            continue
        argv.append(tok.text)
    if argv:
        commands.append(argv)
    # A for/select/case header is not a command (its body, after the
    # separator, is).
    return [a for a in commands if a[0] not in ("for", "select", "case", "in", "esac")]


def _skip_options(
    args: list[str], with_value: set[str], long_with_value: frozenset[str] | set[str] = frozenset()
) -> int:
    """The index of the first argument after a wrapper's options."""
    i = 0
    while i < len(args):
        a = args[i]
        if a == "--":
            return i + 1
        if not a.startswith("-") or a == "-":
            return i
        if a.startswith("--"):
            name = a.split("=", 1)[0]
            i += 2 if name in long_with_value and "=" not in a else 1
            continue
        # A cluster such as -un: the value follows the last letter that takes one.
        takes = a[-1] in with_value and len(a) == 2
        i += 2 if takes else 1
    return i


def _assignments(args: list[str]) -> int:
    i = 0
    while i < len(args) and "=" in args[i] and args[i].split("=", 1)[0].isidentifier():
        i += 1
    return i


def _inner(argv: list[str]) -> tuple[list[str] | None, str | None, str | None]:
    """What a wrapper runs: (argv, or a line to read, or a script's path)."""
    prog = os.path.basename(argv[0])
    args = argv[1:]
    if prog in ("sudo", "doas"):
        i = _skip_options(args, set("ugphCDrtUR"), {"--user", "--group", "--prompt"})
        return args[i:] or None, None, None
    if prog == "env":
        i = 0
        while i < len(args):
            a = args[i]
            if a in ("-u", "--unset", "-C", "--chdir"):
                i += 2
            elif a in ("-S", "--split-string") and i + 1 < len(args):
                return None, " ".join(args[i + 1 :]), None
            elif a.startswith("--split-string="):
                return None, " ".join([a.split("=", 1)[1], *args[i + 1 :]]), None
            elif a.startswith("-") or ("=" in a and a.split("=", 1)[0].isidentifier()):
                i += 1
            else:
                break
        return args[i:] or None, None, None
    if prog == "timeout":
        i = _skip_options(args, set("sk"), {"--signal", "--kill-after"})
        return args[i + 1 :] or None, None, None  # after the duration
    if prog == "nice":
        i = 0
        while i < len(args) and args[i].startswith("-"):
            i += 2 if args[i] == "-n" else 1
        return args[i:] or None, None, None
    if prog == "ionice":
        i = _skip_options(args, set("cnp"))
        return args[i:] or None, None, None
    if prog in ("nohup", "builtin", "unbuffer"):
        return args or None, None, None
    if prog in ("time", "command", "setsid", "exec"):
        i = _skip_options(args, set("a") if prog == "exec" else set())
        return args[i:] or None, None, None
    if prog == "stdbuf":
        i = _skip_options(args, set("ioe"), {"--input", "--output", "--error"})
        return args[i:] or None, None, None
    if prog == "busybox":
        return args or None, None, None
    if prog == "xargs":
        i = _skip_options(
            args,
            set("adEeIiLlnPs"),
            {"--arg-file", "--delimiter", "--eof", "--replace", "--max-lines", "--max-args"},
        )
        return args[i:] or ["echo"], None, None
    if prog == "eval":
        return None, " ".join(args), None
    if prog in _SHELLS:
        i = 0
        while i < len(args):
            a = args[i]
            if a.startswith("-") and not a.startswith("--") and "c" in a[1:]:
                rest = [x for x in args[i + 1 :] if not x.startswith("-")]
                return None, rest[0] if rest else "", None
            if a in ("-o", "+o", "--rcfile", "--init-file"):
                i += 2
                continue
            if a.startswith(("-", "+")):
                i += 1
                continue
            return None, None, a  # a script file
        return None, None, None
    return None, None, None


def _find_exec(argv: list[str]) -> list[list[str]]:
    """The commands ``find`` runs with ``-exec``, ``-execdir``, ``-ok``, ``-okdir``."""
    found: list[list[str]] = []
    args = argv[1:]
    i = 0
    while i < len(args):
        if args[i] in ("-exec", "-execdir", "-ok", "-okdir"):
            j = i + 1
            while j < len(args) and args[j] not in (";", "\\;", "+"):
                j += 1
            if j > i + 1:
                found.append(args[i + 1 : j])
            i = j + 1
            continue
        i += 1
    return found


def commands(
    line: str, *, read_script: ReadScript | None = None, _depth: int = 0
) -> list[tuple[str, ...]]:
    """Every command ``line`` runs, wrappers and what they wrap, as argv
    tuples in the order they appear. Raises :class:`ShellParseError`."""
    if _depth > MAX_DEPTH:
        raise ShellParseError(f"wrappers nested deeper than {MAX_DEPTH}")
    tokens, subs = _tokens(line)
    out: list[tuple[str, ...]] = []
    for argv in _split(tokens):
        out.extend(_expand(argv, read_script, _depth))
    for sub in subs:
        out.extend(commands(sub, read_script=read_script, _depth=_depth + 1))
    return out


def _expand(argv: list[str], read_script: ReadScript | None, depth: int) -> list[tuple[str, ...]]:
    if depth > MAX_DEPTH:
        raise ShellParseError(f"wrappers nested deeper than {MAX_DEPTH}")
    argv = argv[_assignments(argv) :]
    if not argv:
        return []
    out: list[tuple[str, ...]] = [tuple(argv)]
    prog = os.path.basename(argv[0])
    if prog == "find":
        for executed in _find_exec(argv):
            out.extend(_expand(executed, read_script, depth + 1))
        return out
    inner, text, script = _inner(argv)
    if inner:
        out.extend(_expand(inner, read_script, depth + 1))
    if text is not None:
        out.extend(commands(text, read_script=read_script, _depth=depth + 1))
    if script is None and "/" in argv[0] and prog not in _SHELLS:
        script = argv[0]  # ./run.sh: a script the caller may read
    if script is not None and read_script is not None:
        body = read_script(script)
        if body is not None:
            out.extend(commands(body[:MAX_SCRIPT_BYTES], read_script=read_script, _depth=depth + 1))
    return out


__all__ = ["MAX_DEPTH", "ReadScript", "ShellParseError", "commands"]
