"""Memory tools: memory, recall, knowledge_ingest, user_model_write.

They talk to the persona's :class:`~runtime.services.MemoryService`, which is
already bound to the persona: no tool argument can reach another persona's
memories. The tools hide themselves when the runtime has no memory store.
"""

from __future__ import annotations

import asyncio
import re
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from coterie.runtime.context import TurnContext
from coterie.runtime.errors import ToolError
from coterie.runtime.memory.records import MemoryRow, RecallHit
from coterie.runtime.services import MemoryService
from coterie.runtime.tool import tool
from coterie.tools._paths import workspace_path

DATE_RE = re.compile(r"^\d{4}-\d{2}-\d{2}$")


def _has_memory(ctx: TurnContext) -> bool:
    return ctx.services.memory is not None


def _memory(ctx: TurnContext) -> MemoryService:
    if ctx.services.memory is None:
        raise ToolError("unavailable", "this runtime has no memory store")
    return ctx.services.memory


class MemoryArgs(BaseModel):
    model_config = ConfigDict(extra="forbid")

    action: Literal["write", "update", "delete"]
    category: str | None = Field(
        default=None, max_length=64, description="write: e.g. work, people, travel"
    )
    content: str | None = Field(default=None, max_length=20_000, description="write/update")
    importance: int | None = Field(default=None, ge=1, le=10, description="1..10 (default 5)")
    id: str | None = Field(default=None, description="update/delete: the id recall showed")

    @model_validator(mode="after")
    def _needs(self) -> MemoryArgs:
        if self.action in ("update", "delete") and not self.id:
            raise ValueError(f"{self.action} needs the memory's id")
        if self.action in ("write", "update") and not (self.content or "").strip():
            raise ValueError(f"{self.action} needs non-empty content")
        return self


def _row_line(row: MemoryRow) -> str:
    return (
        f"{row.tag} ({row.category or 'general'}, importance {row.importance}, {row.day}) "
        f"{row.content}"
    )


@tool(name="memory", timeout=30, available=_has_memory)
async def memory(args: MemoryArgs, ctx: TurnContext) -> str:
    """Write, update or delete a long-term memory: events, milestones and
    conversations worth recalling later. Stable facts about the user belong
    in user_model_write. update and delete take the id that recall shows."""
    store = _memory(ctx)
    if args.action == "write":
        row = await store.write(
            category=(args.category or "general").strip() or "general",
            content=(args.content or "").strip(),
            importance=args.importance or 5,
        )
        return f"saved {_row_line(row)}"
    assert args.id is not None
    if args.action == "update":
        row = await store.update(
            args.id,
            content=(args.content or "").strip(),
            category=args.category,
            importance=args.importance,
        )
        return f"updated {_row_line(row)}"
    await store.delete(args.id)
    return f"deleted memory {args.id}"


class RecallArgs(BaseModel):
    model_config = ConfigDict(extra="forbid")

    query: str = Field(
        default="",
        max_length=2_000,
        description="what to look for; empty: the most important and recent memories",
    )
    date: str | None = Field(
        default=None, description="YYYY-MM-DD: list every memory written that day"
    )
    source: Literal["all", "memories", "knowledge"] = "all"
    category: str | None = Field(default=None, max_length=64)
    limit: int = Field(default=8, ge=1, le=50)

    @model_validator(mode="after")
    def _date(self) -> RecallArgs:
        if self.date is not None and not DATE_RE.match(self.date):
            raise ValueError("date must be YYYY-MM-DD")
        return self


def _hit_line(hit: RecallHit) -> str:
    content = " ".join(hit.content.split())
    if hit.kind == "knowledge":
        return f"{hit.tag} {content}"
    meta = ", ".join(str(v) for v in (hit.category, f"importance {hit.importance}", hit.day) if v)
    return f"{hit.tag} ({meta}) {content}"


@tool(name="recall", timeout=30, allow_repeat=True, available=_has_memory)
async def recall(args: RecallArgs, ctx: TurnContext) -> str:
    """Search long-term memory: your memories and knowledge base together
    (hybrid full-text + semantic ranking). Results are tagged [memory <id>] or
    [knowledge <source>#<chunk>]. date lists a day's memories; an empty query
    returns the most important and recent memories."""
    hits = await _memory(ctx).recall(
        query=args.query.strip(),
        source=args.source,
        category=args.category,
        limit=args.limit,
        date=args.date,
    )
    if not hits:
        return "Nothing found."
    return "\n".join(_hit_line(h) for h in hits)


class IngestArgs(BaseModel):
    model_config = ConfigDict(extra="forbid")

    source: str = Field(
        min_length=1, max_length=200, description="a short stable name for the document"
    )
    path: str | None = Field(default=None, description="a workspace file: text, markdown or PDF")
    text: str | None = Field(default=None, description="raw text instead of a file")

    @model_validator(mode="after")
    def _one(self) -> IngestArgs:
        if (self.path is None) == (self.text is None):
            raise ValueError("give exactly one of path or text")
        return self


@tool(name="knowledge_ingest", timeout=120, available=_has_memory)
async def knowledge_ingest(args: IngestArgs, ctx: TurnContext) -> str:
    """Add a document to your knowledge base for later recall (specs,
    manuals, articles — not chat snippets). It is split into ~3000-character
    chunks; ingesting the same source again replaces it."""
    if args.path is not None:
        from coterie.runtime.memory import documents

        # Reading (a PDF above all) takes a while: off the loop, so that other
        # conversations' turns go on meanwhile.
        text = await asyncio.to_thread(documents.read_document, workspace_path(ctx, args.path))
    else:
        text = args.text or ""
    result = await _memory(ctx).ingest(source=args.source.strip(), text=text)
    verb = "replaced" if result.replaced else "ingested"
    return f"{verb} {args.source}: {result.chunks} chunk(s)"


class UserModelArgs(BaseModel):
    model_config = ConfigDict(extra="forbid")

    dimension: str = Field(
        min_length=1,
        max_length=64,
        description="e.g. baseline, preferences, working_patterns, feedback, goals",
    )
    content: str = Field(min_length=1, max_length=4_000)
    confidence: int = Field(default=5, ge=1, le=10)


@tool(name="user_model_write", timeout=30, available=_has_memory)
async def user_model_write(args: UserModelArgs, ctx: TurnContext) -> str:
    """Save one dimension of what you know about the user (replaces that
    dimension). The whole user model is in your system prompt every turn."""
    row = await _memory(ctx).write_user_model(
        dimension=args.dimension.strip(), content=args.content.strip(), confidence=args.confidence
    )
    return f"saved user model [{row.dimension}] (confidence {row.confidence}): {row.content}"


MEMORY_TOOLS = [memory, recall, knowledge_ingest, user_model_write]

__all__ = ["MEMORY_TOOLS", "knowledge_ingest", "memory", "recall", "user_model_write"]
