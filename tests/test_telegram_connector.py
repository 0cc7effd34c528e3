"""The Telegram connector against a local stand-in Bot API server.

The real python-telegram-bot client talks HTTP to
:class:`~tests.fakes.telegram_server.TelegramStandIn`, so these tests
check the wire: token in the path, parameters PTB encodes, replies it parses.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest

from coterie.runtime.config import TelegramSettings
from coterie.runtime.connectors.base import Connector, InboundMessage, OutboundMessage
from coterie.runtime.connectors.telegram import (
    MAX_MESSAGE_LEN,
    TelegramConnector,
    split_text,
    telegram_from_env,
)
from coterie.runtime.errors import ConnectorError
from tests.fakes.telegram_server import TelegramStandIn

TOKEN = "424242:AAE-stand-in-s3cret-token-value"
SECRET = TOKEN.split(":", 1)[1]

Factory = Callable[..., TelegramConnector]


@pytest.fixture
async def tg() -> AsyncIterator[TelegramStandIn]:
    async with TelegramStandIn(TOKEN) as server:
        yield server


@pytest.fixture
async def make(tg: TelegramStandIn) -> AsyncIterator[Factory]:
    """Builds connectors on the stand-in; closes them all afterwards."""
    made: list[TelegramConnector] = []

    def build(token: str = TOKEN, **settings: Any) -> TelegramConnector:
        settings.setdefault("persona", "ada")
        settings.setdefault("poll_timeout", 5)
        settings.setdefault("api_base", tg.api_base)
        connector = TelegramConnector(TelegramSettings(**settings), token=token)
        connector.retry_initial = 0.01
        connector.retry_max = 0.05
        made.append(connector)
        return connector

    yield build
    for connector in made:
        await connector.aclose()


def out(text: str, destination: str = "42", **fields: Any) -> OutboundMessage:
    return OutboundMessage(
        connector="telegram",
        destination=destination,
        text=text,
        persona="ada",
        conversation_id="conv_1",
        **fields,
    )


async def next_message(
    stream: AsyncIterator[InboundMessage], timeout: float = 10
) -> InboundMessage:
    return await asyncio.wait_for(anext(stream), timeout)


def assert_no_token(text: str) -> None:
    # Case-insensitive: PTB lowercases some error descriptions.
    assert TOKEN.lower() not in text.lower()
    assert SECRET.lower() not in text.lower()


# -- sending ------------------------------------------------------------------


async def test_send_text(tg: TelegramStandIn, make: Factory) -> None:
    connector = make()
    assert isinstance(connector, Connector)
    assert connector.id == "telegram"
    assert connector.capabilities == {"text", "buttons"}

    message_id = await connector.send(out("hello there"))

    [sent] = await tg.wait_sent(1)
    assert sent["chat_id"] == 42
    assert sent["text"] == "hello there"
    assert sent["reply_markup"] is None
    assert message_id == str(sent["message_id"])
    # initialize() checked the token with getMe before the first send.
    assert [m for m, _ in tg.requests] == ["getMe", "sendMessage"]


async def test_send_question_makes_an_inline_keyboard(tg: TelegramStandIn, make: Factory) -> None:
    connector = make()
    await connector.send(out("Deploy now?", question_id="q_7", buttons=["Yes", "No", "Later"]))

    [sent] = await tg.wait_sent(1)
    rows = sent["reply_markup"]["inline_keyboard"]
    assert [[b["text"] for b in row] for row in rows] == [["Yes"], ["No"], ["Later"]]
    assert [row[0]["callback_data"] for row in rows] == ["q_7:0", "q_7:1", "q_7:2"]


async def test_a_long_question_id_still_fits_callback_data(
    tg: TelegramStandIn, make: Factory
) -> None:
    connector = make()
    stream = connector.receive()
    long_id = "q_" + "x" * 80
    await connector.send(out("Pick", question_id=long_id, buttons=["A", "B"]))
    [sent] = await tg.wait_sent(1)
    for row in sent["reply_markup"]["inline_keyboard"]:
        assert len(row[0]["callback_data"].encode()) <= 64

    tg.press(sent, "B")
    pressed = await next_message(stream)
    assert (pressed.text, pressed.answer_to) == ("B", long_id)


async def test_long_text_is_split_in_two(tg: TelegramStandIn, make: Factory) -> None:
    connector = make()
    text = ("word " * 1000).strip()  # 4999 characters
    assert len(text) > MAX_MESSAGE_LEN

    message_id = await connector.send(out(text, question_id="q_1", buttons=["ok"]))

    first, second = await tg.wait_sent(2)
    assert len(tg.sent) == 2
    assert first["text"] + second["text"] == text
    assert all(len(m["text"]) <= MAX_MESSAGE_LEN for m in tg.sent)
    assert first["text"].endswith(" ")  # broken between words
    # The keyboard rides on the last piece, whose id is returned.
    assert first["reply_markup"] is None
    assert second["reply_markup"] is not None
    assert message_id == str(second["message_id"])


async def test_exactly_five_thousand_chars_without_spaces(
    tg: TelegramStandIn, make: Factory
) -> None:
    connector = make()
    await connector.send(out("x" * 5000))
    first, second = await tg.wait_sent(2)
    assert (len(first["text"]), len(second["text"])) == (4096, 904)


def test_split_text_counts_utf16_units() -> None:
    # An emoji is two UTF-16 units: 4096 units hold 2048 of them.
    pieces = split_text("😀" * 2049)
    assert [len(p) for p in pieces] == [2048, 1]
    assert split_text("short") == ["short"]
    assert split_text("") == []
    lines = "a" * 3000 + "\n" + "b" * 3000
    assert split_text(lines) == ["a" * 3000 + "\n", "b" * 3000]


async def test_server_error_on_send_is_a_connector_error_without_the_token(
    tg: TelegramStandIn, make: Factory
) -> None:
    connector = make()
    # A description that echoes the token, as a URL in an error would.
    tg.fail("sendMessage", 400, f"Bad Request: chat not found (/bot{TOKEN}/sendMessage)")

    with pytest.raises(ConnectorError) as err:
        await connector.send(out("hi", destination="-100777"))

    message = str(err.value)
    assert "-100777" in message
    assert "chat not found" in message.lower()
    assert_no_token(message)
    assert err.value.__cause__ is None  # the raw PTB error is not chained


async def test_wrong_token_fails_send_without_leaking_it(
    tg: TelegramStandIn, make: Factory
) -> None:
    wrong = "999:WRONG-token-nobody-should-see"
    connector = make(token=wrong)

    with pytest.raises(ConnectorError) as err:
        await connector.send(out("hi"))

    message = str(err.value)
    assert "42" in message
    assert "rejected" in message
    assert "wrong-token-nobody-should-see" not in message.lower()
    assert tg.sent == []


async def test_unreachable_server_is_a_connector_error(make: Factory) -> None:
    connector = make(api_base="http://127.0.0.1:9")
    with pytest.raises(ConnectorError) as err:
        await connector.send(out("hi"))
    assert "chat 42" in str(err.value)
    assert_no_token(str(err.value))


async def test_empty_text_is_refused(make: Factory) -> None:
    with pytest.raises(ConnectorError, match="empty"):
        await make().send(out("   "))


async def test_send_after_aclose_fails(make: Factory) -> None:
    connector = make()
    await connector.aclose()
    with pytest.raises(ConnectorError, match="closed"):
        await connector.send(out("hi"))


# -- receiving ----------------------------------------------------------------


async def test_receive_text_message(tg: TelegramStandIn, make: Factory) -> None:
    connector = make()
    tg.push_text(42, "hi ada", username="grace")
    tg.push_text(43, "no username here", username=None, first_name="Linus")

    stream = connector.receive()
    first = await next_message(stream)
    second = await next_message(stream)

    assert first == InboundMessage(
        connector="telegram", destination="42", text="hi ada", sender="grace", persona="ada"
    )
    assert (second.destination, second.sender) == ("43", "Linus")
    params = next(p for m, p in tg.requests if m == "getUpdates")
    assert params["allowed_updates"] == ["message", "callback_query"]
    assert params["timeout"] == 5


async def test_button_press_answers_the_question(tg: TelegramStandIn, make: Factory) -> None:
    connector = make()
    stream = connector.receive()
    await connector.send(out("Deploy now?", question_id="q_9", buttons=["Yes", "No"]))
    [sent] = await tg.wait_sent(1)

    tg.press(sent, "No", username="grace")
    pressed = await next_message(stream)

    assert pressed.text == "No"
    assert pressed.answer_to == "q_9"
    assert pressed.destination == "42"
    assert pressed.sender == "grace"
    [answer] = await tg.wait_answered(1)
    assert answer["callback_query_id"]


async def test_button_press_after_a_restart_reads_the_keyboard(
    tg: TelegramStandIn, make: Factory
) -> None:
    await make().send(out("Deploy now?", question_id="q_5", buttons=["Yes", "No"]))
    [sent] = await tg.wait_sent(1)
    tg.press(sent, "Yes")

    # A fresh connector has no memory of the question.
    pressed = await next_message(make().receive())
    assert (pressed.text, pressed.answer_to) == ("Yes", "q_5")
    await tg.wait_answered(1)


async def test_unknown_button_is_answered_but_not_delivered(
    tg: TelegramStandIn, make: Factory
) -> None:
    connector = make()
    tg.press_button(42, 999, "q_gone:0")  # no such message, no such question
    tg.push_text(42, "after")
    stream = connector.receive()
    assert (await next_message(stream)).text == "after"
    [answer] = tg.answered
    assert "no longer open" in answer["text"]


async def test_offset_advances_so_no_update_comes_twice(tg: TelegramStandIn, make: Factory) -> None:
    connector = make()
    stream = connector.receive()
    first_id = tg.push_text(42, "one")
    assert (await next_message(stream)).text == "one"

    tg.push_text(42, "two")
    assert (await next_message(stream)).text == "two"

    offsets = [params.get("offset") for method, params in tg.requests if method == "getUpdates"]
    assert offsets[0] is None
    assert first_id + 1 in offsets
    assert tg.delivered.count(first_id) == 1

    # A second receive() resumes after what the first handed out, though
    # the server has not seen that offset yet.
    await stream.aclose()  # type: ignore[attr-defined]
    tg.push_text(42, "three")
    assert (await next_message(connector.receive())).text == "three"


async def test_allowed_chats_filters_and_logs_once(
    tg: TelegramStandIn, make: Factory, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="coterie.connectors.telegram")
    connector = make(allowed_chats=[42])
    tg.push_text(7, "stranger 1")
    tg.push_text(7, "stranger 2")
    tg.push_text(42, "friend")

    got = await next_message(connector.receive())

    assert (got.destination, got.text) == ("42", "friend")
    ignored = [r for r in caplog.records if "ignoring chat 7" in r.getMessage()]
    assert len(ignored) == 1
    with pytest.raises(ConnectorError, match="allowed_chats"):
        await connector.send(out("hi", destination="7"))


async def test_polling_errors_are_retried_and_scrubbed(
    tg: TelegramStandIn, make: Factory, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    connector = make()
    tg.fail("getUpdates", 502, f"Bad Gateway at /bot{TOKEN}/getUpdates", times=2)
    tg.push_text(42, "made it")

    got = await next_message(connector.receive())

    assert got.text == "made it"
    failures = [r for r in caplog.records if "polling failed" in r.getMessage()]
    assert len(failures) == 2
    # No log line of any logger (ours, PTB's, httpx's) carries the token.
    assert any("<redacted>" in r.getMessage() for r in caplog.records)
    for record in caplog.records:
        assert_no_token(record.getMessage())
    assert_no_token(caplog.text)


async def test_wrong_token_while_polling_is_logged_not_raised(
    tg: TelegramStandIn, make: Factory, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="coterie.connectors.telegram")
    wrong = "999:WRONG-token-nobody-should-see"
    connector = make(token=wrong)
    received: list[InboundMessage] = []

    async def consume() -> None:
        async for message in connector.receive():
            received.append(message)

    task = asyncio.create_task(consume())
    for _ in range(500):
        if sum("polling failed" in r.getMessage() for r in caplog.records) >= 2:
            break
        await asyncio.sleep(0.01)
    assert not task.done()
    await connector.aclose()
    await asyncio.wait_for(task, 10)  # ended, without raising
    assert received == []
    assert "rejected" in caplog.text
    assert "wrong-token-nobody-should-see" not in caplog.text.lower()


async def test_aclose_ends_receive(tg: TelegramStandIn, make: Factory) -> None:
    # A long poll far longer than the test's patience: aclose must cancel it.
    connector = make(poll_timeout=60)
    received: list[InboundMessage] = []

    async def consume() -> None:
        async for message in connector.receive():
            received.append(message)

    task = asyncio.create_task(consume())
    await tg.wait_polling()
    await connector.aclose()
    await asyncio.wait_for(task, 10)  # the iterator ended
    assert received == []


# -- configuration ------------------------------------------------------------


async def test_telegram_from_env(tg: TelegramStandIn) -> None:
    settings = TelegramSettings(persona="ada", api_base=tg.api_base, token_env="MY_BOT_TOKEN")
    assert telegram_from_env(settings, {}) is None
    assert telegram_from_env(settings, {"MY_BOT_TOKEN": "  "}) is None
    assert telegram_from_env(settings, {"TELEGRAM_BOT_TOKEN": TOKEN}) is None

    connector = telegram_from_env(settings, {"MY_BOT_TOKEN": TOKEN})
    assert connector is not None
    try:
        await connector.send(out("hi"))
        assert len(tg.sent) == 1
    finally:
        await connector.aclose()


def test_settings_need_a_persona_and_forbid_extras() -> None:
    with pytest.raises(ValueError):
        TelegramSettings.model_validate({})
    with pytest.raises(ValueError):
        TelegramSettings.model_validate({"persona": "ada", "token": TOKEN})
    settings = TelegramSettings(persona="ada")
    assert settings.token_env == "TELEGRAM_BOT_TOKEN"
    assert settings.allowed_chats == []
