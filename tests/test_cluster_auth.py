"""Joining a ``ray start --head`` cluster as a user would: its token auth, and
the record of it that a bare ``ray.init()`` would follow.

One head node serves the module. It has its own HOME (so its own auth token,
which ``ray start`` turns token auth on for) and its own RAY_TMPDIR (so its
``ray_current_cluster`` record is not the ``/tmp/ray`` one that other Ray users
of this machine share); it is stopped through its process group, never with
``ray stop``, which would stop every Ray on the machine.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.helpers import scripted, write_persona

ROOT = Path(__file__).resolve().parent.parent
RAY = str(Path(sys.executable).with_name("ray"))
# Ray's own variables that would change how a command authenticates.
RAY_VARS = ("RAY_ADDRESS", "RAY_AUTH_MODE", "RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH")

pytestmark = pytest.mark.ray


@dataclass
class Head:
    address: str
    token: str
    tmp: Path  # RAY_TMPDIR: the head's sessions and its ray_current_cluster


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def user_env(home: Path, ray_tmp: Path, **extra: str) -> dict[str, str]:
    """A user's environment: this HOME, no Ray auth settings of the test run's."""
    env = {k: v for k, v in os.environ.items() if k not in RAY_VARS}
    env.update(HOME=str(home), RAY_TMPDIR=str(ray_tmp), COLUMNS="1000", **extra)
    return env


def make_home(path: Path, token: str | None = None) -> Path:
    (path / ".ray").mkdir(parents=True, exist_ok=True)
    if token is not None:
        (path / ".ray" / "auth_token").write_text(token)
    return path


def stop(proc: subprocess.Popen[bytes]) -> None:
    """``ray start --block`` shuts its node down on SIGTERM; whatever of its
    process group is left then is killed."""
    proc.terminate()
    try:
        proc.wait(30)
    except subprocess.TimeoutExpired:
        pass
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait(10)


@contextlib.contextmanager
def ray_start_head(token: str | None) -> Iterator[Head]:
    """``ray start --head`` by a user whose ~/.ray/auth_token holds ``token``
    (Ray then turns token auth on; without one it leaves it off)."""
    base = Path(tempfile.mkdtemp(prefix="ca", dir="/tmp"))  # short: Ray's socket paths
    home = make_home(base / "head-home", token)
    log = base / "head.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [
                *(RAY, "start", "--head", f"--port={free_port()}", "--num-cpus=1"),
                *("--include-dashboard=false", "--disable-usage-stats", "--block"),
            ],
            # SIGTERM stops it at once (it drains for 30 s by default).
            env=user_env(home, base, RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S="0"),
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    record = base / "ray" / "ray_current_cluster"
    try:
        deadline = time.monotonic() + 120
        while not (record.is_file() and record.read_text().strip()):
            assert proc.poll() is None, f"ray start --head exited:\n{log.read_text()}"
            assert time.monotonic() < deadline, f"no head node yet:\n{log.read_text()}"
            time.sleep(0.2)
        yield Head(record.read_text().strip(), token or "", base)
    finally:
        stop(proc)
        shutil.rmtree(base, ignore_errors=True)


@pytest.fixture(scope="module")
def head() -> Iterator[Head]:
    """A cluster with token auth, as ``ray start --head`` makes it by default."""
    with ray_start_head(secrets.token_hex(32)) as started:
        yield started


def coterie(
    env: dict[str, str], home: Path, *args: str, address: str | None = None
) -> subprocess.CompletedProcess[str]:
    where = ["--address", address] if address else []
    return subprocess.run(
        [sys.executable, "-m", "coterie", "--home", str(home), *where, *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60 if address else 180,  # a join fails at once; a local start takes a while
    )


@pytest.fixture
def echo_home(tmp_path: Path) -> Path:
    home = tmp_path / "coterie"
    write_persona(home, "echo", scripted([{"when": {"contains": "hello"}, "text": "hi back"}]))
    return home


def one_error(proc: subprocess.CompletedProcess[str]) -> str:
    """The command failed with one ``error:`` line and no traceback or Ray log spam."""
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr, proc.stderr
    assert "gcs_client.cc" not in proc.stderr, proc.stderr
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, proc.stderr
    return errors[0]


def test_join_without_a_token_says_how_to_get_one(
    head: Head, tmp_path: Path, echo_home: Path
) -> None:
    env = user_env(make_home(tmp_path / "user"), head.tmp)  # no ~/.ray/auth_token
    error = one_error(coterie(env, echo_home, "ask", "echo", "hello", address=head.address))
    assert f"cannot join the Ray cluster at {head.address}" in error
    assert "wants an auth token and none was found" in error
    assert "~/.ray/auth_token or RAY_AUTH_TOKEN" in error
    assert "ray get-auth-token" in error
    # A token, but token auth turned off by the user: coterie does not overrule that.
    env = user_env(make_home(tmp_path / "off", head.token), head.tmp, RAY_AUTH_MODE="disabled")
    error = one_error(coterie(env, echo_home, "ask", "echo", "hello", address=head.address))
    assert "set RAY_AUTH_MODE=token (not disabled)" in error


def test_join_with_a_wrong_token_says_it_was_refused(
    head: Head, tmp_path: Path, echo_home: Path
) -> None:
    env = user_env(make_home(tmp_path / "user", secrets.token_hex(32)), head.tmp)
    error = one_error(coterie(env, echo_home, "ask", "echo", "hello", address=head.address))
    assert "refused this process's auth token" in error
    assert "~/.ray/auth_token or RAY_AUTH_TOKEN" in error
    # The same with the mode set but no token at all.
    env = user_env(make_home(tmp_path / "bare"), head.tmp, RAY_AUTH_MODE="token")
    error = one_error(coterie(env, echo_home, "ask", "echo", "hello", address=head.address))
    assert "RAY_AUTH_MODE is token but no auth token was found" in error


def test_a_token_path_naming_no_file_is_one_error(
    head: Head, tmp_path: Path, echo_home: Path
) -> None:
    # RAY_AUTH_MODE unset: Ray itself raises from its token lookup, which
    # only the cluster's refusal of a tokenless join makes coterie ask.
    missing = tmp_path / "no-such-token"
    env = user_env(make_home(tmp_path / "user"), head.tmp, RAY_AUTH_TOKEN_PATH=str(missing))
    error = one_error(coterie(env, echo_home, "ask", "echo", "hello", address=head.address))
    assert f"cannot join the Ray cluster at {head.address}" in error
    assert f"RAY_AUTH_TOKEN_PATH names {missing}, which cannot be opened or is empty" in error
    assert "~/.ray/auth_token or RAY_AUTH_TOKEN" in error


def test_join_with_the_users_token_works(head: Head, tmp_path: Path, echo_home: Path) -> None:
    # RAY_AUTH_MODE unset, as after `ray start --head`: coterie sends the token.
    env = user_env(make_home(tmp_path / "user", head.token), head.tmp)
    proc = coterie(env, echo_home, "ask", "echo", "hello", address=head.address)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "hi back"
    # The token in RAY_AUTH_TOKEN instead of a file.
    env = user_env(make_home(tmp_path / "other"), head.tmp, RAY_AUTH_TOKEN=head.token)
    proc = coterie(env, echo_home, "ask", "echo", "hello", address=head.address)
    assert proc.returncode == 0, proc.stderr


# The Python API, with Ray imported first: an actor of the driver's own must
# work (its worker calls the driver back, which needs the same auth on both).
API = """
import os, sys
import ray
from coterie.api import Runtime
rt = Runtime.start(home=sys.argv[2], address=sys.argv[1])
@ray.remote(num_cpus=0)
class Probe:
    def ping(self):
        return "pong"
