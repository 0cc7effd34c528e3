"""Small builders shared by the tests."""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import yaml
from aiohttp import web

from coterie.runtime.config import models as _config_models
from coterie.runtime.context import TurnContext
from coterie.runtime.models import plugins as _model_plugins
from coterie.runtime.testing import turn_context


def make_ctx(text: str = "hi", **kwargs: Any) -> TurnContext:
    """A turn context on a fresh conversation holding one user message."""
    return turn_context(text, **kwargs)


def write_persona(home: Path, name: str, config: dict[str, Any], soul: str = "") -> Path:
    """Write ``<home>/personas/<name>/persona.yaml`` (and SOUL.md)."""
    path = home / "personas" / name
    path.mkdir(parents=True, exist_ok=True)
    (path / "persona.yaml").write_text(yaml.safe_dump(config), encoding="utf-8")
    (path / "SOUL.md").write_text(soul or f"You are {name}.", encoding="utf-8")
    return path


def scripted(
    rules: list[dict[str, Any]] | None = None,
    default: str = "ok",
    *,
    latency_ms: float = 0,
    **extra: Any,
) -> dict[str, Any]:
    """A persona.yaml body with a scripted model."""
    model: dict[str, Any] = {"provider": "scripted", "rules": rules or [], "default": default}
    if latency_ms:
        model["latency_ms"] = latency_ms
    return {"model": model, **extra}


def asker(description: str = "asks back") -> dict[str, Any]:
    """A scripted persona that asks "Which city?" (Paris, Oslo) about a trip
    and otherwise echoes its input as ``you said: …``."""
    return scripted(
        [
            {
                "when": {"contains": "trip"},
                "tool_calls": [
                    {
                        "name": "ask_user",
                        "arguments": {"question": "Which city?", "buttons": ["Paris", "Oslo"]},
                    }
                ],
            },
            {"when": {}, "text": "you said: {input}"},
        ],
        description=description,
    )


def outside_writer(path: str, content: str, reply: str, **extra: Any) -> dict[str, Any]:
    """A scripted persona that writes ``content`` to ``path`` (outside its
    workspace: a permission rule asks first), then answers ``reply``."""
    return scripted(
        [
            {
                "when": {"tool_result": False},
                "tool_calls": [
                    {"name": "file_write", "arguments": {"path": path, "content": content}}
                ],
            },
            {"when": {"tool_result": True}, "text": reply},
        ],
        access="full",
        permissions={"rules": [{"tool": "file_write", "match": "!{workspace}", "action": "ask"}]},
        **extra,
    )


Handler = Callable[[web.Request], Awaitable[web.Response]]


def hashing_embeddings(
    inputs: list[list[str]], *, dim: int = 48, key: str | None = None
) -> Handler:
    """An OpenAI-style ``POST /v1/embeddings`` handler answering the hashing
    embedder's vectors; it records each request's inputs in ``inputs`` and,
    with ``key``, asserts the bearer token."""
    from coterie.runtime.memory import HashingEmbedder

    hashing = HashingEmbedder(dim)

    async def embeddings(request: web.Request) -> web.Response:
        body = await request.json()
        if key is not None:
            assert request.headers["Authorization"] == f"Bearer {key}"
        inputs.append(body["input"])
        data = [
            {"object": "embedding", "index": i, "embedding": vector}
            for i, vector in enumerate(hashing.embed(body["input"]))
        ]
        usage = {"prompt_tokens": 1, "total_tokens": 1}
        return web.json_response(
            {"object": "list", "data": data, "model": body["model"], "usage": usage}
        )

    return embeddings


async def serve_embeddings(handler: Handler) -> tuple[web.AppRunner, str]:
    """``handler`` at ``POST /v1/embeddings`` on a free local port: the runner
    (clean it up) and the base URL."""
    app = web.Application()
    app.router.add_post("/v1/embeddings", handler)
    runner = web.AppRunner(app)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    port = runner.addresses[0][1]
    return runner, f"http://127.0.0.1:{port}/v1"


# -- the Ray cluster's actor table (the GCS's: no dashboard needed) ------------


def ray_actors() -> list[dict[str, Any]]:
    """Every actor the connected cluster knows, alive or dead."""
    import ray

    return list(ray._private.state.actors().values())


def owned_by(name: str, class_name: str) -> list[dict[str, Any]]:
    """The actors of ``class_name`` that the live actor ``name`` created."""
    table = ray_actors()
    (owner,) = [a for a in table if a["Name"] == name and a["State"] == "ALIVE"]
    where = (owner["Address"]["IPAddress"], owner["Address"]["Port"])
    return [
        a
        for a in table
        if a["ActorClassName"] == class_name
        and (a["OwnerAddress"]["IPAddress"], a["OwnerAddress"]["Port"]) == where
    ]


@contextmanager
def no_plugin_providers() -> Iterator[None]:
    """No plugin model provider registered in this process while inside; the
    ones registered before (by a runtime another test started) come back after."""
    saved = dict(_model_plugins._PROVIDERS), dict(_config_models._PROVIDER_NAMES)
    _model_plugins.forget_providers()
    try:
        yield
    finally:
        _model_plugins.forget_providers()
        _model_plugins._PROVIDERS.update(saved[0])
        _config_models._PROVIDER_NAMES.update(saved[1])


def poll(condition: Callable[[], Any], deadline: float, what: str, every: float = 0.25) -> Any:
    """Call ``condition`` until it returns something true, and return that
    (fails naming ``what`` after ``deadline`` seconds)."""
    end = time.monotonic() + deadline
    while True:
        value = condition()
        if value:
            return value
        assert time.monotonic() < end, f"not reached in {deadline:g} s: {what}"
        time.sleep(every)
