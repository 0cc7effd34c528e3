"""An example plugin: one tool, one eval scorer (the guide's "Your own tools").

Copy it into your home's ``plugins/`` folder and name it in ``runtime.yaml``::

    plugins: ["./plugins/weather.py"]

Then a persona offers the tool like any built-in (``tools: {allow: [weather]}``)
and an eval task scores with ``{type: plugin, scorer: temperature_close}``.

The forecasts come from a fixed table, so that it answers the same way on
every node and in every test.
"""

from __future__ import annotations

import re
from typing import Literal

from pydantic import BaseModel, Field

from coterie.runtime import TurnContext, tool
from coterie.runtime.eval.task import Sample

#: City -> (condition, temperature in °C).
FORECASTS: dict[str, tuple[str, int]] = {
    "lisbon": ("sunny", 24),
    "oslo": ("snow", -3),
    "nairobi": ("showers", 21),
    "lima": ("overcast", 18),
    "osaka": ("clear", 15),
}


class WeatherArgs(BaseModel):
    city: str = Field(description="the city's name, e.g. Lisbon")
    unit: Literal["celsius", "fahrenheit"] = "celsius"


@tool(timeout=5)
async def weather(args: WeatherArgs, ctx: TurnContext) -> str:
    """Today's forecast for a city: its condition and temperature."""
    found = FORECASTS.get(args.city.strip().lower())
    if found is None:
        known = ", ".join(sorted(c.title() for c in FORECASTS))
        return f"no forecast for {args.city!r} (known: {known})"
    condition, celsius = found
    if args.unit == "fahrenheit":
        return f"{args.city.title()}: {condition}, {round(celsius * 9 / 5 + 32)} °F"
    return f"{args.city.title()}: {condition}, {celsius} °C"


def temperature_close(sample: Sample, output: str) -> float:
    """1.0 when the answer's first number is within 2 degrees of the
    sample's target, falling to 0.0 at 10 degrees off (no number: 0.0)."""
    found = re.search(r"-?\d+(?:\.\d+)?", output)
    if found is None or not sample.targets:
        return 0.0
    off = abs(float(found.group()) - float(sample.targets[0]))
    return max(0.0, min(1.0, (10.0 - off) / 8.0))


TOOLS = [weather]
SCORERS = {"temperature_close": temperature_close}
