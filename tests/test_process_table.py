"""ProcessTable without Ray or real processes: ids, spares, lost slots, cleanup.

Fake slots stand in for ShellProcess actors; tests/test_processes.py and
tests/test_shell_actor.py run real commands through real slots.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest

from coterie.runtime.errors import ToolError
from coterie.runtime.shell import (
    ProcessOutput,
    ProcessStatus,
    ProcessTable,
    SignalResult,
    StartSpec,
)


class FakeSlot:
    """Records its life; ``gone`` makes every call fail as a dead actor would."""

    made = 0

    def __init__(self, *, fail_start: bool = False) -> None:
        FakeSlot.made += 1
        self.number = FakeSlot.made
        self.fail_start = fail_start
        self.pid_id: str | None = None
        self.running = False
        self.closed = self.discarded = self.gone = False

    def _check(self) -> None:
        if self.gone:
            raise ToolError("not_running", "the process's actor is gone")

    def _status(self) -> ProcessStatus:
        return ProcessStatus(id=self.pid_id or "?", command="x", running=self.running)

    async def start(self, spec: StartSpec, pid_id: str) -> ProcessStatus:
        if self.fail_start:
            raise OSError("no such executable")
        self.pid_id, self.running = pid_id, True
        return self._status()

    async def wait(self, timeout: float | None) -> bool:
        self._check()
        return not self.running

    async def status(self) -> ProcessStatus:
        self._check()
        return self._status()

    async def read(self, since: int | None = None) -> ProcessOutput:
        self._check()
        return ProcessOutput(**self._status().model_dump(), chunk="out", next_offset=3)

    async def write(self, data: bytes) -> int:
        self._check()
        return len(data)

    async def signal(self, name: str) -> SignalResult:
        self._check()
        return SignalResult(**self._status().model_dump(), signal=name, delivered=True)

    async def close(self) -> ProcessStatus:
        self._check()
        self.closed, self.running = True, False
        return self._status()

    async def discard(self) -> None:
        self.discarded = True


SPEC = StartSpec(command="x", argv=["/bin/true"], cwd="/", env={})


def recording(made: list[FakeSlot]) -> Callable[[], FakeSlot]:
    """A slot factory that keeps every slot it makes in ``made``."""

    def make() -> FakeSlot:
        made.append(FakeSlot())
        return made[-1]

    return make


async def test_ids_address_their_slots_and_unknown_ids_are_not_found() -> None:
    made: list[FakeSlot] = []
    table = ProcessTable(recording(made), bwrap=None)
    a, b = await table.start(SPEC), await table.start(SPEC)
    assert a != b and a.startswith("bg_") and len(table) == 2
    assert (await table.status(a)).id == a
    assert (await table.read(b)).chunk == "out"
    assert (await table.signal(a, "term")).delivered
    assert await table.running()
    removed = await table.remove(a)
    assert not removed.running and made[0].closed and made[0].discarded
    for call in (table.status(a), table.remove(a), table.write(a, b"x")):
        with pytest.raises(ToolError) as err:
            await call
        assert err.value.kind == "not_found" and "process action=list" in err.value.detail


async def test_spares_are_made_after_the_first_start_and_discarded_at_close() -> None:
    made: list[FakeSlot] = []
    table = ProcessTable(recording(made), bwrap=None, spares=1)
    assert made == []  # nothing until a command runs
    await table.start(SPEC)
    assert len(made) == 2  # the slot in use and one warm spare
    await table.start(SPEC)  # takes the spare, makes the next
    assert len(made) == 3 and made[1].pid_id is not None and made[2].pid_id is None
    await table.close()
    assert all(slot.discarded for slot in made) and len(table) == 0


async def test_a_slot_that_fails_to_start_is_discarded() -> None:
    slot = FakeSlot(fail_start=True)
    table = ProcessTable(lambda: slot, bwrap=None)
    with pytest.raises(OSError):
        await table.start(SPEC)
    assert slot.discarded and len(table) == 0


async def test_a_lost_slot_is_listed_as_lost_and_can_be_removed() -> None:
    made: list[FakeSlot] = []
    table = ProcessTable(recording(made), bwrap=None)
    pid = await table.start(SPEC)
    made[0].gone = True
    [listed] = await table.list()
    assert (listed.id, listed.lost, listed.running) == (pid, True, False)
    assert not await table.running()
    removed = await table.remove(pid)
    assert removed.lost and made[0].discarded


def test_sandbox_choice() -> None:
    def never() -> FakeSlot:
        raise AssertionError("no slot should be made")

    assert not ProcessTable(never, bwrap=None).sandboxed
    table = ProcessTable(never, bwrap="/usr/bin/bwrap")
    assert table.sandboxed
    with pytest.raises(ValueError, match="spares"):
        ProcessTable(never, spares=-1)
