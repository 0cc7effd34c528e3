"""What crosses a process service: the command to start, and typed answers,
so that callers never index raw dicts."""

from __future__ import annotations

from dataclasses import dataclass, field

from pydantic import BaseModel, ConfigDict

from coterie.runtime.shell.output import DEFAULT_BUFFER_BYTES


@dataclass
class StartSpec:
    """Everything needed to start one command (crosses actor boundaries)."""

    command: str
    argv: list[str]
    cwd: str
    env: dict[str, str]
    # Set in the command's environment (and hidden from its output).
    secrets: dict[str, str] = field(default_factory=dict)
    # Hidden from its output too: every other secret the command could find.
    redact: dict[str, str] = field(default_factory=dict)
    timeout_s: float | None = None
    buffer_bytes: int = DEFAULT_BUFFER_BYTES


class ProcessStatus(BaseModel):
    """Where a ``bg_<hex>`` process stands.

    ``lost`` marks a process whose owner (its actor) is gone: nothing more is
    known about it.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    id: str
    command: str = ""
    running: bool
    exit_code: int | None = None
    timed_out: bool = False
    pid: int | None = None
    runtime_s: float = 0.0
    output_bytes: int = 0
    lost: bool = False


class ProcessOutput(ProcessStatus):
    """A status plus the output read from ``since`` on."""

    chunk: str
    next_offset: int
    # Bytes asked for that had already rolled out of the buffer.
    dropped_bytes: int = 0


class SignalResult(ProcessStatus):
    """A status after a signal: which one, and whether it reached the group."""

    signal: str
    delivered: bool


__all__ = ["ProcessOutput", "ProcessStatus", "SignalResult", "StartSpec"]
