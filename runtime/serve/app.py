"""The HTTP API of ``coterie serve`` (aiohttp).

Routes (all under ``/v1`` need ``Authorization: Bearer <token>``, unless the
request comes from loopback and ``serve.loopback_without_token`` is on):

- ``GET /v1/health``, ``GET /v1/status``
- ``GET /v1/personas``, ``GET /v1/personas/{name}``
- ``GET /v1/personas/{name}/conversations``,
  ``GET /v1/personas/{name}/conversations/{id}``
- ``POST /v1/personas/{name}/messages`` — ``{"text", "conversation_id"?,
  "session"?, "stream"?, "wait"?}``: the reply, or with ``"stream": true`` (or
  ``Accept: text/event-stream``) the turn's events as server-sent events, or
  with ``"wait": false`` 202 ``{"queued": {"id", "conversation_id"}}`` at
  once (the turn runs; its reply stays in the conversation)
- ``GET /v1/personas/{name}/recall?query=&limit=`` — the persona's long-term
  memory hits (``limit`` 1-50, default 8)
- ``POST /v1/audit/query`` — ``{"sql"}``, read-only; ``GET /v1/audit/summary``
- ``GET /v1/connectors``, ``GET /v1/connectors/{id}/messages?destination=&wait=``
- ``GET /v1/usage?since=&by=`` — the model calls' tokens, cache hits and
  cost since ``since`` (``24h``, ``7d``, an ISO date or date-time; default
  all), grouped ``by`` persona (the persona that pays), model, day or
  context; calls without a price counted apart (:mod:`runtime.usage.report`)
- ``GET /v1/schedules?persona=`` — heartbeats, cron entries and pending
  reminders (of one persona): next fires in their zones, last outcomes,
  paused queues, schedule files that do not load
- ``GET /v1/approvals?persona=&state=`` — the approvals permission rules
  asked for (default: pending); ``POST /v1/approvals/{id}`` —
  ``{"decision": "approve" | "deny" | "always", "by"?, "via"?}`` answers one
  (404 unknown, 409 answered or expired already)
- ``POST /v1/chat/completions``, ``GET /v1/models`` (OpenAI-compatible:
  :mod:`runtime.serve.openai_compat`)
- ``GET /`` — the chat page (static, holds no data; it asks for the token)

Every error is ``{"error": {"type", "message", "field"?}}`` with its status:
400 a bad body (``field`` names what), 401 no or wrong token, 404 an unknown
persona, conversation or approval, 409 a conversation with too many messages
waiting or an approval answered already,
413 a body over ``serve.max_body_bytes``, 429 over ``serve.rate_per_minute``,
503 while the runtime starts.
"""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from aiohttp import web
from pydantic import BaseModel, ConfigDict, Field

from coterie.runtime.config import (
    Persona,
    ServeSettings,
    load_persona_dir,
    persona_names,
    runtime_timezone,
)
from coterie.runtime.connectors.mailbox import MailboxConnector
from coterie.runtime.errors import AuditQueryError, CoterieError
from coterie.runtime.frontdoor import FrontDoor
from coterie.runtime.messages import MessageEnvelope, Origin, StreamItem
from coterie.runtime.serve import openai_compat
from coterie.runtime.serve.http import (
    ID_PATTERN,
    STATE,
    ApiError,
    InFlight,
    ServerState,
    api_middleware,
    backend_of,
    close_stream,
    error_for,
    known_persona,
    known_persona_name,
    open_sse,
    read_body,
    sse_event,
    trace_middleware,
    valid_id,
)
from coterie.runtime.usage.report import UsageQuery, parse_grouping, parse_since, usage_report

if TYPE_CHECKING:  # loaded with the first persona described
    from coterie.runtime.plugins.report import PersonaTools

