"""The benchmarks' view of their own Ray processes (psutil)."""

from __future__ import annotations

import compileall
import importlib.util
import json
import os
import subprocess
from pathlib import Path
from typing import Any

import psutil

ROOT = Path(__file__).resolve().parent.parent
#: coterie's own packages: what every persona process imports.
PACKAGES = ("runtime", "tools", "actors", "coterie")


def compile_coterie() -> str:
    """Compile coterie's modules to bytecode, as ``pip install`` does for a
    regular install, and say what was found.

    The floors import only installed packages, which pip compiled. An editable
    checkout's own modules are compiled by the first process that imports
    them, unless ``PYTHONDONTWRITEBYTECODE`` is set (as on these machines):
    then every persona process compiles ~110 modules from source, ~0.3 s of
    CPU each, which is the checkout's setup and not the runtime's cost.
    """
    probe = ROOT / "runtime" / "persona.py"
    had = Path(importlib.util.cache_from_source(str(probe))).exists()
    for name in PACKAGES:
        compileall.compile_dir(ROOT / name, quiet=1)
    flag = "set" if os.environ.get("PYTHONDONTWRITEBYTECODE") else "unset"
    state = "already compiled" if had else "compiled now"
    return f"coterie's modules {state} (PYTHONDONTWRITEBYTECODE {flag})"


def peer_json(cmd: list[str], timeout: float = 1800) -> dict[str, Any] | str:
    """Run a peer's script (``cmd``) and read the JSON object it prints last;
    on a failure, why (the end of its stderr)."""
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    if done.returncode != 0:
        return f"failed: {done.stderr.strip()[-300:]}"
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def cpu_of(proc: psutil.Process) -> float:
    """CPU seconds (user + system) ``proc`` has spent since it started."""
    times = proc.cpu_times()
    return float(times.user + times.system)


def our_ray_processes(title: str) -> list[psutil.Process]:
    """Ray workers of *this* session whose proctitle starts with ``ray::<title>``.

    Only descendants of this driver count (the raylet and its workers are our
    children), which keeps other Ray sessions on a shared machine out.
    """
    found = []
    for proc in psutil.Process().children(recursive=True):
        try:
            cmdline = proc.cmdline()
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
        if cmdline and cmdline[0].startswith(f"ray::{title}"):
            found.append(proc)
    return found


__all__ = ["compile_coterie", "cpu_of", "our_ray_processes"]
