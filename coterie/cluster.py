"""Reaching a Ray cluster: joining one (``--address``, ``RAY_ADDRESS``) or
starting a local one, with one clear error for each way a join can fail.

``ray.init`` alone retries an unreachable address or a refused auth token for
a long while, logs every try, and compares Ray versions only once connected.
:func:`join` asks first — is anyone listening, does the cluster want a token
and does this user have one, does it run our versions of Ray and Python —
and raises one :class:`~coterie.runtime.errors.CoterieError` naming the cause
(the CLI prints it as one ``error:`` line, without a traceback).
:func:`connect` decides between joining, reusing an initialized Ray and
starting a local one, and says whether the runtime's actors are detached.
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import ray

from coterie.actors._ray import NAMESPACE
from coterie.runtime.errors import CoterieError

log = logging.getLogger(__name__)

TOKEN_HELP = (
    "put the cluster's token in ~/.ray/auth_token or RAY_AUTH_TOKEN "
    "(`ray get-auth-token` on its head node prints it)"
)


def host_port(address: str) -> tuple[str, int] | None:
    """``address`` as ``(host, port)``; None for "auto", "ray://…" and the like,
    which Ray resolves itself."""
    host, sep, port = address.rpartition(":")
    if not sep or "://" in address or not port.isdigit():
        return None
    return host.strip("[]"), int(port)


def check_reachable(address: str) -> None:
    """Fail fast on a ``host:port`` nobody listens on (Ray itself retries for minutes)."""
    where = host_port(address)
    if where is None:
        return
    try:
        socket.create_connection(where, timeout=5).close()
    except OSError as exc:
        raise CoterieError(f"cannot reach the Ray cluster at {address}: {exc}") from None


@contextlib.contextmanager
def _stderr_without(tag: bytes) -> Iterator[None]:
    """Hold back what reaches file descriptor 2 meanwhile, then pass it on
    without the lines naming ``tag`` (Ray's C++ client logs each refused
    connect there, past Python's logging)."""
    try:
        sys.stderr.flush()
        saved = os.dup(2)
    except (OSError, ValueError):
        yield
        return
    with tempfile.TemporaryFile() as sink:
        os.dup2(sink.fileno(), 2)
        try:
            yield
        finally:
            with contextlib.suppress(OSError, ValueError):
                sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            sink.seek(0)
            kept = b"".join(line for line in sink if tag not in line)
            while kept:
                kept = kept[os.write(2, kept) :]


def probe_cluster(address: str) -> None:
    """Ask the cluster's GCS once before ``ray.init`` joins it.

    ``ray.init`` retries a refused auth token for ~20 s, logging every try, and
    compares Ray versions only after connecting: one question first makes
    either a single clear error at once. It also tells whether the cluster
    wants this user's token (see below)."""
    try:
        from ray._common.usage.usage_lib import get_cluster_metadata
        from ray._private.utils import check_version_info, compute_version_info
        from ray._raylet import (  # type: ignore[attr-defined]  # not in its stub
            AuthenticationMode,
            AuthenticationTokenLoader,
            Config,
            InnerGcsClient,
            get_authentication_mode,
        )
        from ray.exceptions import AuthenticationError, RayError
    except ImportError:  # a Ray without token auth: its own errors will do
        return
    cannot = f"cannot join the Ray cluster at {address}"
    token_mode = get_authentication_mode() == AuthenticationMode.TOKEN

    def has_token() -> bool:
        """Whether this user has a token for Ray. Only asked when it matters:
        merely loading a token into a process without token auth leaves its
        actors never starting (seen in Ray 2.60). A token file that
        RAY_AUTH_TOKEN_PATH names but that cannot be read is an error of its own."""
        try:
            found: bool = AuthenticationTokenLoader.instance().has_token(ignore_auth_mode=True)
        except AuthenticationError as exc:
            path = os.environ.get("RAY_AUTH_TOKEN_PATH")
            if not path:
                raise CoterieError(f"{cannot}: {_first_line(exc)}") from None
            raise CoterieError(
                f"{cannot}: RAY_AUTH_TOKEN_PATH names {path}, which cannot be opened or is "
                f"empty; point it at the cluster's token, or unset it and {TOKEN_HELP}"
            ) from None
        return found

    if token_mode and not has_token():
        raise CoterieError(
            f"{cannot}: RAY_AUTH_MODE is token but no auth token was found; {TOKEN_HELP}"
        )

    def gcs_client() -> Any:
        """A GCS client; None when the cluster refuses this process's auth."""
        try:
            with _stderr_without(b"gcs_client.cc"):
                return InnerGcsClient.standalone(address, None, 5000)
        except AuthenticationError:
            return None
        except RayError as exc:
            raise CoterieError(f"{cannot}: {_first_line(exc)}") from None

    client = gcs_client()
    mode = os.environ.get("RAY_AUTH_MODE")
    if client is None and mode is None and has_token():
        # What ray.init does for a cluster it finds itself, never for a named
        # one: send this user's token. Only when asked: the actors of a driver
        # with token auth on a cluster without it are cancelled before they
        # start (Ray 2.60). Ray read RAY_AUTH_MODE at import, hence the refresh.
        os.environ["RAY_AUTH_MODE"] = "token"
        Config.initialize("")
        token_mode = True
        log.info("the Ray cluster at %s wants an auth token: sending this user's", address)
        client = gcs_client()
    if client is None:
        if token_mode:
            why = f"it refused this process's auth token; {TOKEN_HELP}"
        elif mode is not None:
            why = f"it wants an auth token; set RAY_AUTH_MODE=token (not {mode}) and {TOKEN_HELP}"
        else:
            why = f"it wants an auth token and none was found; {TOKEN_HELP}"
        raise CoterieError(f"{cannot}: {why}")
    try:
        cluster = get_cluster_metadata(client)
        cluster_versions = (cluster["ray_version"], cluster["python_version"])
    except Exception:  # no metadata (yet): ray.init checks for itself
        return
    try:
        check_version_info(cluster, "this process")
    except RuntimeError:
        ours = compute_version_info()
        raise CoterieError(
            f"{cannot}: version mismatch, the cluster runs Ray {cluster_versions[0]} on "
            f"Python {cluster_versions[1]} and this process Ray {ours[0]} on Python {ours[1]}"
        ) from None


def _first_line(exc: BaseException) -> str:
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0]


