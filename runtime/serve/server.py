"""``coterie serve``: a runtime kept up behind its HTTP front door.

:func:`run_server` settles the bearer token (:mod:`runtime.serve.auth`) and
takes the home's lock (:mod:`runtime.serve.discovery`: one server per home),
then binds the port (``/v1`` answers 503 while the runtime starts), starts
the runtime through the caller's ``start_runtime`` (``coterie`` starts or
joins Ray there), starts the connectors (``web``, ``cli``, and the chat apps
configured in ``runtime.yaml`` whose token is set), and writes
``<home>/serve.json`` so that the other commands find it. When ``stop`` is
set — SIGTERM or Ctrl-C — it stops cleanly: the state file goes, the
connectors stop, the runtime is let go of (every persona's audit buffer
flushed into DuckDB), and the lock is released.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from aiohttp import web

from coterie.runtime.config import RuntimeSettings, load_settings
from coterie.runtime.connectors.base import Connector
from coterie.runtime.connectors.mailbox import cli_connector, web_connector
from coterie.runtime.connectors.manager import ConnectorHost, ConnectorManager
from coterie.runtime.serve.app import build_app, set_backend, set_starting_error
from coterie.runtime.serve.auth import SERVE_DOOR, door_auth, plain_http_warning
from coterie.runtime.serve.discovery import ServeLock, ServerState, remove_state, write_state

log = logging.getLogger("coterie.serve")


@dataclass(frozen=True)
class StartedRuntime:
    """A runtime started for the server, as ``start_runtime`` hands it over."""

    #: Its front door, with the connectors' outbox.
    door: ConnectorHost
    #: Stop it (or let go of it, when it lives on without the server).
    close: Callable[[], Awaitable[None]]
    #: The Ray cluster it runs on and the auth mode a driver joining it needs,
    #: for the state file (``coterie eval`` joins the server's cluster).
    ray_address: str | None = None
    ray_auth_mode: str | None = None


def chat_app_connectors(
    settings: RuntimeSettings, environ: Mapping[str, str] = os.environ
) -> tuple[list[Connector], dict[str, str]]:
    """The configured chat-app connectors whose token is set, and the persona
    that answers each."""
    connectors: list[Connector] = []
    personas: dict[str, str] = {}
    telegram = settings.connectors.telegram
    if telegram is not None:
        from coterie.runtime.connectors.telegram import telegram_from_env

        connector = telegram_from_env(telegram, environ)
        if connector is None:
            log.info("telegram: ${%s} is not set; the connector is off", telegram.token_env)
        else:
            connectors.append(connector)
            personas[connector.id] = telegram.persona
    return connectors, personas


def _nothing() -> None:
    return None


def _stop_on_signals(stop: asyncio.Event) -> Callable[[], None]:
    """Set ``stop`` on SIGTERM or SIGINT (from the running loop); returns the undo."""
    loop = asyncio.get_running_loop()
    installed = []
    for sig in (signal.SIGTERM, signal.SIGINT):
        try:
            loop.add_signal_handler(sig, stop.set)
            installed.append(sig)
        except (RuntimeError, ValueError):  # not the main thread (tests)
            pass

    def undo() -> None:
        for sig in installed:
            loop.remove_signal_handler(sig)

    return undo


async def run_server(
    home: Path,
    start_runtime: Callable[[], Awaitable[StartedRuntime]],
    *,
    host: str | None = None,
    port: int | None = None,
    token_file: Path | None = None,
    ready: asyncio.Event | None = None,
    stop: asyncio.Event | None = None,
    announce: Callable[[str], Any] = print,
    environ: Mapping[str, str] = os.environ,
) -> None:
    """Run the front door of ``home`` until ``stop`` is set (or SIGTERM / SIGINT)."""
    settings = load_settings(home)
    serve_settings = settings.serve.model_copy(
        update={k: v for k, v in (("host", host), ("port", port)) if v is not None}
    )
    auth = door_auth(
        home,
        SERVE_DOOR,
        env_var=serve_settings.token_env,
        host=serve_settings.host,
        token_file=token_file,
        environ=environ,
    )
    lock = await asyncio.to_thread(ServeLock.claim, home)
    runner: web.AppRunner | None = None
    started: StartedRuntime | None = None
    manager: ConnectorManager | None = None
    undo_signals = _nothing
    try:
        auth = auth.publish()  # one server per home: no other start can race it
        assert auth.token is not None  # serve has no --no-auth
        warning = plain_http_warning("serve", serve_settings.host)
        if warning:
            log.warning("%s", warning)
        mailboxes = {"web": web_connector(), "cli": cli_connector()}
        app = build_app(home, serve_settings, token=auth.token, mailboxes=mailboxes)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, serve_settings.host, serve_settings.port)
        await site.start()
        url = f"http://{serve_settings.host}:{runner.addresses[0][1]}"
        stop = stop or asyncio.Event()
        undo_signals = _stop_on_signals(stop)
        announce(f"coterie serve: {url} — starting the runtime… ({auth.source})")
        try:
            started = await start_runtime()
        except Exception as exc:
            set_starting_error(app, f"the runtime could not start: {exc}")
            raise
        chat_apps, personas = chat_app_connectors(settings, environ)
        manager = ConnectorManager(
            started.door,
            [*mailboxes.values(), *chat_apps],
            default_persona=personas.get,
            ask_timeout=serve_settings.ask_timeout,
        )
        await manager.start()
        set_backend(app, started.door)
        write_state(
            home,
            ServerState(
                url=url,
                pid=os.getpid(),
                token=auth.token,
                ray_address=started.ray_address,
                ray_auth_mode=started.ray_auth_mode,
            ),
        )
        names = ", ".join(manager.connectors)
        announce(f"coterie serve: ready on {url} (connectors: {names}); Ctrl-C stops it")
        announce("the chat page's address, with its token: coterie status --page-url")
        if ready is not None:
            ready.set()
        await stop.wait()
        announce("coterie serve: stopping (flushing the audit log)…")
    finally:
        remove_state(home, os.getpid())
        try:
            if manager is not None:
                await manager.aclose()
            if runner is not None:
                await runner.cleanup()
            if started is not None:
                await started.close()
        finally:
            undo_signals()
            lock.release()


__all__ = ["StartedRuntime", "chat_app_connectors", "run_server"]
