"""Who may use a front door: one set of rules for every network door of a
home — ``coterie serve`` (REST, server-sent events, the OpenAI-compatible
route, the chat page) and ``coterie mcp-serve --http``.

The bearer token of a door comes from, in this order:

1. the file the user names (``--token-file PATH``), which must be this user's
   alone (no access for group or others);
2. the door's environment variable (``$COTERIE_SERVE_TOKEN``, or the one
   ``serve.token_env`` names; ``$COTERIE_MCP_TOKEN``);
3. the token an earlier start generated for this door, kept in
   ``<home>/<door>.token`` (``serve.token``, ``mcp-serve.token``) — so a
   client configured with it keeps working across restarts;
4. a new random one, written there: mode 0600 from its creation and in
   place at once (a temporary file, then a link), never world-readable or
   half-written. Of two starts racing to write it, the first wins and the
   other adopts its token.

A kept file is trusted only if it is this user's regular file (not a
symlink), nobody else may read or write it, and it holds a usable token;
otherwise a new token replaces it. Any token has 16 characters or more and no
whitespace. The announcements name where the token is, never the token.

Loopback: ``coterie serve`` lets requests from 127.0.0.1 / ::1 in without a
token when ``serve.loopback_without_token`` is on (any host it binds);
``--no-auth`` (``mcp-serve``) drops the token altogether, and only a
loopback binding (127.0.0.1, ::1, localhost) may. Off loopback the door
speaks plain HTTP, and says so.

A request carries ``Authorization: Bearer <token>`` (the scheme in any case),
compared in constant time.
"""

from __future__ import annotations

import hmac
import os
import secrets
import stat
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path

from coterie.runtime.errors import ConfigError

#: Hosts a door may bind without a token (``--no-auth``), and without a warning.
LOOPBACK_HOSTS = frozenset({"127.0.0.1", "localhost", "::1"})
#: Peer addresses ``serve.loopback_without_token`` lets in.
LOOPBACK_PEERS = frozenset({"127.0.0.1", "::1"})
#: The shortest token accepted from a file or the environment.
MIN_TOKEN_CHARS = 16
#: The doors, by the name of their kept token file.
SERVE_DOOR = "serve"
MCP_DOOR = "mcp-serve"


def token_path(home: Path, door: str) -> Path:
    """Where a token generated for ``door`` is kept."""
    return home / f"{door}.token"


# -- checking a request ----------------------------------------------------------


def bearer_matches(header: str | bytes, token: str) -> bool:
    """Whether an ``Authorization`` header carries ``token`` as its bearer
    (the comparison takes the same time whatever the header holds)."""
    raw = header if isinstance(header, bytes) else header.encode("utf-8", "surrogateescape")
    scheme, _, given = raw.partition(b" ")
    return scheme.lower() == b"bearer" and hmac.compare_digest(given.strip(), token.encode())


def request_authorized(
    header: str | bytes, peer: str | None, token: str, *, loopback_without_token: bool = False
) -> bool:
    """Whether a request may pass: the right bearer token, or (when the door
    allows it) a request from loopback."""
    if loopback_without_token and peer in LOOPBACK_PEERS:
        return True
    return bearer_matches(header, token)


def plain_http_warning(door: str, host: str) -> str | None:
    """What to say when a door binds beyond loopback, where its plain HTTP
    (and the token in it) crosses the network; None on loopback."""
    if host in LOOPBACK_HOSTS:
        return None
    return (
        f"{door} on {host}: plain HTTP, the bearer token travels unencrypted "
        "(a TLS proxy in front, or a trusted network)"
    )


# -- private files ------------------------------------------------------------------


