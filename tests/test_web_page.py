"""The chat page of ``coterie serve`` in a real browser (Chromium via Playwright).

A real ``coterie serve`` runs on the session's Ray with scripted personas; the
page is driven the way a person would: the token, the persona list, a
streamed turn with a tool call, an error, the web connector, a question's
buttons, the conversation list and the audit panel.
"""

from __future__ import annotations

import os
import re
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from playwright import sync_api

from coterie.runtime.serve.discovery import ServerState
from tests.helpers import write_persona
from tests.serving import running_server

Browser = sync_api.Browser
Page = sync_api.Page
expect = sync_api.expect

pytestmark = [pytest.mark.ray, pytest.mark.usefixtures("ray_session")]

CHROMIUM = os.environ.get("COTERIE_CHROMIUM") or shutil.which("chromium") or "/usr/bin/chromium"
WAIT_MS = 30_000
# The guide's picture: COTERIE_SCREENSHOT=docs/images/serve-page.png
# refreshes it; by default the test saves its screenshot under its tmp_path.
SCREENSHOT_ENV = "COTERIE_SCREENSHOT"


def model(rules: list[dict[str, Any]], default: str = "ok", **extra: Any) -> dict[str, Any]:
    """A scripted model that streams its text in small, spaced pieces."""
    return {
        "provider": "scripted",
        "rules": rules,
        "default": default,
        "stream_chunk_chars": 3,
        "stream_delay_ms": 30,
        **extra,
    }


def write_personas(home: Path) -> None:
    calc = [
        {
            "when": {"turn": 1},
            "tool_calls": [{"name": "calculate", "arguments": {"expression": "6*7"}}],
        },
        {"when": {"turn": 2}, "text": "The answer is {last_tool_result}."},
    ]
    write_persona(home, "calc", {"description": "does arithmetic", "model": model(calc)})
    # The model takes longer than its timeout: every turn ends in an error.
    slow = model([], latency_ms=5000, timeout=0.5)
    write_persona(home, "broken", {"description": "a model that times out", "model": slow})
    herald = [
        {
            "when": {"turn": 1},
            "tool_calls": [{"name": "reply_to_origin", "arguments": {"text": "On my way!"}}],
        },
        {"when": {"turn": 2}, "text": "Done."},
    ]
    write_persona(home, "herald", {"description": "writes ahead", "model": model(herald)})
    ask = {
        "name": "ask_user",
        "arguments": {"question": "Red or blue?", "buttons": ["red", "blue"]},
    }
    asker = [
        {"when": {"turn": 1, "contains": "pick"}, "tool_calls": [ask]},
        {"text": "You said: {input}"},
    ]
    write_persona(home, "asker", {"description": "asks back", "model": model(asker)})
    write_persona(home, "ghost", {"description": "about to vanish", "model": model([])})
    # Writes outside its workspace only with a person's approval.
    write_note = {
        "name": "file_write",
        "arguments": {"path": "../notes/{input}.md", "content": "noted"},
    }
    guard = [
        {"when": {"tool_result": False}, "tool_calls": [write_note]},
        {"when": {"tool_result": True}, "text": "Wrote it: {last_tool_result}"},
    ]
    write_persona(
        home,
        "guard",
        {
            "description": "asks before writing outside its workspace",
            "model": model(guard),
            "access": "full",
            "permissions": {
                "rules": [{"tool": "file_write", "match": "!{workspace}", "action": "ask"}]
            },
        },
    )
    # Schedules for the schedules panel: one in force, one file that does not load.
    standup = {"name": "standup", "cron": "0 9 * * 1-5", "tz": "Europe/Paris", "prompt": "hi"}
    clockwork = write_persona(home, "clockwork", {"description": "keeps time", "model": model([])})
    (clockwork / "schedules.yaml").write_text(yaml.safe_dump({"cron": [standup]}))
    mangled = write_persona(home, "mangled", {"description": "a bad schedule", "model": model([])})
    (mangled / "schedules.yaml").write_text("cron:\n  - name: nightly\n    cron: '61 * * * *'\n")


@pytest.fixture(scope="module")
def home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    home = tmp_path_factory.mktemp("web-home")
    write_personas(home)
    return home


