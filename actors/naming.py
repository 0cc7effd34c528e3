"""Names of the runtime's actors on the cluster.

Actor names carry a short id derived from the runtime's home, so several
runtimes (homes) can share one Ray cluster without clashing.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

NAMESPACE = "coterie"


def runtime_id(home: Path) -> str:
    return hashlib.sha1(str(home).encode()).hexdigest()[:10]


def router_name(rid: str) -> str:
    return f"coterie:{rid}:router"


def audit_name(rid: str) -> str:
    return f"coterie:{rid}:audit"


def persona_actor_name(rid: str, persona: str) -> str:
    return f"coterie:{rid}:persona:{persona}"


def memory_name(rid: str) -> str:
    return f"coterie:{rid}:memory"
