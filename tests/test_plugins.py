"""Plugins without Ray: discovery, loading and its failures, shipping,
provider plugins, what a persona gets, and personas defined in code."""

from __future__ import annotations

import asyncio
import pickle
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest
from pydantic import BaseModel
from ray import cloudpickle

from coterie import Persona
from coterie.runtime.config import PluginSettings, load_persona
from coterie.runtime.config.models import provider_names
from coterie.runtime.context import TurnContext
from coterie.runtime.errors import ModelError, ModelTimeoutError, PersonaConfigError, PluginError
from coterie.runtime.messages import ModelRequest, UserMessage
from coterie.runtime.models import build_model
from coterie.runtime.models.plugins import registered_providers
from coterie.runtime.plugins import plugin_set
from coterie.runtime.plugins.code import (
    code_tool_names,
    load_code_tools,
    remove_code_persona,
    write_code_persona,
)
from coterie.runtime.plugins.refs import discover
from coterie.runtime.plugins.report import check_missing, tools_of_persona
from coterie.runtime.tool import ToolDefinitionError, tool
from coterie.tools import builtin_registry, registry_for
from tests.helpers import make_ctx, no_plugin_providers, scripted, write_persona

ROOT = Path(__file__).resolve().parent.parent
WEATHER = ROOT / "configs" / "plugins" / "weather.py"
BUILTIN = builtin_registry().names()


@pytest.fixture(autouse=True)
def _no_providers() -> Iterator[None]:
    """Each test starts with no plugin provider registered in this process
    (and leaves those of other tests' runtimes as they were)."""
    with no_plugin_providers():
        yield


def plugin_file(home: Path, name: str, source: str) -> str:
    """Write ``<home>/plugins/<name>.py``; its runtime.yaml entry."""
    folder = home / "plugins"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"{name}.py").write_text(textwrap.dedent(source), encoding="utf-8")
    return f"./plugins/{name}.py"


def load(home: Path, *entries: str, **settings: object):  # type: ignore[no-untyped-def]
    described, loaded, env = plugin_set(
        home, PluginSettings(load=list(entries), entry_points=False, **settings), taken=BUILTIN
    )
    return described, loaded, env


# -- the example plugin ---------------------------------------------------------


def test_the_example_plugin_gives_a_tool_and_a_scorer(tmp_path: Path) -> None:
    described, loaded, env = load(tmp_path, str(WEATHER))
    assert described.problems == []
    assert described.tool_plugins == {"weather": str(WEATHER)}
    assert described.scorer_plugins == {"temperature_close": str(WEATHER)}
    spec = loaded.tools["weather"]
    result = asyncio.run(spec.fn(spec.args_model(city="Oslo"), make_ctx()))
    assert result == "Oslo: snow, -3 °C"
    assert "no forecast for 'Atlantis'" in asyncio.run(
        spec.fn(spec.args_model(city="Atlantis"), make_ctx())
    )
    # A file outside the installation is shipped: Ray uploads it as is.
    assert env == {"py_modules": [str(WEATHER)]}
    scorer, _ = loaded.scorers["temperature_close"]
    from coterie.runtime.eval.task import Sample

    assert scorer(Sample(id="s", input="?", target="24"), "about 25 degrees") == 1.0
    assert scorer(Sample(id="s", input="?", target="24"), "it is 34") == 0.0
    assert scorer(Sample(id="s", input="?", target="24"), "warm") == 0.0


def test_a_plugin_tool_joins_the_registry_after_the_builtins(tmp_path: Path) -> None:
    _, loaded, _ = load(tmp_path, str(WEATHER))
    registry = registry_for(loaded.tools.values())
    assert registry.get("weather") is loaded.tools["weather"]
    assert registry.get("clock") is not None
    assert builtin_registry().get("weather") is None


# -- failures: contained, each named with its plugin, name and cause -------------


