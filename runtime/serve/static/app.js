// The chat page of `coterie serve`: plain JS, no build step, no dependencies.
// Every piece of data goes into the page as text (textContent), never as HTML.

const TOKEN_KEY = "coterie.token";
const SESSION_KEY = "coterie.session";
const POLL_WAIT_S = 20;
const APPROVAL_POLL_MS = 2000;

const $ = (selector, root = document) => root.querySelector(selector);

const state = {
  token: null,
  session: tabSession(),
  personas: [],
  persona: null,
  conversation: null,
  streaming: false,
  pollGeneration: 0,
  approvalGeneration: 0,
};

// -- small helpers ------------------------------------------------------------

/** An element with properties and children (strings become text nodes). */
function el(tag, props = {}, ...children) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(props)) {
    if (value === undefined || value === null || value === false) continue;
    if (key === "class") node.className = value;
    else if (key === "dataset") Object.assign(node.dataset, value);
    else if (key.startsWith("on")) node.addEventListener(key.slice(2), value);
    else node.setAttribute(key, value === true ? "" : String(value));
  }
  for (const child of children.flat()) {
    if (child !== null && child !== undefined && child !== false) node.append(child);
  }
  return node;
}

function randomId(bytes = 6) {
  const values = crypto.getRandomValues(new Uint8Array(bytes));
  return Array.from(values, (b) => b.toString(16).padStart(2, "0")).join("");
}

function tabSession() {
  let session = sessionStorage.getItem(SESSION_KEY);
  if (!session) {
    session = `web-${randomId(8)}`;
    sessionStorage.setItem(SESSION_KEY, session);
  }
  return session;
}

/** A path segment for a persona name or an id (they only hold [A-Za-z0-9_.:@-]). */
function seg(value) {
  return encodeURIComponent(value).replace(/%3A/gi, ":").replace(/%40/g, "@");
}

function sleep(ms) {
  return new Promise((resolve) => setTimeout(resolve, ms));
}

function formatTime(value) {
  if (value === null || value === undefined || value === "") return "";
  let date;
  if (typeof value === "number") date = new Date(value * 1000);
  else {
    const text = String(value);
    // DuckDB timestamps come as "YYYY-MM-DD HH:MM:SS[.ffffff]" in UTC.
    date = new Date(/[zZ]|[+-]\d\d:?\d\d$/.test(text) ? text : `${text.replace(" ", "T")}Z`);
    if (Number.isNaN(date.getTime())) return text;
  }
  return date.toLocaleString();
}

function formatJson(value) {
  if (typeof value === "string") return value;
  try {
    return JSON.stringify(value, null, 2);
  } catch {
    return String(value);
  }
}

function setStatus(text) {
  $("#status").textContent = text;
}

// -- the API ------------------------------------------------------------------

class ApiError extends Error {
  constructor(status, type, message) {
    super(message);
    this.status = status;
    this.type = type;
  }
}

/** `{"error": {"type", "message"}}` (or whatever else came) as an ApiError. */
async function errorOf(response) {
  let type = "http_error";
  let message = `HTTP ${response.status}`;
  const text = await response.text().catch(() => "");
  try {
    const data = JSON.parse(text);
    if (data && data.error) {
      type = data.error.type || type;
      message = data.error.message || message;
    }
  } catch {
    if (text) message = `${message}: ${text.slice(0, 300)}`;
  }
  return new ApiError(response.status, type, message);
}

/** Fetch `path` (relative to the page) with the token; JSON back, or the Response with raw. */
async function api(path, { method = "GET", body, raw = false, headers = {} } = {}) {
  const init = { method, headers: { ...headers, Authorization: `Bearer ${state.token}` } };
  if (body !== undefined) {
    init.headers["Content-Type"] = "application/json";
    init.body = JSON.stringify(body);
  }
  let response;
  try {
    response = await fetch(path, init);
  } catch (err) {
    throw new ApiError(0, "network", `the server did not answer (${err.message})`);
  }
  if (!response.ok) {
    const error = await errorOf(response);
    if (response.status === 401) unauthorized();
    throw error;
  }
  return raw ? response : response.json();
}

