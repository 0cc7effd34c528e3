"""The HTTP API of a real ``coterie serve`` on the session's Ray: routes, the
error shape and statuses, SSE through ``curl``, the OpenAI-compatible
endpoint through the official ``openai`` SDK, questions and the web
connector's mailbox."""

from __future__ import annotations

import json
import subprocess
import threading
import urllib.error
import urllib.request
from collections.abc import Iterator
from typing import Any

import openai
import pytest
import yaml

from coterie.runtime.errors import ServeError
from coterie.runtime.frontdoor import message
from coterie.runtime.messages import ReplyEnvelope, TextDelta
from coterie.runtime.serve.client import ServedDoor, ServerClient, ServerError
from coterie.runtime.serve.discovery import ServerState
from tests.helpers import asker, scripted, write_persona
from tests.serving import running_server

pytestmark = [pytest.mark.ray, pytest.mark.usefixtures("ray_session")]

CALC = scripted(
    [
        {
            "when": {"turn": 1},
            "tool_calls": [{"name": "calculate", "arguments": {"expression": "6*7"}}],
        },
        {"when": {"turn": 2}, "text": "The answer is {last_tool_result}."},
    ],
    description="does sums",
)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerState]:
    home = tmp_path_factory.mktemp("serve-home")
    CALC["model"]["stream_chunk_chars"] = 4
    write_persona(home, "calc", CALC)
    write_persona(home, "asker", asker())
    write_persona(
        home,
        "notifier",
        scripted(
            [
                {
                    "when": {"turn": 1},
                    "tool_calls": [
                        {"name": "reply_to_origin", "arguments": {"text": "on it"}},
                        {
                            "name": "send_message",
                            "arguments": {
                                "connector": "web",
                                "destination": "tab-other",
                                "text": "hello other tab",
                            },
                        },
                    ],
                },
                {"when": {"turn": 2}, "text": "done: {tool_results}"},
            ],
            description="sends messages",
        ),
    )
    write_persona(home, "slow", scripted(default="slowly", latency_ms=3000, description="slow"))
    (home / "runtime.yaml").write_text(
        yaml.safe_dump({"serve": {"max_in_flight": 1, "max_body_bytes": 4096}})
    )
    with running_server(home) as state:
        yield state


def call(
    state: ServerState,
    method: str,
    path: str,
    body: Any = None,
    *,
    token: str | None = "",
    raw: bytes | None = None,
    headers: dict[str, str] | None = None,
) -> tuple[int, Any, dict[str, str]]:
    """One request; (status, JSON body, headers) whatever the status."""
    data = raw if raw is not None else (None if body is None else json.dumps(body).encode())
    request = urllib.request.Request(state.url + path, data=data, method=method)
    if token is not None:
        request.add_header("Authorization", f"Bearer {token or state.token}")
    for name, value in (headers or {}).items():
        request.add_header(name, value)
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            return response.status, json.loads(response.read()), dict(response.headers)
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read()), dict(exc.headers)


def sse(text: str) -> list[tuple[str, Any]]:
    events = []
    for block in text.strip().split("\n\n"):
        fields = dict(line.split(": ", 1) for line in block.splitlines() if ": " in line)
        events.append((fields.get("event", "message"), json.loads(fields["data"])))
    return events


# -- auth, health, personas ---------------------------------------------------------


def test_every_route_needs_the_token(server: ServerState) -> None:
    for path in ("/v1/health", "/v1/personas", "/v1/status", "/v1/models"):
        status, body, headers = call(server, "GET", path, token=None)
        assert status == 401 and body["error"]["type"] == "unauthorized", path
        assert headers.get("WWW-Authenticate") == "Bearer"
    status, body, _ = call(server, "GET", "/v1/health", token="wrong-token")
    assert status == 401
    status, body, _ = call(server, "GET", "/v1/health")
    assert status == 200 and body["status"] == "ok"


def test_the_page_itself_needs_no_token(server: ServerState) -> None:
    with urllib.request.urlopen(server.url + "/", timeout=30) as response:
        assert response.status == 200 and b"<html" in response.read().lower()


