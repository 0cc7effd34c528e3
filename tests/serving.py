"""A real ``coterie serve`` for the tests, on the session's Ray.

:func:`running_server` runs :func:`coterie.serve.serve` — the same code the
command runs — on its own event loop in a thread, on port 0, and yields the
state it wrote to ``<home>/serve.json`` (URL and token). Leaving the block
stops it the way SIGTERM does (connectors, flush, actors).
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from coterie.runtime.serve.discovery import ServerState, read_state
from coterie.serve import serve


@contextmanager
def running_server(home: Path, *, timeout: float = 120.0) -> Iterator[ServerState]:
    loop = asyncio.new_event_loop()
    ready = asyncio.Event()
    stop = asyncio.Event()
    failure: list[BaseException] = []
    started = threading.Event()

    def run() -> None:
        asyncio.set_event_loop(loop)

        async def main() -> None:
            waiter = asyncio.create_task(ready.wait())
            waiter.add_done_callback(lambda _t: started.set())
            try:
                await serve(home, port=0, ready=ready, stop=stop, announce=lambda _m: None)
            finally:
                started.set()

        try:
            loop.run_until_complete(main())
        except BaseException as exc:  # reported to the test below
            failure.append(exc)
        finally:
            loop.close()

    thread = threading.Thread(target=run, name="coterie-serve-test", daemon=True)
    thread.start()
    if not started.wait(timeout) or failure:
        raise RuntimeError(f"coterie serve did not start: {failure}")
    state = read_state(home)
    assert state is not None, "serve.json was not written"
    try:
        yield state
    finally:
        loop.call_soon_threadsafe(stop.set)
        thread.join(timeout)
        if failure:
            raise failure[0]
