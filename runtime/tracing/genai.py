"""The names coterie's spans use: OpenTelemetry's GenAI semantic conventions,
version :data:`SEMCONV_VERSION` (their status is Development), and
``coterie.*`` for what the conventions have no name for.

Plain constants and small builders: no SDK here.
"""

from __future__ import annotations

from typing import Final

#: The semantic conventions version the spans follow (their schema URL below).
SEMCONV_VERSION: Final = "1.41.0"
SCHEMA_URL: Final = f"https://opentelemetry.io/schemas/{SEMCONV_VERSION}"

OPERATION: Final = "gen_ai.operation.name"
PROVIDER: Final = "gen_ai.provider.name"
AGENT_NAME: Final = "gen_ai.agent.name"
AGENT_ID: Final = "gen_ai.agent.id"
CONVERSATION: Final = "gen_ai.conversation.id"
REQUEST_MODEL: Final = "gen_ai.request.model"
REQUEST_MAX_TOKENS: Final = "gen_ai.request.max_tokens"
RESPONSE_MODEL: Final = "gen_ai.response.model"
FINISH_REASONS: Final = "gen_ai.response.finish_reasons"
INPUT_TOKENS: Final = "gen_ai.usage.input_tokens"
OUTPUT_TOKENS: Final = "gen_ai.usage.output_tokens"
CACHE_READ_TOKENS: Final = "gen_ai.usage.cache_read.input_tokens"
CACHE_WRITE_TOKENS: Final = "gen_ai.usage.cache_creation.input_tokens"
TOOL_NAME: Final = "gen_ai.tool.name"
TOOL_CALL_ID: Final = "gen_ai.tool.call.id"
TOOL_TYPE: Final = "gen_ai.tool.type"
TOOL_ARGUMENTS: Final = "gen_ai.tool.call.arguments"
TOOL_RESULT: Final = "gen_ai.tool.call.result"
ERROR_TYPE: Final = "error.type"
# MCP client spans (the MCP conventions of the same version).
MCP_METHOD: Final = "mcp.method.name"
MCP_RESOURCE_URI: Final = "mcp.resource.uri"
PROMPT_NAME: Final = "gen_ai.prompt.name"
# HTTP server spans (the stable HTTP conventions): ``coterie serve``.
HTTP_METHOD: Final = "http.request.method"
HTTP_ROUTE: Final = "http.route"
HTTP_STATUS: Final = "http.response.status_code"
URL_PATH: Final = "url.path"

# coterie's own.
TURN_ID: Final = "coterie.turn.id"
TURN_CONTEXT: Final = "coterie.turn.context"
TURN_STATUS: Final = "coterie.turn.status"
TURN_STEPS: Final = "coterie.turn.steps"
MESSAGE_IDS: Final = "coterie.message.ids"
SENDER: Final = "coterie.sender"
NODE_ID: Final = "coterie.node.id"
COST_USD: Final = "coterie.cost_usd"
LATENCY_MS: Final = "coterie.latency_ms"
STEP: Final = "coterie.step"
PURPOSE: Final = "coterie.call.purpose"
BILLED_TO: Final = "coterie.billed_to"
DURATION_MS: Final = "coterie.duration_ms"
START_WAITED_MS: Final = "coterie.activation.waited_ms"
SCHEDULE_KIND: Final = "coterie.schedule.kind"
SCHEDULE_NAME: Final = "coterie.schedule.name"
SCHEDULE_FIRE: Final = "coterie.schedule.fire_id"
SCHEDULE_INSTANT: Final = "coterie.schedule.instant"
SCHEDULE_LATE: Final = "coterie.schedule.late"
SCHEDULE_MANUAL: Final = "coterie.schedule.manual"
ACP_UPDATE: Final = "coterie.acp.update"
ACP_TITLE: Final = "coterie.acp.title"
ACP_STATUS: Final = "coterie.acp.status"
ACP_TEXT: Final = "coterie.acp.text"
ACP_FILES_CHANGED: Final = "coterie.acp.files_changed"
MCP_SERVER: Final = "coterie.mcp.server"
EVAL_RUN: Final = "coterie.eval.run"
EVAL_TASK: Final = "coterie.eval.task"
EVAL_SAMPLE: Final = "coterie.eval.sample"
EVAL_EPOCH: Final = "coterie.eval.epoch"
EVAL_ATTEMPTS: Final = "coterie.eval.attempts"
EVAL_STATUS: Final = "coterie.eval.status"
EVAL_LIMIT: Final = "coterie.eval.limit"
EVAL_SCORE: Final = "coterie.eval.score"
EVAL_SCORER: Final = "coterie.eval.scorer"


def agent_span(persona: str) -> str:
    """The name of a turn's span."""
    return f"invoke_agent {persona}"


def chat_span(model: str) -> str:
    """The name of a model call's span."""
    return f"chat {model}"


def activation_span(persona: str) -> str:
    """The name of the router's span that starts a persona's actor."""
    return f"activate_persona {persona}"


def fire_span(kind: str, name: str) -> str:
    """The name of the scheduler's span that sends one fire to its persona."""
    return f"schedule_fire {kind} {name}"


def sample_span(task: str) -> str:
    """The name of an eval sample's span (one sample, one epoch, all its attempts)."""
    return f"eval_sample {task}"


def tool_span(tool: str) -> str:
    """The name of a tool call's span."""
    return f"execute_tool {tool}"