def test_personas_and_describe(server: ServerState) -> None:
    status, body, _ = call(server, "GET", "/v1/personas")
    assert status == 200
    listed = {p["name"]: p for p in body["personas"]}
    assert set(listed) == {"asker", "calc", "notifier", "slow"}
    assert listed["calc"]["description"] == "does sums"
    assert body["total"] == 4 and body["offset"] == 0
    status, page, _ = call(server, "GET", "/v1/personas?offset=1&limit=2")
    assert [p["name"] for p in page["personas"]] == ["calc", "notifier"] and page["total"] == 4
    status, bad, _ = call(server, "GET", "/v1/personas?limit=5000")
    assert status == 400 and bad["error"]["field"] == "limit"
    status, body, _ = call(server, "GET", "/v1/personas/calc")
    assert status == 200 and body["model"] == {"provider": "scripted", "name": "scripted"}
    status, body, _ = call(server, "GET", "/v1/personas/nobody")
    assert status == 404 and body["error"]["type"] == "unknown_persona"
    assert "calc" in body["error"]["message"]


# -- messages -------------------------------------------------------------------------


def test_post_and_wait(server: ServerState) -> None:
    status, body, _ = call(
        server, "POST", "/v1/personas/calc/messages", {"text": "6*7?", "conversation_id": "c-wait"}
    )
    assert status == 200
    reply = body["reply"]
    assert reply["text"] == "The answer is 42." and reply["status"] == "ok"
    assert reply["conversation_id"] == "c-wait" and reply["steps"] == 2


def test_curl_streams_a_turn_as_server_sent_events(server: ServerState) -> None:
    out = subprocess.run(
        [
            "curl",
            "-sN",
            "-H",
            f"Authorization: Bearer {server.token}",
            "-H",
            "Content-Type: application/json",
            "-d",
            json.dumps({"text": "6*7?", "conversation_id": "c-curl", "stream": True}),
            f"{server.url}/v1/personas/calc/messages",
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    ).stdout
    events = sse(out)
    kinds = [k for k, _ in events]
    assert kinds[0] == "turn_started" and kinds[-1] == "reply"
    assert "envelope" not in kinds
    call_event = next(d for k, d in events if k == "tool_call")
    result_event = next(d for k, d in events if k == "tool_result")
    assert call_event["tool"] == "calculate" and call_event["arguments"] == {"expression": "6*7"}
    assert result_event["result"] == "42" and result_event["duration_ms"] >= 0
    deltas = [d["text"] for k, d in events if k == "text_delta"]
    assert len(deltas) > 1 and "".join(deltas) == "The answer is 42."
    assert events[-1][1]["text"] == "The answer is 42."


def test_accept_header_asks_for_a_stream_too(server: ServerState) -> None:
    request = urllib.request.Request(
        server.url + "/v1/personas/calc/messages",
        data=json.dumps({"text": "again", "conversation_id": "c-accept"}).encode(),
        method="POST",
        headers={"Authorization": f"Bearer {server.token}", "Accept": "text/event-stream"},
    )
    with urllib.request.urlopen(request, timeout=60) as response:
        assert response.headers["Content-Type"].startswith("text/event-stream")
        events = sse(response.read().decode())
    assert events[-1][0] == "reply"


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({}, "text"),
        ({"text": ""}, "text"),
        ({"text": "hi", "conversation_id": "has spaces"}, "conversation_id"),
        ({"text": "hi", "surprise": 1}, "surprise"),
        ({"text": "hi", "connector": "telegram", "session": "s"}, "connector"),
    ],
)
def test_bad_bodies_are_400_naming_the_field(
    server: ServerState, body: dict[str, Any], field: str
) -> None:
    status, data, _ = call(server, "POST", "/v1/personas/calc/messages", body)
    assert status == 400 and data["error"]["type"] == "invalid_body"
    assert data["error"]["field"] == field


def test_not_json_is_400(server: ServerState) -> None:
    status, data, _ = call(server, "POST", "/v1/personas/calc/messages", raw=b"{nope")
    assert status == 400 and "not JSON" in data["error"]["message"]


