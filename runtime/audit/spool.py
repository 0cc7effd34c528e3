"""The audit buffer's write-ahead file (the *spool*): its line format, reading
it back, and opening it under an exclusive lock.
"""

from __future__ import annotations

import fcntl
import io
import json
import os
import time
from datetime import UTC, datetime
from pathlib import Path

from coterie.runtime.audit.rows import EVENT_COLUMNS, Row, event_row
from coterie.runtime.errors import AuditSpoolInUseError
from coterie.runtime.messages import turn_event_adapter

# One spool line per row: its id and seq, its span's ids when it was traced,
# then the event as recorded, verbatim (the row's payload). Every other column
# derives from the event, so the line is lossless, and writing it costs no JSON
# encoding: the payload already is JSON (without raw newlines: JSON escapes
# them in strings), the ids are hex.
_EVENT_KEY = ',"event":'


def spool_line(row: Row) -> bytes:
    trace_id, span_id = row["trace_id"], row["span_id"]
    trace = f',"trace":"{trace_id}/{span_id}"' if trace_id and span_id else ""
    head = f'{{"id":"{row["id"]}","seq":{row["seq"]}{trace}'
    return f"{head}{_EVENT_KEY}{row['payload']}}}\n".encode()


def _spool_row(line: bytes) -> Row:
    """The row a spool line holds; ValueError if it is not a whole line."""
    head, sep, rest = line.decode().partition(_EVENT_KEY)
    if not sep or not rest.endswith("}"):
        raise ValueError("not a spool line")
    meta = json.loads(head + "}")
    row_id, seq, payload = meta.get("id"), meta.get("seq"), rest[:-1]
    if not isinstance(row_id, str) or not isinstance(seq, int):
        raise ValueError("spool line without id or seq")
    trace_id, _, span_id = str(meta.get("trace") or "").partition("/")
    trace = (trace_id or None, span_id or None)
    try:
        event = turn_event_adapter.validate_json(payload)
    except ValueError:
        # Written by another version of the event models: keep the event with
        # the columns every event has rather than lose it.
        return _raw_row(row_id, seq, payload, trace)
    return event_row(event, row_id, seq, payload, trace)


def _raw_row(row_id: str, seq: int, payload: str, trace: tuple[str | None, str | None]) -> Row:
    data = json.loads(payload)
    row: Row = dict.fromkeys(EVENT_COLUMNS)
    try:
        row["ts"] = datetime.fromtimestamp(data["ts"], UTC)
        for column in ("kind", "persona", "conversation_id", "turn_id"):
            row[column] = str(data[column])
    except (KeyError, TypeError, OverflowError) as exc:
        raise ValueError(f"unreadable spooled event: {exc!r}") from exc
    row.update(id=row_id, seq=seq, payload=payload, trace_id=trace[0], span_id=trace[1])
    return row


def read_spool(path: Path) -> tuple[list[Row], int, int]:
    """The rows in a spool, the size of its whole lines, and how many lines were bad."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return [], 0, 0
    # A last line without its newline was torn by a kill mid-write: its
    # record() never returned, so it is not part of the log.
    end = data.rfind(b"\n") + 1
    rows: list[Row] = []
    bad = 0
    for line in data[:end].split(b"\n")[:-1]:
        try:
            rows.append(_spool_row(line))
        except ValueError:
            bad += 1
    return rows, end, bad


#: Seconds a new buffer waits for a spool still locked by a process on its way out.
LOCK_WAIT = 2.0


def open_spool(path: Path, *, lock_wait: float = LOCK_WAIT) -> io.FileIO:
    """Open the spool for appending, locked against any other buffer.

    Two buffers on one spool would truncate each other's unsent rows. A killed
    process's lock goes with it, so waiting briefly covers a restart racing the
    old process's exit.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    deadline = time.monotonic() + lock_wait
    while True:
        # Unbuffered append: one write(2) per row, always at the end.
        spool = open(path, "ab", buffering=0)  # noqa: SIM115 - owned by the buffer
        try:
            fcntl.flock(spool.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            spool.close()
            if time.monotonic() >= deadline:
                raise AuditSpoolInUseError(
                    f"audit spool {path} is in use by another audit buffer"
                ) from None
            time.sleep(0.02)
            continue
        except BaseException:
            spool.close()
            raise
        try:
            same = os.path.samestat(os.fstat(spool.fileno()), os.stat(path))
        except FileNotFoundError:
            same = False
        if same:
            return spool
        # Replaced (compacted) or removed while we waited: lock the current file.
        spool.close()


__all__ = ["LOCK_WAIT", "open_spool", "read_spool", "spool_line"]
