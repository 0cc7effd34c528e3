"""Shell processes, without Ray: output, environment and secrets, the sandbox,
one command's handle and slot, and the per-persona process table."""

from __future__ import annotations

from coterie.runtime.shell.env import (
    INHERITED_ENV,
    MIN_SECRET_CHARS,
    PROVIDER_KEY_VARS,
    SAFE_PATH,
    load_secrets,
    read_dotenv,
    scrubbed_env,
    secrets_to_hide,
)
from coterie.runtime.shell.handle import (
    SIGNALS,
    ProcessHandle,
    SignalName,
    group_alive,
    new_process_id,
)
from coterie.runtime.shell.output import DEFAULT_BUFFER_BYTES, OutputBuffer, Redactor
from coterie.runtime.shell.records import ProcessOutput, ProcessStatus, SignalResult, StartSpec
from coterie.runtime.shell.sandbox import BWRAP_PATH, Sandbox, SandboxChoice, bwrap_available
from coterie.runtime.shell.slot import ProcessSlot
from coterie.runtime.shell.table import LocalProcesses, ProcessTable, Slot, not_found

__all__ = [
    "BWRAP_PATH",
    "DEFAULT_BUFFER_BYTES",
    "INHERITED_ENV",
    "MIN_SECRET_CHARS",
    "PROVIDER_KEY_VARS",
    "SAFE_PATH",
    "SIGNALS",
    "LocalProcesses",
    "OutputBuffer",
    "ProcessHandle",
    "ProcessOutput",
    "ProcessSlot",
    "ProcessStatus",
    "ProcessTable",
    "Redactor",
    "Sandbox",
    "SandboxChoice",
    "SignalName",
    "SignalResult",
    "Slot",
    "StartSpec",
    "bwrap_available",
    "group_alive",
    "load_secrets",
    "new_process_id",
    "not_found",
    "read_dotenv",
    "scrubbed_env",
    "secrets_to_hide",
]