print(ray.get(Probe.remote().ping.remote(), timeout=60), os.environ.get("RAY_AUTH_MODE"))
rt.shutdown()
"""


def api_join(env: dict[str, str], home: Path, address: str) -> str:
    proc = subprocess.run(
        [sys.executable, "-c", API, address, str(home)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.strip()


def test_the_api_sends_the_token_only_to_a_cluster_that_wants_it(
    head: Head, tmp_path: Path
) -> None:
    user = make_home(tmp_path / "user", head.token)
    assert api_join(user_env(user, head.tmp), tmp_path / "one", head.address) == "pong token"
    # A cluster without token auth: joined without it, though the user has a token.
    with ray_start_head(None) as open_head:
        env = user_env(user, open_head.tmp)
        assert api_join(env, tmp_path / "two", open_head.address) == "pong None"


# Reads (and with a second argument replaces) the cluster's version record,
# which ray.init compares with the joining process's versions.
METADATA = """
import sys
from ray._common.usage.usage_constants import CLUSTER_METADATA_KEY as KEY
from ray._private.ray_constants import KV_NAMESPACE_CLUSTER as NS
from ray._raylet import GcsClient
gcs = GcsClient(address=sys.argv[1])
if len(sys.argv) > 2:
    gcs.internal_kv_put(KEY, sys.argv[2].encode(), True, NS)