def write_private(path: Path, text: str, *, replace_existing: bool = True) -> bool:
    """Write ``text`` to ``path``, readable by this user only, atomically: a
    temporary file created with mode 0600, then moved (or, without
    ``replace_existing``, linked) into place. Returns False when
    ``replace_existing`` is off and ``path`` exists already (nothing written)."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as out:
            out.write(text)
            out.flush()
            os.fsync(out.fileno())
        if replace_existing:
            os.replace(tmp, path)
            return True
        try:
            os.link(tmp, path)
        except FileExistsError:
            return False
        return True
    finally:
        tmp.unlink(missing_ok=True)


def checked_token(token: str, where: str) -> str:
    """``token`` without surrounding whitespace, if usable; else :class:`ConfigError`."""
    token = token.strip()
    if len(token) < MIN_TOKEN_CHARS or any(c.isspace() for c in token):
        raise ConfigError(
            f"{where} does not hold a usable token "
            f"({MIN_TOKEN_CHARS} characters or more, without spaces)"
        )
    return token


def read_token_file(path: Path) -> str:
    """The token in ``path`` (``--token-file``), which only its owner may read or write."""
    return _read_private_token(path, f"--token-file {path}")


def _read_private_token(path: Path, where: str, *, kept: bool = False) -> str:
    """The token in ``path``, checked on the open file (no swap in between):
    nobody else may read or write it. ``kept`` (a generated file in the home):
    not through a symlink, and this user's own. Raises :class:`ConfigError`
    naming ``where``."""
    try:
        fd = os.open(path, os.O_RDONLY | (os.O_NOFOLLOW if kept else 0))
    except OSError as exc:
        raise ConfigError(f"{where}: cannot open it: {exc.strerror}") from None
    with os.fdopen(fd, "rb") as handle:
        info = os.fstat(fd)
        if kept and (info.st_uid != os.getuid() or not stat.S_ISREG(info.st_mode)):
            raise ConfigError(f"{where} is not a file of this user's")
        mode = stat.S_IMODE(info.st_mode)
        if mode & 0o077:
            raise ConfigError(
                f"{where} is open to other users (mode {mode:04o}); "
                f"make it yours alone: chmod 600 {path}"
            )
        data = handle.read(4096)
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise ConfigError(f"{where} is not a text file") from None
    return checked_token(text, where)


def kept_token(path: Path) -> str | None:
    """The token an earlier start generated into ``path``, if it can still be
    trusted (see the module docstring); else None."""
    try:
        return _read_private_token(path, str(path), kept=True)
    except ConfigError:
        return None


# -- where a door's token comes from --------------------------------------------------


@dataclass(frozen=True)
class DoorAuth:
    """How a door checks its callers (see :func:`door_auth`)."""

    #: The bearer token; None: no authentication (``--no-auth``, loopback only).
    token: str | None = field(repr=False)
    #: Where the token is, for the announcement: never the token itself.
    source: str
    #: Where a token generated here is to be kept (by :meth:`publish`).
    write_to: Path | None = None
    #: Whether :meth:`publish` replaces a file found there (one not trusted).
    replaces: bool = False

    def publish(self) -> DoorAuth:
        """Keep a generated token in its file; the authentication in force
        after it: this one, or the token of a start that kept its own first."""
        if self.write_to is None or self.token is None:
            return self
        try:
            written = write_private(
                self.write_to, self.token + "\n", replace_existing=self.replaces
            )
        except OSError as exc:
            raise ConfigError(f"cannot write the bearer token to {self.write_to}: {exc}") from None
        if written:
            return self
        # Another start of this door kept a token between our look and our write.
        theirs = kept_token(self.write_to)
        if theirs is None:
            return replace(self, replaces=True).publish()
        return DoorAuth(
            token=theirs, source=f"bearer token in {self.write_to} (kept by another start)"
        )


def door_auth(
    home: Path,
    door: str,
    *,
    env_var: str,
    host: str,
    token_file: Path | None = None,
    no_auth: bool = False,
    environ: Mapping[str, str] = os.environ,
) -> DoorAuth:
    """The authentication of ``door`` bound on ``host``: ``no_auth`` (loopback
    only), else the token of ``token_file``, else ``$env_var``, else the kept
    one, else a new one (written by :meth:`DoorAuth.publish`). Raises
    :class:`ConfigError` before anything starts."""
    if no_auth:
        if token_file is not None:
            raise ConfigError("--no-auth and --token-file contradict each other: choose one")
        if host not in LOOPBACK_HOSTS:
            raise ConfigError(
                f"--no-auth is refused on --host {host}: anyone who reaches the port could "
                "talk to the personas and, through them, use their tools. It is only for a "
                f"loopback host ({', '.join(sorted(LOOPBACK_HOSTS))}); elsewhere keep the "
                "bearer token"
            )
        return DoorAuth(token=None, source="no authentication (--no-auth)")
    if token_file is not None:
        return DoorAuth(
            token=read_token_file(token_file),
            source=f"bearer token from --token-file {token_file}",
        )
    if environ.get(env_var, "").strip():
        token = checked_token(environ[env_var], f"${env_var}")
        return DoorAuth(token=token, source=f"bearer token from ${env_var}")
    path = token_path(home, door)
    kept = kept_token(path)
    if kept is not None:
        return DoorAuth(token=kept, source=f"bearer token in {path} (kept from an earlier start)")
    return DoorAuth(
        token=secrets.token_urlsafe(32),
        source=f"bearer token in {path}",
        write_to=path,
        replaces=path.exists() or path.is_symlink(),
    )


__all__ = [
    "LOOPBACK_HOSTS",
    "LOOPBACK_PEERS",
    "MCP_DOOR",
    "MIN_TOKEN_CHARS",
    "SERVE_DOOR",
    "DoorAuth",
    "bearer_matches",
    "checked_token",
    "door_auth",
    "kept_token",
    "plain_http_warning",
    "read_token_file",
    "request_authorized",
    "token_path",
    "write_private",
]
