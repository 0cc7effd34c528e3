"""Persona files: loading, home resolution, and every kind of bad file."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from coterie.runtime.config import (
    OpenAIModelConfig,
    install_personas,
    load_persona,
    persona_names,
    resolve_home,
)
from coterie.runtime.errors import PersonaConfigError, UnknownPersonaError
from tests.helpers import no_plugin_providers, scripted, write_persona


def test_home_resolution(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv("COTERIE_HOME", raising=False)
    assert resolve_home() == (Path.home() / ".coterie").resolve()
    monkeypatch.setenv("COTERIE_HOME", str(tmp_path / "env"))
    assert resolve_home() == tmp_path / "env"
    assert resolve_home(tmp_path / "flag") == tmp_path / "flag"


def test_load_valid_persona(tmp_path: Path) -> None:
    write_persona(
        tmp_path,
        "alpha",
        {
            "model": {"provider": "openai", "name": "gpt-x", "base_url": "http://127.0.0.1:1/v1"},
            "tools": {"allow": ["*"], "deny": ["todo_*"]},
            "thinking": False,  # YAML's bare `off`
            "max_steps": 5,
        },
        soul="Be brief.",
    )
    persona = load_persona(tmp_path, "alpha")
    assert isinstance(persona.config.model, OpenAIModelConfig)
    assert persona.config.model.api_key_env == "OPENAI_API_KEY"
    assert persona.config.thinking == "off"
    assert persona.config.tools.deny == ["todo_*"]
    assert persona.soul == "Be brief."
    assert persona_names(tmp_path) == ["alpha"]


def test_bare_yaml_off_is_read_as_off(tmp_path: Path) -> None:
    path = tmp_path / "personas" / "beta"
    path.mkdir(parents=True)
    (path / "persona.yaml").write_text("model: {provider: scripted}\nthinking: off\n")
    assert load_persona(tmp_path, "beta").config.thinking == "off"


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        (
            {"model": {"provider": "Gemini Pro", "name": "x"}},
            "model.plugin.provider: expected one of scripted, openai, anthropic, "
            "the name of a provider a loaded plugin registers (loaded: none) or 'module:Class', "
            "got 'Gemini Pro'",
        ),
        ({"model": {"name": "x"}}, "model: missing 'provider'"),
        ({"model": {"provider": "openai"}}, "model.openai.name: Field required"),
        ({**scripted(), "max_steps": 0}, "max_steps: Input should be greater than or equal to 1"),
        ({**scripted(), "thinking": "maybe"}, "thinking: Input should be 'on', 'off' or 'auto'"),
        ({**scripted(), "colour": "blue"}, "colour: unknown field"),
        ({**scripted(), "tools": {"allow": "*"}}, "tools.allow: Input should be a valid list"),
        ({}, "model: Field required"),
    ],
)
def test_bad_persona_file_names_file_and_field(
    tmp_path: Path, body: dict[str, object], expected: str
) -> None:
    write_persona(tmp_path, "bad", body)
    with pytest.raises(PersonaConfigError) as info:
        load_persona(tmp_path, "bad")
    message = str(info.value)
    assert str(tmp_path / "personas" / "bad" / "persona.yaml") in message
    assert expected in message


def test_unparseable_yaml(tmp_path: Path) -> None:
    path = tmp_path / "personas" / "broken"
    path.mkdir(parents=True)
    (path / "persona.yaml").write_text("model: [unclosed\n")
    with pytest.raises(PersonaConfigError, match="not valid YAML"):
        load_persona(tmp_path, "broken")


def test_yaml_that_is_not_utf8(tmp_path: Path) -> None:
    path = tmp_path / "personas" / "latin"
    path.mkdir(parents=True)
    (path / "persona.yaml").write_bytes("description: caf\u00e9\n".encode("latin-1"))
    with pytest.raises(PersonaConfigError, match="not valid YAML"):
        load_persona(tmp_path, "latin")


def test_yaml_that_is_not_a_mapping(tmp_path: Path) -> None:
    path = tmp_path / "personas" / "listy"
    path.mkdir(parents=True)
    (path / "persona.yaml").write_text("- a\n- b\n")
    with pytest.raises(PersonaConfigError, match="expected a mapping"):
        load_persona(tmp_path, "listy")


def test_unknown_persona_lists_known(tmp_path: Path) -> None:
    write_persona(tmp_path, "alpha", scripted())
    with pytest.raises(
        UnknownPersonaError, match=r"unknown persona 'ghost' \(known personas: alpha\)"
    ):
        load_persona(tmp_path, "ghost")
    with pytest.raises(UnknownPersonaError):
        load_persona(tmp_path, "../alpha")


def test_bundled_personas_install_and_load(tmp_path: Path) -> None:
    from coterie.demo import BUNDLED_PERSONAS, DEMO_PERSONAS

    written = install_personas(tmp_path, BUNDLED_PERSONAS)
    # Exactly the personas the demo talks to (and the README names).
    assert written == sorted(DEMO_PERSONAS)
    for name in written:
        load_persona(tmp_path, name)
    # A second install leaves the user's copies alone.
    (tmp_path / "personas" / "planner" / "SOUL.md").write_text("mine", encoding="utf-8")
    assert install_personas(tmp_path, BUNDLED_PERSONAS) == []
    assert (tmp_path / "personas" / "planner" / "SOUL.md").read_text(encoding="utf-8") == "mine"


@pytest.fixture(autouse=True)
def _no_plugin_providers() -> Iterator[None]:
    """Messages here name the plugin providers loaded: none, whatever ran before."""
    with no_plugin_providers():
        yield