print(gcs.internal_kv_get(KEY, NS).decode())
"""


def metadata(head: Head, replace: str | None = None) -> str:
    env = user_env(Path(tempfile.gettempdir()), head.tmp)
    env.update(RAY_AUTH_MODE="token", RAY_AUTH_TOKEN=head.token)
    args = [head.address, *([replace] if replace is not None else [])]
    proc = subprocess.run(
        [sys.executable, "-c", METADATA, *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    return proc.stdout.strip()


def test_another_ray_version_is_named(head: Head, tmp_path: Path, echo_home: Path) -> None:
    original = metadata(head)
    other = {**json.loads(original), "ray_version": "2.0.0", "python_version": "3.9.1"}
    metadata(head, json.dumps(other))
    try:
        env = user_env(make_home(tmp_path / "user", head.token), head.tmp)
        error = one_error(coterie(env, echo_home, "ask", "echo", "hello", address=head.address))
    finally:
        metadata(head, original)
    assert "version mismatch" in error
    assert "the cluster runs Ray 2.0.0 on Python 3.9.1" in error


def test_no_address_starts_its_own_ray_beside_a_ray_start_cluster(
    head: Head, tmp_path: Path, echo_home: Path
) -> None:
    """A bare ray.init() would join the recorded cluster and refuse num_cpus."""
    sessions = set((head.tmp / "ray").glob("session_2*"))
    env = user_env(make_home(tmp_path / "user", head.token), head.tmp)
    proc = coterie(env, echo_home, "ask", "echo", "hello")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "hi back"
    assert "ValueError" not in proc.stderr
    note = f"a Ray cluster started with `ray start` is running at {head.address}"
    assert note in proc.stderr
    assert f"pass --address {head.address}" in proc.stderr
    # Its own instance: a session of its own beside the head's.
    assert len(set((head.tmp / "ray").glob("session_2*")) - sessions) == 1


def test_no_address_ignores_a_stale_ray_start_record(tmp_path: Path, echo_home: Path) -> None:
    ray_tmp = Path(tempfile.mkdtemp(prefix="cs", dir="/tmp"))  # short: Ray's socket paths
    try:
        (ray_tmp / "ray").mkdir()
        stale = f"127.0.0.1:{free_port()}"  # a cluster that has gone
        (ray_tmp / "ray" / "ray_current_cluster").write_text(stale)
        env = user_env(make_home(tmp_path / "user"), ray_tmp)
        proc = coterie(env, echo_home, "-v", "ask", "echo", "hello")
        assert proc.returncode == 0, proc.stderr
        assert proc.stdout.strip().splitlines()[-1] == "hi back"
        assert f"record of a `ray start` cluster at {stale} is stale" in proc.stderr
        assert "is running at" not in proc.stderr
    finally:
        shutil.rmtree(ray_tmp, ignore_errors=True)