@pytest.fixture(scope="module")
def server(home: Path, ray_session: None) -> Iterator[ServerState]:
    with running_server(home) as state:
        yield state


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    if not Path(CHROMIUM).exists():
        message = f"no Chromium at {CHROMIUM} (apt-get install chromium, or set $COTERIE_CHROMIUM)"
        if os.environ.get("CI"):
            pytest.fail(message)  # CI must not pass by skipping the browser tests
        pytest.skip(message)
    with sync_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM)
        yield browser
        browser.close()


@pytest.fixture
def page(browser: Any) -> Iterator[Any]:
    context = browser.new_context(viewport={"width": 1280, "height": 800})
    page = context.new_page()
    page.set_default_timeout(WAIT_MS)
    expect.set_options(timeout=WAIT_MS)
    errors: list[str] = []
    page.on("pageerror", lambda exc: errors.append(f"uncaught: {exc}"))
    page.on(
        "console",
        lambda msg: (
            errors.append(f"console: {msg.text}")
            if msg.type == "error" and "Content Security Policy" in msg.text
            else None
        ),
    )
    yield page
    context.close()
    assert not errors, errors


def open_page(page: Any, server: ServerState, persona: str | None = None) -> None:
    page.goto(f"{server.url}/#token={server.token}")
    expect(page.locator("#personas li[data-name=calc]")).to_be_visible()
    if persona is not None:
        pick(page, persona)


def pick(page: Any, name: str) -> None:
    page.locator(f"#personas li[data-name={name}]").click()
    expect(page.locator(f"#personas li[data-name={name}]")).to_have_class("selected")
    expect(page.locator("#chat-persona")).to_have_text(name)


def send(page: Any, text: str) -> None:
    page.locator("#composer textarea").fill(text)
    page.locator("#send").click()


def last(page: Any, selector: str) -> Any:
    return page.locator(selector).last


def turn_done(page: Any) -> None:
    expect(page.locator("#send")).to_be_enabled()


# Records every distinct text of the newest assistant bubble, and whether
# the send button was disabled at that moment.
WATCH_ASSISTANT = """() => {
  window.__seen = [];
  const log = document.querySelector("#log");
  const record = () => {
    const bubbles = log.querySelectorAll(".msg.assistant");
    if (!bubbles.length) return;
    const text = bubbles[bubbles.length - 1].textContent;
    const seen = window.__seen;
    if (!seen.length || seen[seen.length - 1].text !== text) {
      seen.push({ text, sendDisabled: document.querySelector("#send").disabled });
    }
  };
  const watch = { childList: true, subtree: true, characterData: true };
  new MutationObserver(record).observe(log, watch);
}"""


def test_streamed_turn_with_a_tool_call(page: Any, server: ServerState, tmp_path: Path) -> None:
    open_page(page, server)
    assert "token" not in page.url, "the token stays out of the address bar"
    for name, description in [("calc", "does arithmetic"), ("broken", "a model that times out")]:
        item = page.locator(f"#personas li[data-name={name}]")
        expect(item.locator(".description")).to_have_text(description)
        expect(item.locator(".dot")).to_have_count(1)
    pick(page, "calc")
    page.evaluate(WATCH_ASSISTANT)
    send(page, "What is six times seven?")
    expect(last(page, ".msg.user")).to_have_text("What is six times seven?")
    answer = last(page, ".msg.assistant")
    expect(answer).to_have_text("The answer is 42.")
    turn_done(page)

    seen = page.evaluate("window.__seen")
    final = "The answer is 42."
    partials = [s["text"] for s in seen if s["text"] and s["text"] != final]
    assert len(partials) > 1, f"the text did not stream: {seen}"
    assert all(final.startswith(p) for p in partials), seen
    assert all(s["sendDisabled"] for s in seen), f"send was enabled mid-turn: {seen}"

    tool = page.locator("details.tool", has_text="calculate")
    expect(tool).to_have_count(1)
    expect(tool).to_have_attribute("data-state", "done")
    assert tool.get_attribute("open") is None, "a tool call is folded by default"
    expect(tool.locator("summary")).to_contain_text("calculate")
    expect(tool.locator(".tool-error")).to_have_count(0)
    expect(tool.locator("pre.tool-result")).to_be_hidden()
    tool.locator("summary").click()
    expect(tool.locator("pre.tool-args")).to_contain_text("6*7")
    expect(tool.locator("pre.tool-result")).to_be_visible()
    expect(tool.locator("pre.tool-result")).to_have_text("42")

    shot = Path(os.environ.get(SCREENSHOT_ENV) or tmp_path / "serve-page.png")
    shot.parent.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(shot), full_page=True)
    assert shot.stat().st_size > 0


