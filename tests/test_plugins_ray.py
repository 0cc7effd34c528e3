"""Plugins on Ray: a plugin tool and a plugin provider answering personas,
failures that stay contained (or stop a persona under ``plugins.strict``),
and a persona defined in code answering through ``ask``, ``serve`` and ``eval``.
(The cluster case, a plugin that only the driver has, is in
tests/test_cluster_placement.py.)"""

from __future__ import annotations

import json
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from pydantic import BaseModel

from coterie import Persona, Runtime
from coterie.runtime.context import TurnContext
from coterie.runtime.errors import PersonaConfigError, PluginError
from coterie.runtime.serve.client import ServerClient
from coterie.runtime.tool import tool
from tests.helpers import scripted, write_persona
from tests.serving import running_server

pytestmark = pytest.mark.usefixtures("ray_session")

ROOT = Path(__file__).resolve().parent.parent
WEATHER = ROOT / "configs" / "plugins" / "weather.py"

PROVIDER = """
from coterie.runtime.messages import AssistantMessage, ModelResponse

class ParrotModel:
    def __init__(self, config):
        self.name = config.name
        self.prefix = config.options.get("prefix", "parrot")

    async def request(self, request):
        text = request.messages[-1].text
        return ModelResponse(
            message=AssistantMessage(text=f"{self.prefix} says: {text}"),
            provider="parrot",
            model=self.name,
        )

    async def aclose(self):
        pass

MODELS = {"parrot": ParrotModel}
"""


def forecaster(city: str = "Lisbon", **extra: object) -> dict[str, object]:
    """A scripted persona that asks the weather tool, then reports its result."""
    return scripted(
        [
            {
                "when": {"tool_result": False},
                "tool_calls": [{"name": "weather", "arguments": {"city": city}}],
            },
            {"when": {"tool_result": True}, "text": "{last_tool_result}"},
        ],
        **extra,
    )


def make_home(root: Path, *, strict: bool = False) -> Path:
    home = root / "home"
    (home / "plugins").mkdir(parents=True)
    (home / "plugins" / "parrot_provider.py").write_text(textwrap.dedent(PROVIDER))
    (home / "plugins" / "broken_forecast.py").write_text("raise RuntimeError('no network')\n")
    plugins = {
        "load": [str(WEATHER), "./plugins/parrot_provider.py", "./plugins/broken_forecast.py"],
        "entry_points": False,
        "strict": strict,
    }
    (home / "runtime.yaml").write_text(yaml.safe_dump({"plugins": plugins}))
    write_persona(home, "forecaster", forecaster(tools={"allow": ["weather", "clock"]}))
    write_persona(home, "plain", scripted([{"text": "plain answer"}]))
    write_persona(
        home, "hopeful", scripted([{"text": "still here"}], tools={"allow": ["forecast"]})
    )
    write_persona(home, "talker", {"model": {"provider": "parrot", "options": {"prefix": "polly"}}})
    return home


@pytest.fixture(scope="module")
def rt(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Runtime]:
    runtime = Runtime.start(home=make_home(tmp_path_factory.mktemp("plugins")))
    yield runtime
    runtime.shutdown()


def test_a_scripted_persona_uses_a_plugin_tool_end_to_end(rt: Runtime) -> None:
    reply = rt.ask("forecaster", "weather in Lisbon?")
    assert reply.status == "ok", reply.error
    assert reply.text == "Lisbon: sunny, 24 °C"
    rows = rt.query(
        "select tool, error_kind from events where persona = 'forecaster' and kind = 'tool_result'"
    ).rows
    assert rows == [("weather", None)]


def test_a_provider_plugin_answers_a_persona(rt: Runtime) -> None:
    reply = rt.ask("talker", "hello there")
    assert reply.status == "ok", reply.error
    assert reply.text == "polly says: hello there"