def test_a_body_over_the_limit_is_413(server: ServerState) -> None:
    status, data, _ = call(server, "POST", "/v1/personas/calc/messages", {"text": "x" * 5000})
    assert status == 413 and data["error"]["type"] == "too_large"
    assert "4096" in data["error"]["message"]


def test_unknown_persona_message_is_404(server: ServerState) -> None:
    status, data, _ = call(server, "POST", "/v1/personas/ghost/messages", {"text": "hi"})
    assert status == 404 and data["error"]["type"] == "unknown_persona"


def test_a_conversation_over_its_in_flight_cap_is_409(server: ServerState) -> None:
    in_turn = threading.Event()
    events: list[str] = []

    def first() -> None:
        body = {"text": "one", "conversation_id": "c-busy", "stream": True}
        for event, _data in ServerClient(server).stream("/v1/personas/slow/messages", body):
            events.append(event)
            in_turn.set()  # the first message is in flight: its turn started

    worker = threading.Thread(target=first)
    worker.start()
    assert in_turn.wait(60)
    status, data, _ = call(
        server, "POST", "/v1/personas/slow/messages", {"text": "two", "conversation_id": "c-busy"}
    )
    worker.join(60)
    assert status == 409 and data["error"]["type"] == "queue_full"
    assert "c-busy" in data["error"]["message"]
    assert events[-1] == "reply"  # the first one was answered all the same


# -- conversations and audit -------------------------------------------------------------


def test_conversations_and_history(server: ServerState) -> None:
    call(server, "POST", "/v1/personas/calc/messages", {"text": "hist", "conversation_id": "c-h"})
    status, body, _ = call(server, "GET", "/v1/personas/calc/conversations")
    assert status == 200
    ids = {c["id"]: c for c in body["conversations"]}
    assert "c-h" in ids and ids["c-h"]["messages"] >= 4
    status, body, _ = call(server, "GET", "/v1/personas/calc/conversations/c-h")
    assert status == 200
    kinds = [m["kind"] for m in body["messages"]]
    assert kinds[0] == "user" and body["messages"][0]["text"] == "hist"
    assert body["messages"][-1]["text"] == "The answer is 42."
    status, body, _ = call(server, "GET", "/v1/personas/calc/conversations/never-was")
    assert status == 404 and body["error"]["type"] == "unknown_conversation"


def test_audit_query_is_read_only(server: ServerState) -> None:
    call(server, "POST", "/v1/personas/calc/messages", {"text": "q", "conversation_id": "c-q"})
    status, body, _ = call(
        server,
        "POST",
        "/v1/audit/query",
        {"sql": "select count(*) as n from events where kind = 'turn_ended'"},
    )
    assert status == 200 and body["columns"] == ["n"] and body["rows"][0][0] >= 1
    status, body, _ = call(server, "POST", "/v1/audit/query", {"sql": "delete from events"})
    assert status == 400 and body["error"]["type"] == "invalid_query"
    assert body["error"]["field"] == "sql"
    status, body, _ = call(server, "POST", "/v1/audit/query", {"query": "select 1"})
    assert status == 400 and body["error"]["field"] == "sql"


def test_audit_summary_and_status(server: ServerState) -> None:
    call(server, "POST", "/v1/personas/calc/messages", {"text": "s", "conversation_id": "c-s"})
    status, body, _ = call(server, "GET", "/v1/audit/summary")
    assert status == 200
    calc = next(p for p in body["personas"] if p["persona"] == "calc")
    assert calc["turns"] >= 1 and calc["input_tokens"] > 0 and calc["model_latency_ms"] >= 0
    assert body["recent_turns"] and body["recent_turns"][0]["status"] in ("ok", "error")
    status, body, _ = call(server, "GET", "/v1/status")
    assert status == 200
    active = {p["name"] for p in body["personas"]["active"]}
    assert "calc" in active and body["personas"]["registered"] == 4
    assert {c["id"] for c in body["connectors"]} == {"cli", "web"}
    assert body["audit"]["write_errors"] == 0