def test_a_failed_turn_shows_its_error(page: Any, server: ServerState) -> None:
    open_page(page, server, "broken")
    send(page, "hello?")
    error = page.locator("#log .error")
    expect(error).to_be_visible()
    expect(error).to_contain_text("did not answer within 0.5s")
    turn_done(page)
    expect(page.locator("#log .msg.assistant")).to_have_count(0)


def test_the_token_form(page: Any, server: ServerState) -> None:
    page.goto(server.url)
    form = page.locator("#token-form")
    expect(form).to_be_visible()
    page.locator("#token-input").fill("not-the-right-token-at-all")
    page.locator("#token-submit").click()
    expect(form.locator(".error")).to_be_visible()
    expect(form.locator(".error")).to_contain_text("refused")
    expect(form).to_be_visible()
    expect(page.locator("#personas li[data-name=calc]")).to_have_count(0)

    page.locator("#token-input").fill(server.token)
    page.locator("#token-submit").click()
    expect(form).to_be_hidden()
    expect(page.locator("#personas li[data-name=calc]")).to_be_visible()
    # The tab remembers it.
    page.reload()
    expect(page.locator("#personas li[data-name=herald]")).to_be_visible()
    expect(form).to_be_hidden()


def test_the_audit_panel(page: Any, server: ServerState) -> None:
    open_page(page, server, "calc")
    send(page, "and again?")
    expect(last(page, ".msg.assistant")).to_have_text("The answer is 42.")
    turn_done(page)
    page.locator("#tab-audit").click()
    expect(page.locator("#audit")).to_be_visible()
    expect(page.locator("#chat")).to_be_hidden()
    row = page.locator("#audit-personas tr[data-persona=calc]")
    expect(row).to_be_visible()
    assert int(row.locator("td[data-col=turns]").inner_text()) >= 1
    assert int(row.locator("td[data-col=output_tokens]").inner_text()) >= 1
    expect(page.locator("#audit-recent tr[data-persona=calc]").first).to_be_visible()
    # Cost by the persona that pays: a scripted model is priced at 0, so no flag.
    usage = page.locator("#usage-personas tbody tr[data-persona=calc]")
    expect(usage).to_be_visible()
    assert int(usage.locator("td[data-col=calls]").inner_text()) >= 2
    expect(usage.locator("td[data-col=cost_usd]")).to_have_text("$0.0000")
    expect(usage.locator("td[data-col=cache_hit_rate]")).to_have_text(re.compile(r"^\d+\.\d%$"))
    expect(page.locator("#usage-personas tfoot tr[data-total] td[data-col=persona]")).to_have_text(
        "total"
    )
    expect(page.locator("#usage-unpriced")).to_be_hidden()
    page.locator("#usage-since").select_option("24h")
    expect(page.locator("#audit-status")).to_contain_text("updated")
    expect(usage).to_be_visible()
    page.locator("#audit-refresh").click()
    expect(page.locator("#audit-status")).to_contain_text("updated")
    expect(row).to_be_visible()
    page.locator("#tab-chat").click()
    expect(page.locator("#chat")).to_be_visible()