def test_each_failure_names_the_plugin_the_name_and_the_cause(tmp_path: Path) -> None:
    broken = plugin_file(tmp_path, "broken_at_import", "import not_a_module_anywhere\n")
    empty = plugin_file(tmp_path, "declares_nothing", "VALUE = 1\n")
    clash = plugin_file(
        tmp_path,
        "clashing",
        """
        from pydantic import BaseModel
        from coterie.runtime.tool import tool

        class A(BaseModel):
            pass

        @tool(name="clock")
        async def my_clock(args: A, ctx) -> str:
            "Not the built-in."
            return "tick"

        @tool(name="weather")
        async def other_weather(args: A, ctx) -> str:
            "A second weather."
            return "rain"

        @tool()
        async def fine(args: A, ctx) -> str:
            "Loads although its neighbours do not."
            return "fine"

        def not_a_tool(args, ctx):
            return 1

        TOOLS = [my_clock, other_weather, fine, not_a_tool]
        """,
    )
    bad_model = plugin_file(
        tmp_path,
        "bad_model",
        """
        from coterie.runtime.tool import tool

        @tool()
        async def untyped(args: dict, ctx) -> str:
            "Its arguments are no pydantic model."
            return ""

        TOOLS = [untyped]
        """,
    )
    described, loaded, _ = load(
        tmp_path, str(WEATHER), broken, empty, clash, bad_model, "./plugins/missing.py"
    )
    problems = {(p.plugin, p.name): p.cause for p in described.problems}
    assert "ModuleNotFoundError" in problems[(broken, None)]
    assert "not_a_module_anywhere" in problems[(broken, None)]
    assert "declares none of TOOLS, MODELS, SCORERS, DATASETS" in problems[(empty, None)]
    assert problems[(clash, "clock")] == (
        "a tool named 'clock' is already registered by coterie (a built-in tool)"
    )
    assert problems[(clash, "weather")] == (
        f"a tool named 'weather' is already registered by plugin {WEATHER}"
    )
    assert "not_a_tool" in {name for plugin, name in problems if plugin == clash}
    assert "first parameter must be a pydantic model" in problems[(bad_model, "untyped")]
    assert "no file or folder" in problems[("./plugins/missing.py", None)]
    # What did load, loaded: the example's tool (first), the clashing file's good one.
    assert described.tool_plugins == {"weather": str(WEATHER), "fine": clash}
    assert loaded.tools["weather"].fn.__module__ == "weather"
    # Each is in the plugin's own words when printed (what the log and the CLI show).
    printed = [str(p) for p in described.problems]
    assert any(
        line.startswith(f"plugin {broken}: failed to import: ModuleNotFoundError")
        for line in printed
    ), printed


def test_a_module_entry_that_is_not_installed_is_a_problem(tmp_path: Path) -> None:
    described, _, _ = load(tmp_path, "nowhere_to_be_found.tools")
    [problem] = described.problems
    assert (problem.plugin, problem.cause) == (
        "nowhere_to_be_found.tools",
        "no module named 'nowhere_to_be_found'",
    )


def test_a_home_file_named_like_an_installed_module_is_refused(tmp_path: Path) -> None:
    entry = plugin_file(tmp_path, "json", "TOOLS = []\n")
    described, _, _ = load(tmp_path, entry)
    [problem] = described.problems
    assert "its module name 'json' is taken by" in problem.cause


def test_runtime_yaml_plugins_entries_are_checked() -> None:
    assert PluginSettings.model_validate(["a.b", "./c.py"]).load == ["a.b", "./c.py"]
    with pytest.raises(ValueError, match=r"a\.b listed more than once"):
        PluginSettings.model_validate({"load": ["a.b", "a.b"]})
    with pytest.raises(ValueError, match=r"lod\n  Extra inputs are not permitted"):
        PluginSettings.model_validate({"lod": ["a.b"]})