def join(address: str) -> None:
    """``ray.init`` on ``address``; a failed join is one :class:`CoterieError`
    naming its cause (the CLI prints it without a traceback)."""
    check_reachable(address)
    if host_port(address) is not None:
        probe_cluster(address)
    try:
        ray.init(address=address, namespace=NAMESPACE, log_to_driver=False)
    except Exception as exc:
        with contextlib.suppress(Exception):
            ray.shutdown()
        auth_error = getattr(ray.exceptions, "AuthenticationError", ())
        why = _first_line(exc)
        if isinstance(exc, auth_error):
            why = f"auth token missing or refused; set RAY_AUTH_MODE=token and {TOKEN_HELP}"
        raise CoterieError(f"cannot join the Ray cluster at {address}: {why}") from exc


def note_recorded_cluster() -> None:
    """Say so when `ray start` recorded a live cluster on this machine.

    A bare ``ray.init()`` would join it (and refuse coterie's ``num_cpus``);
    coterie starts its own local instance instead, which may surprise a user
    who meant to join that one."""
    try:
        from ray._private.utils import read_ray_address

        recorded = read_ray_address()
    except Exception:
        return
    where = host_port(recorded) if recorded else None
    if where is None:
        return
    try:
        socket.create_connection(where, timeout=1).close()
    except OSError:
        log.info("Ray's record of a `ray start` cluster at %s is stale: ignored", recorded)
        return
    log.warning(
        "a Ray cluster started with `ray start` is running at %s; coterie starts its own "
        "local one (pass --address %s or set RAY_ADDRESS to join it)",
        recorded,
        recorded,
    )


@dataclass(frozen=True)
class Connection:
    """How this process is on Ray, as :func:`connect` left it."""

    namespace: str
    #: The runtime's actors outlive this driver (a joined cluster).
    detached: bool
    #: This process started Ray, and stops it with the runtime.
    owns_ray: bool


def connect(address: str | None, *, num_cpus: int | None = None) -> Connection:
    """Join ``address``, reuse an initialized Ray, or start a local one."""
    if ray.is_initialized():
        return Connection(ray.get_runtime_context().namespace or NAMESPACE, False, False)
    if address:
        join(address)
        return Connection(NAMESPACE, detached=True, owns_ray=False)
    # "local": never the cluster a bare ray.init() finds on its own.
    note_recorded_cluster()
    ray.init(
        address="local",
        num_cpus=num_cpus or os.cpu_count() or 2,
        namespace=NAMESPACE,
        include_dashboard=False,
        log_to_driver=False,
        configure_logging=False,
    )
    return Connection(NAMESPACE, detached=False, owns_ray=True)


__all__ = [
    "TOKEN_HELP",
    "Connection",
    "check_reachable",
    "connect",
    "host_port",
    "join",
    "note_recorded_cluster",
    "probe_cluster",
]
