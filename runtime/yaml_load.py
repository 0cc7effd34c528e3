"""YAML as PyYAML's safe loader reads it, with less of PyYAML's Python.

Listing a home's personas reads every ``persona.yaml`` (10,000 of them in
``benchmarks/scale.py``). libyaml parses and composes in C, but PyYAML then
builds the Python objects in Python through a generator per collection and
bookkeeping per node, and for a short file that costs more than the parse.
:func:`load_yaml` composes in C the same way and builds the plain documents
(mappings, sequences, and the scalar types of YAML 1.1 that the safe loader
knows) itself, calling the safe loader's own constructor for each scalar so
that every value is what ``yaml.load(text, Loader=SafeLoader)`` gives:
``on``/``off`` are booleans, ``0o17`` is an int, dates are dates.

Anything else — merge keys (``<<``), ``!!set``/``!!omap``/``!!pairs``, tags
the safe loader does not know, unhashable keys — is handed to the full safe
loader, so results and errors there are PyYAML's own.
"""

from __future__ import annotations

from typing import Any

import yaml
from yaml.constructor import SafeConstructor
from yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode

#: PyYAML's safe loader, in C when libyaml is there.
SAFE_LOADER: Any = getattr(yaml, "CSafeLoader", yaml.SafeLoader)

_MAP = "tag:yaml.org,2002:map"
_SEQ = "tag:yaml.org,2002:seq"
_STR = "tag:yaml.org,2002:str"
#: The safe loader's constructors of the scalar types it resolves plain
#: scalars to (and accepts as explicit ``!!`` tags). Each returns its value.
_SCALARS = {
    tag: SafeConstructor.yaml_constructors[tag]
    for tag in (
        "tag:yaml.org,2002:null",
        "tag:yaml.org,2002:bool",
        "tag:yaml.org,2002:int",
        "tag:yaml.org,2002:float",
        "tag:yaml.org,2002:binary",
        "tag:yaml.org,2002:timestamp",
    )
}


class _Unusual(Exception):
    """A node the lean builder leaves to the full safe loader."""


def load_yaml(text: str) -> Any:
    """The one document in ``text``, as ``yaml.load(text, Loader=SafeLoader)``
    returns it (``None`` for an empty one); raises :class:`yaml.YAMLError`."""
    loader = SAFE_LOADER(text)
    try:
        node = loader.get_single_node()
        if node is None:
            return None
        try:
            return _build(node, loader, {})
        except (_Unusual, TypeError):  # TypeError: an unhashable key
            pass
    finally:
        loader.dispose()
    return yaml.load(text, Loader=SAFE_LOADER)


def _build(node: Node, constructor: Any, built: dict[int, Any]) -> Any:
    # ``built`` holds the collections made so far by node, so that an alias
    # is the same object as its anchor, as in PyYAML (a recursive document
    # included).
    tag = node.tag
    if isinstance(node, ScalarNode):
        if tag == _STR:
            return node.value
        make = _SCALARS.get(tag)
        if make is None:
            raise _Unusual(tag)
        return make(constructor, node)
    done = built.get(id(node))
    if done is not None:
        return done
    if isinstance(node, MappingNode) and tag == _MAP:
        mapping: dict[Any, Any] = {}
        built[id(node)] = mapping
        # A ``<<`` (merge) or ``=`` key is a scalar of a tag not in _SCALARS;
        # a collection as a key is unhashable (TypeError): both go on.
        for key_node, value_node in node.value:
            mapping[_build(key_node, constructor, built)] = _build(value_node, constructor, built)
        return mapping
    if isinstance(node, SequenceNode) and tag == _SEQ:
        sequence: list[Any] = []
        built[id(node)] = sequence
        sequence.extend(_build(item, constructor, built) for item in node.value)
        return sequence
    raise _Unusual(tag)


__all__ = ["SAFE_LOADER", "load_yaml"]
