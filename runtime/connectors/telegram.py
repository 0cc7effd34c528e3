"""The Telegram connector: a bot people talk to, over the Bot API.

Inbound messages come by long polling (``getUpdates``), so the bot needs no
public address. A question's choices become an inline keyboard; a press comes
back as an :class:`InboundMessage` whose ``answer_to`` names the question.

The bot token is a credential that the Bot API carries in every URL path,
and PTB and httpx put those URLs in some errors and log lines. The connector
scrubs the token from everything it raises or logs, and it installs a filter
on the PTB and httpx loggers that does the same.

``telegram`` is imported only when a connector is built. Its settings,
:class:`~coterie.runtime.config.TelegramSettings`, are part of the config
package (``connectors:`` in runtime.yaml).
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import math
import re
from collections import OrderedDict
from collections.abc import AsyncIterator, Mapping
from contextlib import suppress
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

from coterie.runtime.config.connectors import TelegramSettings
from coterie.runtime.connectors.base import (
    APPROVAL_BUTTONS,
    Capability,
    InboundMessage,
    OutboundMessage,
)
from coterie.runtime.errors import ConnectorError
from coterie.runtime.messages import now

if TYPE_CHECKING:
    from telegram import Bot, CallbackQuery, InlineKeyboardMarkup, Update

log = logging.getLogger("coterie.connectors.telegram")

#: The longest text one message may hold (UTF-16 code units, as Telegram counts).
MAX_MESSAGE_LEN = 4096
#: The most bytes a button's ``callback_data`` may hold.
MAX_CALLBACK_DATA = 64
#: Questions whose choices the connector remembers (the oldest are forgotten).
MAX_OPEN_QUESTIONS = 1024

_ALLOWED_UPDATES = ["message", "callback_query"]
_REDACTED = "<redacted>"
# Marks a callback key that stands in for a question id too long to fit.
_ALIAS = "~"


# -- token scrubbing --------------------------------------------------------


def _secret_forms(token: str) -> list[str]:
    """The token as it may appear: plain, URL-quoted, and its secret half."""
    forms = {token, quote(token, safe="")}
    _, _, secret = token.partition(":")
    if len(secret) >= 8:
        forms.add(secret)
    # Longest first, so a form that contains another is replaced whole.
    return sorted((f for f in forms if f), key=len, reverse=True)


def _scrub(text: str, secrets: set[str]) -> str:
    # Case-insensitive: PTB lowercases some server descriptions (capitalize()).
    for secret in sorted(secrets, key=len, reverse=True):
        text = re.sub(re.escape(secret), _REDACTED, text, flags=re.IGNORECASE)
    return text


class _ScrubFilter(logging.Filter):
    """Removes live bot tokens from the records of third-party loggers.

    A logger's filters see only the records logged on that very logger, so
    this is attached to each of the loggers known to print request URLs.
    """

    def __init__(self) -> None:
        super().__init__()
        self.secrets: set[str] = set()

    def filter(self, record: logging.LogRecord) -> bool:
        if not self.secrets:
            return True
        message = record.getMessage()
        clean = _scrub(message, self.secrets)
        if clean != message:
            record.msg, record.args = clean, None
        if record.exc_info and not record.exc_text:
            record.exc_text = logging.Formatter().formatException(record.exc_info)
        if record.exc_text:
            record.exc_text = _scrub(record.exc_text, self.secrets)
        return True


_SCRUB = _ScrubFilter()
_SCRUBBED_LOGGERS = (
    "httpx",
    "telegram.Bot",
    "telegram.request.BaseRequest",
    "telegram.request.HTTPXRequest",
    log.name,
)
_live_tokens: dict[str, int] = {}


def _register_token(token: str) -> None:
    if not _live_tokens:
        for name in _SCRUBBED_LOGGERS:
            logger = logging.getLogger(name)
            if _SCRUB not in logger.filters:
                logger.addFilter(_SCRUB)
    _live_tokens[token] = _live_tokens.get(token, 0) + 1
    _SCRUB.secrets.update(_secret_forms(token))


def _unregister_token(token: str) -> None:
    count = _live_tokens.get(token, 0) - 1
    if count > 0:
        _live_tokens[token] = count
        return
    _live_tokens.pop(token, None)
    _SCRUB.secrets = {s for t in _live_tokens for s in _secret_forms(t)}


# -- text splitting -----------------------------------------------------------


def _utf16_len(text: str) -> int:
    return len(text.encode("utf-16-le")) // 2


def split_text(text: str, limit: int = MAX_MESSAGE_LEN) -> list[str]:
    """``text`` in pieces of at most ``limit`` UTF-16 units, joined they are ``text``.

    Telegram measures length in UTF-16 units, so an emoji counts twice. A
    piece breaks after a newline or a space in its second half when there is
    one, so words stay whole.
    """
    pieces: list[str] = []
    rest = text
    while _utf16_len(rest) > limit:
        cut, units = 0, 0
        for ch in rest:
            width = 2 if ord(ch) > 0xFFFF else 1
            if units + width > limit:
                break
            units += width
            cut += 1
        window = rest[:cut]
        brk = window.rfind("\n", cut // 2)
        if brk < 0:
            brk = window.rfind(" ", cut // 2)
        if brk >= 0:
            cut = brk + 1
        pieces.append(rest[:cut])
        rest = rest[cut:]
    if rest:
        pieces.append(rest)
    return pieces


# -- the connector ------------------------------------------------------------


@dataclass
class _Question:
    question_id: str | None
    labels: list[str]
    expires_at: float | None


def _chat_id(destination: str) -> int | str:
    """A numeric chat id as an int; ``@channel`` names stay strings."""
    try:
        return int(destination)
    except ValueError:
        return destination


class TelegramConnector:
    """A Telegram bot as a :class:`~runtime.connectors.base.Connector`."""

    id = "telegram"
    capabilities: frozenset[Capability] = frozenset({"text", "buttons"})

    #: Seconds before the first retry of a failed poll; doubles up to ``retry_max``.
    retry_initial: float = 1.0
    retry_max: float = 30.0

    def __init__(self, config: TelegramSettings, *, token: str) -> None:
        if not token:
            raise ConnectorError("telegram: no bot token")
        from telegram import Bot

        self.config = config
        self.persona = config.persona
        self._token = token
        self._secrets = set(_secret_forms(token))
        # Before the Bot exists: its constructor logs the URL with the token.
        _register_token(token)
        api_base = config.api_base.rstrip("/")
        try:
            self._bot: Bot = Bot(
                token, base_url=f"{api_base}/bot", base_file_url=f"{api_base}/file/bot"
            )
        except Exception as exc:
            _unregister_token(token)
            raise ConnectorError(f"telegram: {_scrub(str(exc), self._secrets)}") from None
        self._allowed = frozenset(config.allowed_chats)
        self._ready_lock = asyncio.Lock()
        self._ready = False
        self._stop = asyncio.Event()
        self._closed = False
        self._receiving = False
        self._poll_task: asyncio.Future[Any] | None = None
        self._offset = 0
        self._questions: OrderedDict[str, _Question] = OrderedDict()
        self._ignored_chats: set[int] = set()

    # -- helpers ---------------------------------------------------------------

    def _clean(self, exc: BaseException) -> str:
        text = str(exc) or type(exc).__name__
        return _scrub(text, self._secrets)

    async def _ensure_ready(self) -> None:
        """Initialize the Bot once (``getMe`` checks the token)."""
        if self._ready:
            return
        async with self._ready_lock:
            if not self._ready:
                await self._bot.initialize()
                self._ready = True

    def _allows(self, chat_id: int | str) -> bool:
        return not self._allowed or chat_id in self._allowed

    def _callback_key(self, message: OutboundMessage) -> str:
        """The question's part of ``callback_data``: its id when that fits
        (an approval's id always does)."""
        if message.approval_id is not None:
            return message.approval_id
        qid = message.question_id or message.id
        widest = f"{qid}:{len(message.buttons) - 1}"
        if len(widest.encode()) <= MAX_CALLBACK_DATA and not qid.startswith(_ALIAS):
            return qid
        return _ALIAS + hashlib.blake2b(qid.encode(), digest_size=12).hexdigest()

    def _remember(self, key: str, question: _Question) -> None:
        self._questions[key] = question
        self._questions.move_to_end(key)
        current = now()
        for old in [
            k for k, q in self._questions.items() if q.expires_at and q.expires_at < current
        ]:
            if old != key:
                del self._questions[old]
        while len(self._questions) > MAX_OPEN_QUESTIONS:
            self._questions.popitem(last=False)

    def _keyboard(self, message: OutboundMessage) -> InlineKeyboardMarkup:
        from telegram import InlineKeyboardButton, InlineKeyboardMarkup

        key = self._callback_key(message)
        self._remember(
            key, _Question(message.question_id, list(message.buttons), message.expires_at)
        )
        rows = [
            [InlineKeyboardButton(label, callback_data=f"{key}:{index}")]
            for index, label in enumerate(message.buttons)
        ]
        return InlineKeyboardMarkup(rows)

    # -- sending ---------------------------------------------------------------

    async def send(self, message: OutboundMessage) -> str:
        """Send ``message``; the Telegram message id (of its last piece).

        A text longer than Telegram's limit goes out as several messages; a
        question's keyboard rides on the last one, under the full text.
        """
        from telegram.error import TelegramError

        dest = message.destination
        if self._closed:
            raise ConnectorError(f"telegram: cannot send to chat {dest}: the connector is closed")
        chat_id = _chat_id(dest)
        if not self._allows(chat_id):
            raise ConnectorError(f"telegram: chat {dest} is not in allowed_chats")
        pieces = [p for p in split_text(message.text) if p.strip()]
        if not pieces:
            raise ConnectorError(f"telegram: cannot send an empty message to chat {dest}")
        markup = self._keyboard(message) if message.buttons else None
        sent_id = ""
        try:
            await self._ensure_ready()
            for index, piece in enumerate(pieces):
                last = index == len(pieces) - 1
                sent = await self._bot.send_message(
                    chat_id, piece, reply_markup=markup if last else None
                )
                sent_id = str(sent.message_id)
        except (TelegramError, OSError, TimeoutError) as exc:
            # ``from None``: the cause's text may carry the token.
            raise ConnectorError(
                f"telegram: could not send to chat {dest}: {self._clean(exc)}"
            ) from None
        return sent_id

    # -- receiving -------------------------------------------------------------

    async def receive(self) -> AsyncIterator[InboundMessage]:
        """Long-poll for updates until :meth:`aclose`; failures are retried.

        The offset advances past each update before it is handed out, so an
        update is never delivered twice, even across ``receive()`` calls.
        """
        if self._receiving:
            raise RuntimeError("telegram: receive() is already running")
        self._receiving = True
        delay = self.retry_initial
        try:
            while not self._stop.is_set():
                try:
                    updates = await self._poll()
                except _Stopped:
                    return
                except Exception as exc:  # a poll failure must not end receiving
                    log.warning(
                        "telegram: polling failed (%s: %s); retrying in %.1fs",
                        type(exc).__name__,
                        self._clean(exc),
                        delay,
                    )
                    if await self._sleep(delay):
                        return
                    delay = min(delay * 2, self.retry_max)
                    continue
                delay = self.retry_initial
                for update in updates:
                    self._offset = max(self._offset, update.update_id + 1)
                    inbound = await self._inbound(update)
                    if inbound is not None:
                        yield inbound
                    if self._stop.is_set():
                        return
        finally:
            self._receiving = False

    async def _sleep(self, seconds: float) -> bool:
        """Wait ``seconds``, or less if the connector closes; True when it did."""
        with suppress(TimeoutError):
            await asyncio.wait_for(self._stop.wait(), seconds)
        return self._stop.is_set()

    async def _get_updates(self) -> tuple[Update, ...]:
        await self._ensure_ready()
        return await self._bot.get_updates(
            offset=self._offset or None,
            timeout=max(1, math.ceil(self.config.poll_timeout)),
            allowed_updates=_ALLOWED_UPDATES,
        )

    async def _poll(self) -> tuple[Update, ...]:
        """One long poll, run as a task so :meth:`aclose` can cancel it."""
        poll = asyncio.ensure_future(self._get_updates())
        stopper = asyncio.ensure_future(self._stop.wait())
        self._poll_task = poll
        try:
            await asyncio.wait({poll, stopper}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            stopper.cancel()
            if not poll.done():
                poll.cancel()
                await asyncio.wait({poll})
            self._poll_task = None
        if self._stop.is_set() or poll.cancelled():
            if not poll.cancelled():
                poll.exception()  # retrieved, so asyncio does not warn
            raise _Stopped
        return poll.result()

    def _admit(self, chat_id: int) -> bool:
        if self._allows(chat_id):
            return True
        if chat_id not in self._ignored_chats:
            self._ignored_chats.add(chat_id)
            log.info("telegram: ignoring chat %s (not in allowed_chats)", chat_id)
        return False

    async def _inbound(self, update: Update) -> InboundMessage | None:
        if update.callback_query is not None:
            return await self._button_press(update.callback_query)
        message = update.message
        if message is None:
            return None
        if not self._admit(message.chat.id):
            return None
        text = message.text or message.caption
        if not text:
            log.debug("telegram: skipping a message without text in chat %s", message.chat.id)
            return None
        user = message.from_user
        sender = (user.username or user.first_name) if user else None
        return InboundMessage(
            connector=self.id,
            destination=str(message.chat.id),
            text=text,
            sender=sender or "user",
            persona=self.persona,
        )

    def _resolve(self, query: CallbackQuery) -> tuple[str | None, str] | None:
        """The question id and the label a press stands for, if known.

        The connector's memory comes first; after a restart the label is
        read back from the keyboard on the message the button was on.
        """
        from telegram import Message

        data = query.data or ""
        key, sep, index = data.rpartition(":")
        question = self._questions.get(key) if sep else None
        if question is not None and index.isdigit() and int(index) < len(question.labels):
            return question.question_id, question.labels[int(index)]
        message = query.message
        if isinstance(message, Message) and message.reply_markup is not None:
            for row in message.reply_markup.inline_keyboard:
                for button in row:
                    if button.callback_data == data and sep and not key.startswith(_ALIAS):
                        return key, button.text
        return None

    async def _answer(self, query: CallbackQuery, text: str | None = None) -> None:
        """Stop the button's spinner; a failure here loses nothing."""
        try:
            await self._bot.answer_callback_query(query.id, text=text)
        except Exception as exc:
            log.warning("telegram: answering a button press failed: %s", self._clean(exc))

    async def _button_press(self, query: CallbackQuery) -> InboundMessage | None:
        if query.message is None:
            # A button on an inline-mode message: no chat to answer in.
            await self._answer(query)
            return None
        chat_id = query.message.chat.id
        if not self._admit(chat_id):
            return None
        user = query.from_user
        key, _, index = (query.data or "").rpartition(":")
        if key.startswith("apr_") and index.isdigit() and int(index) < len(APPROVAL_BUTTONS):
            # An approval's button: its id and the answer are in the data
            # itself, so a press works after a restart of the connector too.
            await self._answer(query, APPROVAL_BUTTONS[int(index)][0])
            return InboundMessage(
                connector=self.id,
                destination=str(chat_id),
                text=APPROVAL_BUTTONS[int(index)][0],
                sender=user.username or user.first_name or "user",
                approval=key,
                decision=APPROVAL_BUTTONS[int(index)][1],
                persona=self.persona,
            )
        resolved = self._resolve(query)
        if resolved is None:
            await self._answer(query, "This question is no longer open.")
            return None
        await self._answer(query)
        question_id, label = resolved
        return InboundMessage(
            connector=self.id,
            destination=str(chat_id),
            text=label,
            sender=user.username or user.first_name or "user",
            answer_to=question_id,
            persona=self.persona,
        )

    # -- closing ---------------------------------------------------------------

    async def aclose(self) -> None:
        """Stop receiving (cancelling a pending long poll) and shut the Bot down."""
        if self._closed:
            return
        self._closed = True
        self._stop.set()
        task = self._poll_task
        if task is not None and not task.done():
            task.cancel()
            await asyncio.wait({task})
        try:
            await self._bot.shutdown()
        except Exception as exc:
            log.warning("telegram: shutting the bot down failed: %s", self._clean(exc))
        finally:
            _unregister_token(self._token)


class _Stopped(Exception):
    """The connector closed while a poll was pending."""


def telegram_from_env(
    settings: TelegramSettings, environ: Mapping[str, str]
) -> TelegramConnector | None:
    """The connector, or None when ``settings.token_env`` is unset or empty."""
    token = (environ.get(settings.token_env) or "").strip()
    if not token:
        return None
    return TelegramConnector(settings, token=token)


__all__ = [
    "MAX_MESSAGE_LEN",
    "TelegramConnector",
    "split_text",
    "telegram_from_env",
]