def test_a_broken_plugin_leaves_other_personas_alone_and_is_reported(rt: Runtime) -> None:
    assert rt.ask("plain", "anything").text == "plain answer"
    # A persona that allows the broken plugin's tool starts without it.
    hopeful = rt.ask("hopeful", "anything")
    assert hopeful.status == "ok" and hopeful.text == "still here"
    plugins = rt.status()["plugins"]
    assert plugins["tool_plugins"] == {"weather": str(WEATHER)}
    assert plugins["model_plugins"] == {"parrot": "./plugins/parrot_provider.py"}
    [problem] = plugins["problems"]
    assert problem["plugin"] == "./plugins/broken_forecast.py"
    assert problem["cause"] == "failed to import: RuntimeError: no network"


def test_permission_rules_name_plugin_tools_like_builtins(rt: Runtime) -> None:
    deny = {"tool": "weather", "action": "deny", "reason": "no forecasts today"}
    write_persona(
        rt.home,
        "guarded",
        forecaster(tools={"allow": ["weather"]}, permissions={"rules": [deny]}),
    )
    reply = rt.ask("guarded", "Lisbon?")
    assert reply.status == "ok", reply.error
    assert "permission_denied" in reply.text and "no forecasts today" in reply.text
    # A rule naming a plugin tool wrongly stops the persona, as for a built-in.
    typo = {**deny, "tool": "weathr"}
    write_persona(rt.home, "typo", forecaster(permissions={"rules": [typo]}))
    with pytest.raises(PersonaConfigError, match=r"'weathr' names no tool \(did you mean weather"):
        rt.ask("typo", "Lisbon?")


def test_a_persona_defined_in_code_answers_and_is_evaluated(rt: Runtime, tmp_path: Path) -> None:
    rt.register(
        Persona(
            "weatherbot",
            soul="You report the weather.",
            model=forecaster("Oslo")["model"],
            tools=[remember_city, "weather"],
        )
    )
    reply = rt.ask("weatherbot", "and Oslo?")
    assert reply.status == "ok", reply.error
    assert reply.text == "Oslo: snow, -3 °C"
    assert "weatherbot" in {p.name for p in rt.personas()}
    # Its own tool (pickled with its code) runs in its actor too.
    rt.register(
        Persona(
            "noter",
            model=scripted(
                [
                    {
                        "when": {"tool_result": False},
                        "tool_calls": [{"name": "remember_city", "arguments": {"city": "Lima"}}],
                    },
                    {"when": {"tool_result": True}, "text": "{last_tool_result}"},
                ]
            )["model"],
            tools=[remember_city],
        )
    )
    assert rt.ask("noter", "remember").text == "remembered LIMA"
    # Evaluated with the plugin's scorer: Oslo's -3 °C is one sample's target.
    (tmp_path / "cities.jsonl").write_text(
        "\n".join(
            json.dumps({"id": c, "input": f"weather in {c}?", "target": t})
            for c, t in [("oslo", "-3"), ("lisbon", "24")]
        )
    )
    task = {
        "name": "forecasts",
        "dataset": {"path": "cities.jsonl"},
        "solver": {"persona": "weatherbot"},
        "scorers": [{"type": "plugin", "scorer": "temperature_close"}],
    }
    (tmp_path / "task.yaml").write_text(yaml.safe_dump(task))
    report = rt.eval(tmp_path / "task.yaml")
    # It always answers Oslo's forecast: right for oslo, 27 degrees off for lisbon.
    assert report.counts["ok"] == 2
    [summary] = report.summaries
    assert summary.scorer == "temperature_close"
    assert summary.mean == pytest.approx(0.5)
    assert rt.unregister("noter") is True
    with pytest.raises(Exception, match="noter"):
        rt.ask("noter", "still there?")


class CityArgs(BaseModel):
    city: str


@tool()
async def remember_city(args: CityArgs, ctx: TurnContext) -> str:
    """Remember a city (defined in the test module: it reaches the actor pickled by value)."""
    return f"remembered {args.city.upper()}"


