"""``--address`` joins an existing Ray cluster; the runtime's actors outlive the command."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import ray

from coterie.actors import NAMESPACE, audit_name, persona_actor_name, router_name, runtime_id
from tests.helpers import scripted, write_persona

ROOT = Path(__file__).resolve().parent.parent


def run_cli(address: str, home: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    env["COLUMNS"] = "200"
    return subprocess.run(
        [sys.executable, "-m", "coterie", "--home", str(home), "--address", address, *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
    )


def test_cli_joins_existing_cluster(tmp_path: Path, ray_session: None) -> None:
    address = ray.get_runtime_context().gcs_address
    home = tmp_path / "home"
    write_persona(home, "echo", scripted([{"when": {"contains": "hello"}, "text": "hi back"}]))
    rid = runtime_id(home.resolve())
    try:
        proc = run_cli(address, home, "ask", "echo", "hello")
        assert proc.returncode == 0, proc.stderr
        assert proc.stdout.strip() == "hi back"
        # Detached: the router, audit log and persona are still on the cluster.
        for name in (router_name(rid), audit_name(rid), persona_actor_name(rid, "echo")):
            ray.get_actor(name, namespace=NAMESPACE)
        # A second command reuses them, and audit queries go through the actor
        # (the running AuditLog holds the DuckDB file).
        proc = run_cli(address, home, "ask", "echo", "hello again")
        assert proc.returncode == 0, proc.stderr
        proc = run_cli(
            address,
            home,
            "audit",
            "select count(*) from events where kind = 'turn_ended'",
            "--json",
        )
        assert proc.returncode == 0, proc.stderr
        assert '"count_star()": 2' in proc.stdout
    finally:
        for name in (persona_actor_name(rid, "echo"), router_name(rid), audit_name(rid)):
            try:
                ray.kill(ray.get_actor(name, namespace=NAMESPACE))
            except ValueError:
                pass


def test_unreachable_address_is_a_clear_error(tmp_path: Path) -> None:
    with socket.socket() as sock:  # a loopback port nobody listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    write_persona(tmp_path, "echo", scripted())
    proc = run_cli(f"127.0.0.1:{port}", tmp_path, "ask", "echo", "hello")
    assert proc.returncode == 1
    assert f"cannot reach the Ray cluster at 127.0.0.1:{port}" in proc.stderr
