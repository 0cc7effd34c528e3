"""Telegram end to end: ``coterie serve`` runs the connector (python-telegram-bot
against a local stand-in Bot API server); a person's message reaches the
persona on that chat's conversation and the reply goes back; ``ask_user``
shows its choices as buttons and a press answers it; ``send_message``
reaches a chat; without the token the connector stays off."""

from __future__ import annotations

import asyncio
import os
import threading
from collections.abc import Coroutine, Iterator
from pathlib import Path
from typing import Any, TypeVar

import pytest
import yaml

from coterie.runtime.serve.client import ServerClient
from coterie.runtime.serve.discovery import ServerState
from tests.fakes.telegram_server import TelegramStandIn
from tests.helpers import scripted, write_persona
from tests.serving import running_server

pytestmark = [pytest.mark.ray, pytest.mark.usefixtures("ray_session")]

T = TypeVar("T")
CHAT = 4242


class StandInThread:
    """The stand-in server on its own loop; its calls made from the test."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.server = TelegramStandIn()
        self.run(self.server.start())

    def run(self, coro: Coroutine[Any, Any, T], timeout: float = 60) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def call(self, fn: Any, *args: Any, **kw: Any) -> Any:
        async def inside() -> Any:
            return fn(*args, **kw)

        return self.run(inside())

    def close(self) -> None:
        self.run(self.server.stop())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)


def write_home(home: Path, api_base: str) -> None:
    write_persona(
        home,
        "concierge",
        scripted(
            [
                {
                    "when": {"contains": "write note", "tool_result": False},
                    "tool_calls": [
                        {"name": "file_write", "arguments": {"path": "../note.md", "content": "n"}}
                    ],
                },
                {
                    "when": {"contains": "write note", "tool_result": True},
                    "text": "wrote: {last_tool_result}",
                },
                {
                    "when": {"contains": "trip"},
                    "tool_calls": [
                        {
                            "name": "ask_user",
                            "arguments": {"question": "Which city?", "buttons": ["Paris", "Oslo"]},
                        }
                    ],
                },
                {
                    "when": {"contains": "tell bob", "turn": 1},
                    "tool_calls": [
                        {
                            "name": "send_message",
                            "arguments": {
                                "connector": "telegram",
                                "destination": "777",
                                "text": "a note for bob",
                            },
                        }
                    ],
                },
                {"when": {"turn": 1}, "text": "you said: {input}"},
                {"when": {"turn": 2}, "text": "sent"},
            ],
            description="answers on Telegram",
            access="full",
            permissions={
                "rules": [{"tool": "file_write", "match": "!{workspace}", "action": "ask"}]
            },
        ),
    )
    (home / "runtime.yaml").write_text(
        yaml.safe_dump(
            {
                "connectors": {
                    "telegram": {"api_base": api_base, "persona": "concierge", "poll_timeout": 1}
                }
            }
        )
    )


@pytest.fixture(scope="module")
def stand_in() -> Iterator[StandInThread]:
    s = StandInThread()
    yield s
    s.close()


@pytest.fixture(scope="module")
def server(
    stand_in: StandInThread, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ServerState]:
    home = tmp_path_factory.mktemp("telegram-home")
    write_home(home, stand_in.server.api_base)
    os.environ["TELEGRAM_BOT_TOKEN"] = stand_in.server.token
    try:
        with running_server(home) as state:
            yield state
    finally:
        os.environ.pop("TELEGRAM_BOT_TOKEN", None)


def test_a_message_is_answered_in_its_chat(server: ServerState, stand_in: StandInThread) -> None:
    before = len(stand_in.server.sent)
    stand_in.call(stand_in.server.push_text, CHAT, "hello bot")
    sent = stand_in.run(stand_in.server.wait_sent(before + 1, timeout=60))[before]
    assert sent["chat_id"] == CHAT and sent["text"] == "you said: hello bot"
    # The chat has its own conversation, kept by the persona.
    history = ServerClient(server).get(
        f"/v1/personas/concierge/conversations/concierge:telegram:{CHAT}"
    )
    assert [m["text"] for m in history["messages"] if m["kind"] == "user"] == ["hello bot"]


def test_a_question_has_buttons_and_a_press_answers_it(
    server: ServerState, stand_in: StandInThread
) -> None:
    before = len(stand_in.server.sent)
    stand_in.call(stand_in.server.push_text, CHAT, "plan a trip")
    question = stand_in.run(stand_in.server.wait_sent(before + 1, timeout=60))[before]
    assert question["text"] == "Which city?"
    labels = [b["text"] for row in question["reply_markup"]["inline_keyboard"] for b in row]
    assert labels == ["Paris", "Oslo"]
    answered = len(stand_in.server.answered)
    stand_in.call(stand_in.server.press, question, "Oslo")
    reply = stand_in.run(stand_in.server.wait_sent(before + 2, timeout=60))[before + 1]
    assert reply["text"] == 'you said: [answer to your question "Which city?"] Oslo'
    stand_in.run(stand_in.server.wait_answered(answered + 1, timeout=30))


def test_an_approval_has_buttons_and_a_press_answers_it(
    server: ServerState, stand_in: StandInThread
) -> None:
    note = server_home(server) / "personas" / "concierge" / "note.md"
    before = len(stand_in.server.sent)
    stand_in.call(stand_in.server.push_text, CHAT, "write note please")
    asked = stand_in.run(stand_in.server.wait_sent(before + 1, timeout=60))[before]
    assert asked["chat_id"] == CHAT
    assert (
        asked["text"].startswith("file_write needs your approval:") and str(note) in asked["text"]
    )
    labels = [b["text"] for row in asked["reply_markup"]["inline_keyboard"] for b in row]
    assert labels == ["Approve", "Deny", "Always allow"]
    assert not note.exists()
    stand_in.call(stand_in.server.press, asked, "Approve", username="carol")
    sent = stand_in.run(stand_in.server.wait_sent(before + 3, timeout=60))[before + 1 :]
    texts = sorted(m["text"] for m in sent)
    assert texts[0] == f"approved: write {note}" and texts[1].startswith("wrote: ")
    assert note.read_text() == "n"
    rows = ServerClient(server).post(
        "/v1/audit/query",
        {"sql": "SELECT state, decided_by, via FROM approvals WHERE persona = 'concierge'"},
    )["rows"]
    assert rows == [["approved", "telegram:carol", "telegram"]]
    # A second press of the same button: the approval is closed, and the chat hears so.
    stand_in.call(stand_in.server.press, asked, "Deny")
    late = stand_in.run(stand_in.server.wait_sent(before + 4, timeout=60))[before + 3]
    assert late["text"].startswith("(not answered)") and "already" in late["text"]


def test_send_message_reaches_another_chat(server: ServerState, stand_in: StandInThread) -> None:
    before = len(stand_in.server.sent)
    reply = ServerClient(server).post(
        "/v1/personas/concierge/messages", {"text": "tell bob", "conversation_id": "c-bob"}
    )["reply"]
    assert reply["text"] == "sent"
    sent = stand_in.run(stand_in.server.wait_sent(before + 1, timeout=60))[before]
    assert sent["chat_id"] == 777 and sent["text"] == "a note for bob"
    status = ServerClient(server).get("/v1/status")
    assert "telegram" in {c["id"] for c in status["connectors"]}


def server_home(server: ServerState) -> Path:
    return Path(ServerClient(server).get("/v1/status")["home"])


def test_without_its_token_the_connector_is_off(tmp_path: Path) -> None:
    from coterie.runtime.config import load_settings
    from coterie.runtime.serve.server import chat_app_connectors

    write_home(tmp_path, "http://127.0.0.1:9")
    saved = os.environ.pop("TELEGRAM_BOT_TOKEN", None)
    try:
        connectors, personas = chat_app_connectors(load_settings(tmp_path))
    finally:
        if saved is not None:
            os.environ["TELEGRAM_BOT_TOKEN"] = saved
    assert connectors == [] and personas == {}
