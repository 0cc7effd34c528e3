"""``coterie serve``: the wiring of the HTTP front door to a runtime on Ray.

The server (the token, the home's lock and state file, the app, the
connectors, a clean stop on SIGTERM or Ctrl-C) is
:func:`coterie.runtime.serve.server.run_server`; what stays here starts or
joins Ray and the runtime's actors for it.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from coterie.runtime.config import resolve_home
from coterie.runtime.serve.server import StartedRuntime, run_server


async def start_runtime(home: Path, address: str | None) -> StartedRuntime:
    """Start (or join) the runtime of ``home`` on Ray, for the server."""
    from coterie.api import Runtime  # imports Ray

    runtime = await asyncio.to_thread(Runtime.start, home=home, address=address)
    import ray

    async def shutdown() -> None:
        await asyncio.to_thread(runtime.shutdown)

    return StartedRuntime(
        door=runtime,
        close=shutdown,
        ray_address=ray.get_runtime_context().gcs_address,
        ray_auth_mode=os.environ.get("RAY_AUTH_MODE"),
    )


async def serve(
    home: Path,
    *,
    host: str | None = None,
    port: int | None = None,
    address: str | None = None,
    token_file: Path | None = None,
    ready: asyncio.Event | None = None,
    stop: asyncio.Event | None = None,
    announce: Callable[[str], Any] = print,
) -> None:
    """Run the front door of ``home`` until ``stop`` is set (or SIGTERM / SIGINT)."""
    await run_server(
        home,
        lambda: start_runtime(home, address),
        host=host,
        port=port,
        token_file=token_file,
        ready=ready,
        stop=stop,
        announce=announce,
    )


def run_serve(
    home: str | None,
    *,
    host: str | None,
    port: int | None,
    address: str | None,
    token_file: str | None = None,
) -> int:
    """``coterie serve``: run until SIGTERM or Ctrl-C."""
    path = Path(token_file).expanduser() if token_file is not None else None
    asyncio.run(serve(resolve_home(home), host=host, port=port, address=address, token_file=path))
    return 0


__all__ = ["run_serve", "serve", "start_runtime"]