STATIC = Path(__file__).parent / "static"
#: Personas listed per page of ``GET /v1/personas`` (and at most).
PERSONA_PAGE = 1000
#: Hits one ``GET /v1/personas/{name}/recall`` returns by default and at most
#: (the persona's own ``recall`` tool has the same bounds).
RECALL_LIMIT = 8
RECALL_MAX = 50
RECALL_QUERY_CHARS = 2_000
#: Stream items a client never needs (the envelope it sent).
QUIET_KINDS = frozenset({"envelope"})


# -- bodies -----------------------------------------------------------------


class _Body(BaseModel):
    model_config = ConfigDict(extra="forbid")


class PostMessage(_Body):
    text: str = Field(min_length=1)
    conversation_id: str | None = Field(default=None, pattern=ID_PATTERN)
    # The web page's or the CLI's session: where send_message / reply_to_origin reach it.
    session: str | None = Field(default=None, pattern=ID_PATTERN)
    connector: str = Field(default="web", pattern=r"^(web|cli)$")
    stream: bool = False
    # False: queue it and answer 202 at once (nobody waits for the reply).
    wait: bool = True


class DecideApproval(_Body):
    decision: Literal["approve", "deny", "always"]
    # Who answers (shown in the audit log); how: this route, the chat page,
    # coterie chat, the Telegram connector.
    by: str | None = Field(default=None, max_length=200)
    via: Literal["http", "web", "cli", "telegram"] = "http"


class AuditQuery(_Body):
    sql: str = Field(min_length=1, max_length=20_000)


# -- routes -------------------------------------------------------------------


async def health(request: web.Request) -> web.Response:
    state = request.app[STATE]
    return web.json_response({"status": "ok", "uptime_s": round(time.time() - state.started, 1)})


async def status(request: web.Request) -> web.Response:
    data = await backend_of(request).status_async()
    state = request.app[STATE]
    data["server"] = {
        "uptime_s": round(time.time() - state.started, 1),
        "in_flight": sum(state.in_flight.values()),
    }
    return web.json_response(data)


def _int_query(request: web.Request, name: str, default: int, high: int, *, low: int = 0) -> int:
    raw = request.query.get(name)
    if raw is None:
        return default
    if not raw.isdigit() or not low <= int(raw) <= high:
        raise ApiError(400, "invalid_query", f"{name} must be a whole number {low}-{high}", name)
    return int(raw)


async def list_personas(request: web.Request) -> web.Response:
    """A page of the roster (``offset``, ``limit``: at most 1,000 at a time)."""
    offset = _int_query(request, "offset", 0, 10**9)
    limit = _int_query(request, "limit", PERSONA_PAGE, PERSONA_PAGE)
    door = backend_of(request)
    infos = await door.personas_async(offset, limit)
    total = await door.persona_count_async()
    return web.json_response(
        {
            "personas": [i.model_dump() for i in infos],
            "offset": offset,
            "limit": limit,
            "total": total,
        }
    )


async def _plugin_tools(request: web.Request, persona: Persona) -> PersonaTools:
    from coterie.runtime.plugins import PluginSet
    from coterie.runtime.plugins.report import tools_of_persona

    plugins = PluginSet.model_validate(await backend_of(request).plugins_async())
    return tools_of_persona(
        persona.config.tools,
        persona.path,
        builtin=plugins.builtin_tools,
        plugin_tools=plugins.tool_plugins,
        problems=plugins.problems,
    )


async def describe_persona(request: web.Request) -> web.Response:
    name = known_persona(request)
    persona = load_persona_dir(request.app[STATE].home / "personas" / name, name)
    cfg = persona.config
    page = await backend_of(request).personas_async(
        persona_names(request.app[STATE].home).index(name), 1
    )
    active = {i.name: i.active for i in page}
    tools = await _plugin_tools(request, persona)
    return web.json_response(
        {
            "name": name,
            "description": cfg.description,
            "active": active.get(name, False),
            "model": {"provider": cfg.model.provider, "name": cfg.model.name},
            "tools": cfg.tools.model_dump(),
            # The tools it gets from plugins (and from its own code), by plugin,
            # and those it names that nobody provides, with the reason.
            "plugin_tools": tools.plugin_tools,
            "missing_tools": tools.missing,
            "access": cfg.access,
            # Its own rules (runtime.yaml's and approved.yaml's come with them
            # when it runs) and whom it may message (None: everyone).
            "permissions": cfg.permissions.model_dump(mode="json") if cfg.permissions else None,
            "team": cfg.team,
        }
    )


