"""AutoGen AgentChat peer of the scale benchmark's burst: the same turns, run in AutoGen.

What it runs: ``--personas`` ``OpenAIChatCompletionClient``s (one per persona, as each
coterie persona holds one openai client) against the OpenAI-compatible server at ``--url``,
and for each burst ``--turns`` fresh ``AssistantAgent``s (``--turns / --personas``
conversations per persona, each agent one conversation), all ``run()`` at once in this one
process, each with one user message. AutoGen runs agents in one process and one event loop:
that is its shape, as a process per persona is coterie's.

What it measures, per burst: wall time of the ``asyncio.gather`` of the runs (agent
construction included, as coterie's burst includes opening a conversation), the CPU time of
this whole process meanwhile (``os.times``: user + system, the SDK and its HTTP client
included), and how many runs ended with the server's reply as their last message. First one
warm-up burst (connections opened, code paths loaded; as coterie's personas are warm), then
``--rounds`` bursts; the best wall is kept with its CPU. Memory: this process's USS after the
bursts (``psutil``), beside the USS before any client was built (the interpreter with
AutoGen imported).

AutoGen is not a dependency of coterie. Its ``autogen-ext[openai]`` needs a protobuf older
than the one coterie's environment holds, so it goes in a virtualenv of its own::

    python -m venv ~/autogen && ~/autogen/bin/pip install \\
        autogen-agentchat autogen-ext[openai] psutil

and ``benchmarks/scale.py --autogen-python ~/autogen/bin/python`` runs this script with it.
Run alone: ``~/autogen/bin/python benchmarks/_autogen_peer.py --url URL --json``; it prints one
JSON line (or a short summary without ``--json``). It imports nothing of coterie's.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import os
import time
from typing import Any


def _parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", required=True, help="the server's base URL (…/v1)")
    parser.add_argument("--personas", type=int, default=100)
    parser.add_argument("--turns", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=2, help="bursts after the warm-up")
    parser.add_argument("--json", action="store_true", help="print one JSON line")
    return parser.parse_args(argv)


def _cpu() -> float:
    times = os.times()
    return times.user + times.system


async def _burst(clients: list[Any], per: int, label: str) -> dict[str, Any]:
    from autogen_agentchat.agents import AssistantAgent

    async def one(persona: int, conversation: int) -> bool:
        agent = AssistantAgent(f"p{persona:03d}_{label}_{conversation}", clients[persona])
        result = await agent.run(task=f"hi {conversation}")
        last = result.messages[-1] if result.messages else None
        return bool(last is not None and getattr(last, "content", None) == "pong")

    gc.collect()
    cpu0, t0 = _cpu(), time.perf_counter()
    oks = await asyncio.gather(
        *(one(p, k) for k in range(per) for p in range(len(clients))), return_exceptions=True
    )
    wall, cpu = time.perf_counter() - t0, _cpu() - cpu0
    errors = [repr(o)[:120] for o in oks if isinstance(o, BaseException)]
    return {
        "wall": wall,
        "cpu": cpu,
        "n": len(oks),
        "ok": sum(1 for o in oks if o is True),
        "errors": errors[:3],
    }


async def _run(args: argparse.Namespace) -> dict[str, Any]:
    import psutil
    from autogen_agentchat import __version__ as agentchat_version
    from autogen_ext.models.openai import OpenAIChatCompletionClient
    from openai import __version__ as openai_version

    me = psutil.Process()
    uss_bare = me.memory_full_info().uss / 2**20
    model_info: Any = {
        "vision": False,
        "function_calling": True,
        "json_output": False,
        "structured_output": False,
        "family": "unknown",
    }
    clients = [
        OpenAIChatCompletionClient(
            model="fake-model",
            base_url=args.url,
            api_key="sk-bench-dummy",
            model_info=model_info,
            max_retries=0,
        )
        for _ in range(args.personas)
    ]
    per = max(1, args.turns // args.personas)
    await _burst(clients, per, "warm")
    bursts = [await _burst(clients, per, f"r{r}") for r in range(args.rounds)]
    uss = me.memory_full_info().uss / 2**20
    for client in clients:
        await client.close()
    best = min(bursts, key=lambda b: b["wall"])
    return {
        "autogen_agentchat": agentchat_version,
        "openai": openai_version,
        "personas": args.personas,
        "turns": per * args.personas,
        "walls": [b["wall"] for b in bursts],
        "wall": best["wall"],
        "cpu": best["cpu"],
        "cpu_per_turn_ms": best["cpu"] * 1000 / max(1, best["n"]),
        "n": best["n"],
        "ok": best["ok"],
        "errors": best["errors"],
        "uss_mib": uss,
        "uss_bare_mib": uss_bare,
    }


def main(argv: list[str] | None = None) -> None:
    args = _parse_args(argv)
    out = asyncio.run(_run(args))
    if args.json:
        print(json.dumps(out))
    else:
        print(
            f"AutoGen AgentChat {out['autogen_agentchat']}: {out['turns']} turns over "
            f"{out['personas']} clients in {out['wall']:.2f} s, "
            f"{out['cpu_per_turn_ms']:.2f} ms CPU per turn, {out['ok']} ok, "
            f"USS {out['uss_mib']:.0f} MiB"
        )


if __name__ == "__main__":
    main()
