"""The lifecycle the local test servers share: an aiohttp app on an
ephemeral port of 127.0.0.1, started and stopped on the caller's loop
(``async with``)."""

from __future__ import annotations

from types import TracebackType
from typing import Self

from aiohttp import web


class LocalHttpServer:
    """Subclasses add their routes in :meth:`_add_routes`."""

    #: Pending connections the listening socket holds.
    backlog: int = 128

    def __init__(self) -> None:
        self._runner: web.AppRunner | None = None
        self._port: int | None = None

    def _add_routes(self, app: web.Application) -> None:
        raise NotImplementedError

    async def start(self) -> Self:
        """Bind to an ephemeral port on 127.0.0.1 and start serving."""
        app = web.Application(client_max_size=64 * 1024 * 1024)
        self._add_routes(app)
        # handler_cancellation: a client that timed out should not leave a
        # sleeping handler behind that delays shutdown.
        self._runner = web.AppRunner(
            app, access_log=None, handler_cancellation=True, shutdown_timeout=0.5
        )
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0, backlog=self.backlog)
        await site.start()
        self._port = int(self._runner.addresses[0][1])
        return self

    async def stop(self) -> None:
        """Stop serving; idempotent."""
        if self._runner is not None:
            runner, self._runner = self._runner, None
            await runner.cleanup()

    async def __aenter__(self) -> Self:
        return await self.start()

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.stop()

    @property
    def root_url(self) -> str:
        """``http://127.0.0.1:<port>``."""
        if self._port is None:
            raise RuntimeError("server is not started")
        return f"http://127.0.0.1:{self._port}"


__all__ = ["LocalHttpServer"]