/** Server-sent events of a fetch body, as {event, data} (the spec's line rules). */
async function* readSse(body) {
  const reader = body.pipeThrough(new TextDecoderStream()).getReader();
  let buffer = "";
  let event = "message";
  let data = [];
  const take = (line) => {
    if (line === "") {
      const block = data.length ? { event, data: data.join("\n") } : null;
      event = "message";
      data = [];
      return block;
    }
    if (line.startsWith(":")) return null;
    const colon = line.indexOf(":");
    const field = colon < 0 ? line : line.slice(0, colon);
    let value = colon < 0 ? "" : line.slice(colon + 1);
    if (value.startsWith(" ")) value = value.slice(1);
    if (field === "event") event = value;
    else if (field === "data") data.push(value);
    return null;
  };
  for (;;) {
    const { value, done } = await reader.read();
    if (done) break;
    buffer += value;
    // A trailing "\r" may be the first half of "\r\n": keep it for the next read.
    const cut = buffer.endsWith("\r") ? buffer.length - 1 : buffer.length;
    const lines = buffer.slice(0, cut).split(/\r\n|\r|\n/);
    buffer = lines.pop() + buffer.slice(cut);
    for (const line of lines) {
      const block = take(line);
      if (block) yield block;
    }
  }
  const last = take(buffer) || take("");
  if (last) yield last;
}

// -- the token ----------------------------------------------------------------

function tokenFromPage() {
  const params = new URLSearchParams(location.hash.slice(1));
  const given = params.get("token");
  if (given) {
    sessionStorage.setItem(TOKEN_KEY, given);
    history.replaceState(null, "", location.pathname + location.search);
    return given;
  }
  return sessionStorage.getItem(TOKEN_KEY);
}

function showTokenForm(message) {
  const form = $("#token-form");
  const error = $(".error", form);
  error.textContent = message || "";
  error.hidden = !message;
  form.hidden = false;
  $("#layout").classList.add("locked");
  $("#token-input").focus();
}

function hideTokenForm() {
  $("#token-form").hidden = true;
  $("#layout").classList.remove("locked");
}

/** A 401: forget the token, stop polling, ask for another. */
function unauthorized() {
  state.token = null;
  state.pollGeneration += 1;
  sessionStorage.removeItem(TOKEN_KEY);
  setStatus("");
  showTokenForm("The server refused this token.");
}

async function useToken(token) {
  state.token = token;
  for (;;) {
    try {
      await loadPersonas();
      break;
    } catch (err) {
      if (err.status === 401) return; // unauthorized() asks again
      if (err.status !== 503 && err.status !== 0) {
        showTokenForm(`The server answered: ${err.message}`);
        return;
      }
      setStatus(err.message); // starting, or not reachable: try again
      await sleep(2000);
      if (state.token !== token) return;
    }
  }
  setStatus("");
  sessionStorage.setItem(TOKEN_KEY, token);
  hideTokenForm();
  pollConnector();
  pollApprovals();
}

// -- personas and conversations -------------------------------------------------

async function loadPersonas() {
  const data = await api("v1/personas");
  state.personas = data.personas;
  renderPersonas();
}

function renderPersonas() {
  const list = $("#personas");
  if (!state.personas.length) {
    list.replaceChildren(el("li", { class: "empty" }, "No personas in this home"));
    return;
  }
  list.replaceChildren(
    ...state.personas.map((p) =>
      el(
        "li",
        { dataset: { name: p.name }, class: p.name === state.persona ? "selected" : "" },
        el(
          "button",
          { type: "button", onclick: () => pickPersona(p.name) },
          el("span", {
            class: p.active ? "dot active" : "dot",
            title: p.active ? "active" : "idle",
          }),
          el("span", { class: "name" }, p.name),
          el("span", { class: "description" }, p.description || ""),
        ),
      ),
    ),
  );
}

function pickPersona(name) {
  if (state.persona === name) return;
  state.persona = name;
  renderPersonas();
  $("#conversations-panel").hidden = false;
  $("#conversations").replaceChildren();
  newConversation();
  loadConversations();
}

function newConversation() {
  setConversation(`${state.persona}:web:${randomId()}`);
}

