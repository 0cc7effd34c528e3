"""The AuditLog actor on a real (local) Ray cluster: naming, the persona-side
buffer wired to it, and a killed source losing nothing. The log's own logic is
tested without Ray in tests/test_audit_log.py."""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import ray

from coterie.actors._ray import audit_buffer_for
from coterie.actors.audit import get_or_create_audit_log
from coterie.runtime.audit import AuditLogStats, event_to_row
from coterie.runtime.messages import HistoryAppended, ModelCalled, UserMessage

pytestmark = [pytest.mark.ray, pytest.mark.usefixtures("ray_session")]


def rows(n: int, *, persona: str = "scribe", conversation_id: str = "c1") -> list[dict[str, Any]]:
    return [
        event_to_row(
            ModelCalled(
                persona=persona,
                conversation_id=conversation_id,
                turn_id="t",
                provider="openai",
                model="m",
                step=1,
                latency_ms=1.0,
                input_tokens=i,
            )
        )
        for i in range(n)
    ]


@pytest.fixture
def make_log(tmp_path: Path) -> Any:
    """Creates uniquely named audit log actors; kills them afterwards."""
    handles: list[Any] = []

    def make(**kwargs: Any) -> Any:
        handle = get_or_create_audit_log(
            str(tmp_path / "home" / "audit.duckdb"), name=f"audit-{uuid.uuid4().hex}", **kwargs
        )
        handles.append(handle)
        return handle

    yield make
    for handle in handles:
        ray.kill(handle)


def stats(log: Any) -> AuditLogStats:
    result: AuditLogStats = ray.get(log.stats.remote())
    return result


def wait_for(predicate: Callable[[], bool], timeout: float = 5.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.05)
    return predicate()


def count(log: Any) -> int:
    result = ray.get(log.query.remote("SELECT count(*) FROM events"))
    return int(result.rows[0][0])


def test_get_or_create_returns_the_same_actor(make_log: Any, tmp_path: Path) -> None:
    name = f"audit-{uuid.uuid4().hex}"
    a = get_or_create_audit_log(str(tmp_path / "a.duckdb"), name=name)
    try:
        b = get_or_create_audit_log(str(tmp_path / "other.duckdb"), name=name)
        assert ray.get(a.append.remote(rows(2))) == 2  # acknowledged: written
        assert stats(b).rows_written == 2
        assert stats(b).path == str(tmp_path / "a.duckdb")
    finally:
        ray.kill(a)


async def test_audit_buffer_into_actor(make_log: Any) -> None:
    log = make_log()
    buf = audit_buffer_for(log, max_events=100, interval=60)
    for i in range(1050):
        buf.record(
            HistoryAppended(
                persona="scribe",
                conversation_id="c1",
                turn_id="t",
                message=UserMessage(text=str(i)),
            )
        )
    await buf.aclose()
    assert (buf.events_sent, buf.failures, buf.dropped) == (1050, 0, 0)
    history = await log.history.remote("scribe", "c1")
    assert [m.text for m in history] == [str(i) for i in range(1050)]


async def test_killed_persona_process_loses_no_row(make_log: Any, tmp_path: Path) -> None:
    log = make_log()
    spool = str(tmp_path / "spool" / "scribe.jsonl")

    @ray.remote(num_cpus=0)
    class Recorder:
        """Stands in for a persona actor."""

        def __init__(self, log: Any, spool: str) -> None:
            # Takes over what a killed predecessor left in the spool, if any.
            self.buffer = audit_buffer_for(log, spool_path=spool, interval=60)

        async def record(self, batch: list[dict[str, Any]]) -> None:
            for row in batch:
                self.buffer.record(ModelCalled.model_validate_json(row["payload"]))

        async def flush(self) -> int:
            await self.buffer.flush()
            return self.buffer.events_sent

    def dead(handle: Any) -> bool:
        try:
            ray.get(handle.flush.remote())
        except ray.exceptions.RayActorError:
            return True
        return False

    recorder = Recorder.remote(log, spool)  # type: ignore[attr-defined]
    ray.get(recorder.record.remote(rows(20)))
    assert ray.get(recorder.flush.remote()) == 20
    ray.get(recorder.record.remote(rows(30)))  # the next flush is 60 s away
    ray.kill(recorder)  # SIGKILLs the worker process
    assert wait_for(lambda: dead(recorder))
    # The successor: here the driver, to spare the test a ~1 s worker start; a
    # restarted Recorder runs the same line in __init__.
    successor = audit_buffer_for(log, spool_path=spool, interval=60)
    assert successor.recovered == 30
    await successor.aclose()
    assert successor.events_sent == 30
    result = await log.query.remote("SELECT count(*), count(DISTINCT id) FROM events")
    assert result.rows == [(50, 50)]
    assert not Path(spool).exists()
