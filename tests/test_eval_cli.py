"""``coterie eval`` on Ray: a run of the bundled example with its summary,
--list/--show/--compare, a bad task file, and a two-node cluster on which
the samples run on both nodes."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import duckdb
import pytest

from coterie import cli

REPO = Path(__file__).resolve().parents[1]
EXAMPLES = REPO / "configs" / "evals"


@pytest.fixture(scope="module")
def home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("eval-home")
    (path / "personas").mkdir()
    return path


def run_cli(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str]:
    code = cli.main([*args])
    out = capsys.readouterr()
    return code, out.out + out.err


@pytest.mark.usefixtures("ray_session")
def test_eval_runs_the_example_and_reports_it(
    home: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    task = str(EXAMPLES / "arithmetic.yaml")
    code, out = run_cli(capsys, "--home", str(home), "eval", task, "--run-id", "first")
    assert code == 0, out
    assert "done: 24 run now, 0 already finished, 0 errors" in out
    assert "numeric" in out and "0.917" in out  # 11 of 12 right, the summary table
    with duckdb.connect(str(home / "evals.duckdb"), read_only=True) as con:
        rows = con.execute(
            "select count(*), count(distinct node), sum(model_calls) from eval_samples "
            "where run_id = 'first' and status = 'ok'"
        ).fetchall()
        assert rows == [(24, 1, 48)]
        # Transcripts by reference: the audit log holds each sample's conversation.
        conv = con.execute(
            "select conversation_id from eval_samples where run_id = 'first' "
            "and sample_id = 'add-1' and epoch = 1"
        ).fetchone()
    assert conv == ("eval:first:add-1:1:1",)
    code, out = run_cli(
        capsys,
        "--home",
        str(home),
        "audit",
        "select count(*) from events where conversation_id = 'eval:first:add-1:1:1' "
        "and kind = 'model_call'",
        "--json",
    )
    assert code == 0 and '"count_star()": 2' in out, out

    code, out = run_cli(capsys, "--home", str(home), "eval", "--show", "first", "--by", "op")
    assert code == 0 and "words" in out and "mul" in out

    # The same task with another model: a paired comparison with its flips.
    code, out = run_cli(
        capsys, "--home", str(home), "eval", task, "--run-id", "second", "--model", "scripted"
    )
    assert code == 0, out
    code, out = run_cli(capsys, "--home", str(home), "eval", "--compare", "first", "second")
    assert code == 0, out
    assert "-0.917" in out  # the scripted default answers nothing right
    assert "second − first" in out

    code, out = run_cli(capsys, "--home", str(home), "eval", "--list")
    assert code == 0 and "first" in out and "second" in out and "finished" in out


def test_a_bad_task_file_is_an_error_naming_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: bad\ndataset: {path: nowhere.jsonl}\nscorers: []\n")
    code, out = run_cli(capsys, "--home", str(tmp_path / "home"), "eval", str(bad))
    assert code != 0
    assert str(bad) in out and "solver" in out and "scorers" in out
    with duckdb.connect(str(tmp_path / "home" / "evals.duckdb"), read_only=True) as con:
        assert con.execute("select count(*) from eval_runs").fetchone() == (0,)


# -- two raylets on this machine -----------------------------------------------------

CLUSTER = """
import sys
from ray.cluster_utils import Cluster
c = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "include_dashboard": False})
c.add_node(num_cpus=1)
c.wait_for_nodes()
print(c.address, flush=True)
sys.stdin.read()
c.shutdown()
"""


@pytest.fixture
def two_nodes() -> Iterator[str]:
    proc = subprocess.Popen(
        [sys.executable, "-c", CLUSTER],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    assert proc.stdout is not None and proc.stdin is not None
    try:
        address = proc.stdout.readline().strip()
        assert address, "the two-node cluster did not start"
        yield address
    finally:
        proc.stdin.close()
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)


def test_samples_run_on_both_nodes_of_a_two_node_cluster(two_nodes: str, tmp_path: Path) -> None:
    home = tmp_path / "home"
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "coterie",
            "--home",
            str(home),
            "--address",
            two_nodes,
            "eval",
            str(EXAMPLES / "files.yaml"),
            "--run-id",
            "spread",
            "--workers",
            "2",
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    with duckdb.connect(str(home / "evals.duckdb"), read_only=True) as con:
        per_node = con.execute(
            "select node, count(*) from eval_samples where run_id = 'spread' "
            "and status = 'ok' group by 1"
        ).fetchall()
    summary = [line for line in done.stdout.splitlines() if "on nodes" in line]
    assert len(per_node) == 2 and sum(n for _, n in per_node) == 8, (per_node, summary)
