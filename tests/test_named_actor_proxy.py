"""A persona reaches the Scheduler actor through a proxy that makes the
actor's handle at the first call: Ray imports an actor's class module (and
what it imports) wherever a handle to it is made, so a persona that never
gets a fire nor sets a reminder does not hold the scheduler's engine, store
and actor modules in its memory (issue 41; docs/benchmarks.md)."""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import ray

from coterie import Runtime
from coterie.actors import persona_actor_name
from coterie.actors._ray import NamedActorProxy
from coterie.runtime.errors import ActorLostError
from tests.helpers import scripted, write_persona

pytestmark = [pytest.mark.ray, pytest.mark.usefixtures("ray_session")]

#: What a handle to the Scheduler actor loads in the process that makes it.
SCHEDULER_MODULES = (
    "coterie.actors.scheduler",
    "coterie.runtime.fires",
    "coterie.runtime.schedule.engine",
    "coterie.runtime.schedule.store",
)


@ray.remote(num_cpus=0)
class Echo:
    def echo(self, value: int) -> int:
        return value


def test_the_handle_is_made_at_the_first_call_and_kept() -> None:
    actor = Echo.options(name="proxy-echo", namespace="proxy-tests").remote()  # type: ignore[attr-defined]
    try:
        ray.get(actor.echo.remote(0))
        proxy = NamedActorProxy("proxy-echo", "proxy-tests")
        assert proxy._handle is None
        assert asyncio.run(proxy.echo(7)) == 7
        handle = proxy._handle
        assert handle is not None
        assert asyncio.run(proxy.echo(8)) == 8
        assert proxy._handle is handle
    finally:
        ray.kill(actor)


def test_a_name_no_actor_holds_fails_at_the_call_as_unreachable() -> None:
    proxy = NamedActorProxy("proxy-nobody", "proxy-tests")  # no error yet
    with pytest.raises(ActorLostError, match="proxy-nobody"):
        asyncio.run(proxy.echo(1))
    with pytest.raises(AttributeError):
        proxy.__deepcopy__  # noqa: B018  (not the actor's: never a handle lookup)


def loaded_in(actor: object, names: tuple[str, ...]) -> list[str]:
    """Which of ``names`` the actor's process has imported. The probe is a
    lambda so that Ray sends it by value: a function of this module would be
    sent by reference, and importing this module there loads coterie's API."""
    probe = lambda self: [name for name in names if name in sys.modules]  # noqa: E731
    return list(ray.get(actor.__ray_call__.remote(probe)))  # type: ignore[attr-defined]


@pytest.fixture
def rt(tmp_path: Path) -> Iterator[Runtime]:
    rules = [
        {
            "when": {"contains": "my reminders", "tool_result": False},
            "tool_calls": [{"name": "remind", "arguments": {"action": "list"}}],
        },
        {"when": {"tool_result": True}, "text": "listed them"},
    ]
    write_persona(tmp_path, "keeper", scripted(rules, default="hello"))
    runtime = Runtime.start(home=tmp_path)
    try:
        yield runtime
    finally:
        runtime.shutdown()


def test_a_persona_loads_the_schedulers_modules_only_once_it_uses_it(rt: Runtime) -> None:
    assert rt.ask("keeper", "hi").text == "hello"
    persona = ray.get_actor(persona_actor_name(rt.id, "keeper"), namespace=rt.namespace)
    assert loaded_in(persona, SCHEDULER_MODULES) == []
    reply = rt.ask("keeper", "what are my reminders?")
    assert (reply.status, reply.text) == ("ok", "listed them")
    assert loaded_in(persona, SCHEDULER_MODULES) == list(SCHEDULER_MODULES)
