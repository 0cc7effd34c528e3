"""A local stand-in for the Telegram Bot API, enough for python-telegram-bot.

The connector tests run the real PTB client against it, so what is checked
is the wire: the URL with the token, the form-encoded parameters, the JSON
replies PTB parses. Tests push updates in (:meth:`TelegramStandIn.push_text`,
:meth:`TelegramStandIn.press_button`) and read what the bot sent
(:attr:`TelegramStandIn.sent`)::

    async with TelegramStandIn() as tg:
        connector = TelegramConnector(
            TelegramSettings(persona="p", api_base=tg.api_base), token=tg.token
        )
        tg.push_text(42, "hello")

Like the real server it refuses a wrong token (401), a text over 4096 units
and a ``callback_data`` over 64 bytes (400), and it forgets updates once a
``getUpdates`` offset has passed them.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import time
from collections import deque
from collections.abc import Callable
from contextlib import suppress
from dataclasses import dataclass
from typing import Any

from aiohttp import web

from tests.fakes._http import LocalHttpServer

__all__ = ["TelegramStandIn"]

DEFAULT_TOKEN = "123456:stand-in-SECRET-token"

# How form values (all strings on the wire) are decoded, by parameter name.
_INT_PARAMS = {"chat_id", "offset", "limit", "message_id", "cache_time", "message_thread_id"}
_FLOAT_PARAMS = {"timeout"}
_JSON_PARAMS = {"reply_markup", "allowed_updates", "entities", "link_preview_options"}
_BOOL_PARAMS = {"show_alert", "disable_notification", "protect_content"}

#: The longest long poll the stand-in honours, so a stray client cannot stall shutdown.
MAX_POLL_SECONDS = 60.0


@dataclass
class _Failure:
    status: int
    description: str
    remaining: int


def _decode(name: str, value: Any) -> Any:
    """A parameter as Telegram reads it, from form text or JSON."""
    if not isinstance(value, str):
        return value
    if name in _JSON_PARAMS:
        return json.loads(value)
    if name in _INT_PARAMS:
        try:
            return int(value)
        except ValueError:
            return value  # "@channelname"
    if name in _FLOAT_PARAMS:
        return float(value)
    if name in _BOOL_PARAMS:
        return value.lower() == "true"
    return value


def _utf16_len(text: str) -> int:
    return len(text.encode("utf-16-le")) // 2


class TelegramStandIn(LocalHttpServer):
    """The Bot API methods the connector uses, on 127.0.0.1.

    ``requests`` records every call as ``(method, params)``; ``sent`` the
    ``sendMessage`` calls (``chat_id``, ``text``, decoded ``reply_markup``);
    ``answered`` the ``answerCallbackQuery`` calls.
    """

    def __init__(self, token: str = DEFAULT_TOKEN, *, bot_username: str = "coterie_test_bot"):
        super().__init__()
        self.token = token
        self.bot_user: dict[str, Any] = {
            "id": int(token.split(":", 1)[0]) if token.split(":", 1)[0].isdigit() else 1,
            "is_bot": True,
            "first_name": "Coterie Test",
            "username": bot_username,
            "can_join_groups": True,
            "can_read_all_group_messages": False,
            "supports_inline_queries": False,
        }
        self.requests: list[tuple[str, dict[str, Any]]] = []
        self.sent: list[dict[str, Any]] = []
        self.answered: list[dict[str, Any]] = []
        #: Every update id each ``getUpdates`` returned, in order.
        self.delivered: list[int] = []
        #: ``getUpdates`` calls waiting right now.
        self.polling = 0
        self._updates: deque[dict[str, Any]] = deque()
        self._update_ids = itertools.count(1)
        self._message_ids = itertools.count(1)
        self._callback_ids = itertools.count(1)
        self._messages: dict[tuple[int | str, int], dict[str, Any]] = {}
        self._failures: dict[str, deque[_Failure]] = {}
        self._changed = asyncio.Event()

    # -- lifecycle ---------------------------------------------------------

    def _add_routes(self, app: web.Application) -> None:
        app.router.add_route("*", "/bot{token}/{method}", self._handle)

    @property
    def api_base(self) -> str:
        """The ``api_base`` for :class:`~coterie.runtime.config.TelegramSettings`."""
        return self.root_url

    def _notify(self) -> None:
        """Wake the long polls and the ``wait_*`` helpers; callable from sync code."""
        changed, self._changed = self._changed, asyncio.Event()
        changed.set()

    async def _until(self, ready: Callable[[], bool], timeout: float) -> bool:
        """Wait until ``ready()`` holds or ``timeout`` passes; whether it holds."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while not ready():
            remaining = deadline - loop.time()
            if remaining <= 0:
                return False
            with suppress(TimeoutError):
                await asyncio.wait_for(self._changed.wait(), remaining)
        return True

    # -- scripting ---------------------------------------------------------

    def fail(
        self, method: str, status: int = 400, description: str = "Bad Request", *, times: int = 1
    ) -> None:
        """Answer the next ``times`` calls of ``method`` with an error."""
        self._failures.setdefault(method, deque()).append(_Failure(status, description, times))

    def _user(self, chat_id: int, username: str | None, first_name: str) -> dict[str, Any]:
        user: dict[str, Any] = {"id": chat_id, "is_bot": False, "first_name": first_name}
        if username is not None:
            user["username"] = username
        return user

    def _enqueue(self, update: dict[str, Any]) -> int:
        update_id = next(self._update_ids)
        self._updates.append({"update_id": update_id, **update})
        self._notify()
        return update_id

    def push_text(
        self,
        chat_id: int,
        text: str,
        *,
        username: str | None = "alice",
        first_name: str = "Alice",
    ) -> int:
        """Queue a text message from a person in a private chat; its update id."""
        message = {
            "message_id": next(self._message_ids),
            "date": int(time.time()),
            "chat": {"id": chat_id, "type": "private", "first_name": first_name},
            "from": self._user(chat_id, username, first_name),
            "text": text,
        }
        return self._enqueue({"message": message})

    def press_button(
        self,
        chat_id: int,
        message_id: int,
        callback_data: str,
        *,
        username: str | None = "alice",
        first_name: str = "Alice",
    ) -> int:
        """Queue a press of an inline button on a message the bot sent; its update id."""
        query: dict[str, Any] = {
            "id": str(next(self._callback_ids)),
            "from": self._user(chat_id, username, first_name),
            "chat_instance": f"ci-{chat_id}",
            "data": callback_data,
        }
        # An unknown message comes as Telegram sends one too old to show:
        # inaccessible (date 0), with its chat but no text or keyboard.
        query["message"] = self._messages.get((chat_id, message_id)) or {
            "chat": {"id": chat_id, "type": "private"},
            "message_id": message_id,
            "date": 0,
        }
        return self._enqueue({"callback_query": query})

    def press(self, sent: dict[str, Any], label: str, **user: Any) -> int:
        """Press the button labelled ``label`` on a message in :attr:`sent`."""
        for row in sent["reply_markup"]["inline_keyboard"]:
            for button in row:
                if button["text"] == label:
                    return self.press_button(
                        sent["chat_id"], sent["message_id"], button["callback_data"], **user
                    )
        raise KeyError(f"no button {label!r} on message {sent['message_id']}")

    # -- waiting -----------------------------------------------------------

    async def _wait(self, ready: Callable[[], bool], timeout: float, what: str) -> None:
        if not await self._until(ready, timeout):
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")

    async def wait_sent(self, n: int, timeout: float = 5.0) -> list[dict[str, Any]]:
        """The ``sent`` list once it holds at least ``n`` messages."""
        await self._wait(lambda: len(self.sent) >= n, timeout, f"{n} sent message(s)")
        return self.sent

    async def wait_answered(self, n: int, timeout: float = 5.0) -> list[dict[str, Any]]:
        """The ``answered`` list once it holds at least ``n`` callback answers."""
        await self._wait(lambda: len(self.answered) >= n, timeout, f"{n} callback answer(s)")
        return self.answered

    async def wait_polling(self, timeout: float = 5.0) -> None:
        """Until a ``getUpdates`` long poll is waiting on the server."""
        await self._wait(lambda: self.polling > 0, timeout, "a pending getUpdates")

    # -- the API -----------------------------------------------------------

    @staticmethod
    def _ok(result: Any) -> web.Response:
        return web.json_response({"ok": True, "result": result})

    @staticmethod
    def _error(status: int, description: str) -> web.Response:
        body = {"ok": False, "error_code": status, "description": description}
        return web.json_response(body, status=status)

    async def _params(self, request: web.Request) -> dict[str, Any]:
        raw: dict[str, Any] = {}
        if request.content_type == "application/json":
            body = await request.json()
            raw.update(body if isinstance(body, dict) else {})
        elif request.can_read_body:
            form = await request.post()
            raw.update({k: v for k, v in form.items() if isinstance(v, str)})
        raw.update(request.query)
        return {name: _decode(name, value) for name, value in raw.items()}

    async def _handle(self, request: web.Request) -> web.Response:
        if request.match_info["token"] != self.token:
            return self._error(401, "Unauthorized")
        method = request.match_info["method"]
        try:
            params = await self._params(request)
        except (ValueError, json.JSONDecodeError) as exc:
            return self._error(400, f"Bad Request: can't parse parameters: {exc}")
        self.requests.append((method, params))
        failures = self._failures.get(method)
        if failures:
            failure = failures[0]
            failure.remaining -= 1
            if failure.remaining <= 0:
                failures.popleft()
            return self._error(failure.status, failure.description)
        handler = getattr(self, f"_api_{method.lower()}", None)
        if handler is None:
            return self._error(404, "Not Found")
        response: web.Response = await handler(params)
        return response

    async def _api_getme(self, params: dict[str, Any]) -> web.Response:
        return self._ok(self.bot_user)

    async def _api_getupdates(self, params: dict[str, Any]) -> web.Response:
        offset = params.get("offset")
        if isinstance(offset, int) and offset > 0:
            # Like Telegram: an offset confirms every update before it.
            while self._updates and self._updates[0]["update_id"] < offset:
                self._updates.popleft()
        timeout = min(float(params.get("timeout") or 0), MAX_POLL_SECONDS)
        if not self._updates and timeout > 0:
            self.polling += 1
            self._notify()
            try:
                await self._until(lambda: bool(self._updates), timeout)
            finally:
                self.polling -= 1
        limit = int(params.get("limit") or 100)
        batch = list(itertools.islice(self._updates, limit))
        self.delivered.extend(u["update_id"] for u in batch)
        return self._ok(batch)

    async def _api_sendmessage(self, params: dict[str, Any]) -> web.Response:
        chat_id = params.get("chat_id")
        text = params.get("text")
        if not isinstance(chat_id, int):
            return self._error(400, "Bad Request: chat not found")
        if not isinstance(text, str) or not text.strip():
            return self._error(400, "Bad Request: message text is empty")
        if _utf16_len(text) > 4096:
            return self._error(400, "Bad Request: message is too long")
        markup = params.get("reply_markup")
        if markup is not None:
            for row in markup.get("inline_keyboard", []):
                for button in row:
                    data = button.get("callback_data")
                    if data is not None and len(str(data).encode()) > 64:
                        return self._error(400, "Bad Request: BUTTON_DATA_INVALID")
        message: dict[str, Any] = {
            "message_id": next(self._message_ids),
            "date": int(time.time()),
            "chat": {"id": chat_id, "type": "private" if chat_id > 0 else "group"},
            "from": self.bot_user,
            "text": text,
        }
        if markup is not None:
            message["reply_markup"] = markup
        self._messages[(chat_id, message["message_id"])] = message
        self.sent.append(
            {
                "chat_id": chat_id,
                "message_id": message["message_id"],
                "text": text,
                "reply_markup": markup,
                "params": params,
            }
        )
        self._notify()
        return self._ok(message)

    async def _api_answercallbackquery(self, params: dict[str, Any]) -> web.Response:
        if "callback_query_id" not in params:
            return self._error(400, "Bad Request: query is too old or query ID is invalid")
        self.answered.append(params)
        self._notify()
        return self._ok(True)
