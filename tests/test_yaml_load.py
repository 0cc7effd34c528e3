"""``load_yaml`` gives what PyYAML's safe loader gives, value for value."""

from __future__ import annotations

import datetime
from pathlib import Path

import pytest
import yaml

import coterie.runtime.yaml_load as yaml_load
from coterie.runtime.routing.roster import _read
from coterie.runtime.yaml_load import SAFE_LOADER, load_yaml

ROOT = Path(__file__).resolve().parent.parent

#: Documents the lean builder makes itself: YAML 1.1's plain scalars, tags
#: it resolves explicitly, every collection style, anchors.
PLAIN = {
    "persona": "description: a persona\nmodel:\n  provider: scripted\nmax_steps: 4\n",
    "booleans of YAML 1.1": "a: on\nb: off\nc: yes\nd: No\ne: TRUE\nf: y\n",
    "nulls": "a: ~\nb: null\nc:\nd: Null\n",
    "ints": "a: 0x1f\nb: 017\nc: 1_000\nd: 1:30\ne: -12\nf: +3\ng: 0b101\n",
    "floats": "a: 1.5\nb: .inf\nc: -.Inf\nd: 1e3\ne: 6.8523015e+5\nf: 1_0.5\n",
    "not a number": "a: .nan\n",
    "timestamps": "a: 2026-12-02\nb: 2026-12-02 10:00:00+01:00\nc: 2026-12-02T10:00:00.5Z\n",
    "explicit tags": 'a: !!str 12\nb: !!int "7"\nc: !!float 1\nd: !!binary aGVsbG8=\n'
    "e: !!bool yes\nf: !!null ''\ng: !!map {k: v}\nh: !!seq [1]\n",
    "quoted and block": "a: 'it''s'\nb: \"tab\\there \\u00e9\"\nc: |\n  line 1\n  line 2\n"
    "d: >-\n  folded\n  text\n",
    "flow": "a: {b: [1, two, {c: 3.0}], d: []}\ne: {}\n",
    "non-string keys": "1: one\ntrue: yes\n~: nothing\n2.5: half\n2026-01-01: date\n",
    "duplicate keys keep the last": "a: 1\na: 2\n",
    "a list at the top": "- a\n- b: 1\n  c: [x]\n- - nested\n",
    "a scalar at the top": "just text\n",
    "comments only": "# nothing here\n",
    "empty": "",
    "unicode": "beschreibung: Grüße, 世界 🙂\n",
}

#: Documents the lean builder hands to the full safe loader.
HANDED_ON = {
    "merge keys": "base: &b {x: 1, y: 2}\nderived:\n  <<: *b\n  y: 3\n",
    "a set": "s: !!set {a, b}\n",
    "an ordered map": "o: !!omap [{a: 1}, {b: 2}]\n",
    "pairs": "p: !!pairs [{a: 1}, {a: 2}]\n",
    "a value key": "a: {=: 1}\n",
}

#: Documents the safe loader refuses: the same error, word for word.
REFUSED = {
    "unknown tag": "a: !thing x\n",
    "python object": "a: !!python/object:os.system x\n",
    "unhashable key": "? [a, b]\n: 1\n",
    "a mapping as a key": "? {a: 1}\n: 2\n",
    "two documents": "a: 1\n---\nb: 2\n",
    "not closed": "a: [1, 2\n",
    "an undefined alias": "a: *nowhere\n",
    "a sequence tagged as a string": "a: !!str [1]\n",
}


def pure_python(text: str) -> object:
    return yaml.load(text, Loader=yaml.SafeLoader)


@pytest.mark.parametrize("text", PLAIN.values(), ids=PLAIN.keys())
def test_plain_documents_are_built_without_the_full_loader(
    text: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    expected = repr(pure_python(text))  # repr: True is not 1, 1.0 is not 1

    def refuse(*_: object, **__: object) -> None:
        raise AssertionError("handed to the full loader")

    monkeypatch.setattr(yaml_load.yaml, "load", refuse)
    assert repr(load_yaml(text)) == expected


@pytest.mark.parametrize("text", HANDED_ON.values(), ids=HANDED_ON.keys())
def test_what_the_lean_builder_does_not_know_is_the_safe_loaders(text: str) -> None:
    assert repr(load_yaml(text)) == repr(pure_python(text))


def test_the_types_are_yaml_1_1s() -> None:
    loaded = load_yaml(PLAIN["booleans of YAML 1.1"] + "g: 2026-12-02\nh: 0x10\n")
    assert loaded == {
        "a": True,
        "b": False,
        "c": True,
        "d": False,
        "e": True,
        "f": "y",
        "g": datetime.date(2026, 12, 2),
        "h": 16,
    }
    assert type(loaded["a"]) is bool


@pytest.mark.parametrize("text", REFUSED.values(), ids=REFUSED.keys())
def test_refused_documents_raise_the_safe_loaders_error(text: str) -> None:
    with pytest.raises(yaml.YAMLError) as expected:
        yaml.load(text, Loader=SAFE_LOADER)
    with pytest.raises(type(expected.value)) as got:
        load_yaml(text)
    assert str(got.value) == str(expected.value)


def test_an_alias_is_its_anchors_object() -> None:
    loaded = load_yaml("a: &x {k: [1]}\nb: *x\nc: &l [1]\nd: *l\n")
    assert loaded == {"a": {"k": [1]}, "b": {"k": [1]}, "c": [1], "d": [1]}
    assert loaded["a"] is loaded["b"]
    assert loaded["c"] is loaded["d"]


def test_a_recursive_document_refers_to_itself() -> None:
    loaded = load_yaml("&r [1, *r]\n")
    assert loaded[0] == 1 and loaded[1] is loaded
    mapping = load_yaml("&m {self: *m}\n")
    assert mapping["self"] is mapping


def test_the_shipped_yaml_files_load_as_pyyaml_loads_them() -> None:
    files = sorted((ROOT / "configs").rglob("*.yaml"))
    assert files
    for file in files:
        text = file.read_text(encoding="utf-8")
        assert repr(load_yaml(text)) == repr(pure_python(text)), file


def test_a_file_read_past_its_stat_size_is_read_whole() -> None:
    # /proc reports a size of 0 for files that hold bytes: what a file that
    # grew between the stat and the read looks like.
    path = "/proc/self/cmdline"
    _, data = _read(path)
    assert len(data) > 1
    assert data == Path(path).read_bytes()