def test_a_code_persona_is_refused_with_the_messages_of_a_persona_file(rt: Runtime) -> None:
    with pytest.raises(PersonaConfigError, match="<persona clock defined in code>"):
        rt.register(Persona("clock", model={"provider": "parrots"}))

    @tool(name="weather")
    async def my_weather(args: CityArgs, ctx: TurnContext) -> str:
        """Another weather."""
        return ""

    with pytest.raises(PersonaConfigError, match="'weather' is the name of a built-in or plugin"):
        rt.register(Persona("dup", model={"provider": "parrot"}, tools=[my_weather]))
    with pytest.raises(PersonaConfigError, match="not defined in code"):
        rt.register(Persona("plain", model={"provider": "parrot"}))
    assert rt.ask("plain", "x").text == "plain answer"


def test_strict_plugins_refuse_a_persona_whose_tool_is_missing(tmp_path: Path) -> None:
    runtime = Runtime.start(home=make_home(tmp_path, strict=True))
    try:
        with pytest.raises(
            PluginError, match=r"'hopeful' names tools that are not there.*forecast"
        ):
            runtime.ask("hopeful", "anything")
        with pytest.raises(PluginError, match="RuntimeError: no network"):
            runtime.ask("hopeful", "anything")
        assert runtime.ask("forecaster", "Lisbon?").text == "Lisbon: sunny, 24 °C"
    finally:
        runtime.shutdown()


def test_a_served_code_persona_answers_and_shows_its_tools(tmp_path: Path) -> None:
    home = make_home(tmp_path)
    runtime = Runtime.start(home=home)
    try:
        runtime.register(
            Persona(
                "weatherbot", model=forecaster("Lima")["model"], tools=[remember_city, "weather"]
            )
        )
    finally:
        runtime.shutdown()
    with running_server(home) as state:
        client = ServerClient(state)
        described = client.get("/v1/personas/weatherbot")
        assert described["plugin_tools"] == {"remember_city": "code", "weather": str(WEATHER)}
        assert described["missing_tools"] == {}
        hopeful = client.get("/v1/personas/hopeful")
        assert list(hopeful["missing_tools"]) == ["forecast"]
        assert "RuntimeError: no network" in hopeful["missing_tools"]["forecast"]
        answer = client.post("/v1/personas/weatherbot/messages", {"text": "Lima?"})
        assert answer["reply"]["text"] == "Lima: overcast, 18 °C"


NEEDS_TOOLZ = """
from pydantic import BaseModel
from coterie.runtime.tool import tool

REQUIRES = ["toolz"]

class NoArgs(BaseModel):
    pass

@tool()
async def toolz_here(args: NoArgs, ctx) -> str:
    "Where toolz comes from, in the process that runs the tool."
    import toolz  # not installed where the driver runs: Ray installs it for the actors

    return toolz.__file__

TOOLS = [toolz_here]
"""


def test_a_plugins_requirements_are_installed_by_ray_with_pip_on(tmp_path: Path) -> None:
    with pytest.raises(ImportError):
        import toolz  # noqa: F401 - the point: the driver's environment does not have it
    home = tmp_path / "home"
    (home / "plugins").mkdir(parents=True)
    (home / "plugins" / "needs_toolz.py").write_text(NEEDS_TOOLZ)
    plugins = {"load": ["./plugins/needs_toolz.py"], "entry_points": False, "pip": True}
    (home / "runtime.yaml").write_text(yaml.safe_dump({"plugins": plugins}))
    rules = [
        {"when": {"tool_result": False}, "tool_calls": [{"name": "toolz_here"}]},
        {"when": {"tool_result": True}, "text": "{last_tool_result}"},
    ]
    write_persona(home, "needy", scripted(rules))
    runtime = Runtime.start(home=home)
    try:
        assert runtime.plugins.runtime_env is not None
        assert runtime.plugins.runtime_env["pip"]["packages"] == ["toolz"]
        reply = runtime.ask("needy", "where is toolz?", timeout=300)
        assert reply.status == "ok", reply.error
        assert reply.text.endswith("toolz/__init__.py") and "runtime_resources" in reply.text
    finally:
        runtime.shutdown()