def test_the_audit_panel_flags_calls_without_a_price(page: Any, server: ServerState) -> None:
    """A model without a price: its cost is "?", never $0, and the note names it."""
    from coterie.runtime.usage.report import UnpricedModel, UsageQuery, UsageReport, UsageRow

    def row(key: str, calls: int, cost: float, unpriced: int) -> UsageRow:
        sums = {"input_tokens": 1000 * calls, "output_tokens": 10, "cache_write_tokens": 0}
        return UsageRow.of(
            key, calls=calls, cache_read_tokens=500, cost_usd=cost, unpriced_calls=unpriced, **sums
        )

    rows = [row("ada", 3, 0.5, 1), row("bob", 2, 0.0, 2)]
    report = UsageReport(
        by="persona",
        group_label="the persona that pays",
        since=None,
        timezone="UTC",
        rows=rows,
        total=row("total", 5, 0.5, 3),
        by_caller=[],
        unpriced_models=[UnpricedModel(provider="openai", model="mystery-1", calls=3)],
    )
    assert UsageQuery().by == report.by  # what the page asks for
    page.route(
        re.compile(r"/v1/usage\b"),
        lambda route: route.fulfill(json=report.model_dump(mode="json")),
    )
    open_page(page, server)
    page.locator("#tab-audit").click()
    cost = "td[data-col=cost_usd]"
    expect(page.locator(f"#usage-personas tr[data-persona=ada] {cost}")).to_have_text("$0.5000 + ?")
    expect(page.locator(f"#usage-personas tr[data-persona=bob] {cost}")).to_have_text("?")
    expect(page.locator(f"#usage-personas tr[data-persona=bob] {cost}")).to_have_class(
        re.compile("unpriced")
    )
    expect(
        page.locator("#usage-personas tr[data-persona=ada] td[data-col=cache_hit_rate]")
    ).to_have_text("16.7%")
    note = page.locator("#usage-unpriced")
    expect(note).to_be_visible()
    expect(note).to_contain_text("3 call(s) of models without a price")
    expect(note).to_contain_text("openai/mystery-1 (3)")
    expect(note).to_contain_text("prices: in runtime.yaml")


def test_the_conversation_list_reloads_history(page: Any, server: ServerState) -> None:
    open_page(page, server, "calc")
    conversation = page.locator("#chat").get_attribute("data-conversation")
    assert conversation is not None and conversation.startswith("calc:web:")
    send(page, "Six sevens?")
    expect(last(page, ".msg.assistant")).to_have_text("The answer is 42.")
    turn_done(page)
    item = page.locator(f'#conversations li[data-id="{conversation}"]')
    expect(item).to_be_visible()

    page.locator("#new-conversation").click()
    expect(page.locator("#log .msg")).to_have_count(0)
    assert page.locator("#chat").get_attribute("data-conversation") != conversation
    item.click()
    expect(item).to_have_class("selected")
    expect(page.locator("#log .msg.user")).to_have_text(["Six sevens?"])
    expect(page.locator("#log .msg.assistant")).to_have_text(["The answer is 42."])
    tool = page.locator("#log details.tool[data-state=done]")
    expect(tool).to_have_count(1)
    expect(tool.locator("summary")).to_contain_text("calculate")
    tool.locator("summary").click()
    expect(tool.locator("pre.tool-result")).to_have_text("42")


def test_web_connector_messages(page: Any, server: ServerState) -> None:
    open_page(page, server, "herald")
    send(page, "go")
    message = page.locator("#log .msg.connector")
    expect(message).to_be_visible()
    expect(message.locator(".from")).to_have_text("message from herald")
    expect(message.locator(".text")).to_have_text("On my way!")
    expect(last(page, ".msg.assistant")).to_have_text("Done.")
    turn_done(page)


def test_question_buttons_answer(page: Any, server: ServerState) -> None:
    open_page(page, server, "asker")
    send(page, "pick a colour for me")
    expect(last(page, ".msg.assistant")).to_have_text("Red or blue?")
    buttons = page.locator("#log .choices button")
    expect(buttons).to_have_text(["red", "blue"])
    turn_done(page)
    buttons.filter(has_text="blue").click()
    expect(last(page, ".msg.user")).to_have_text("blue")
    # The persona hears the press as the answer to its question.
    answer = re.compile(r'^You said: \[answer to your question "Red or blue\?"\] blue$')
    expect(last(page, ".msg.assistant")).to_have_text(answer)
    turn_done(page)
    expect(buttons.first).to_be_disabled()


