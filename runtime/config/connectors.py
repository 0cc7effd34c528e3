"""``connectors:`` in ``runtime.yaml``: the chat-app connectors of ``coterie serve``.

A leaf of the config package (it imports no connector): the settings are
read with the rest of ``runtime.yaml`` before any connector is built, and
``runtime.connectors`` imports them from here.
"""

from __future__ import annotations

from pydantic import Field

from coterie.runtime.config._strict import Strict


class TelegramSettings(Strict):
    """``connectors: {telegram: ...}`` in runtime.yaml."""

    #: The environment variable holding the bot token (never the token itself).
    token_env: str = "TELEGRAM_BOT_TOKEN"
    #: The Bot API root; a local stand-in server in the tests.
    api_base: str = "https://api.telegram.org"
    #: The persona that answers this bot.
    persona: str
    #: Chat ids the bot talks with; empty means any chat.
    allowed_chats: list[int] = Field(default_factory=list)
    #: Seconds one long poll waits for updates (Telegram takes whole seconds).
    poll_timeout: float = Field(default=20, gt=0, le=300)


class ConnectorSettings(Strict):
    """Chat-app connectors of ``coterie serve`` (``connectors:`` in
    ``runtime.yaml``); each runs only when its token is in the environment."""

    telegram: TelegramSettings | None = None


__all__ = ["ConnectorSettings", "TelegramSettings"]
