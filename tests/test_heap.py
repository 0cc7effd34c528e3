"""The heap trimmer: a quiet persona gives back what its turns freed, once,
without a timer while it stays idle or busy (runtime.heap)."""

from __future__ import annotations

import asyncio

from coterie.runtime.heap import HeapTrimmer, malloc_trim
from coterie.runtime.loop import TurnResult
from coterie.runtime.persona import Batch, ConversationQueues, PersonaHost
from coterie.runtime.services import NullAudit
from tests.test_persona_parts import env


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_glibc_trim_is_found_here_and_runs() -> None:
    trim = malloc_trim()
    assert trim is not None  # this machine's Python runs on glibc
    assert trim() in (0, 1)


async def test_a_quiet_process_is_trimmed_once_after_the_pause() -> None:
    done: list[int] = []
    heap = HeapTrimmer(lambda: done.append(1), quiet_for=0.05, every=0.0)
    heap.quiet()
    heap.quiet()  # a second quiet while one is pending schedules nothing more
    assert heap.pending
    await asyncio.sleep(0.15)
    assert (done, heap.trims, heap.pending) == ([1], 1, False)


async def test_work_before_the_pause_ends_cancels_the_trim() -> None:
    done: list[int] = []
    heap = HeapTrimmer(lambda: done.append(1), quiet_for=0.05)
    heap.quiet()
    heap.busy()
    assert not heap.pending
    await asyncio.sleep(0.15)
    assert done == []


async def test_trims_are_spaced_by_every() -> None:
    clock = Clock()
    done: list[float] = []
    heap = HeapTrimmer(lambda: done.append(clock.now), quiet_for=0.01, every=30.0, clock=clock)
    heap.quiet()
    await asyncio.sleep(0.05)
    assert done == [100.0]
    clock.now = 110.0  # 10 s later: the next trim waits until 30 s after the last
    heap.quiet()
    assert heap._timer is not None
    assert 19.0 < heap._timer.when() - asyncio.get_running_loop().time() <= 20.0
    heap.busy()


async def test_without_a_trim_nothing_is_scheduled_and_a_failing_one_costs_no_turn() -> None:
    none = HeapTrimmer(None, quiet_for=0.01)
    none.quiet()
    assert not none.pending

    def broken() -> None:
        raise OSError("no")

    heap = HeapTrimmer(broken, quiet_for=0.01, every=0.0)
    heap.quiet()
    await asyncio.sleep(0.05)
    assert heap.trims == 1 and not heap.pending


class Gate:
    """A turn that waits until released."""

    def __init__(self) -> None:
        self.release = asyncio.Event()
        self.started = 0

    async def run(self, batch: Batch) -> tuple[TurnResult, str]:
        self.started += 1
        await self.release.wait()
        return TurnResult(text="ok"), f"t{self.started}"


async def test_the_queues_call_quiet_once_the_last_conversation_is_done() -> None:
    calls: list[str] = []

    class Recorder(HeapTrimmer):
        def quiet(self) -> None:
            calls.append("quiet")

        def busy(self) -> None:
            calls.append("busy")

    async def answered(batch: Batch, result: TurnResult) -> None:
        return None

    turn = Gate()
    q = ConversationQueues(
        "solo",
        host=PersonaHost(heap=Recorder(None)),
        audit=NullAudit(),
        run_turn=turn.run,
        answered=answered,
    )
    one = q.accept(env("a"), wait=True)
    other = env("b").model_copy(update={"conversation_id": "solo:d"})
    two = q.accept(other, wait=True)
    await asyncio.sleep(0.01)
    assert (turn.started, calls) == (2, ["busy"])  # one busy for both
    turn.release.set()
    await asyncio.gather(one.future, two.future)
    await asyncio.sleep(0.01)
    assert calls == ["busy", "quiet"]  # quiet only once both were done
    q.accept(env("c"), wait=False)
    await asyncio.sleep(0.01)
    assert calls == ["busy", "quiet", "busy", "quiet"]