def _literal(value: str) -> str:
    return "'" + value.replace("'", "''") + "'"


async def list_conversations(request: web.Request) -> web.Response:
    name = known_persona(request)
    result = await backend_of(request).query_async(
        "SELECT conversation_id, count(*) AS messages, max(ts) AS last_ts FROM events "
        f"WHERE persona = {_literal(name)} AND kind = 'chat_message' "
        "GROUP BY conversation_id ORDER BY last_ts DESC LIMIT 500"
    )
    return web.json_response(
        {"conversations": [{"id": c, "messages": n, "last_ts": ts} for c, n, ts in result.rows]},
        dumps=_dumps,
    )


async def conversation_history(request: web.Request) -> web.Response:
    name = known_persona(request)
    conversation_id = valid_id(request.match_info["conversation_id"], "conversation_id")
    messages = await backend_of(request).history_async(name, conversation_id)
    if not messages:
        raise ApiError(
            404, "unknown_conversation", f"{name} has no conversation {conversation_id!r}"
        )
    return web.json_response(
        {
            "persona": name,
            "conversation_id": conversation_id,
            "messages": [m.model_dump(mode="json") for m in messages],
        }
    )


def envelope_for(name: str, body: PostMessage) -> MessageEnvelope:
    """The envelope of a message posted through the API."""
    origin = (
        Origin(connector=body.connector, destination=body.session) if body.session else Origin()
    )
    return MessageEnvelope(
        recipient=name,
        conversation_id=body.conversation_id or f"{name}:api",
        text=body.text,
        origin=origin,
    )


def wants_stream(request: web.Request, asked: bool) -> bool:
    return asked or "text/event-stream" in request.headers.get("Accept", "")


async def post_message(request: web.Request) -> web.StreamResponse:
    name = known_persona(request)
    body: PostMessage = await read_body(request, PostMessage)
    envelope = envelope_for(name, body)
    if not body.wait:
        if wants_stream(request, body.stream):
            raise ApiError(400, "invalid_body", "wait: false cannot stream a reply", "wait")
        envelope.reply_mode = "none"
        await backend_of(request).post_async(envelope)
        queued = {"id": envelope.id, "conversation_id": envelope.conversation_id}
        return web.json_response({"queued": queued}, status=202)
    state = request.app[STATE]
    with InFlight(state, (name, envelope.conversation_id)):
        if not wants_stream(request, body.stream):
            reply = await backend_of(request).deliver_async(
                envelope, timeout=state.settings.ask_timeout
            )
            return web.json_response({"reply": reply.model_dump(mode="json")})
        return await stream_sse(request, backend_of(request).stream_async(envelope))


async def stream_sse(request: web.Request, items: AsyncIterator[StreamItem]) -> web.StreamResponse:
    """The items as server-sent events (``event: <kind>``, ``data: <json>``),
    ending with ``reply``; a failure mid-way ends with an ``error`` event."""
    response = await open_sse(request)
    try:
        async for item in items:
            if item.kind in QUIET_KINDS:
                continue
            await sse_event(response, item.kind, item.model_dump_json())
    except CoterieError as exc:
        err = error_for(exc)
        await sse_event(
            response, "error", json.dumps({"error": {"type": err.kind, "message": str(err)}})
        )
    finally:
        # Also when the client went away: stop listening (the turn goes on).
        await close_stream(items)
    await response.write_eof()
    return response


