"""Deciding one tool call: the rules of a persona against the call's effect.

Precedence, in this order:

1. a matching ``deny`` rule wins, wherever it is (a persona's own rules, the
   rules a person approved with ``always``, ``runtime.yaml``'s);
2. otherwise the *first* matching ``allow`` or ``ask`` rule decides, in the
   order: approved rules, the persona's ``permissions.rules``, then
   ``runtime.yaml``'s;
3. no rule matches: the call is allowed (as without rules).

A shell line is decided command by command and gets the strictest answer:
``git status && git push`` asks if ``git push`` asks.

How a ``match`` reads the effect depends on the tool's kind:

- shell: words. The first is the program (``rm`` matches ``/bin/rm``);
  ``-rf`` matches when the command has both ``r`` and ``f`` short flags in
  any spelling (``-fr``, ``-r -f``), ``--force`` when it has that long
  flag; the other words are globs on the command's arguments. A ``deny`` or
  ``ask`` rule finds its arguments anywhere in order (``git push`` catches
  ``git -C x push``); an ``allow`` rule only as the first ones (``git
  status`` never allows ``git push status``); ``exact: true`` wants the same
  arguments and flags, nothing more.
- path: a glob on the real path, or on a folder above it (``{workspace}``
  covers everything inside); ``!`` matches every path the rest does not.
- host: a glob on the name, or an address or CIDR range on every address
  the host is or resolves to.
- agent, persona: a glob on the name. Other tools: a glob on the JSON.
"""

from __future__ import annotations

import fnmatch
import ipaddress
import os
import shlex
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from coterie.runtime.config import PermissionAction, PermissionRule
from coterie.runtime.permissions.effects import Effect

_SEVERITY: dict[str, int] = {"allow": 0, "ask": 1, "deny": 2}


@dataclass(frozen=True)
class RuleRef:
    """One rule and where it is written: ``persona.yaml rule 2``."""

    rule: PermissionRule
    source: str
    index: int

    @property
    def label(self) -> str:
        return f"{self.source} rule {self.index + 1}"

    def describe(self) -> str:
        """The rule as a person reads it in an error."""
        tools = ", ".join(self.rule.tools())
        what = f" {self.rule.match!r}" if self.rule.match else ""
        why = f" ({self.rule.reason})" if self.rule.reason else ""
        return f"{self.label}: {self.rule.action} {tools}{what}{why}"


@dataclass(frozen=True)
class Decision:
    """What the rules say about one call, and which rule said it."""

    action: PermissionAction
    rule: RuleRef | None = None
    #: The part of the effect the rule matched (one command of a shell line).
    subject: str | None = None
    #: Why there was no rule to read the effect with (an unreadable line).
    note: str | None = None


@dataclass(frozen=True)
class Places:
    """The folders path patterns' placeholders stand for."""

    workspace: Path | None = None
    persona: Path | None = None
    home: Path | None = None

    def expand(self, pattern: str) -> str:
        for key, value in (
            ("{workspace}", self.workspace),
            ("{persona}", self.persona),
            ("{home}", self.home),
        ):
            if key in pattern:
                if value is None:
                    return "\x00"  # matches no path
                pattern = pattern.replace(key, os.path.realpath(value))
        pattern = os.path.expanduser(pattern)
        if not pattern.startswith("/") and self.workspace is not None:
            pattern = os.path.join(os.path.realpath(self.workspace), pattern)
        if not any(c in pattern for c in "*?["):
            pattern = os.path.realpath(pattern)
        return pattern


class _Compiled:
    """A rule ready to match: its tool matcher and its effect pattern."""

    def __init__(self, ref: RuleRef, places: Places) -> None:
        self.ref = ref
        self.tools = ref.rule.tools()
        match = ref.rule.match
        self.negate = bool(match and match.startswith("!"))
        self.text = match.removeprefix("!") if match else None
        self.words = shlex.split(self.text) if self.text else []
        if self.words and self.words[-1] == "*":
            self.words.pop()
        self.path = places.expand(self.text) if self.text else None
        self.network: ipaddress.IPv4Network | ipaddress.IPv6Network | None = None
        if self.text:
            try:
                self.network = ipaddress.ip_network(self.text.strip("[]"), strict=False)
            except ValueError:
                self.network = None

    def covers(self, tool: str) -> bool:
        return any(fnmatch.fnmatchcase(tool, p) for p in self.tools)

    def matches(self, effect: Effect, subject: object) -> bool:
        """Whether the rule's match holds for one subject of ``effect``."""
        if self.text is None:
            return True
        hit = self._hit(effect, subject)
        return not hit if self.negate else hit

    def _hit(self, effect: Effect, subject: object) -> bool:
        exact = self.ref.rule.exact
        if effect.kind == "shell":
            assert isinstance(subject, tuple)
            return _words_match(
                self.words, subject, exact=exact, anywhere=self.ref.rule.action != "allow"
            )
        if effect.kind == "path":
            assert isinstance(subject, str) and self.path is not None
            if fnmatch.fnmatchcase(subject, self.path):
                return True
            if exact:
                return False
            parent = os.path.dirname(subject)
            while parent and parent != subject:
                if fnmatch.fnmatchcase(parent, self.path):
                    return True
                subject, parent = parent, os.path.dirname(parent)
            return False
        if effect.kind == "host":
            names = effect.subjects
            if self.network is not None:
                for value in names:
                    try:
                        if ipaddress.ip_address(value) in self.network:
                            return True
                    except ValueError:
                        continue
                return False
            return fnmatch.fnmatchcase(str(names[0]), (self.text or "").lower())
        return fnmatch.fnmatchcase(str(subject), self.text or "")


