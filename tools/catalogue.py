"""``find_tools``: look up the tools the catalogue keeps out of a call.

With the catalogue on (:mod:`coterie.runtime.catalogue`), a model call
carries the core tools' definitions only; ``find_tools`` lists the other
tools matching a query, one line each, and the turn's next model calls
carry their full definitions. The loop offers it only when tools are held
back (it is never offered otherwise, whatever ``tools.allow`` says).
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from coterie.runtime.catalogue import FIND_LIMIT, one_line, search
from coterie.runtime.context import TurnContext
from coterie.runtime.tool import tool


class FindToolsArgs(BaseModel):
    model_config = ConfigDict(extra="forbid")

    query: str = Field(
        min_length=1,
        max_length=200,
        description="what the tool should do, in a few words (e.g. 'fetch a web page', "
        "'background process'), an exact tool name, or a name pattern such as 'web_*'",
    )


def _never(ctx: TurnContext) -> bool:
    # The loop adds find_tools itself, when the catalogue holds tools back.
    return False


@tool(name="find_tools", timeout=10, allow_repeat=True, available=_never)
async def find_tools(args: FindToolsArgs, ctx: TurnContext) -> str:
    """Find more tools. Only some of your tools are listed in full; this
    lists the others matching a query, with one line each, and makes them
    available from your next step: call them then by name."""
    hidden = ctx.outputs.catalogue
    found = search(hidden, args.query, limit=FIND_LIMIT)
    if not found:
        names = ", ".join(sorted(hidden)) or "none"
        return f"No tool matches {args.query!r}. The tools you can look up: {names}."
    for spec in found:
        ctx.outputs.revealed.add(spec.name)
    lines = [f"- {spec.name}: {one_line(spec)}" for spec in found]
    return f"Found {len(found)} tool(s), available from your next step:\n" + "\n".join(lines)


CATALOGUE_TOOLS = [find_tools]

__all__ = ["CATALOGUE_TOOLS", "FindToolsArgs", "find_tools"]