# -- entry points of an installed distribution -----------------------------------


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A distribution with coterie entry points, installed by pip into a folder."""
    src = tmp_path_factory.mktemp("shoutdist")
    (src / "pyproject.toml").write_text(
        textwrap.dedent(
            """
            [build-system]
            requires = ["setuptools>=68"]
            build-backend = "setuptools.build_meta"

            [project]
            name = "coterie-shout"
            version = "1.2.0"

            [tool.setuptools]
            py-modules = ["coterie_shout"]

            [project.entry-points."coterie.tools"]
            shout = "coterie_shout:shout"

            [project.entry-points."coterie.models"]
            echo = "coterie_shout:EchoModel"

            [project.entry-points."coterie.scorers"]
            loud = "coterie_shout:loud"
            """
        ),
        encoding="utf-8",
    )
    (src / "coterie_shout.py").write_text(
        textwrap.dedent(
            """
            from pydantic import BaseModel
            from coterie.runtime.messages import AssistantMessage, ModelResponse
            from coterie.runtime.tool import tool

            class ShoutArgs(BaseModel):
                text: str

            @tool()
            async def shout(args: ShoutArgs, ctx) -> str:
                "Say it loudly."
                return args.text.upper() + "!"

            class EchoModel:
                def __init__(self, config):
                    self.config = config

                async def request(self, request):
                    last = request.messages[-1]
                    return ModelResponse(
                        message=AssistantMessage(text="echo: " + getattr(last, "text", "")),
                        provider="echo",
                        model=self.config.name,
                    )

                async def aclose(self):
                    pass

            def loud(sample, output):
                return output.isupper()
            """
        ),
        encoding="utf-8",
    )
    target = tmp_path_factory.mktemp("site")
    subprocess.run(
        [
            sys.executable,
            *("-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation", "--no-index"),
            *("--target", str(target), str(src)),
        ],
        check=True,
        capture_output=True,
    )
    sys.path.insert(0, str(target))
    try:
        yield target
    finally:
        sys.path.remove(str(target))
        sys.modules.pop("coterie_shout", None)


def test_entry_points_of_an_installed_distribution_are_found(
    installed: Path, tmp_path: Path
) -> None:
    found = discover(tmp_path, PluginSettings())
    labels = {ref.label: ref for ref in found.refs}
    tools_ref = labels["coterie-shout 1.2.0 (coterie.tools: shout)"]
    assert (tools_ref.module, tools_ref.attr, tools_ref.provides) == (
        "coterie_shout",
        "shout",
        "tools",
    )
    # Installed into a folder outside the Python installation: shipped.
    assert tools_ref.ship == str(installed / "coterie_shout.py")
    described, _, _ = plugin_set(tmp_path, PluginSettings(), taken=BUILTIN)
    assert described.tool_plugins == {"shout": "coterie-shout 1.2.0 (coterie.tools: shout)"}
    assert described.model_plugins == {"echo": "coterie-shout 1.2.0 (coterie.models: echo)"}
    assert "loud" in described.scorer_plugins
    assert registered_providers() == {"echo": "plugin coterie-shout 1.2.0 (coterie.models: echo)"}
    # Off, they are not looked at.
    off, _, _ = plugin_set(tmp_path, PluginSettings(entry_points=False), taken=BUILTIN)
    assert off.refs == []


# -- model providers --------------------------------------------------------------


PROVIDER = """
import asyncio
from pydantic import BaseModel
from coterie.runtime.messages import AssistantMessage, ModelResponse

class Options(BaseModel):
    prefix: str = "said"
    delay: float = 0.0

class PrefixModel:
    options_model = Options

    def __init__(self, config):
        self.options = Options.model_validate(config.options)
        self.name = config.name

    async def request(self, request):
        await asyncio.sleep(self.options.delay)
        text = request.messages[-1].text
        return ModelResponse(
            message=AssistantMessage(text=f"{self.options.prefix}: {text}"),
            provider="prefix",
            model=self.name,
        )

    async def aclose(self):
        pass

class NotAModel:
    pass