function setConversation(id) {
  state.conversation = id;
  $("#chat").dataset.persona = state.persona;
  $("#chat").dataset.conversation = id;
  $("#chat-persona").textContent = state.persona;
  $("#chat-conversation").textContent = id;
  $("#log").replaceChildren();
  for (const li of document.querySelectorAll("#conversations li")) {
    li.classList.toggle("selected", li.dataset.id === id);
  }
  updateComposer();
}

async function loadConversations() {
  const persona = state.persona;
  if (!persona) return;
  const list = $("#conversations");
  let items;
  try {
    const data = await api(`v1/personas/${seg(persona)}/conversations`);
    if (persona !== state.persona) return;
    items = data.conversations.map((c) =>
      el(
        "li",
        { dataset: { id: c.id }, class: c.id === state.conversation ? "selected" : "" },
        el(
          "button",
          { type: "button", title: c.id, onclick: () => openConversation(c.id) },
          el("span", { class: "conversation-id" }, c.id),
          el("span", { class: "meta" }, `${c.messages} message${c.messages === 1 ? "" : "s"} · ${formatTime(c.last_ts)}`),
        ),
      ),
    );
    if (!items.length) items = [el("li", { class: "empty" }, "No conversations yet")];
  } catch (err) {
    if (persona !== state.persona) return;
    items = [el("li", { class: "error" }, `Could not list the conversations: ${err.message}`)];
  }
  list.replaceChildren(...items);
}

async function openConversation(id) {
  const persona = state.persona;
  setConversation(id);
  const log = $("#log");
  try {
    const data = await api(`v1/personas/${seg(persona)}/conversations/${seg(id)}`);
    if (id !== state.conversation) return;
    renderHistory(log, data.messages);
  } catch (err) {
    if (id !== state.conversation) return;
    log.append(errorLine(`Could not load the conversation: ${err.message}`));
  }
}

function renderHistory(log, messages) {
  const tools = new Map();
  for (const m of messages) {
    if (m.kind === "user") log.append(userBubble(m.text, m.source));
    else if (m.kind === "assistant") {
      if (m.text) log.append(assistantBubble(m.text));
      for (const call of m.tool_calls || []) {
        const details = toolDetails(call.id, call.name, call.arguments);
        tools.set(call.id, details);
        log.append(details);
      }
    } else if (m.kind === "tool_result") {
      let details = tools.get(m.call_id);
      if (!details) {
        details = toolDetails(m.call_id, m.name, undefined);
        log.append(details);
      }
      finishTool(details, { result: m.content, error_kind: m.error_kind });
    }
  }
  scrollDown();
}

// -- what the log shows -----------------------------------------------------------

function userBubble(text, source = "user") {
  const bubble = el("div", { class: "msg user", dataset: { source } }, text);
  if (source && source !== "user") bubble.prepend(el("div", { class: "from" }, `from ${source}`));
  return bubble;
}

function assistantBubble(text) {
  return el("div", { class: "msg assistant" }, text);
}

function errorLine(text) {
  return el("div", { class: "msg error", role: "alert" }, text);
}

function noteLine(text) {
  return el("div", { class: "note" }, text);
}

function toolDetails(callId, name, args) {
  const summary = el(
    "summary",
    {},
    el("span", { class: "tool-name" }, name),
    el("span", { class: "tool-status" }, "running…"),
  );
  const details = el("details", { class: "tool", dataset: { callId, tool: name, state: "running" } });
  details.append(summary);
  if (args !== undefined) {
    details.append(
      el("div", { class: "label" }, "arguments"),
      el("pre", { class: "tool-args" }, formatJson(args)),
    );
  }
  return details;
}

function finishTool(details, { duration_ms, error_kind, result }) {
  details.dataset.state = "done";
  const status = $(".tool-status", details);
  status.textContent = typeof duration_ms === "number" ? `${Math.round(duration_ms)} ms` : "done";
  if (error_kind) {
    details.dataset.error = error_kind;
    status.after(el("span", { class: "tool-error" }, error_kind));
  }
  details.append(
    el("div", { class: "label" }, "result"),
    el("pre", { class: "tool-result" }, result ?? ""),
  );
}