def test_usage_by_the_persona_that_pays_and_a_bad_parameter(server: ServerState) -> None:
    call(server, "POST", "/v1/personas/calc/messages", {"text": "u", "conversation_id": "c-u"})
    status, body, _ = call(server, "GET", "/v1/usage?since=1h")
    assert status == 200 and body["by"] == "persona" and "pays" in body["group_label"]
    calc = next(r for r in body["rows"] if r["key"] == "calc")
    # Two steps of a scripted model: they run locally, priced at 0 (not unpriced).
    assert calc["calls"] >= 2 and calc["input_tokens"] > 0
    assert calc["cost_usd"] == 0 and calc["unpriced_calls"] == 0
    assert body["total"]["calls"] >= calc["calls"] and body["unpriced_models"] == []
    status, body, _ = call(server, "GET", "/v1/usage?by=context")
    assert status == 200 and "user" in {r["key"] for r in body["rows"]}
    for query, field in (("since=soon", "since"), ("by=persona,model", "by")):
        status, body, _ = call(server, "GET", f"/v1/usage?{query}")
        assert status == 400 and body["error"]["field"] == field, query


# -- questions and the web connector -------------------------------------------------------


def test_a_question_comes_back_with_its_buttons_and_is_answered(server: ServerState) -> None:
    body = {"text": "plan a trip", "conversation_id": "c-trip"}
    status, data, _ = call(server, "POST", "/v1/personas/asker/messages", body)
    assert status == 200
    reply = data["reply"]
    assert reply["text"] == "Which city?" and reply["question"]["buttons"] == ["Paris", "Oslo"]
    status, data, _ = call(
        server, "POST", "/v1/personas/asker/messages", {"text": "Oslo", "conversation_id": "c-trip"}
    )
    assert data["reply"]["text"] == 'you said: [answer to your question "Which city?"] Oslo'
    assert data["reply"]["question"] is None


def test_reply_to_origin_and_send_message_reach_web_sessions(server: ServerState) -> None:
    body = {"text": "go", "conversation_id": "c-note", "session": "tab-one", "connector": "web"}
    status, data, _ = call(server, "POST", "/v1/personas/notifier/messages", body)
    assert status == 200 and "queued for web:tab-one" in data["reply"]["text"]
    status, mine, _ = call(server, "GET", "/v1/connectors/web/messages?destination=tab-one&wait=10")
    assert status == 200 and [m["text"] for m in mine["messages"]] == ["on it"]
    status, other, _ = call(
        server, "GET", "/v1/connectors/web/messages?destination=tab-other&wait=10"
    )
    assert [(m["text"], m["persona"]) for m in other["messages"]] == [
        ("hello other tab", "notifier")
    ]
    status, again, _ = call(server, "GET", "/v1/connectors/web/messages?destination=tab-one")
    assert again["messages"] == []
    status, bad, _ = call(server, "GET", "/v1/connectors/telegram/messages?destination=x")
    assert status == 404 and bad["error"]["type"] == "unknown_connector"
    status, bad, _ = call(server, "GET", "/v1/connectors/web/messages?destination=a%20b")
    assert status == 400 and bad["error"]["field"] == "destination"


# -- /v1/chat/completions through the openai SDK ------------------------------------------------


@pytest.fixture(scope="module")
def client(server: ServerState) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url + "/v1", api_key=server.token, max_retries=0)


def test_openai_sdk_completes_through_a_persona(client: openai.OpenAI) -> None:
    raw = client.chat.completions.with_raw_response.create(
        model="calc", messages=[{"role": "user", "content": "what is 6*7?"}]
    )
    completion = raw.parse()
    assert completion.choices[0].message.content == "The answer is 42."
    assert completion.choices[0].finish_reason == "stop" and completion.model == "calc"
    assert completion.usage is not None and completion.usage.prompt_tokens > 0
    conversation = raw.headers["x-coterie-conversation"]
    assert conversation.startswith("calc:openai:")