def test_an_approval_is_answered_with_its_buttons(
    page: Any, server: ServerState, home: Path, tmp_path: Path
) -> None:
    open_page(page, server, "guard")
    send(page, "plan")
    box = page.locator("#log .msg.approval")
    expect(box).to_be_visible()
    expect(box.locator(".label")).to_have_text("file_write needs your approval")
    note = home / "personas" / "guard" / "notes" / "plan.md"
    expect(box.locator(".approval-summary")).to_have_text(f"write {note}")
    expect(box.locator(".approval-rule")).to_contain_text("ask file_write '!{workspace}'")
    expect(box.locator("button")).to_have_text(["Approve", "Deny", "Always allow"])
    assert not note.exists()
    # The guide's picture of an approval: COTERIE_APPROVAL_SCREENSHOT=docs/images/approval.png
    shot = Path(os.environ.get("COTERIE_APPROVAL_SCREENSHOT") or tmp_path / "approval.png")
    shot.parent.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(shot), full_page=True)
    box.locator("button.approval-approve").click()
    expect(box.locator(".approval-state")).to_contain_text("approved")
    expect(last(page, ".msg.assistant")).to_contain_text("Wrote it:")
    turn_done(page)
    assert note.read_text() == "noted"
    # A denial: the model reads permission_denied and nothing is written.
    send(page, "secret")
    second = page.locator("#log .msg.approval").last
    second.locator("button.approval-deny").click()
    expect(second.locator(".approval-state")).to_contain_text("denied")
    expect(last(page, ".msg.assistant")).to_contain_text("permission_denied")
    turn_done(page)
    assert not (home / "personas" / "guard" / "notes" / "secret.md").exists()


def test_an_approval_no_turn_on_the_page_streamed_shows_too(
    page: Any, server: ServerState, home: Path
) -> None:
    """Asked by a turn someone else started (another client, a delegation):
    the page lists the picked persona's pending approvals."""
    import json
    import urllib.request

    request = urllib.request.Request(
        f"{server.url}/v1/personas/guard/messages",
        data=json.dumps({"text": "elsewhere", "conversation_id": "g-api", "wait": False}).encode(),
        method="POST",
        headers={"Authorization": f"Bearer {server.token}"},
    )
    with urllib.request.urlopen(request, timeout=30) as response:
        assert response.status == 202
    open_page(page, server, "guard")
    box = page.locator("#approvals .msg.approval")
    expect(box).to_be_visible()
    expect(box.locator(".approval-summary")).to_contain_text("notes/elsewhere.md")
    expect(box).to_contain_text("conversation g-api")
    box.locator("button.approval-deny").click()
    expect(box.locator(".approval-state")).to_contain_text("denied")
    assert not (home / "personas" / "guard" / "notes" / "elsewhere.md").exists()


def test_text_is_never_markup(page: Any, server: ServerState) -> None:
    open_page(page, server, "asker")
    text = '<img src=x onerror="window.__pwned=1"><b>bold</b>'
    send(page, text)
    expect(last(page, ".msg.assistant")).to_contain_text(text)
    turn_done(page)
    expect(last(page, ".msg.user")).to_have_text(text)
    expect(page.locator("#log img, #log b")).to_have_count(0)
    assert page.evaluate("window.__pwned") is None


def test_an_http_error_shows(page: Any, server: ServerState, home: Path) -> None:
    open_page(page, server, "ghost")
    config = home / "personas" / "ghost" / "persona.yaml"
    hidden = config.with_suffix(".off")
    config.rename(hidden)  # the page still lists it; the server no longer knows it
    try:
        send(page, "are you there?")
        error = page.locator("#log .error")
        expect(error).to_be_visible()
        expect(error).to_contain_text("ghost")
        expect(error).to_contain_text("unknown_persona")
        turn_done(page)
    finally:
        hidden.rename(config)


def test_the_schedules_panel(page: Any, server: ServerState) -> None:
    open_page(page, server)
    page.locator("#tab-schedules").click()
    expect(page.locator("#schedules")).to_be_visible()
    expect(page.locator("#chat")).to_be_hidden()
    row = page.locator("#schedules-table tr[data-persona=clockwork][data-entry=standup]")
    expect(row).to_be_visible()
    expect(row.locator("td").nth(2)).to_have_text("cron")
    # The next fire is a weekday 09:00 on Paris's wall clock, named with its zone.
    expect(row.locator("td[data-col=next]")).to_have_text(
        re.compile(r"^\d{4}-\d\d-\d\d 09:00 Europe/Paris$")
    )
    expect(page.locator("#schedules-zone")).to_contain_text("the runtime's zone is UTC")
    error = page.locator("#schedules-errors li[data-persona=mangled]")
    expect(error).to_contain_text("schedules.yaml")
    expect(error).to_contain_text("nightly")
    expect(error).to_contain_text("cron")
    page.locator("#schedules-refresh").click()
    expect(page.locator("#schedules-status")).to_contain_text("updated")
    page.locator("#tab-chat").click()
    expect(page.locator("#chat")).to_be_visible()
    expect(page.locator("#schedules")).to_be_hidden()