async def recall(request: web.Request) -> web.Response:
    """The persona's long-term memory hits for ``query`` (empty: its most
    important and recent memories), best first."""
    name = known_persona(request)
    query = request.query.get("query", "")
    if len(query) > RECALL_QUERY_CHARS:
        raise ApiError(
            400, "invalid_query", f"query is longer than {RECALL_QUERY_CHARS} characters", "query"
        )
    limit = _int_query(request, "limit", RECALL_LIMIT, RECALL_MAX, low=1)
    hits = await backend_of(request).recall_async(name, query, limit=limit)
    return web.json_response(
        {"persona": name, "query": query, "hits": [h.model_dump(mode="json") for h in hits]}
    )


async def audit_query(request: web.Request) -> web.Response:
    body: AuditQuery = await read_body(request, AuditQuery)
    result = await backend_of(request).query_async(body.sql)
    return web.json_response(
        {"columns": result.columns, "rows": [list(r) for r in result.rows]}, dumps=_dumps
    )


def _dumps(data: Any) -> str:
    return json.dumps(data, default=str)


SUMMARY_SQL = """
SELECT persona,
       count(*) FILTER (WHERE kind = 'turn_ended') AS turns,
       count(*) FILTER (WHERE kind = 'turn_ended' AND status = 'error') AS errors,
       coalesce(sum(input_tokens) FILTER (WHERE kind = 'model_call'), 0) AS input_tokens,
       coalesce(sum(output_tokens) FILTER (WHERE kind = 'model_call'), 0) AS output_tokens,
       round(avg(latency_ms) FILTER (WHERE kind = 'model_call'), 1) AS model_latency_ms,
       round(avg(duration_ms) FILTER (WHERE kind = 'turn_ended'), 1) AS turn_ms
FROM events WHERE persona IS NOT NULL GROUP BY persona ORDER BY persona
"""
RECENT_SQL = """
SELECT ts, persona, conversation_id, turn_id, status, round(duration_ms, 1) AS duration_ms
FROM events WHERE kind = 'turn_ended' ORDER BY ts DESC LIMIT 20
"""


async def audit_summary(request: web.Request) -> web.Response:
    """Per persona: turns, errors, tokens and latency; and the 20 latest turns."""
    door = backend_of(request)
    per_persona = await door.query_async(SUMMARY_SQL)
    recent = await door.query_async(RECENT_SQL)
    return web.json_response(
        {"personas": per_persona.as_dicts(), "recent_turns": recent.as_dicts()}, dumps=_dumps
    )


async def usage(request: web.Request) -> web.Response:
    """The usage report: ``since`` (default all), ``by`` (default persona);
    a bad value is 400 naming its parameter."""
    zone = runtime_timezone()
    try:
        since = parse_since(request.query.get("since"), zone=zone)
    except AuditQueryError as exc:
        raise ApiError(400, "invalid_query", str(exc), "since") from None
    try:
        by = parse_grouping(request.query.get("by"))
    except AuditQueryError as exc:
        raise ApiError(400, "invalid_query", str(exc), "by") from None
    spec = UsageQuery(by=by, since=since, timezone=zone.key)
    report = await usage_report(backend_of(request).query_async, spec)
    return web.json_response(report.model_dump(mode="json"))


async def list_connectors(request: web.Request) -> web.Response:
    status_data = await backend_of(request).status_async()
    return web.json_response({"connectors": status_data.get("connectors", [])})


async def connector_messages(request: web.Request) -> web.Response:
    connector_id = request.match_info["connector"]
    box = request.app[STATE].mailboxes.get(connector_id)
    if box is None:
        raise ApiError(
            404, "unknown_connector", f"{connector_id!r} has no mailbox (only web and cli do)"
        )
    destination = valid_id(request.query.get("destination", ""), "destination")
    try:
        wait = min(max(float(request.query.get("wait", "0")), 0.0), 30.0)
    except ValueError:
        raise ApiError(400, "invalid_query", "wait must be a number of seconds", "wait") from None
    messages = await box.take(destination, wait)
    return web.json_response({"messages": [m.model_dump(mode="json") for m in messages]})