def test_openai_sdk_streams(client: openai.OpenAI) -> None:
    stream = client.chat.completions.create(
        model="calc",
        messages=[{"role": "user", "content": "what is 6*7?"}],
        stream=True,
        stream_options={"include_usage": True},
    )
    pieces: list[str] = []
    finish = None
    usage = None
    for chunk in stream:
        if chunk.usage is not None:
            usage = chunk.usage
        for choice in chunk.choices:
            pieces.append(choice.delta.content or "")
            finish = choice.finish_reason or finish
    assert len([p for p in pieces if p]) > 1
    assert "".join(pieces) == "The answer is 42."
    assert finish == "stop" and usage is not None and usage.total_tokens > 0


def test_openai_conversation_from_header_and_user(
    client: openai.OpenAI, server: ServerState
) -> None:
    for _ in range(2):
        client.chat.completions.create(
            model="asker",
            messages=[{"role": "user", "content": "hello"}],
            extra_headers={"X-Coterie-Conversation": "oa-fixed"},
        )
    status, body, _ = call(server, "GET", "/v1/personas/asker/conversations/oa-fixed")
    assert [m["text"] for m in body["messages"] if m["kind"] == "user"] == ["hello", "hello"]
    client.chat.completions.create(
        model="asker", messages=[{"role": "user", "content": "hi"}], user="bob"
    )
    status, body, _ = call(server, "GET", "/v1/personas/asker/conversations/asker:user:bob")
    assert status == 200


def test_openai_errors_come_back_as_sdk_errors(client: openai.OpenAI) -> None:
    with pytest.raises(openai.NotFoundError, match="unknown persona 'ghost'"):
        client.chat.completions.create(model="ghost", messages=[{"role": "user", "content": "x"}])
    with pytest.raises(openai.BadRequestError, match="last message must be the user's"):
        client.chat.completions.create(
            model="calc", messages=[{"role": "assistant", "content": "x"}]
        )
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(
            base_url=client.base_url, api_key="wrong", max_retries=0
        ).chat.completions.create(model="calc", messages=[{"role": "user", "content": "x"}])


def test_openai_models_lists_personas(client: openai.OpenAI) -> None:
    assert {m.id for m in client.models.list()} == {"asker", "calc", "notifier", "slow"}


# -- the served door: the front door over this API (what mcp-serve goes through) ----------


async def test_the_served_door_is_the_whole_front_door_over_the_api(server: ServerState) -> None:
    door = ServedDoor(ServerClient(server))
    assert [p.name for p in await door.personas_async()] == ["asker", "calc", "notifier", "slow"]
    assert [p.name for p in await door.personas_async(1, 2)] == ["calc", "notifier"]
    assert await door.persona_count_async() == 4
    asked = message("calc", "what is 6*7?", conversation_id="door:c1")
    reply = await door.deliver_async(asked, timeout=60)
    assert reply.text == "The answer is 42." and reply.conversation_id == "door:c1"
    items = [
        i async for i in door.stream_async(message("calc", "again", conversation_id="door:c1"))
    ]
    assert isinstance(items[-1], ReplyEnvelope) and items[-1].text == "The answer is 42."
    deltas = [i.text for i in items if isinstance(i, TextDelta)]
    assert len(deltas) > 1 and "".join(deltas) == "The answer is 42."
    await door.post_async(message("asker", "no wait", conversation_id="c-door-post", wait=False))
    history = await door.history_async("calc", "door:c1")
    assert [m.text for m in history if m.kind == "user"] == ["what is 6*7?", "again"]
    assert await door.history_async("calc", "never-was") == []
    counted = await door.query_async(
        "select count(*) from events where conversation_id = 'door:c1' and kind = 'turn_ended'"
    )
    assert counted.rows[0][0] == 2
    assert (await door.status_async())["personas"]["registered"] == 4
    with pytest.raises(ServerError) as unknown:
        await door.deliver_async(message("ghost", "boo", conversation_id="c-ghost"), timeout=60)
    assert unknown.value.status == 404 and "unknown persona 'ghost'" in str(unknown.value)
    # What the API cannot carry is refused, not dropped on the way.
    from_a_persona = message("calc", "x", conversation_id="c-x", wait=False)
    from_a_persona.sender = "asker"
    with pytest.raises(ServeError, match="cannot carry sender 'asker'"):
        await door.post_async(from_a_persona)