def _flags(words: Sequence[str]) -> tuple[set[str], set[str], list[str]]:
    """Short flag letters, long flags and the other words of a command."""
    short: set[str] = set()
    long: set[str] = set()
    rest: list[str] = []
    for word in words:
        if word.startswith("--") and len(word) > 2:
            long.add(word.split("=", 1)[0])
        elif word.startswith("-") and len(word) > 1:
            short.update(word[1:])
        else:
            rest.append(word)
    return short, long, rest


def _words_match(
    pattern: Sequence[str], argv: tuple[str, ...], *, exact: bool, anywhere: bool
) -> bool:
    if not pattern or not argv:
        return not pattern
    program, *args = argv
    if not (
        fnmatch.fnmatchcase(os.path.basename(program), pattern[0])
        or fnmatch.fnmatchcase(program, pattern[0])
    ):
        return False
    want_short, want_long, want_rest = _flags(pattern[1:])
    have_short, have_long, have_rest = _flags(args)
    if not (want_short <= have_short and want_long <= have_long):
        return False
    if exact:
        return (
            want_short == have_short
            and want_long == have_long
            and len(want_rest) == len(have_rest)
            and all(fnmatch.fnmatchcase(h, w) for w, h in zip(want_rest, have_rest, strict=True))
        )
    if not anywhere:
        return len(have_rest) >= len(want_rest) and all(
            fnmatch.fnmatchcase(h, w) for w, h in zip(want_rest, have_rest, strict=False)
        )
    position = 0
    for word in want_rest:  # in order, anywhere
        while position < len(have_rest) and not fnmatch.fnmatchcase(have_rest[position], word):
            position += 1
        if position == len(have_rest):
            return False
        position += 1
    return True


class PermissionRules:
    """A persona's rules, compiled, in the order they are tried."""

    def __init__(self, layers: Sequence[tuple[str, Sequence[PermissionRule]]], places: Places):
        """``layers``: (where the rules are written, the rules), in order."""
        self._rules = [
            _Compiled(RuleRef(rule, source, i), places)
            for source, rules in layers
            for i, rule in enumerate(rules)
        ]

    def __bool__(self) -> bool:
        return bool(self._rules)

    def refs(self) -> list[RuleRef]:
        return [c.ref for c in self._rules]

    def covers(self, tool: str) -> bool:
        """Whether any rule names ``tool`` (else its calls are allowed as they are)."""
        return any(c.covers(tool) for c in self._rules)

    def unknown_tools(self, known: Sequence[str]) -> list[str]:
        """Rules whose tool patterns name no tool of ``known`` (a typo would
        void the rule): ``persona.yaml rule 2: tool 'shel_exec'``. MCP names
        (``server__tool``) are left out: servers come and go."""
        problems: list[str] = []
        for c in self._rules:
            for pattern in c.tools:
                if "__" in pattern or any(fnmatch.fnmatchcase(t, pattern) for t in known):
                    continue
                close = [t for t in known if _close(t, pattern)]
                hint = f" (did you mean {close[0]}?)" if close else ""
                problems.append(f"{c.ref.label}: tool {pattern!r} names no tool{hint}")
        return problems

    def decide(self, tool: str, effect: Effect) -> Decision:
        """The decision for one call of ``tool`` doing ``effect``."""
        rules = [c for c in self._rules if c.covers(tool)]
        if not rules:
            return Decision("allow")
        if effect.unreadable is not None:
            denied = next(
                (c for c in rules if c.text is None and c.ref.rule.action == "deny"), None
            )
            if denied is not None:
                return Decision("deny", denied.ref)
            if any(c.text is not None for c in rules):
                return Decision("ask", note=f"the call could not be read: {effect.unreadable}")
        worst: Decision | None = None
        subjects = effect.subjects if effect.kind in ("shell", "path") else effect.subjects[:1]
        for subject in subjects or ((),):
            decision = self._one(rules, effect, subject)
            if worst is None or _SEVERITY[decision.action] > _SEVERITY[worst.action]:
                worst = decision
            if worst.action == "deny":
                break
        assert worst is not None
        return worst

    def _one(self, rules: list[_Compiled], effect: Effect, subject: object) -> Decision:
        shown = shlex.join(subject) if isinstance(subject, tuple) else str(subject)
        for c in rules:
            if c.ref.rule.action == "deny" and c.matches(effect, subject):
                return Decision("deny", c.ref, shown)
        for c in rules:
            if c.ref.rule.action != "deny" and c.matches(effect, subject):
                return Decision(c.ref.rule.action, c.ref, shown)
        return Decision("allow", None, shown)


def _close(a: str, b: str) -> bool:
    """Whether two names differ by at most two edits (a typo)."""
    if abs(len(a) - len(b)) > 2:
        return False
    prev = list(range(len(b) + 1))
    for i, ca in enumerate(a, 1):
        cur = [i]
        for j, cb in enumerate(b, 1):
            cur.append(min(prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (ca != cb)))
        prev = cur
    return prev[-1] <= 2


__all__ = ["Decision", "PermissionRules", "Places", "RuleRef"]
