"""What a model is shown of a tool's arguments: pydantic's JSON schema,
without the titles pydantic makes up from names."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from coterie.runtime.context import TurnContext
from coterie.runtime.tool import tool
from coterie.tools import builtin_registry


class Entry(BaseModel):
    """One entry of the list."""

    text: str


class Args(BaseModel):
    model_config = ConfigDict(extra="forbid")

    max_results: int = Field(default=5, description="how many")
    # A property named "title" is an argument, not a schema keyword.
    title: str
    label: str = Field(default="", title="Shown label")
    entries: list[Entry] = Field(default_factory=list)


@tool(name="sample")
async def sample(args: Args, ctx: TurnContext) -> str:
    """A tool with a nested model."""
    return ""


def property_titles(schema: dict[str, Any]) -> dict[str, str]:
    """The ``title`` keyword of each property of ``schema`` and of its $defs."""
    found: dict[str, str] = {}
    for where, node in [("", schema), *schema.get("$defs", {}).items()]:
        if "title" in node:
            found[where or "<root>"] = node["title"]
        for name, prop in node.get("properties", {}).items():
            if "title" in prop:
                found[f"{where}.{name}"] = prop["title"]
    return found


def test_properties_and_nested_models_carry_no_titles_made_up_from_names() -> None:
    schema = sample.definition().parameters
    assert set(schema["properties"]) == {"max_results", "title", "label", "entries"}
    assert schema["required"] == ["title"]
    # Only the title someone wrote is left.
    assert property_titles(schema) == {".label": "Shown label"}
    # What the titles stood beside is all there.
    assert schema["properties"]["max_results"] == {
        "default": 5,
        "description": "how many",
        "type": "integer",
    }
    assert schema["$defs"]["Entry"]["description"] == "One entry of the list."
    assert schema["properties"]["entries"]["items"] == {"$ref": "#/$defs/Entry"}
    assert schema["additionalProperties"] is False


def test_no_built_in_tool_shows_a_made_up_title() -> None:
    registry = builtin_registry()
    shown = {
        name: property_titles(registry.get(name).definition().parameters)
        for name in registry.names()
    }
    assert len(shown) >= 30
    assert {name: titles for name, titles in shown.items() if titles} == {}
