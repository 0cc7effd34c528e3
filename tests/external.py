"""What some tests need from outside Python, and what its absence does to them.

``tests/run.sh`` installs every piece: Debian's bubblewrap and chromium, node
with the npm packages claude-agent-acp (in ``.acp-agents/``) and the reference
MCP server "everything" (in ``.mcp-servers/``), and the OTLP receiver Arize
Phoenix (in ``.otlp-receiver/``, a virtual environment of its own). A test says what it needs with
``@pytest.mark.needs("bubblewrap")`` (conftest.py checks the mark before the
test runs) or calls :func:`require` where the need shows up in a fixture.
Outside CI a missing piece skips the test with a reason naming what to
install; in CI (``CI=1``) it fails the test: CI must not pass by skipping.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.mcp_fixtures.everything import EVERYTHING, NODE

REPO = Path(__file__).resolve().parents[1]
IN_CI = bool(os.environ.get("CI"))

CLAUDE_ACP = Path(
    os.environ.get(
        "COTERIE_CLAUDE_AGENT_ACP",
        REPO / ".acp-agents/node_modules/@zed-industries/claude-agent-acp/dist/index.js",
    )
)
CHROMIUM = os.environ.get("COTERIE_CHROMIUM", "/usr/bin/chromium")
PHOENIX = REPO / ".otlp-receiver/bin/phoenix"


def _bubblewrap() -> str | None:
    from coterie.runtime.shell.sandbox import bwrap_available

    if bwrap_available() is not None:
        return None
    return (
        "bubblewrap is not installed at /usr/bin/bwrap, or COTERIE_BWRAP=0 turns it off "
        "(apt-get install bubblewrap)"
    )


def _claude_agent_acp() -> str | None:
    if NODE is not None and CLAUDE_ACP.is_file():
        return None
    return (
        "needs node and @zed-industries/claude-agent-acp "
        "(npm install --prefix .acp-agents @zed-industries/claude-agent-acp@0.23.1)"
    )


def _server_everything() -> str | None:
    if NODE is not None and EVERYTHING.is_file():
        return None
    return (
        "needs node and @modelcontextprotocol/server-everything in .mcp-servers "
        "(npm install --prefix .mcp-servers @modelcontextprotocol/server-everything@2026.8.31)"
    )


def _chromium() -> str | None:
    if Path(CHROMIUM).exists():
        return None
    return f"no Chromium at {CHROMIUM} (apt-get install chromium, or set $COTERIE_CHROMIUM)"


def _phoenix() -> str | None:
    if PHOENIX.is_file():
        return None
    return (
        "needs Arize Phoenix in .otlp-receiver "
        "(python3 -m venv .otlp-receiver && "
        ".otlp-receiver/bin/python -m pip install arize-phoenix==20.26.1)"
    )


#: Each piece and how to tell what is missing of it (None: nothing).
PIECES = {
    "bubblewrap": _bubblewrap,
    "claude-agent-acp": _claude_agent_acp,
    "server-everything": _server_everything,
    "chromium": _chromium,
    "phoenix": _phoenix,
}


def missing(piece: str) -> str | None:
    """Why ``piece`` cannot be used on this machine, or None when it can."""
    if piece not in PIECES:
        raise ValueError(f"unknown external piece {piece!r}; known: {', '.join(PIECES)}")
    return PIECES[piece]()


def require(piece: str) -> None:
    """Skip the running test without ``piece`` (fail it in CI)."""
    reason = missing(piece)
    if reason is None:
        return
    reason = f"{reason}; tests/run.sh installs it"
    if IN_CI:
        pytest.fail(f"CI: {reason}", pytrace=False)
    pytest.skip(reason)
