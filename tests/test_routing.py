"""The router's logic without Ray: roster, activation, passivation, the
caller-side directory, the idle watcher and transient retries."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any, Literal

import pytest

from coterie.runtime import tracing
from coterie.runtime.config import RuntimeSettings, load_settings
from coterie.runtime.errors import (
    ActorLostError,
    ConfigError,
    DeliveryError,
    PersonaConfigError,
    PersonaPassivatedError,
    UnknownPersonaError,
)
from coterie.runtime.messages import MessageEnvelope, PersonaStats, ReplyEnvelope, TurnStarted
from coterie.runtime.routing import Directory, IdleWatcher, Roster, Router, retry_transient
from tests.helpers import scripted, write_persona


class Handle:
    """A fake actor handle: a name and an id."""

    def __init__(self, name: str, number: int) -> None:
        self.name = name
        self.id = f"{name}#{number}"
        self.alive = True
        self.flushed = 0
        self.shut_down = False


class FakeHost:
    """A PersonaHost that records what the router asked of it."""

    def __init__(self) -> None:
        self.started: list[str] = []
        self.stopped: list[str] = []
        self.gate: asyncio.Event | None = None
        self.fail_next: BaseException | None = None
        self.ready = True
        self.rosters: list[list[tuple[str, str]]] = []
        self.hung: set[str] = set()  # personas whose activity never answers
        self.starting: set[str] = set()  # inside start() now
        self.most_starting = 0

    async def start(self, name: str, roster: list[tuple[str, str]]) -> Handle:
        self.started.append(name)
        self.rosters.append(roster)
        self.starting.add(name)
        self.most_starting = max(self.most_starting, len(self.starting))
        try:
            if self.gate is not None:
                await self.gate.wait()
            if self.fail_next is not None:
                error, self.fail_next = self.fail_next, None
                raise error
            return Handle(name, len(self.started))
        finally:
            self.starting.discard(name)

    async def deliver(self, handle: Handle, data: str) -> str:
        if not handle.alive:
            raise ActorLostError("gone")
        envelope = MessageEnvelope.model_validate_json(data)
        return ReplyEnvelope(
            reply_to=envelope.id,
            sender=handle.name,
            conversation_id=envelope.conversation_id,
            turn_id="t",
            text=f"{handle.name} got {envelope.text}",
        ).model_dump_json()

    async def prepare_passivation(self, handle: Handle, idle_timeout: float) -> bool:
        if not handle.alive:
            raise ActorLostError("gone")
        return self.ready

    async def flush(self, handle: Handle) -> None:
        handle.flushed += 1

    async def shutdown(self, handle: Handle) -> None:
        handle.shut_down = True

    def stop(self, handle: Handle) -> None:
        handle.alive = False
        self.stopped.append(handle.id)

    def actor_id(self, handle: Handle) -> str:
        return handle.id

    async def activity(self, handle: Handle) -> PersonaStats:
        if not handle.alive:
            raise ActorLostError("gone")
        if handle.name in self.hung:
            await asyncio.sleep(3600)
        return PersonaStats(
            name=handle.name,
            conversations=1,
            turns_running=0,
            queued=handle.flushed,
            delegations_running=0,
            turns_run=3,
            idle_seconds=0.0,
        )


@pytest.fixture
def home(tmp_path: Path) -> Path:
    write_persona(tmp_path, "ana", scripted(description="ana's job"))
    write_persona(tmp_path, "bo", scripted(description="bo's job"))
    return tmp_path


async def until(condition: Callable[[], bool], deadline: float = 10.0) -> None:
    """Yield to the loop until ``condition()`` holds (fails after ``deadline`` s)."""
    loop = asyncio.get_running_loop()
    end = loop.time() + deadline
    while not condition():
        assert loop.time() < end, "condition not reached in time"
        await asyncio.sleep(0.001)


def router(home: Path, **kw: Any) -> tuple[Router[Handle], FakeHost]:
    host = FakeHost()
    kw.setdefault("idle_timeout", 10.0)
    return Router(home, host, **kw), host


# -- the roster ----------------------------------------------------------------


def test_roster_rereads_a_description_only_when_its_file_changes(home: Path) -> None:
    roster = Roster(home)
    assert roster.entries() == [("ana", "ana's job"), ("bo", "bo's job")]
    path = home / "personas" / "ana" / "persona.yaml"
    path.write_text(path.read_text().replace("ana's job", "new job"))
    # Same mtime as cached (written within the same tick) would hide it: bump it.
    stat = path.stat()
    import os

    os.utime(path, (stat.st_atime, stat.st_mtime + 5))
    assert roster.description("ana") == "new job"
    assert roster.entries(limit=1) == [("ana", "new job")]


def test_roster_skips_broken_personas_and_forgets_removed_ones(home: Path) -> None:
    import shutil

    roster = Roster(home)
    roster.entries()
    (home / "personas" / "bo" / "persona.yaml").write_text("model: {provider: gemini}")
    assert roster.description("bo") is None
    assert roster.entries() == [("ana", "ana's job")]
    shutil.rmtree(home / "personas" / "ana")
    assert roster.refresh() == ["bo"]
    assert not roster.knows("ana")
    write_persona(home, "cy", scripted())
    assert roster.knows("cy")  # looks again once before saying no


def test_roster_reads_only_new_or_changed_files_after_a_refresh(
    home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import coterie.runtime.routing.roster as roster_module

    roster = Roster(home)
    assert roster.entries() == [("ana", "ana's job"), ("bo", "bo's job")]
    read: list[str] = []
    real = roster_module.parse_persona_config

    def counting(yaml_path: str, data: bytes) -> Any:
        read.append(Path(yaml_path).parent.name)
        return real(yaml_path, data)

    monkeypatch.setattr(roster_module, "parse_persona_config", counting)
    write_persona(home, "al", scripted(description="al's job"))  # sorts before ana
    (home / "personas" / "notes.txt").write_text("not a persona")
    (home / "personas" / "empty").mkdir()  # no persona.yaml: not a persona
    assert roster.refresh() == ["al", "ana", "bo"] and len(roster) == 3
    assert roster.entries() == [("al", "al's job"), ("ana", "ana's job"), ("bo", "bo's job")]
    # The rows moved by the insertion kept their descriptions.
    assert read == ["al"]
    assert roster.page(1, 1) == [("ana", "ana's job")]
    assert read == ["al"]
    assert not roster.knows("empty")


def test_the_roster_reads_nothing_for_a_name_that_is_not_a_persona_name(home: Path) -> None:
    roster = Roster(home)
    # A persona file outside <home>/personas, reachable by a name with "..".
    write_persona(home / "outside", "x", scripted(description="not in this home"))
    assert (home / "personas" / ".." / "outside" / "personas" / "x" / "persona.yaml").is_file()
    assert roster.description("../outside/personas/x") is None
    assert roster.description("Ana") is None  # not a valid name either
    # Files the roster cannot use are skipped, not raised.
    (home / "personas" / "bo" / "persona.yaml").write_bytes(b"description: caf\xe9\n")
    assert roster.description("bo") is None
    assert roster.description("ana") == "ana's job"


def test_a_refresh_during_a_read_does_not_put_a_description_in_another_row(
    home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import os

    import coterie.runtime.routing.roster as roster_module

    roster = Roster(home)
    # Same mtime for both files: a misplaced row would pass the freshness check.
    for name in ("ana", "bo"):
        os.utime(home / "personas" / name / "persona.yaml", (1_700_000_000, 1_700_000_000))
    real = roster_module.parse_persona_config

    def refreshed_meanwhile(yaml_path: str, data: bytes) -> Any:
        if Path(yaml_path).parent.name == "bo":  # the router's loop refreshes meanwhile
            write_persona(home, "al", scripted(description="al's job"))
            roster.refresh()
        return real(yaml_path, data)

    monkeypatch.setattr(roster_module, "parse_persona_config", refreshed_meanwhile)
    assert roster.description("bo") == "bo's job"
    monkeypatch.setattr(roster_module, "parse_persona_config", real)
    assert roster.entries() == [("al", "al's job"), ("ana", "ana's job"), ("bo", "bo's job")]


# -- activation ------------------------------------------------------------------


async def test_concurrent_resolves_start_one_actor(home: Path) -> None:
    r, host = router(home)
    host.gate = asyncio.Event()
    waiters = [asyncio.ensure_future(r.resolve("ana")) for _ in range(5)]
    await until(lambda: host.started == ["ana"])  # the start is waiting on the gate
    assert r.activating("ana")
    host.gate.set()
    handles = await asyncio.gather(*waiters)
    assert host.started == ["ana"]
    assert len({h.id for h in handles}) == 1
    assert await r.resolve("ana") is handles[0]
    assert r.active() == ["ana"]
    # Every actor starts with the roster of valid personas.
    assert host.rosters == [[("ana", "ana's job"), ("bo", "bo's job")]]


async def test_stopping_a_persona_stops_a_start_under_way_too(home: Path) -> None:
    r, host = router(home)
    host.gate = asyncio.Event()
    waiter = asyncio.ensure_future(r.resolve("ana"))
    await until(lambda: host.started == ["ana"])
    stopping = asyncio.ensure_future(r.stop("ana"))
    await asyncio.sleep(0)
    host.gate.set()
    old = await waiter
    assert await stopping is True
    # The actor that started from the old definition is gone; a new one comes.
    assert host.stopped == [old.id] and old.shut_down and r.active() == []
    assert (await r.resolve("ana")).id != old.id
    assert await r.stop("bo") is False


async def test_a_waiter_that_gives_up_does_not_cancel_the_start(home: Path) -> None:
    r, host = router(home)
    host.gate = asyncio.Event()
    first = asyncio.ensure_future(r.resolve("ana"))
    second = asyncio.ensure_future(r.resolve("ana"))
    await until(lambda: host.started == ["ana"])  # both wait on the gated start
    first.cancel()
    host.gate.set()
    handle = await second
    assert first.cancelled()
    assert host.started == ["ana"] and r.active() == ["ana"]
    assert await r.resolve("ana") is handle


async def test_starts_beyond_the_limit_wait_their_turn(home: Path) -> None:
    for name in ("cy", "di"):
        write_persona(home, name, scripted())
    r, host = router(home, start_limit=2)
    host.gate = asyncio.Event()
    names = ["ana", "bo", "cy", "di"]
    resolves = [asyncio.ensure_future(r.resolve(n)) for n in names]
    await until(lambda: len(host.starting) == 2)
    for _ in range(20):
        await asyncio.sleep(0)  # the other two have every chance to start too
    assert len(host.started) == 2
    waiting = set(names) - host.starting
    status = await r.status()
    assert set(status.waiting_to_start) == waiting and status.start_limit == 2
    assert status.activating == names  # starting or waiting, all of them
    host.gate.set()
    handles = await asyncio.gather(*resolves)
    assert [h.name for h in handles] == names
    assert sorted(host.started) == names and host.most_starting == 2
    assert (await r.status()).waiting_to_start == []


async def test_a_pinned_persona_does_not_wait_for_a_start_slot(home: Path) -> None:
    pinned = {**scripted(), "placement": {"resources": {"gpu_box": 1}, "start_timeout": 5}}
    write_persona(home, "gpu", pinned)
    r, host = router(home, start_limit=1)
    host.gate = asyncio.Event()
    first = asyncio.ensure_future(r.resolve("ana"))  # takes the only slot
    await until(lambda: host.starting == {"ana"})
    queued = asyncio.ensure_future(r.resolve("bo"))
    gpu = asyncio.ensure_future(r.resolve("gpu"))
    await until(lambda: "gpu" in host.starting)
    assert host.starting == {"ana", "gpu"} and (await r.status()).waiting_to_start == ["bo"]
    host.gate.set()
    assert [h.name for h in await asyncio.gather(first, queued, gpu)] == ["ana", "bo", "gpu"]


async def test_a_failed_or_abandoned_start_gives_its_slot_back(home: Path) -> None:
    r, host = router(home, start_limit=1)
    host.fail_next = ActorLostError("no worker")
    with pytest.raises(ActorLostError):
        await r.resolve("ana")
    # A caller that stops waiting does not stop the start, nor keep its slot.
    host.gate = asyncio.Event()
    waiter = asyncio.ensure_future(r.resolve("ana"))
    await until(lambda: host.starting == {"ana"})
    waiter.cancel()
    host.gate.set()
    assert (await asyncio.wait_for(r.resolve("bo"), 5)).name == "bo"
    assert r.active() == ["ana", "bo"]


def test_a_start_limit_below_one_is_refused(home: Path) -> None:
    with pytest.raises(ValueError, match="start_limit must be at least 1"):
        router(home, start_limit=0)


def test_runtime_yaml_sets_how_many_personas_start_at_a_time(tmp_path: Path) -> None:
    assert RuntimeSettings().max_starting_personas is None  # the cluster's CPUs
    (tmp_path / "runtime.yaml").write_text("max_starting_personas: 3\n", encoding="utf-8")
    assert load_settings(tmp_path).max_starting_personas == 3
    for bad in ("0", "-2", "lots"):
        (tmp_path / "runtime.yaml").write_text(f"max_starting_personas: {bad}\n", encoding="utf-8")
        with pytest.raises(ConfigError, match=r"runtime.yaml: max_starting_personas: "):
            load_settings(tmp_path)


async def test_unknown_and_broken_personas_are_refused_before_starting(home: Path) -> None:
    r, host = router(home)
    with pytest.raises(UnknownPersonaError, match="known personas: ana, bo"):
        await r.resolve("ghost")
    (home / "personas" / "bo" / "persona.yaml").write_text("model: {provider: gemini}")
    with pytest.raises(PersonaConfigError, match="gemini"):
        await r.resolve("bo")
    assert host.started == []


async def test_a_failed_start_reaches_every_waiter_and_the_next_resolve_retries(
    home: Path,
) -> None:
    r, host = router(home)
    host.gate = asyncio.Event()
    host.fail_next = RuntimeError("no worker")
    waiters = [asyncio.ensure_future(r.resolve("ana")) for _ in range(3)]
    await until(lambda: host.started == ["ana"])
    host.gate.set()
    results = await asyncio.gather(*waiters, return_exceptions=True)
    assert [(type(x), str(x)) for x in results] == [(RuntimeError, "no worker")] * 3
    assert not r.activating("ana") and r.active() == []
    handle = await r.resolve("ana")
    assert host.started == ["ana", "ana"] and handle.alive


async def test_deliver_through_the_router_turns_a_dead_actor_into_an_error_reply(
    home: Path,
) -> None:
    r, _ = router(home)
    envelope = MessageEnvelope(recipient="ana", conversation_id="ana:x", text="hi")
    reply = ReplyEnvelope.model_validate_json(await r.deliver(envelope.model_dump_json()))
    assert (reply.text, reply.reply_to) == ("ana got hi", envelope.id)
    (await r.resolve("ana")).alive = False
    reply = ReplyEnvelope.model_validate_json(await r.deliver(envelope.model_dump_json()))
    assert reply.status == "error" and "persona 'ana' failed" in (reply.error or "")


# -- passivation -----------------------------------------------------------------


async def test_passivation_stops_an_idle_actor_and_remembers_it(home: Path) -> None:
    r, host = router(home)
    handle = await r.resolve("ana")
    host.ready = False  # busy: it says no
    assert not await r.passivate("ana")
    assert r.active() == ["ana"] and host.stopped == []
    host.ready = True
    assert await r.passivate("ana")
    assert r.active() == [] and host.stopped == [handle.id]
    assert r.was_passivated(handle.id)
    assert not r.was_passivated("someone-else")
    # The next message starts a new actor.
    again = await r.resolve("ana")
    assert again.id != handle.id


async def test_passivation_of_a_dead_actor_and_when_switched_off(home: Path) -> None:
    r, _host = router(home)
    handle = await r.resolve("ana")
    handle.alive = False  # it crashed: nothing to ask, still forgotten
    assert await r.passivate("ana") and r.active() == []
    off, _ = router(home, idle_timeout=None)
    await off.resolve("bo")
    assert not await off.passivate("bo")
    assert not await r.passivate("never-started")


async def test_passivated_ids_are_bounded(home: Path) -> None:
    r, _ = router(home, passivated_cap=2)
    ids = []
    for _ in range(3):
        ids.append((await r.resolve("ana")).id)
        assert await r.passivate("ana")
    assert [r.was_passivated(i) for i in ids] == [False, True, True]


async def test_flush_and_stop_all(home: Path) -> None:
    r, _host = router(home)
    ana, bo = await r.resolve("ana"), await r.resolve("bo")
    assert await r.flush_all() == 2 and (ana.flushed, bo.flushed) == (1, 1)
    stranger = Handle("cy", 99)  # found by name, started by an earlier router
    assert await r.stop_all({"cy": stranger}) == 3
    assert all(h.shut_down and not h.alive for h in (ana, bo, stranger))
    assert r.active() == []


async def test_personas_listing(home: Path) -> None:
    r, _ = router(home)
    await r.resolve("bo")
    listing = await r.personas()
    assert [(p.name, p.description, p.active) for p in listing] == [
        ("ana", "ana's job", False),
        ("bo", "bo's job", True),
    ]


# -- the directory ---------------------------------------------------------------


class FakeLink:
    """A PersonaLink over a Router of fake handles; failures are scripted."""

    def __init__(self, r: Router[Handle]) -> None:
        self.router = r
        self.router_down = 0  # calls to the router that fail before it answers
        self.refuse: list[BaseException] = []  # raised by the next persona calls
        self.calls: list[tuple[str, str]] = []
        self.resolves = 0
        self.die_mid_stream = False

    async def call_router(self, method: str, *args: Any) -> Any:
        if self.router_down:
            self.router_down -= 1
            raise ActorLostError("router restarting")
        if method == "resolve":
            self.resolves += 1
            return await self.router.resolve(*args)
        if method == "was_passivated":
            return self.router.was_passivated(*args)
        raise AssertionError(method)

    async def call(self, handle: Handle, method: Literal["handle", "post"], data: str) -> Any:
        self.calls.append((handle.id, method))
        if self.refuse:
            raise self.refuse.pop(0)
        if not handle.alive:
            raise ActorLostError("actor died")
        return await self.router.host.deliver(handle, data)

    async def ping(self, handle: Handle) -> None:
        return None

    def actor_id(self, handle: Handle) -> str:
        return handle.id

    async def stream(self, handle: Handle, data: str) -> AsyncIterator[str]:
        self.calls.append((handle.id, "stream"))
        if self.refuse:
            raise self.refuse.pop(0)
        if not handle.alive:
            raise ActorLostError("actor died")
        envelope = MessageEnvelope.model_validate_json(data)
        yield TurnStarted(
            persona=handle.name, conversation_id=envelope.conversation_id, turn_id="t"
        ).model_dump_json()
        if self.die_mid_stream:
            raise ActorLostError("actor died mid-turn")
        yield await self.router.host.deliver(handle, data)


async def no_sleep(seconds: float) -> None:
    return None


def envelope(text: str = "hi") -> MessageEnvelope:
    return MessageEnvelope(recipient="ana", conversation_id="ana:d", text=text)


async def test_directory_caches_handles_and_delivers_directly(home: Path) -> None:
    r, host = router(home)
    link = FakeLink(r)
    d: Directory[Handle] = Directory(link, sleep=no_sleep)
    assert (await d.ask(envelope("one"), timeout=5)).text == "ana got one"
    assert (await d.ask(envelope("two"), timeout=5)).text == "ana got two"
    assert host.started == ["ana"] and len(link.calls) == 2


async def test_directory_resends_after_a_passivation(home: Path) -> None:
    r, host = router(home)
    link = FakeLink(r)
    d: Directory[Handle] = Directory(link, sleep=no_sleep)
    await d.ask(envelope(), timeout=5)
    # Closing when the message arrived: not taken, resolve again and resend.
    link.refuse = [PersonaPassivatedError("closing")]
    assert (await d.ask(envelope("again"), timeout=5)).text == "ana got again"
    # Stopped while idle, before the message reached it: resend too.
    assert await r.passivate("ana")
    assert (await d.ask(envelope("later"), timeout=5)).text == "ana got later"
    assert host.started == ["ana", "ana"]
    # Each refused or lost delivery was sent once more, to the new handle.
    assert link.calls == [("ana#1", "handle")] * 4 + [("ana#2", "handle")]


async def test_directory_reports_a_persona_that_died_with_the_message(home: Path) -> None:
    r, host = router(home)
    link = FakeLink(r)
    d: Directory[Handle] = Directory(link, sleep=no_sleep)
    await d.ask(envelope(), timeout=5)
    link.refuse = [ActorLostError("killed mid-turn")]
    with pytest.raises(DeliveryError, match="died while handling the message"):
        await d.ask(envelope("doomed"), timeout=5)
    # Not resent: it may have run (part of) the turn, and no new actor started.
    assert link.calls == [("ana#1", "handle")] * 2
    assert host.started == ["ana"]
    assert link.refuse == []


async def test_directory_gives_up_on_a_persona_that_keeps_passivating(home: Path) -> None:
    r, _ = router(home)
    link = FakeLink(r)
    d: Directory[Handle] = Directory(link, sleep=no_sleep)
    link.refuse = [PersonaPassivatedError("closing")] * 3
    with pytest.raises(PersonaPassivatedError):
        await d.post(envelope())
    # Three attempts, each after resolving the persona again; every refusal used.
    assert link.calls == [("ana#1", "post")] * 3
    assert link.resolves == 3
    assert link.refuse == []


async def test_directory_waits_out_a_router_restart_then_gives_up(home: Path) -> None:
    r, _ = router(home)
    link = FakeLink(r)
    slept: list[float] = []

    async def sleep(seconds: float) -> None:
        slept.append(seconds)

    d: Directory[Handle] = Directory(link, router_wait=2.0, sleep=sleep)
    link.router_down = 4
    assert (await d.ask(envelope(), timeout=5)).text == "ana got hi"
    assert slept == [0.05, 0.1, 0.2, 0.4]  # doubling backoff
    link.router_down = 1000
    d.forget("ana")
    with pytest.raises(DeliveryError, match="the router is unavailable"):
        await d.ask(envelope(), timeout=5)
    # Doubling from 0.05 s again, capped at 1 s, until 2 s were waited.
    assert slept[4:] == [0.05, 0.1, 0.2, 0.4, 0.8, 1.0]


async def test_directory_handle_cache_is_bounded(home: Path) -> None:
    r, _ = router(home)
    link = FakeLink(r)
    d: Directory[Handle] = Directory(link, cache_size=1, sleep=no_sleep)
    await d.resolve("ana")
    await d.resolve("ana")  # cached
    assert link.resolves == 1
    await d.resolve("bo")  # evicts ana
    await d.resolve("ana")  # asks the router again
    await d.resolve("ana")  # cached again
    assert link.resolves == 3


# -- the idle watcher and retries ------------------------------------------------


async def test_idle_watcher_asks_once_idle_and_survives_failures() -> None:
    idle = [0.0]
    asked: list[float] = []
    state = {"stopped": False, "fail": True}

    async def on_idle() -> None:
        asked.append(idle[0])
        if state["fail"]:
            state["fail"] = False
            raise DeliveryError("router restarting")
        state["stopped"] = True

    async def tick(seconds: float) -> None:
        idle[0] += seconds

    watcher = IdleWatcher(
        idle_for=lambda: idle[0],
        on_idle=on_idle,
        idle_timeout=8.0,
        stopped=lambda: state["stopped"],
        sleep=tick,
    )
    assert watcher.tick == 2.0
    await asyncio.wait_for(watcher.run(), 5)
    assert asked == [8.0, 10.0]  # not before 8 s idle; again after the failure
    assert (watcher.requests, watcher.failures) == (2, 1)


async def test_retry_transient_retries_only_what_is_transient() -> None:
    attempts: list[int] = []
    slept: list[float] = []

    async def sleep(seconds: float) -> None:
        slept.append(seconds)

    async def flaky() -> str:
        attempts.append(1)
        if len(attempts) < 3:
            raise ConnectionError("not yet")
        return "done"

    assert await retry_transient(flaky, transient=(ConnectionError,), sleep=sleep) == "done"
    assert len(attempts) == 3
    assert slept == [0.1, 0.2]  # a doubling delay before each retry

    broken_calls: list[int] = []

    async def broken() -> str:
        broken_calls.append(1)
        raise ValueError("a bug")

    slept.clear()
    with pytest.raises(ValueError, match="a bug"):
        await retry_transient(broken, transient=(ConnectionError,), sleep=sleep)
    assert len(broken_calls) == 1  # not transient: never called again
    assert slept == []
    attempts.clear()

    async def never() -> str:
        attempts.append(1)
        raise ConnectionError("down")

    with pytest.raises(ConnectionError, match="down"):
        await retry_transient(never, transient=(ConnectionError,), attempts=4, sleep=sleep)
    assert len(attempts) == 4
    assert slept == [0.1, 0.2, 0.4]  # none after the last attempt


async def test_a_restarted_router_adopts_the_running_actors(home: Path) -> None:
    r, host = router(home)
    running = Handle("ana", 7)  # started by the router before it restarted
    assert r.adopt({"ana": running}) == 1
    assert r.adopt({"ana": Handle("ana", 8)}) == 0  # what it has, it keeps
    assert await r.resolve("ana") is running and host.started == []
    assert await r.flush_all() == 1 and running.flushed == 1
    assert await r.passivate("ana") and host.stopped == [running.id]


async def test_status_reports_active_personas_and_skips_hung_ones(home: Path) -> None:
    write_persona(home, "bo", scripted(description="bo"))
    r, host = router(home)
    await r.resolve("ana")
    await r.resolve("bo")
    host.hung.add("bo")
    status = await r.status(timeout=0.05)
    assert status.registered == 2
    assert [s.name for s in status.active] == ["ana"] and status.active[0].turns_run == 3
    assert status.unresponsive == ["bo"] and status.activating == []
    assert status.connectors == [] and status.outbound_waiting == {}


async def test_directory_stream_resends_after_a_passivation(home: Path) -> None:
    r, _host = router(home)
    link = FakeLink(r)
    d: Directory[Handle] = Directory(link, sleep=no_sleep)
    link.refuse = [PersonaPassivatedError("closing")]
    items = [item async for item in d.stream(envelope("streamed"))]
    assert [i.kind for i in items] == ["turn_started", "reply"]
    assert isinstance(items[-1], ReplyEnvelope) and items[-1].text == "ana got streamed"
    assert [m for _, m in link.calls] == ["stream", "stream"]


async def test_directory_stream_reports_a_persona_lost_mid_turn(home: Path) -> None:
    r, _host = router(home)
    link = FakeLink(r)
    d: Directory[Handle] = Directory(link, sleep=no_sleep)
    link.die_mid_stream = True
    seen: list[str] = []
    with pytest.raises(DeliveryError, match="died while handling the message"):
        async for item in d.stream(envelope()):
            seen.append(item.kind)
    assert seen == ["turn_started"]  # not resent: events had already flowed
    assert [m for _, m in link.calls] == ["stream"]


async def test_personas_are_listed_by_pages(home: Path) -> None:
    for name in ("bo", "cy", "di"):
        write_persona(home, name, scripted(description=f"{name}'s job"))
    (home / "personas" / "cy" / "persona.yaml").write_text("model: [broken")
    r, _host = router(home)
    everyone = await r.personas()
    assert [p.name for p in everyone] == ["ana", "bo", "di"]  # cy is invalid: left out
    assert r.count() == 4
    assert [p.name for p in await r.personas(0, 2)] == ["ana", "bo"]
    # The page is over names: the invalid one makes it shorter, not shifted.
    assert [p.name for p in await r.personas(2, 2)] == ["di"]
    assert await r.personas(10, 5) == []
    assert (await r.personas(1, 1))[0].description == "bo's job"


# -- tracing ---------------------------------------------------------------------


async def test_starting_a_persona_is_a_span_under_the_caller_that_needed_it(
    home: Path, spans: Any
) -> None:
    r, host = router(home, start_limit=1)
    d: Directory[Handle] = Directory(FakeLink(r), sleep=no_sleep)
    host.gate = asyncio.Event()
    host.fail_next = RuntimeError("no worker")
    caller = tracing.tracer().start("execute_tool ask_persona")
    with tracing.active(caller):
        first = asyncio.ensure_future(d.ask(envelope("one"), timeout=5))
        second = asyncio.ensure_future(r.resolve("bo"))  # no caller's context: a trace of its own
        await until(lambda: host.started == ["ana"])
        host.gate.set()
        with pytest.raises(RuntimeError, match="no worker"):
            await first
        assert (await second).name == "bo"
        # The next message starts ana again; once up, it is not started (nor traced) again.
        assert (await d.ask(envelope("two"), timeout=5)).text == "ana got two"
        assert (await d.ask(envelope("three"), timeout=5)).text == "ana got three"
    caller.end()
    tracing.tracer().flush()
    finished = spans.get_finished_spans()
    starts = [s for s in finished if s.name.startswith("activate_persona ")]
    assert sorted(s.name for s in starts) == [
        "activate_persona ana",
        "activate_persona ana",
        "activate_persona bo",
    ]
    asked = caller.span_id
    under = [s for s in starts if s.parent and format(s.parent.span_id, "016x") == asked]
    assert sorted((s.name, s.status.is_ok) for s in under) == [
        ("activate_persona ana", False),
        ("activate_persona ana", True),
    ]
    failed = next(s for s in under if not s.status.is_ok)
    assert failed.attributes["error.type"] == "RuntimeError"
    (bo,) = [s for s in starts if s.name == "activate_persona bo"]
    assert bo.parent is None
    # bo waited for the one start slot that ana's first start held.
    assert bo.attributes["coterie.activation.waited_ms"] > 0