/** Buttons that answer with their label, on `target`'s conversation (default: this one). */
function choiceButtons(buttons, target = null) {
  const row = el("div", { class: "choices" });
  const answer = async (label) => {
    if (state.streaming) return;
    for (const b of row.querySelectorAll("button")) b.disabled = true;
    if (target && (target.persona !== state.persona || target.conversation !== state.conversation)) {
      pickPersona(target.persona);
      await openConversation(target.conversation);
    }
    send(label);
  };
  for (const label of buttons) {
    row.append(el("button", { type: "button", class: "choice", onclick: () => answer(label) }, label));
  }
  return row;
}

/** A tool call waiting for a person: what it would do, and Approve / Deny / Always. */
function approvalBox(item) {
  const stateLine = el("div", { class: "approval-state" }, "waiting for your answer");
  const row = el("div", { class: "choices" });
  const box = el(
    "div",
    { class: "msg approval", "data-approval": item.approval_id },
    el("div", { class: "label" }, `${item.tool} needs your approval`),
    el("pre", { class: "approval-summary" }, item.summary),
    item.rule ? el("div", { class: "approval-rule" }, item.rule) : "",
    row,
    stateLine,
  );
  const answer = async (decision) => {
    for (const b of row.querySelectorAll("button")) b.disabled = true;
    try {
      const body = await api(`v1/approvals/${seg(item.approval_id)}`, {
        method: "POST",
        body: { decision, via: "web" },
      });
      stateLine.textContent = `${body.approval.state} (you, ${decision})`;
      row.remove();
    } catch (err) {
      stateLine.textContent = `could not answer: ${err.message}`;
      for (const b of row.querySelectorAll("button")) b.disabled = false;
    }
  };
  for (const [decision, label] of [["approve", "Approve"], ["deny", "Deny"], ["always", "Always allow"]]) {
    row.append(el("button", { type: "button", class: `choice approval-${decision}`, onclick: () => answer(decision) }, label));
  }
  return box;
}

function scrollDown() {
  const log = $("#log");
  log.scrollTop = log.scrollHeight;
}

/** One turn as it streams: text bubbles, tool calls, the reply. */
class TurnView {
  constructor(log, text) {
    this.root = el("div", { class: "turn" }, userBubble(text));
    this.bubble = null;
    this.gotText = false;
    this.tools = new Map();
    log.append(this.root);
    scrollDown();
  }

  append(node) {
    this.root.append(node);
    scrollDown();
  }

  handle(kind, item) {
    if (kind === "text_delta") {
      if (!this.bubble) {
        this.bubble = assistantBubble("");
        this.append(this.bubble);
      }
      this.bubble.append(item.text);
      this.gotText = true;
      scrollDown();
    } else if (kind === "tool_call") {
      this.bubble = null; // text after the tools is a new bubble
      const details = toolDetails(item.call_id, item.tool, item.arguments);
      this.tools.set(item.call_id, details);
      this.append(details);
    } else if (kind === "tool_result") {
      let details = this.tools.get(item.call_id);
      if (!details) {
        details = toolDetails(item.call_id, item.tool, undefined);
        this.append(details);
      }
      finishTool(details, item);
    } else if (kind === "delegation" && (item.phase === "started" || item.phase === "finished")) {
      const status = item.status ? ` (${item.status})` : "";
      this.append(noteLine(`${item.work} ${item.handle} ${item.phase}${status}`));
    } else if (kind === "approval" && item.phase === "requested") {
      // Listed by the poll first: shown here, in its turn, instead.
      $("#approvals")?.querySelector(`[data-approval="${item.approval_id}"]`)?.remove();
      this.append(approvalBox(item));
    } else if (kind === "approval" && item.phase === "decided") {
      const box = this.root.querySelector(`[data-approval="${item.approval_id}"]`);
      if (box) {
        box.querySelector(".choices")?.remove();
        const by = item.decided_by ? ` by ${item.decided_by}` : "";
        box.querySelector(".approval-state").textContent = `${item.state}${by} (${item.via})`;
      }
    } else if (kind === "todos") {
      const done = item.todos.filter((t) => t.status === "completed").length;
      this.append(noteLine(`todo list: ${done}/${item.todos.length} done`));
    } else if (kind === "reply") {
      this.finish(item);
    }
  }

