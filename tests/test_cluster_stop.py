"""A runtime left on a ``ray start --head`` cluster, as a user meets it: a
command joined with ``--address`` leaves its actors there (detached); a later
command on the same home without ``--address`` is told what holds the home
and what to do; ``coterie stop`` stops that runtime with its audit log
flushed, and the home is free again.

The head node is started as tests/test_cluster_auth.py starts it (its own
HOME, token auth on, its own RAY_TMPDIR), stopped through its process group.
"""

from __future__ import annotations

import json
import secrets
from collections.abc import Iterator
from pathlib import Path

import pytest

from coterie.holder import HOLDER_FILE
from tests.helpers import scripted, write_persona
from tests.test_cluster_auth import Head, coterie, make_home, one_error, ray_start_head, user_env

pytestmark = pytest.mark.ray


@pytest.fixture(scope="module")
def cluster() -> Iterator[Head]:
    with ray_start_head(secrets.token_hex(32)) as started:
        yield started


def test_a_home_held_on_a_cluster_says_so_and_coterie_stop_frees_it(
    cluster: Head, tmp_path: Path
) -> None:
    home = tmp_path / "coterie"
    write_persona(home, "echo", scripted([{"when": {"contains": "hello"}, "text": "hi back"}]))
    env = user_env(make_home(tmp_path / "user", cluster.token), cluster.tmp)
    joined = coterie(env, home, "ask", "echo", "hello", address=cluster.address)
    assert joined.returncode == 0, joined.stderr
    assert joined.stdout.strip() == "hi back"
    # The home records where its runtime was left.
    holder = json.loads((home / HOLDER_FILE).read_text())
    assert holder["detached"] is True and holder["address"] == cluster.address

    # Without --address: its own local Ray, whose audit log cannot open the home.
    error = one_error(coterie(env, home, "ask", "echo", "hello"))
    assert f"{home} is held by a coterie runtime left running (detached) on the Ray cluster " in (
        error
    )
    assert f"at {cluster.address}" in error
    assert f"--address {cluster.address}" in error
    assert f"coterie --home {home} stop --address {cluster.address}" in error
    assert "IOException" not in error and "ActorDiedError" not in error

    # coterie stop finds the cluster in the record, and stops the runtime there.
    stopped = coterie(env, home, "stop")
    assert stopped.returncode == 0, stopped.stderr
    assert (
        f"Stopped the runtime of {home} on the Ray cluster at {cluster.address}: "
        "1 persona actor(s), the audit log flushed and closed." in " ".join(stopped.stdout.split())
    )
    assert not (home / HOLDER_FILE).exists()
    # Nothing of it is left there.
    again = coterie(env, home, "stop", address=cluster.address)
    assert again.returncode == 1
    assert f"no runtime of {home} runs on the Ray cluster at {cluster.address}" in again.stderr

    # The home is free: a local runtime opens it, and the audit log holds the
    # cluster's turn (flushed by the stop) beside its own.
    local = coterie(env, home, "ask", "echo", "hello")
    assert local.returncode == 0, local.stderr
    assert local.stdout.strip() == "hi back"
    counted = coterie(
        env,
        home,
        "audit",
        "--json",
        "select count(*) as n from events where kind = 'turn_ended' and persona = 'echo'",
    )
    assert counted.returncode == 0, counted.stderr
    assert json.loads(counted.stdout)[0]["n"] == 2


def test_stop_without_a_cluster_to_name_starts_nothing(cluster: Head, tmp_path: Path) -> None:
    home = tmp_path / "coterie"
    home.mkdir()
    env = user_env(make_home(tmp_path / "user", cluster.token), cluster.tmp)
    error = one_error(coterie(env, home, "stop"))
    assert f"nothing to stop for {home}" in error and "--address ADDRESS" in error
    assert sorted(p.name for p in home.iterdir()) == []
