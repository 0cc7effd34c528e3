"""The memory tools through the tool loop, over a real LanceDB directory."""

from __future__ import annotations

import json
import re
import threading
from pathlib import Path

import pytest

from coterie.runtime.config import load_persona
from coterie.runtime.memory import HashingEmbedder, MemoryClient, MemoryServer, MemoryStore
from coterie.runtime.messages import AssistantMessage, MessageEnvelope, ToolResultMessage
from coterie.runtime.models.scripted import ScriptedModel, tool_call
from coterie.runtime.persona import PersonaRuntime
from coterie.runtime.services import Services
from coterie.tools import builtin_registry
from tests.helpers import make_ctx, scripted, write_persona


@pytest.fixture
def store(tmp_path: Path) -> MemoryStore:
    return MemoryStore(str(tmp_path / "memory"), HashingEmbedder(dim=64))


def persona_with(
    tmp_path: Path, store: MemoryStore, name: str, steps: list[object]
) -> tuple[PersonaRuntime, ScriptedModel]:
    write_persona(tmp_path / "home", name, scripted())
    persona = load_persona(tmp_path / "home", name)
    persona.workspace.mkdir(parents=True, exist_ok=True)
    model = ScriptedModel(steps)  # type: ignore[arg-type]
    runtime = PersonaRuntime(
        persona,
        model=model,
        registry=builtin_registry(),
        services=Services(memory=MemoryClient(MemoryServer.serving(store), name)),
    )
    return runtime, model


def results(model: ScriptedModel) -> list[str]:
    """Every tool result the model has seen (the last request holds them all)."""
    return [m.content for m in model.requests[-1].messages if isinstance(m, ToolResultMessage)]


def env(to: str, text: str = "go") -> MessageEnvelope:
    return MessageEnvelope(recipient=to, conversation_id=f"{to}:t", text=text)


async def test_write_recall_update_delete(tmp_path: Path, store: MemoryStore) -> None:
    rt, model = persona_with(
        tmp_path,
        store,
        "ana",
        [
            AssistantMessage(
                tool_calls=[
                    tool_call(
                        "memory",
                        {
                            "action": "write",
                            "category": "work",
                            "content": "Shipped the ZEPHYR-42 fix",
                            "importance": 8,
                        },
                    )
                ]
            ),
            AssistantMessage(tool_calls=[tool_call("recall", {"query": "ZEPHYR-42"})]),
            "done",
        ],
    )
    await rt.handle(env("ana"))
    saved, found = results(model)[:2]
    memory_id = re.search(r"\[memory ([0-9a-f-]+)\]", saved).group(1)  # type: ignore[union-attr]
    assert f"[memory {memory_id}] (work, importance 8," in found and "ZEPHYR-42" in found

    rt2, model2 = persona_with(
        tmp_path,
        store,
        "ana",
        [
            AssistantMessage(
                tool_calls=[
                    tool_call(
                        "memory",
                        {"action": "update", "id": memory_id, "content": "Shipped ZEPHYR-43"},
                    )
                ]
            ),
            AssistantMessage(
                tool_calls=[tool_call("memory", {"action": "delete", "id": memory_id})]
            ),
            AssistantMessage(
                tool_calls=[tool_call("memory", {"action": "delete", "id": memory_id})]
            ),
            AssistantMessage(
                tool_calls=[tool_call("memory", {"action": "write", "content": "  "})]
            ),
            "ok",
        ],
    )
    await rt2.handle(env("ana"))
    updated, deleted, again, empty = results(model2)
    assert updated.startswith(f"updated [memory {memory_id}]") and "ZEPHYR-43" in updated
    assert deleted == f"deleted memory {memory_id}"
    assert json.loads(again)["error"] == "not_found"
    assert json.loads(empty)["error"] == "invalid_arguments"