  finish(reply) {
    this.replied = true;
    if (reply.question) {
      const box = el("div", { class: "msg assistant question" }, reply.question.text);
      this.append(box);
      if (reply.question.buttons?.length) this.append(choiceButtons(reply.question.buttons));
    } else if (!this.gotText && reply.text) {
      this.append(assistantBubble(reply.text));
    }
    if (reply.status === "error" || reply.status === "failed") {
      this.error(reply.error || `the turn ended with status ${reply.status}`);
    }
  }

  error(text) {
    this.replied = true;
    this.append(errorLine(`Error: ${text}`));
  }
}

// -- sending ----------------------------------------------------------------------

function updateComposer() {
  const ready = Boolean(state.persona) && !state.streaming;
  $("#send").disabled = !ready;
  $("#composer textarea").disabled = !state.persona;
  $("#chat").classList.toggle("streaming", state.streaming);
}

async function send(text) {
  text = text.trim();
  if (!text || state.streaming || !state.persona) return;
  const persona = state.persona;
  const turn = new TurnView($("#log"), text);
  state.streaming = true;
  updateComposer();
  try {
    const response = await api(`v1/personas/${seg(persona)}/messages`, {
      method: "POST",
      raw: true,
      headers: { Accept: "text/event-stream" },
      body: {
        text,
        conversation_id: state.conversation,
        session: state.session,
        connector: "web",
        stream: true,
      },
    });
    for await (const { event, data } of readSse(response.body)) {
      let item;
      try {
        item = JSON.parse(data);
      } catch {
        continue;
      }
      if (event === "error") {
        const e = item.error || {};
        turn.error(`${e.message || "the stream failed"}${e.type ? ` (${e.type})` : ""}`);
      } else {
        turn.handle(event, item);
      }
    }
    if (!turn.replied) turn.error("the stream ended without a reply");
  } catch (err) {
    turn.error(`${err.message}${err.type && err.type !== "http_error" ? ` (${err.type})` : ""}`);
  } finally {
    state.streaming = false;
    updateComposer();
    if (persona === state.persona) loadConversations();
    loadPersonas().catch(() => {});
  }
}

// -- the web connector: what personas send this tab -------------------------------

function showConnectorMessage(message) {
  const bubble = el(
    "div",
    { class: "msg connector", dataset: { persona: message.persona } },
    el("div", { class: "from" }, `message from ${message.persona}`),
    el("div", { class: "text" }, message.text),
  );
  const log = $("#log");
  // Inside the streaming turn of the same conversation, else at the end.
  const turns = log.querySelectorAll(".turn");
  const last = turns[turns.length - 1];
  const here = state.streaming && last && message.conversation_id === state.conversation;
  (here ? last : log).append(bubble);
  if (message.buttons?.length) {
    const target = { persona: message.persona, conversation: message.conversation_id };
    (here ? last : log).append(choiceButtons(message.buttons, target));
  }
  scrollDown();
}

/** Approvals of the picked persona that no turn on this page streamed: asked by
 * a coding agent it delegated to, a message sent elsewhere, another tab. */
async function pollApprovals() {
  const generation = ++state.approvalGeneration;
  while (generation === state.approvalGeneration) {
    const persona = state.persona;
    if (persona) {
      try {
        const data = await api(`v1/approvals?persona=${encodeURIComponent(persona)}`);
        const panel = approvalsPanel();
        const open = new Set(data.approvals.map((a) => a.id));
        for (const box of panel.querySelectorAll("[data-approval]")) {
          // Answered elsewhere (or expired): gone. One answered here keeps its line.
          if (!open.has(box.dataset.approval) && box.querySelector(".choices")) box.remove();
        }
        for (const a of data.approvals) {
          if (document.querySelector(`[data-approval="${a.id}"]`)) continue;
          const box = approvalBox({ approval_id: a.id, tool: a.tool, summary: a.summary, rule: a.rule });
          box.append(el("div", { class: "approval-rule" }, `conversation ${a.conversation_id}`));
          panel.append(box);
        }
      } catch (err) {
        if (err.status === 401 || generation !== state.approvalGeneration) return;
      }
    }
    await sleep(APPROVAL_POLL_MS);
  }
}

function approvalsPanel() {
  let panel = $("#approvals");
  if (!panel) {
    panel = el("div", { id: "approvals", "aria-live": "polite" });
    $("#log").before(panel);
  }
  return panel;
}

