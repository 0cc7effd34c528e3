"""A shell command's environment: the scrubbed allowlist, ``.env`` files, secrets."""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Mapping
from pathlib import Path

from runtime.errors import ToolError

SAFE_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
# Inherited from the runtime's environment when set; nothing else is.
INHERITED_ENV = ("LANG", "LC_ALL", "TERM", "TZ")
SECRET_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def _dropped_env_key(key: str) -> bool:
    upper = key.upper()
    return upper == "PATH" or upper.startswith(("LD_", "DYLD_"))


def scrubbed_env(
    *,
    home: Path | str,
    extra: Mapping[str, str] | None = None,
    secrets: Mapping[str, str] | None = None,
    parent: Mapping[str, str] | None = None,
) -> dict[str, str]:
    """A clean environment: an allowlist, then secrets, then ``extra`` (wins).

    Nothing of the runtime's own environment leaks but ``INHERITED_ENV``;
    ``extra`` may not set ``PATH``, ``LD_*`` or ``DYLD_*``.
    """
    source = os.environ if parent is None else parent
    env = {"PATH": SAFE_PATH, "HOME": str(home), "LANG": "C.UTF-8"}
    for key in INHERITED_ENV:
        if key in source:
            env[key] = source[key]
    for key, value in (secrets or {}).items():
        env[key] = value
    for key, value in (extra or {}).items():
        if _dropped_env_key(key) or not key or "=" in key or "\x00" in key + value:
            continue
        env[key] = value
    return env


def read_dotenv(path: Path) -> dict[str, str]:
    """``KEY=VALUE`` lines (``export``, quotes and ``#`` comments tolerated)."""
    out: dict[str, str] = {}
    try:
        text = path.read_text(encoding="utf-8")
    except (FileNotFoundError, NotADirectoryError):
        return out
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith("#") or "=" not in line:
            continue
        key, _, value = line.partition("=")
        key = key.strip().removeprefix("export ").strip()
        value = value.strip()
        if len(value) >= 2 and value[0] == value[-1] and value[0] in "'\"":
            value = value[1:-1]
        if SECRET_NAME_RE.match(key):
            out[key] = value
    return out


#: Environment variables holding the runtime's own provider keys (plus whatever
#: a persona's model or the memory settings name in ``api_key_env``).
PROVIDER_KEY_VARS = ("OPENAI_API_KEY", "ANTHROPIC_API_KEY", "EXA_API_KEY")
#: Values shorter than this are not redacted: they would mangle ordinary text
#: and hide nothing.
MIN_SECRET_CHARS = 4


def secrets_to_hide(
    persona_dir: Path | None,
    *,
    key_vars: Iterable[str] = (),
    environ: Mapping[str, str] | None = None,
) -> dict[str, str]:
    """Every value that must never be shown: all of the persona's ``.env``
    values and the runtime's provider keys, by name (for ``[redacted:NAME]``)."""
    source = os.environ if environ is None else environ
    hidden: dict[str, str] = {}
    for name in dict.fromkeys([*PROVIDER_KEY_VARS, *key_vars]):
        value = source.get(name, "")
        if len(value) >= MIN_SECRET_CHARS:
            hidden[name] = value
    if persona_dir is not None:
        for name, value in read_dotenv(persona_dir / ".env").items():
            if len(value) >= MIN_SECRET_CHARS:
                hidden[name] = value
    return hidden


def load_secrets(persona_dir: Path | None, names: Iterable[str], persona: str) -> dict[str, str]:
    """The named secrets from ``persona_dir/.env``; ToolError names any missing."""
    wanted = list(dict.fromkeys(names))
    if not wanted:
        return {}
    bad = [n for n in wanted if not SECRET_NAME_RE.match(n)]
    if bad:
        raise ToolError("invalid_arguments", f"not a variable name: {', '.join(bad)}")
    found = read_dotenv(persona_dir / ".env") if persona_dir is not None else {}
    missing = [n for n in wanted if n not in found]
    if missing:
        raise ToolError(
            "missing_secret", f"secret not set for persona {persona}: {', '.join(missing)}"
        )
    return {n: found[n] for n in wanted}


__all__ = [
    "INHERITED_ENV",
    "MIN_SECRET_CHARS",
    "PROVIDER_KEY_VARS",
    "SAFE_PATH",
    "SECRET_NAME_RE",
    "load_secrets",
    "read_dotenv",
    "scrubbed_env",
    "secrets_to_hide",
]
