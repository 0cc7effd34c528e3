"""Confining shell commands with bubblewrap, where it is installed."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from coterie.runtime.config import AccessLevel

BWRAP_PATH = "/usr/bin/bwrap"


def bwrap_available(path: str = BWRAP_PATH) -> str | None:
    """The bubblewrap binary, unless missing or disabled by ``COTERIE_BWRAP=0``."""
    if os.environ.get("COTERIE_BWRAP", "").strip().lower() in ("0", "off", "false", "no"):
        return None
    return path if os.path.isfile(path) and os.access(path, os.X_OK) else None


@dataclass(frozen=True)
class Sandbox:
    """How a persona's commands are confined (``bwrap=None``: not confined).

    Inside bubblewrap a command has no network (its own empty network
    namespace, so not even the runtime's ports on loopback) unless
    ``network`` is true; unconfined commands share the runtime's network.
    """

    workspace: Path
    access: AccessLevel = "workspace"
    persona_dir: Path | None = None
    home: Path | None = None
    bwrap: str | None = None
    network: bool = False

    def argv(self, command: str, cwd: Path) -> list[str]:
        shell = ["/bin/sh", "-c", command]
        if self.bwrap is None:
            return shell
        ws = str(self.workspace)
        argv = [self.bwrap, "--die-with-parent", "--unshare-pid"]
        if not self.network:
            argv.append("--unshare-net")
        argv += ["--ro-bind", "/", "/"]
        argv += ["--dev", "/dev", "--proc", "/proc", "--tmpfs", "/tmp"]
        # Hide the runtime user's home, the coterie home (every persona, their
        # .env files) and the persona's own directory, then bring back the workspace.
        hidden: list[str] = []
        for p in (Path.home(), self.home, self.persona_dir):
            if p is not None and p.is_dir() and str(p) != "/":
                hidden.append(str(p.resolve()))
        for h in hidden:
            if not h.startswith("/tmp/") and h != "/tmp":
                argv += ["--tmpfs", h]
        argv += ["--ro-bind" if self.access == "readonly" else "--bind", ws, ws]
        dotenv = self.workspace / ".env"
        if dotenv.exists():
            argv += ["--ro-bind", "/dev/null", str(dotenv)]
        argv += ["--chdir", str(cwd), *shell]
        return argv


class SandboxChoice:
    """Whether a process service wraps commands in bubblewrap, and how.

    ``bwrap="auto"`` finds it (see :func:`bwrap_available`); ``None`` never
    confines; a path uses that binary.
    """

    def __init__(self, *, bwrap: str | None = "auto") -> None:
        self.bwrap: str | None = bwrap_available() if bwrap == "auto" else bwrap

    @property
    def sandboxed(self) -> bool:
        return self.bwrap is not None

    def sandbox(
        self,
        workspace: Path,
        access: AccessLevel,
        persona_dir: Path | None,
        home: Path | None,
        *,
        network: bool = False,
    ) -> Sandbox:
        """The confinement of one command; ``network``: whether a sandboxed
        command may use the network (see :class:`Sandbox`)."""
        return Sandbox(workspace, access, persona_dir, home, self.bwrap, network)


__all__ = ["BWRAP_PATH", "Sandbox", "SandboxChoice", "bwrap_available"]