async def schedules(request: web.Request) -> web.Response:
    """The scheduler's listing (``?persona=``: one persona's)."""
    name = request.query.get("persona") or None
    if name is not None:
        name = known_persona_name(request, name, field="persona")
    listing = await backend_of(request).schedules_async(name)
    return web.json_response(listing.model_dump(mode="json"))


async def list_approvals(request: web.Request) -> web.Response:
    """Approvals (``?persona=``, ``?state=pending|approved|denied|expired|all``;
    default pending), oldest first."""
    name = request.query.get("persona") or None
    if name is not None:
        name = known_persona_name(request, name, field="persona")
    state: str | None = request.query.get("state", "pending")
    if state == "all":
        state = None
    elif state not in ("pending", "approved", "denied", "expired"):
        raise ApiError(
            400, "invalid_query", "state is pending, approved, denied, expired or all", "state"
        )
    found = await backend_of(request).approvals_async(name, state)
    return web.json_response({"approvals": [a.model_dump(mode="json") for a in found]})


async def decide_approval(request: web.Request) -> web.Response:
    """Answer one approval: ``{"decision": "approve" | "deny" | "always", "by"?, "via"?}``."""
    approval_id = request.match_info["approval_id"]
    body: DecideApproval = await read_body(request, DecideApproval)
    decided = await backend_of(request).decide_approval_async(
        approval_id, body.decision, by=body.by, via=body.via
    )
    return web.json_response({"approval": decided.model_dump(mode="json")})


async def index(request: web.Request) -> web.FileResponse:
    return web.FileResponse(STATIC / "index.html")


def build_app(
    home: Path,
    settings: ServeSettings,
    *,
    token: str,
    mailboxes: dict[str, MailboxConnector] | None = None,
) -> web.Application:
    """The front door's app; it answers 503 on ``/v1`` until :func:`set_backend`."""
    app = web.Application(
        middlewares=[trace_middleware, api_middleware], client_max_size=settings.max_body_bytes
    )
    app[STATE] = ServerState(home, settings, token, mailboxes or {})
    app.router.add_get("/v1/health", health)
    app.router.add_get("/v1/status", status)
    app.router.add_get("/v1/personas", list_personas)
    app.router.add_get("/v1/personas/{name}", describe_persona)
    app.router.add_get("/v1/personas/{name}/conversations", list_conversations)
    app.router.add_get("/v1/personas/{name}/conversations/{conversation_id}", conversation_history)
    app.router.add_post("/v1/personas/{name}/messages", post_message)
    app.router.add_get("/v1/personas/{name}/recall", recall)
    app.router.add_post("/v1/audit/query", audit_query)
    app.router.add_get("/v1/audit/summary", audit_summary)
    app.router.add_get("/v1/usage", usage)
    app.router.add_get("/v1/connectors", list_connectors)
    app.router.add_get("/v1/connectors/{connector}/messages", connector_messages)
    app.router.add_get("/v1/schedules", schedules)
    app.router.add_get("/v1/approvals", list_approvals)
    app.router.add_post("/v1/approvals/{approval_id}", decide_approval)
    openai_compat.add_routes(app)
    app.router.add_get("/", index)
    app.router.add_static("/static/", STATIC)
    return app


def set_backend(app: web.Application, door: FrontDoor) -> None:
    """The runtime is up: ``/v1`` answers from now on."""
    app[STATE].backend = door


def set_starting_error(app: web.Application, error: str) -> None:
    """The runtime could not start: ``/v1`` answers 503 with this."""
    app[STATE].starting_error = error


__all__ = ["PostMessage", "build_app", "envelope_for", "set_backend", "set_starting_error"]