async function pollConnector() {
  const generation = ++state.pollGeneration;
  const path = `v1/connectors/web/messages?destination=${seg(state.session)}&wait=${POLL_WAIT_S}`;
  while (generation === state.pollGeneration) {
    try {
      const data = await api(path);
      for (const message of data.messages) showConnectorMessage(message);
      setStatus("");
    } catch (err) {
      if (err.status === 401 || generation !== state.pollGeneration) return;
      setStatus(`messages: ${err.message}`);
      await sleep(3000);
    }
  }
}

// -- the audit panel ----------------------------------------------------------------

const AUDIT_COLUMNS = [
  "persona",
  "turns",
  "errors",
  "input_tokens",
  "output_tokens",
  "model_latency_ms",
  "turn_ms",
];

async function loadAudit() {
  const status = $("#audit-status");
  status.className = "";
  status.textContent = "loading…";
  try {
    const data = await api("v1/audit/summary");
    $("#audit-personas tbody").replaceChildren(
      ...data.personas.map((row) =>
        el(
          "tr",
          { dataset: { persona: row.persona } },
          AUDIT_COLUMNS.map((col) => {
            const classes = [col === "persona" ? "" : "num", col === "errors" && row.errors ? "bad" : ""];
            return el("td", { dataset: { col }, class: classes.join(" ").trim() }, String(row[col] ?? ""));
          }),
        ),
      ),
    );
    $("#audit-recent tbody").replaceChildren(
      ...data.recent_turns.map((t) =>
        el(
          "tr",
          { dataset: { turn: t.turn_id, persona: t.persona } },
          el("td", {}, formatTime(t.ts)),
          el("td", {}, t.persona),
          el("td", { class: "mono" }, t.conversation_id),
          el("td", { class: t.status === "ok" ? "" : "bad" }, t.status),
          el("td", { class: "num" }, String(t.duration_ms ?? "")),
        ),
      ),
    );
    await loadUsage();
    status.textContent = `updated ${new Date().toLocaleTimeString()}`;
  } catch (err) {
    status.className = "error";
    status.textContent = err.message;
  }
}

// -- the usage table (in the audit panel) ---------------------------------------------

/** "$0.0123"; "?" when no call of the row had a price, "$0.0123 + ?" when some had none. */
function costText(row) {
  if (!row.unpriced_calls) return `$${row.cost_usd.toFixed(4)}`;
  if (row.unpriced_calls === row.calls) return "?";
  return `$${row.cost_usd.toFixed(4)} + ?`;
}

function usageRow(row, { total = false } = {}) {
  const rate = row.cache_hit_rate === null ? "" : `${(row.cache_hit_rate * 100).toFixed(1)}%`;
  const cell = (col, text, extra = "") =>
    el("td", { dataset: { col }, class: `num ${extra}`.trim() }, text);
  return el(
    "tr",
    { dataset: total ? { total: "" } : { persona: row.key } },
    el("td", { dataset: { col: "persona" } }, total ? "total" : row.key),
    cell("calls", String(row.calls)),
    cell("input_tokens", String(row.input_tokens)),
    cell("output_tokens", String(row.output_tokens)),
    cell("cache_hit_rate", rate),
    cell("cost_usd", costText(row), row.unpriced_calls ? "unpriced" : ""),
    cell("unpriced_calls", row.unpriced_calls ? String(row.unpriced_calls) : ""),
  );
}

async function loadUsage() {
  const since = $("#usage-since").value;
  const data = await api(`v1/usage?by=persona${since ? `&since=${encodeURIComponent(since)}` : ""}`);
  $("#usage-personas tbody").replaceChildren(...data.rows.map((row) => usageRow(row)));
  $("#usage-personas tfoot").replaceChildren(usageRow(data.total, { total: true }));
  const note = $("#usage-unpriced");
  note.hidden = !data.unpriced_models.length;
  note.textContent = data.unpriced_models.length
    ? `?: ${data.total.unpriced_calls} call(s) of models without a price, not in the costs: ` +
      data.unpriced_models.map((m) => `${m.provider}/${m.model} (${m.calls})`).join(", ") +
      ". Give them one under prices: in runtime.yaml."
    : "";
}

// -- the schedules panel ------------------------------------------------------------

