"""The exception tree drawn in runtime/errors.py's docstring is the real one.

Every exception class the package defines (runtime/, tools/, actors/,
coterie/) derives from CoterieError and is drawn under its actual parent, and
nothing drawn is stale, so the drawing cannot drift from the code. Apart from
the tree: ToolError (a tool's failure the model reads, never a runtime fault)
and private exceptions (``_Name``), signals raised and caught inside one
module that never reach a caller.
"""

from __future__ import annotations

import importlib
import re

from coterie.runtime import errors
from coterie.runtime.errors import CoterieError, ToolError
from tests.test_layout import modules

#: The tree glyphs are four columns wide a level ("├── ", "│   ").
LEVEL = 4


def defined_exceptions() -> dict[str, type[BaseException]]:
    """Every public exception class the package defines, by name."""
    found: dict[str, type[BaseException]] = {}
    for name in modules():
        if name.endswith("__main__"):  # runs the command line when imported
            continue
        module = importlib.import_module(name)
        for attr, obj in vars(module).items():
            if (
                isinstance(obj, type)
                and issubclass(obj, BaseException)
                and obj.__module__ == name
                and not attr.startswith("_")
                and not issubclass(obj, ToolError)
            ):
                assert attr not in found, f"{attr} is defined twice: {found[attr]} and {obj}"
                found[attr] = obj
    return found


def drawn_tree() -> dict[str, str | None]:
    """Each class of the docstring's drawing -> the class drawn as its parent."""
    doc = errors.__doc__ or ""
    block = doc.split("::\n\n", 1)[1].split("\n\n", 1)[0]
    parents: dict[str, str | None] = {}
    trail: list[str] = []
    for line in block.splitlines():
        match = re.search(r"[A-Za-z_]\w*", line)
        assert match, line
        depth = (match.start() - LEVEL) // LEVEL
        name = match.group()
        del trail[depth:]
        parents[name] = trail[-1] if trail else None
        trail.append(name)
    return parents


def exception_parent(cls: type[BaseException]) -> str:
    return next(b for b in cls.__bases__ if issubclass(b, BaseException)).__name__


def test_the_drawing_parses() -> None:
    tree = drawn_tree()
    assert tree["CoterieError"] is None
    assert tree["PersonaConfigError"] == "ConfigError"


def test_every_exception_of_the_package_is_a_coterie_error() -> None:
    outside = [
        f"{cls.__module__}.{name}"
        for name, cls in defined_exceptions().items()
        if not issubclass(cls, CoterieError)
    ]
    assert outside == []


def test_the_docstring_draws_every_exception_under_its_parent() -> None:
    defined = defined_exceptions()
    tree = drawn_tree()
    assert set(tree) == set(defined), (
        f"not drawn: {sorted(set(defined) - set(tree))}; "
        f"drawn but not defined: {sorted(set(tree) - set(defined))}"
    )
    wrong = {
        name: (tree[name], exception_parent(cls))
        for name, cls in defined.items()
        if name != "CoterieError" and tree[name] != exception_parent(cls)
    }
    assert wrong == {}, "(drawn parent, real parent)"


def test_tool_errors_stay_apart_from_the_tree() -> None:
    assert not issubclass(ToolError, CoterieError)
    doc = errors.__doc__ or ""
    assert "ToolError" not in doc.split("::\n\n", 1)[1].split("\n\n", 1)[0]
    assert re.search(r"^    ToolError\b", doc, re.MULTILINE)
