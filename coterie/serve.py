"""``coterie serve``: the runtime kept up behind an HTTP front door.

It binds the port first (``/v1`` answers 503 while the runtime starts), then
starts or joins Ray and the runtime's actors, starts the connectors (``web``,
``cli``, and the chat apps configured in ``runtime.yaml`` whose token is
set), and writes ``<home>/serve.json`` so that the other commands find it.
SIGTERM or Ctrl-C stops it cleanly: the connectors stop, every persona's
audit buffer is flushed into DuckDB, the actors stop, the state file goes.
"""

from __future__ import annotations

import asyncio
import logging
import os
import secrets
import signal
from pathlib import Path
from typing import Any

from aiohttp import web

from coterie.client import ServerState, remove_state, write_state
from coterie.runtime.config import RuntimeSettings, ServeSettings, load_settings, resolve_home
from coterie.runtime.connectors.base import Connector
from coterie.runtime.connectors.mailbox import cli_connector, web_connector
from coterie.runtime.connectors.manager import ConnectorManager
from coterie.runtime.errors import ConfigError
from coterie.runtime.serve.app import build_app, set_backend, set_starting_error

log = logging.getLogger("coterie.serve")


def serve_token(settings: ServeSettings) -> str:
    """The bearer token: ``$<token_env>`` if set, else a new random one."""
    token = os.environ.get(settings.token_env, "").strip()
    if token and len(token) < 16:
        raise ConfigError(f"${settings.token_env} is too short for a token (16 characters or more)")
    return token or secrets.token_urlsafe(32)


def chat_app_connectors(settings: RuntimeSettings) -> tuple[list[Connector], dict[str, str]]:
    """The configured chat-app connectors whose token is set, and the persona
    that answers each."""
    connectors: list[Connector] = []
    personas: dict[str, str] = {}
    telegram = settings.connectors.telegram
    if telegram is not None:
        from coterie.runtime.connectors.telegram import telegram_from_env

        connector = telegram_from_env(telegram, os.environ)
        if connector is None:
            log.info("telegram: ${%s} is not set; the connector is off", telegram.token_env)
        else:
            connectors.append(connector)
            personas[connector.id] = telegram.persona
    return connectors, personas


async def serve(
    home: Path,
    *,
    host: str | None = None,
    port: int | None = None,
    address: str | None = None,
    ready: asyncio.Event | None = None,
    stop: asyncio.Event | None = None,
    announce: Any = print,
) -> None:
    """Run the front door until ``stop`` is set (or SIGTERM / SIGINT)."""
    settings = load_settings(home)
    serve_settings = settings.serve.model_copy(
        update={k: v for k, v in (("host", host), ("port", port)) if v is not None}
    )
    token = serve_token(serve_settings)
    mailboxes = {"web": web_connector(), "cli": cli_connector()}
    app = build_app(home, serve_settings, token=token, mailboxes=mailboxes)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, serve_settings.host, serve_settings.port)
    await site.start()
    bound = runner.addresses[0]
    url = f"http://{serve_settings.host}:{bound[1]}"
    stop = stop or asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        try:
            loop.add_signal_handler(sig, stop.set)
        except (RuntimeError, ValueError):  # not the main thread (tests)
            pass
    announce(f"coterie serve: {url} — starting the runtime…")
    from coterie.api import Runtime  # imports Ray

    rt: Runtime | None = None
    manager: ConnectorManager | None = None
    try:
        try:
            rt = await asyncio.to_thread(Runtime.start, home=home, address=address)
        except Exception as exc:
            set_starting_error(app, f"the runtime could not start: {exc}")
            raise
        chat_apps, personas = chat_app_connectors(settings)
        manager = ConnectorManager(
            rt,
            [*mailboxes.values(), *chat_apps],
            default_persona=personas.get,
            ask_timeout=serve_settings.ask_timeout,
        )
        await manager.start()
        set_backend(app, rt)
        import ray

        write_state(
            home,
            ServerState(
                url=url,
                pid=os.getpid(),
                token=token,
                ray_address=ray.get_runtime_context().gcs_address,
                ray_auth_mode=os.environ.get("RAY_AUTH_MODE"),
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
        if manager is not None:
            await manager.aclose()
        await runner.cleanup()
        if rt is not None:
            await asyncio.to_thread(rt.shutdown)


def run_serve(home: str | None, *, host: str | None, port: int | None, address: str | None) -> int:
    asyncio.run(serve(resolve_home(home), host=host, port=port, address=address))
    return 0


__all__ = ["chat_app_connectors", "run_serve", "serve", "serve_token"]
