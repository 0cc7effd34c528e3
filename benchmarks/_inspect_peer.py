"""Inspect AI peer of the evaluator benchmark: the same tool-use task, run in Inspect AI.

What it measures: wall time of one ``inspect_ai.eval()`` call (imports and task construction
excluded), throughput in samples/s, peak RSS (``ru_maxrss`` of this process and, separately, of
any children), accuracy from the returned ``EvalLog`` and the number of model calls made.

The task: sample ``i`` asks "What is {a} + {b}? Use the add tool." with seeded small ints and
target ``str(a + b)``; the solver is ``use_tools(add())`` then ``generate()``; the scorer is
``includes()``; epochs 1, ``max_samples`` from ``--max-samples`` and ``max_connections`` equal to
it so that connections never limit concurrency.

The model is Inspect's own ``mockllm/model``. Its ``custom_outputs`` may be a callable taking
``(input, tools, tool_choice, config)`` (sync or async), which is used here instead of a fixed
list: samples run concurrently, so a shared list of scripted outputs would be consumed in an
arbitrary interleaving and hand one sample another's answer. The callable reads the conversation
instead: if the last message is a tool result it answers "The answer is {result}."; otherwise it
emits a tool call to ``add`` with the two ints parsed from the user's question. Each sample thus
makes exactly two model calls whatever the interleaving. Every output carries explicit
``ModelUsage``; without it mockllm counts tokens itself, which may fetch a tokenizer (offline
failure). ``--latency`` makes each call ``await asyncio.sleep(latency)`` first, to stand for a
remote model.

Everything else is what an Inspect user gets by default (``eval`` log format, samples logged),
except that the display is off and logs go to a temporary directory that is deleted afterwards.

Run: ``python benchmarks/_inspect_peer.py --samples 500 --latency 0 --max-samples 100 --json``.
It prints one JSON line (or a short human-readable summary without ``--json``).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import re
import resource
import shutil
import sys
import tempfile
import time
from typing import Any

QUESTION = "What is {a} + {b}? Use the add tool."
QUESTION_RE = re.compile(r"What is (-?\d+) \+ (-?\d+)\?")


def _parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=500, help="number of samples")
    parser.add_argument("--latency", type=float, default=0.0, help="seconds per model call")
    parser.add_argument("--max-samples", type=int, default=100, help="samples in flight")
    parser.add_argument("--seed", type=int, default=1234, help="seed for the operands")
    parser.add_argument("--json", action="store_true", help="print one JSON line")
    return parser.parse_args(argv)


def _offline_env(log_dir: str) -> None:
    """Point Inspect at a temporary log dir and keep it from anything interactive or remote."""
    os.environ["INSPECT_LOG_DIR"] = log_dir
    os.environ["INSPECT_DISPLAY"] = "none"
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")


def _rss_mib(who: int) -> float:
    # ru_maxrss is in KiB on Linux.
    return round(resource.getrusage(who).ru_maxrss / 1024, 1)


def run(samples: int, latency: float, max_samples: int, seed: int, log_dir: str) -> dict[str, Any]:
    _offline_env(log_dir)  # before Inspect is imported, so that it reads these settings
    from inspect_ai import Task, eval
    from inspect_ai import __version__ as inspect_version
    from inspect_ai.dataset import Sample
    from inspect_ai.model import (
        ChatMessage,
        ChatMessageTool,
        GenerateConfig,
        ModelOutput,
        ModelUsage,
        get_model,
    )
    from inspect_ai.scorer import includes
    from inspect_ai.solver import generate, use_tools
    from inspect_ai.tool import Tool, ToolChoice, ToolInfo, tool

    @tool
    def add() -> Tool:
        async def execute(x: int, y: int) -> int:
            """Add two integers.

            Args:
                x: First integer.
                y: Second integer.

            Returns:
                The sum of x and y.
            """
            return x + y

        return execute

    calls = 0

    async def scripted(
        input: list[ChatMessage],
        tools: list[ToolInfo],
        tool_choice: ToolChoice,
        config: GenerateConfig,
    ) -> ModelOutput:
        nonlocal calls
        calls += 1
        if latency > 0:
            await asyncio.sleep(latency)
        last = input[-1]
        if isinstance(last, ChatMessageTool):
            output = ModelOutput.from_content("mockllm/model", f"The answer is {last.text}.")
        else:
            match = QUESTION_RE.search(input[-1].text)
            assert match is not None, input[-1].text
            x, y = int(match.group(1)), int(match.group(2))
            output = ModelOutput.for_tool_call("mockllm/model", "add", {"x": x, "y": y})
        output.usage = ModelUsage(input_tokens=20, output_tokens=10, total_tokens=30)
        return output

    rng = random.Random(seed)
    dataset = []
    for i in range(samples):
        a, b = rng.randint(1, 99), rng.randint(1, 99)
        dataset.append(Sample(id=i, input=QUESTION.format(a=a, b=b), target=str(a + b)))
    task = Task(dataset=dataset, solver=[use_tools(add()), generate()], scorer=includes())
    model = get_model("mockllm/model", custom_outputs=scripted)

    start = time.perf_counter()
    logs = eval(
        task,
        model=model,
        epochs=1,
        max_samples=max_samples,
        max_connections=max_samples,
        display="none",
        log_dir=log_dir,
    )
    wall = time.perf_counter() - start

    log = logs[0]
    if log.status != "success" or log.results is None:
        raise RuntimeError(f"eval did not succeed: {log.status} {log.error}")
    accuracy = log.results.scores[0].metrics["accuracy"].value
    return {
        "samples": samples,
        "wall_s": round(wall, 3),
        "samples_per_s": round(samples / wall, 1),
        "peak_rss_mib": _rss_mib(resource.RUSAGE_SELF),
        "peak_rss_children_mib": _rss_mib(resource.RUSAGE_CHILDREN),
        "accuracy": accuracy,
        "model_calls": calls,
        "inspect_version": inspect_version,
    }


def main(argv: list[str] | None = None) -> int:
    args = _parse_args(argv)
    log_dir = tempfile.mkdtemp(prefix="inspect-peer-")
    try:
        result = run(args.samples, args.latency, args.max_samples, args.seed, log_dir)
    finally:
        shutil.rmtree(log_dir, ignore_errors=True)
    if args.json:
        print(json.dumps(result))
    else:
        for key, value in result.items():
            print(f"{key:>22}: {value}")
    ok = result["accuracy"] == 1.0 and result["model_calls"] == 2 * args.samples
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
