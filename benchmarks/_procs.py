"""The benchmarks' view of their own Ray processes (psutil)."""

from __future__ import annotations

import psutil


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


__all__ = ["our_ray_processes"]
