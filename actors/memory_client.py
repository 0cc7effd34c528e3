"""The persona side of the MemoryStore actor.

A :class:`MemoryClient` is bound to one persona: every call carries that
persona's name, so no tool argument can reach another persona's rows. Kept
apart from :mod:`actors.memory` so persona processes never import LanceDB
or the embedding model.
"""

from __future__ import annotations

from typing import Any

import ray

from actors._retry import idempotent_call
from runtime.errors import CoterieError, ToolError


def _unwrap(exc: BaseException) -> BaseException:
    cause = getattr(exc, "cause", None)
    return cause if isinstance(cause, ToolError | CoterieError) else exc


class MemoryClient:
    """:class:`runtime.context.MemoryService` over the MemoryStore actor."""

    def __init__(self, handle: Any, persona: str) -> None:
        self._handle = handle
        self.persona = persona
        # The user model goes into every system prompt: cache it, and keep the
        # cache current on our own writes (only this persona writes it).
        self._user_model: list[dict[str, Any]] | None = None

    async def _call(self, method: str, *args: Any, **kwargs: Any) -> Any:
        try:
            return await getattr(self._handle, method).remote(self.persona, *args, **kwargs)
        except ray.exceptions.RayError as exc:
            raise _unwrap(exc) from None

    async def write(self, *, category: str, content: str, importance: int) -> dict[str, Any]:
        row: dict[str, Any] = await self._call(
            "write", category=category, content=content, importance=importance
        )
        return row

    async def update(
        self,
        memory_id: str,
        *,
        content: str,
        category: str | None = None,
        importance: int | None = None,
    ) -> dict[str, Any]:
        row: dict[str, Any] = await self._call(
            "update", memory_id, content=content, category=category, importance=importance
        )
        return row

    async def delete(self, memory_id: str) -> None:
        await self._call("delete", memory_id)

    async def recall(
        self,
        *,
        query: str = "",
        source: str = "all",
        category: str | None = None,
        limit: int = 8,
        date: str | None = None,
    ) -> list[dict[str, Any]]:
        hits: list[dict[str, Any]] = await self._call(
            "recall", query=query, source=source, category=category, limit=limit, date=date
        )
        return hits

    async def ingest(self, *, source: str, text: str) -> dict[str, Any]:
        result: dict[str, Any] = await self._call("ingest", source=source, text=text)
        return result

    async def write_user_model(
        self, *, dimension: str, content: str, confidence: int
    ) -> dict[str, Any]:
        row: dict[str, Any] = await self._call(
            "write_user_model", dimension=dimension, content=content, confidence=confidence
        )
        if self._user_model is not None:
            rest = [r for r in self._user_model if r["dimension"] != row["dimension"]]
            self._user_model = sorted([*rest, row], key=lambda r: str(r["dimension"]))
        return row

    async def user_model(self) -> list[dict[str, Any]]:
        if self._user_model is None:
            loaded: list[dict[str, Any]] = await idempotent_call(lambda: self._call("user_model"))
            self._user_model = loaded
            return list(loaded)
        return list(self._user_model)


__all__ = ["MemoryClient"]
