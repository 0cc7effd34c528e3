"""``coterie eval`` on Ray: a run of the bundled example with its summary,
--list/--show/--compare, a bad task file, and a two-node cluster on which
the samples run on both nodes."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import duckdb
import pytest
import yaml

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


def test_ctrl_c_stops_a_run_and_resume_finishes_it(tmp_path: Path) -> None:
    """SIGINT to ``coterie eval`` (what Ctrl-C sends), then ``--resume``."""
    home = tmp_path / "home"
    total = 100
    rows = [{"id": f"s{i}", "input": f"{i} + {i}", "target": str(2 * i)} for i in range(total)]
    (tmp_path / "data.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    solver = {
        "inline": {
            "tools": {"allow": ["calculate"]},
            "model": {
                "provider": "scripted",
                "latency_ms": 200,
                "rules": [
                    {
                        "when": {"turn": 1},
                        "tool_calls": [
                            {"name": "calculate", "arguments": {"expression": "{input}"}}
                        ],
                    },
                    {"when": {"turn": 2}, "text": "= {last_tool_result}"},
                ],
            },
        }
    }
    task = tmp_path / "task.yaml"
    task.write_text(
        yaml.safe_dump(
            {
                "name": "slow-sums",
                "dataset": {"path": "data.jsonl"},
                "solver": solver,
                "scorers": [{"type": "includes"}],
                "max_samples": 2,
            }
        )
    )
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    base = [sys.executable, "-m", "coterie", "--home", str(home), "eval"]
    proc = subprocess.Popen(
        [*base, str(task), "--run-id", "cut", "--workers", "1"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env,
    )
    assert proc.stdout is not None
    for line in proc.stdout:  # the samples start once the workers are up
        if "eval workers on" in line:
            break
    # Some samples finish (0.4 s each, two at a time: 20 s for all), not all.
    time.sleep(3)
    proc.send_signal(signal.SIGINT)
    out = proc.communicate(timeout=120)[0]
    assert proc.returncode == 130, out
    assert "resume with `coterie eval --resume cut`" in out
    with duckdb.connect(str(home / "evals.duckdb"), read_only=True) as con:
        (status,) = con.execute("select status from eval_runs where run_id = 'cut'").fetchone()
        (first,) = con.execute("select count(*) from eval_samples where run_id = 'cut'").fetchone()
        finished_first = {
            sid
            for (sid,) in con.execute(
                "select sample_id from eval_samples where run_id = 'cut'"
            ).fetchall()
        }
    assert status == "interrupted" and 0 < first < total, (status, first)

    done = subprocess.run(
        [*base, "--resume", "cut"], capture_output=True, text=True, env=env, timeout=300
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"{total - first} run now, {first} already finished, 0 errors" in done.stdout
    with duckdb.connect(str(home / "evals.duckdb"), read_only=True) as con:
        assert con.execute(
            "select count(*), count(distinct sample_id), min(attempts), max(attempts) "
            "from eval_samples where run_id = 'cut' and status = 'ok'"
        ).fetchone() == (total, total, 1, 1)
        recorded = dict(
            con.execute(
                "select conversation_id, sample_id from eval_samples where run_id = 'cut'"
            ).fetchall()
        )
    with duckdb.connect(str(home / "audit.duckdb"), read_only=True) as con:
        calls = dict(
            con.execute(
                "select conversation_id, count(*) from events where kind = 'model_call' "
                "and conversation_id like 'eval:cut:%' group by 1"
            ).fetchall()
        )
    # Each recorded result's conversation made its two model calls ...
    assert all(calls.get(conv) == 2 for conv in recorded), (recorded, calls)
    # ... and no sample finished before the interruption ran again after it
    # (the resumed attempts' conversations are tagged "@r…").
    rerun = {conv.split(":")[2] for conv in calls if "@" in conv}
    assert rerun & finished_first == set() and len(rerun) == total - first
