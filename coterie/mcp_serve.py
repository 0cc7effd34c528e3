"""``coterie mcp-serve``: the wiring of the home's MCP server.

The server itself (its tools, stdio and streamable HTTP, the bearer token)
is :mod:`coterie.runtime.serve.mcp` and :mod:`coterie.runtime.serve.mcp_transport`.
What stays here is what needs Ray: :func:`open_door` goes through the
``coterie serve`` of the home when one answers (its HTTP API), else starts
the runtime in this process (shut down on exit).
"""

from __future__ import annotations

import asyncio
from pathlib import Path

from coterie.runtime.config import load_settings
from coterie.runtime.errors import ConfigError
from coterie.runtime.frontdoor import OpenedDoor
from coterie.runtime.serve.client import ServedDoor, find_server
from coterie.runtime.serve.mcp_transport import http_auth, mcp_serve


async def _nothing_to_close() -> None:
    return None  # the server is not ours to stop


async def open_door(home: Path, *, address: str | None = None) -> OpenedDoor:
    """The ``coterie serve`` of ``home`` if one answers (unless ``address``
    names a cluster to join), else a runtime started here."""
    if not address:
        client = await asyncio.to_thread(find_server, home)
        if client is not None:
            door = ServedDoor(client)
            return OpenedDoor(door=door, where=door.where, close=_nothing_to_close)
    from coterie.api import Runtime  # imports Ray: only when no server runs

    runtime = await asyncio.to_thread(Runtime.start, home=home, address=address)

    async def shutdown() -> None:
        await asyncio.to_thread(runtime.shutdown)

    return OpenedDoor(
        door=runtime, where=f"an in-process runtime for {runtime.home}", close=shutdown
    )


def run_mcp_serve(
    home: Path,
    *,
    address: str | None,
    http_port: int | None,
    host: str,
    allow_recall: bool,
    token_file: str | Path | None = None,
    no_auth: bool = False,
) -> int:
    """``coterie mcp-serve``: run until stdin closes (stdio) or a signal. The
    HTTP authentication is settled first: a refused one starts nothing."""
    auth = None
    token_path = Path(token_file).expanduser() if token_file is not None else None
    if http_port is not None:
        auth = http_auth(home, host=host, token_file=token_path, no_auth=no_auth)
    elif token_file is not None or no_auth:
        flag = "--token-file" if token_file is not None else "--no-auth"
        raise ConfigError(f"{flag} needs --http PORT (stdio has no front door to lock)")
    asyncio.run(
        mcp_serve(
            lambda: open_door(home, address=address),
            auth=auth,
            host=host,
            http_port=http_port,
            allow_recall=allow_recall,
            ask_timeout=load_settings(home).serve.ask_timeout,
        )
    )
    return 0


__all__ = ["open_door", "run_mcp_serve"]