/** "2025-01-06T09:30:00+01:00" as the wall clock it names: "2025-01-06 09:30". */
function wallClock(iso) {
  if (!iso) return "";
  return String(iso).slice(0, 16).replace("T", " ");
}

function lastOutcome(row) {
  if (!row.last_outcome) return "";
  let text = row.last_outcome;
  if (row.last_at) text += ` ${wallClock(row.last_at)}`;
  if (row.last_reason) text += `: ${row.last_reason}`;
  return text;
}

async function loadSchedules() {
  const status = $("#schedules-status");
  status.className = "";
  status.textContent = "loading…";
  try {
    const data = await api("v1/schedules");
    const broken = new Set(data.errors.map((e) => e.persona));
    $("#schedules-zone").textContent =
      `Times are in each entry's zone; the runtime's zone is ${data.timezone}.`;
    $("#schedules-table tbody").replaceChildren(
      ...data.entries.map((row) => {
        const failed = row.last_outcome === "failed" || row.last_outcome === "missed";
        const error = row.error || (broken.has(row.persona) ? "schedules.yaml: see below" : "");
        return el(
          "tr",
          { dataset: { persona: row.persona, entry: row.name, kind: row.kind } },
          el("td", {}, row.persona),
          el("td", { class: "mono" }, row.name),
          el("td", {}, row.kind),
          el("td", {}, row.schedule),
          el("td", { dataset: { col: "next" } }, `${wallClock(row.next_fire)} ${row.tz}`.trim()),
          el("td", { dataset: { col: "last" }, class: failed ? "bad" : "" }, lastOutcome(row)),
          el("td", { dataset: { col: "paused" } }, row.paused ? "paused" : ""),
          el("td", { dataset: { col: "error" }, class: error ? "bad" : "" }, error),
        );
      }),
    );
    $("#schedules-errors").replaceChildren(
      ...data.errors.map((e) =>
        el(
          "li",
          { class: "error", dataset: { persona: e.persona } },
          `${e.path}: ${e.entry}: ${e.field}: ${e.message} (the previous schedule stays in force)`,
        ),
      ),
    );
    status.textContent = data.entries.length
      ? `updated ${new Date().toLocaleTimeString()}`
      : "no heartbeats, cron entries or reminders";
  } catch (err) {
    status.className = "error";
    status.textContent = err.message;
  }
}

const PANELS = { chat: null, audit: loadAudit, schedules: loadSchedules };

function showTab(name) {
  for (const [panel, load] of Object.entries(PANELS)) {
    const shown = panel === name;
    $(`#${panel}`).hidden = !shown;
    $(`#tab-${panel}`).setAttribute("aria-selected", String(shown));
    if (shown && load) load();
  }
}

// -- start ----------------------------------------------------------------------------

function wire() {
  $("#token-form").addEventListener("submit", (event) => {
    event.preventDefault();
    const token = $("#token-input").value.trim();
    if (token) useToken(token);
  });
  $("#composer").addEventListener("submit", (event) => {
    event.preventDefault();
    const box = $("#composer textarea");
    if (state.streaming || !box.value.trim()) return;
    const text = box.value;
    box.value = "";
    send(text);
  });
  $("#composer textarea").addEventListener("keydown", (event) => {
    if (event.key === "Enter" && !event.shiftKey && !event.isComposing) {
      event.preventDefault();
      $("#composer").requestSubmit();
    }
  });
  $("#new-conversation").addEventListener("click", () => {
    if (state.persona) newConversation();
  });
  $("#tab-chat").addEventListener("click", () => showTab("chat"));
  $("#tab-audit").addEventListener("click", () => showTab("audit"));
  $("#tab-schedules").addEventListener("click", () => showTab("schedules"));
  $("#audit-refresh").addEventListener("click", loadAudit);
  $("#usage-since").addEventListener("change", loadAudit);
  $("#schedules-refresh").addEventListener("click", loadSchedules);
  // A #token=… pasted into the open tab changes only the fragment: no reload.
  window.addEventListener("hashchange", () => {
    const given = new URLSearchParams(location.hash.slice(1)).get("token");
    if (given) useToken(tokenFromPage());
  });
}

wire();
const token = tokenFromPage();
if (token) useToken(token);
else showTokenForm();