async def test_isolation_between_personas(tmp_path: Path, store: MemoryStore) -> None:
    ana, _ = persona_with(
        tmp_path,
        store,
        "ana",
        [
            AssistantMessage(
                tool_calls=[
                    tool_call("memory", {"action": "write", "content": "ana's secret plan"})
                ]
            ),
            "ok",
        ],
    )
    await ana.handle(env("ana"))
    [row] = store.recall("ana", query="secret plan")
    bob, model = persona_with(
        tmp_path,
        store,
        "bob",
        [
            AssistantMessage(
                tool_calls=[
                    tool_call("recall", {"query": "secret plan"}),
                    tool_call("memory", {"action": "delete", "id": row.id}),
                    tool_call("memory", {"action": "update", "id": row.id, "content": "pwned"}),
                ]
            ),
            "ok",
        ],
    )
    await bob.handle(env("bob"))
    found, deleted, updated = results(model)
    assert found == "Nothing found."
    assert json.loads(deleted)["error"] == json.loads(updated)["error"] == "not_found"
    assert store.recall("ana", query="secret plan")[0].content == "ana's secret plan"


async def test_user_model_goes_into_every_system_prompt(tmp_path: Path, store: MemoryStore) -> None:
    rt, model = persona_with(
        tmp_path,
        store,
        "ana",
        [
            AssistantMessage(
                tool_calls=[
                    tool_call(
                        "user_model_write",
                        {
                            "dimension": "preferences",
                            "content": "Prefers short answers",
                            "confidence": 8,
                        },
                    )
                ]
            ),
            "noted",
            "second turn",
        ],
    )
    await rt.handle(env("ana"))
    assert results(model)[0] == (
        "saved user model [preferences] (confidence 8): Prefers short answers"
    )
    await rt.handle(env("ana", "again"))
    assert "- preferences (confidence 8/10): Prefers short answers" in model.requests[-1].system


async def test_knowledge_ingest_from_workspace_and_rails(
    tmp_path: Path, store: MemoryStore
) -> None:
    rt, model = persona_with(tmp_path, store, "ana", [])
    workspace = rt.persona.workspace
    (workspace / "manual.md").write_text("# Pump manual\n\nBleed the valve before restarting.\n")
    (workspace / "latin1.txt").write_bytes("caf\xe9".encode("latin-1"))
    outside = tmp_path / "outside.txt"
    outside.write_text("not yours")
    (workspace / "link.txt").symlink_to(outside)
    model.steps = [
        AssistantMessage(
            tool_calls=[
                tool_call("knowledge_ingest", {"source": "pump", "path": "manual.md"}),
                tool_call("knowledge_ingest", {"source": "x", "path": "../../outside.txt"}),
                tool_call("knowledge_ingest", {"source": "x", "path": "link.txt"}),
                tool_call("knowledge_ingest", {"source": "x", "path": "latin1.txt"}),
                tool_call("knowledge_ingest", {"source": "x", "path": "manual.md", "text": "both"}),
            ]
        ),
        AssistantMessage(
            tool_calls=[tool_call("recall", {"query": "bleed valve", "source": "knowledge"})]
        ),
        "ok",
    ]
    await rt.handle(env("ana"))
    ok, escape, link, latin, both, found = results(model)
    assert ok == "ingested pump: 1 chunk(s)"
    assert json.loads(escape)["error"] == json.loads(link)["error"] == "path_denied"
    assert json.loads(latin)["error"] == "not_utf8"
    assert json.loads(both)["error"] == "invalid_arguments"
    assert found.startswith("[knowledge pump#0]") and "Bleed the valve" in found


async def test_memory_tools_hidden_without_a_store() -> None:
    names = set(builtin_registry().visible(make_ctx()))
    assert not names & {"memory", "recall", "knowledge_ingest", "user_model_write"}


async def test_documents_are_read_off_the_event_loop(
    tmp_path: Path, store: MemoryStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    from coterie.runtime.memory import documents

    loop_thread = threading.get_ident()
    readers: list[int] = []
    real = documents.read_document

    def probe(path: Path, **kwargs: object) -> str:
        readers.append(threading.get_ident())
        return real(path)

    monkeypatch.setattr(documents, "read_document", probe)
    rt, model = persona_with(
        tmp_path,
        store,
        "ana",
        [
            AssistantMessage(
                tool_calls=[tool_call("knowledge_ingest", {"source": "m", "path": "m.md"})]
            ),
            "ok",
        ],
    )
    (rt.persona.workspace / "m.md").write_text("# Manual\n\nBleed the valve.", encoding="utf-8")
    await rt.handle(env("ana"))
    assert results(model) == ["ingested m: 1 chunk(s)"]
    assert len(readers) == 1 and readers[0] != loop_thread