MODELS = {"prefix": PrefixModel, "hollow": NotAModel}
"""


def _request(text: str) -> ModelRequest:
    return ModelRequest(system="", messages=[UserMessage(text=text)])


def test_a_provider_plugin_answers_by_its_registered_name(tmp_path: Path) -> None:
    entry = plugin_file(tmp_path, "prefix_provider", PROVIDER)
    # Before the plugin is loaded, the name is unknown to a persona file.
    write_persona(tmp_path, "talker", {"model": {"provider": "prefix", "options": {"prefix": "p"}}})
    with pytest.raises(PersonaConfigError, match="loaded: none"):
        load_persona(tmp_path, "talker")
    described, _, _ = load(tmp_path, entry)
    assert described.model_plugins == {"prefix": entry}
    problems = {p.name: p.cause for p in described.problems}
    assert "has no request or aclose method" in problems["hollow"]
    assert provider_names() == {"prefix": f"plugin {entry}"}
    persona = load_persona(tmp_path, "talker")
    model = build_model(persona.config.model)
    response = asyncio.run(model.request(_request("hello")))
    assert response.message.text == "p: hello"
    assert (model.provider, model.name) == ("prefix", "prefix")
    # Another short name is still refused, naming what is loaded.
    write_persona(tmp_path, "typo", {"model": {"provider": "prefx"}})
    with pytest.raises(
        PersonaConfigError, match=r"loaded: prefix\) or 'module:Class', got 'prefx'"
    ):
        load_persona(tmp_path, "typo")


def test_a_provider_by_module_and_class_its_options_and_timeout(tmp_path: Path) -> None:
    (tmp_path / "prefix_by_path.py").write_text(PROVIDER, encoding="utf-8")
    sys.path.insert(0, str(tmp_path))
    try:
        config = {"provider": "prefix_by_path:PrefixModel", "name": "m1", "timeout": 0.2}
        write_persona(tmp_path, "p", {"model": config})
        model = build_model(load_persona(tmp_path, "p").config.model)
        assert asyncio.run(model.request(_request("x"))).message.text == "said: x"
        slow = {**config, "options": {"delay": 5}}
        write_persona(tmp_path, "slow", {"model": slow})
        model = build_model(load_persona(tmp_path, "slow").config.model)
        with pytest.raises(ModelTimeoutError, match=r"no answer within 0\.2s"):
            asyncio.run(model.request(_request("x")))
        write_persona(tmp_path, "bad", {"model": {**config, "options": {"delay": "soon"}}})
        with pytest.raises(ModelError, match=r"options\.delay"):
            build_model(load_persona(tmp_path, "bad").config.model)
        write_persona(tmp_path, "gone", {"model": {"provider": "prefix_by_path:Missing"}})
        with pytest.raises(ModelError, match="has no 'Missing'"):
            build_model(load_persona(tmp_path, "gone").config.model)
        write_persona(tmp_path, "hollow", {"model": {"provider": "prefix_by_path:NotAModel"}})
        with pytest.raises(ModelError, match="is not a model provider"):
            build_model(load_persona(tmp_path, "hollow").config.model)
    finally:
        sys.path.remove(str(tmp_path))
        sys.modules.pop("prefix_by_path", None)


def test_a_provider_that_answers_anything_but_a_response_fails_the_call(tmp_path: Path) -> None:
    entry = plugin_file(
        tmp_path,
        "sloppy_provider",
        """
        class Sloppy:
            def __init__(self, config):
                pass

            async def request(self, request):
                return "just a string"

            async def aclose(self):
                pass

        MODELS = {"sloppy": Sloppy}
        """,
    )
    load(tmp_path, entry)
    write_persona(tmp_path, "s", {"model": {"provider": "sloppy"}})
    model = build_model(load_persona(tmp_path, "s").config.model)
    with pytest.raises(ModelError, match="'sloppy' returned str, expected a ModelResponse"):
        asyncio.run(model.request(_request("x")))


# -- what a persona gets, and what it misses -------------------------------------


def test_a_persona_is_told_which_tools_come_from_plugins_and_which_are_missing(
    tmp_path: Path,
) -> None:
    broken = plugin_file(tmp_path, "broken_forecast", "raise RuntimeError('no network')\n")
    described, _, _ = load(tmp_path, str(WEATHER), broken)
    write_persona(
        tmp_path,
        "fc",
        scripted(tools={"allow": ["weather", "clock", "forecast", "files_*", "gh__x"]}),
    )
    persona = load_persona(tmp_path, "fc")
    found = tools_of_persona(
        persona.config.tools,
        persona.path,
        builtin=BUILTIN,
        plugin_tools=described.tool_plugins,
        problems=described.problems,
    )
    assert found.plugin_tools == {"weather": str(WEATHER)}
    # Patterns and MCP names are no promise of a tool; a plain name is.
    assert list(found.missing) == ["forecast"]
    assert "RuntimeError: no network" in found.missing["forecast"]
    check_missing("fc", found, strict=False)  # a warning only
    with pytest.raises(PluginError, match=r"'fc' names tools that are not there.*forecast"):
        check_missing("fc", found, strict=True)


# -- personas defined in code -----------------------------------------------------


class NoteArgs(BaseModel):
    text: str


@tool()
async def note(args: NoteArgs, ctx: TurnContext) -> str:
    """Keep a note."""
    return f"noted {args.text}"


def test_a_code_persona_is_validated_like_a_persona_file() -> None:
    with pytest.raises(PersonaConfigError) as info:
        Persona("coder", soul="s", model={"provider": "scripted"}, max_steps=0, colour="red")
    message = str(info.value)
    assert "<persona coder defined in code>" in message
    assert "max_steps: Input should be greater than or equal to 1" in message
    assert "colour: unknown field" in message
    with pytest.raises(PersonaConfigError, match="model: missing 'provider'"):
        Persona("coder", model={"name": "x"})
    with pytest.raises(PersonaConfigError, match="name"):
        Persona("Not A Name", model={"provider": "scripted"})

    async def plain(args: NoteArgs, ctx: TurnContext) -> str:
        return ""

    with pytest.raises(PersonaConfigError, match=r"tools\.0: "):
        Persona("coder", model={"provider": "scripted"}, tools=[plain])
    with pytest.raises(PersonaConfigError, match="'note' is listed more than once"):
        Persona("coder", model={"provider": "scripted"}, tools=[note, note])
    with pytest.raises(ToolDefinitionError, match="first parameter must be a pydantic model"):

        @tool()
        async def untyped(args: dict, ctx: TurnContext) -> str:  # type: ignore[type-arg]
            """No model."""
            return ""

    persona = Persona("coder", model={"provider": "scripted"}, tools=[note, "clock"])
    with pytest.raises(PersonaConfigError, match="'note' is the name of a built-in or plugin tool"):
        persona.check_names([*BUILTIN, "note"])


def test_a_code_persona_is_written_whole_and_removed_again(tmp_path: Path) -> None:
    persona = Persona(
        "coder", soul="You code.", model={"provider": "scripted"}, tools=[note, "clock"]
    )
    directory = write_code_persona(tmp_path, persona, cloudpickle.dumps)
    loaded = load_persona(tmp_path, "coder")
    assert loaded.soul == "You code."
    assert loaded.config.tools.allow == ["note", "clock"]
    assert code_tool_names(directory) == ["note"]
    tools, problems = load_code_tools(directory, pickle.loads)
    assert [t.name for t in tools] == ["note"] and problems == []

    # A failure while writing leaves no persona behind.
    def failing(_: object) -> bytes:
        raise RuntimeError("cannot pickle")

    with pytest.raises(RuntimeError):
        write_code_persona(
            tmp_path, Persona("half", model={"provider": "scripted"}, tools=[note]), failing
        )
    assert not (tmp_path / "personas" / "half" / "persona.yaml").exists()
    # A hand-written persona is never replaced nor removed.
    write_persona(tmp_path, "byhand", scripted())
    with pytest.raises(PersonaConfigError, match="not defined in code"):
        write_code_persona(
            tmp_path, Persona("byhand", model={"provider": "scripted"}), cloudpickle.dumps
        )
    with pytest.raises(PersonaConfigError, match="not a persona defined in code"):
        remove_code_persona(tmp_path, "byhand")
    assert remove_code_persona(tmp_path, "coder") is True
    assert not directory.exists()
    assert remove_code_persona(tmp_path, "coder") is False


def test_tools_that_no_longer_load_are_named(tmp_path: Path) -> None:
    directory = tmp_path / "personas" / "p"
    directory.mkdir(parents=True)
    (directory / "tools.pickle").write_bytes(b"not a pickle")
    tools, [problem] = load_code_tools(directory, pickle.loads)
    assert tools == [] and problem.plugin == "code of persona p"
    assert "cannot load" in problem.cause


def test_each_eval_solver_gets_its_own_code_tools(tmp_path: Path) -> None:
    """A solver and a grader defined in code, each with a tool named ``same``:
    each sample runs its own solver's."""
    from coterie.runtime.config import PersonaConfig
    from coterie.runtime.eval.task import Sample
    from coterie.runtime.eval.worker import SampleJob, SampleWorker, SolverSetup

    def answering(word: str):  # type: ignore[no-untyped-def]
        @tool(name="same")
        async def same(args: NoteArgs, ctx: TurnContext) -> str:
            """Says which one it is."""
            return word

        return same

    rules = [
        {
            "when": {"tool_result": False},
            "tool_calls": [{"name": "same", "arguments": {"text": ""}}],
        },
        {"when": {"tool_result": True}, "text": "{last_tool_result}"},
    ]
    config = PersonaConfig.model_validate(scripted(rules, tools={"allow": ["same"]}))
    setups = {key: SolverSetup(name=key.replace(":", "-"), config=config) for key in ("a", "b:c")}
    worker = SampleWorker(
        setups,
        registry=builtin_registry(),
        scratch=tmp_path / "scratch",
        registries={
            "a": registry_for([answering("solver's")]),
            "b:c": registry_for([answering("grader's")]),
        },
    )

    async def both() -> list[str]:
        outputs = []
        for key in setups:
            job = SampleJob(run_id="r", sample=Sample(id="s", input="go"), epoch=1, solver=key)
            outputs.append((await worker.run(job)).output)
        await worker.aclose()
        return outputs

    assert asyncio.run(both()) == ["solver's", "grader's"]
