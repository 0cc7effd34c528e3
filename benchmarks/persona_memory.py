"""Where an active persona's memory goes: Ray's, the SDK's and coterie's.

``python benchmarks/persona_memory.py [--personas 3] [--conversations 10] [--rounds 3]``

One Ray worker built as coterie's actors are (its serialization context
without pyarrow, pydantic.v1 and starlette: ``actors._lean``) takes, one
stage at a time, what an OpenAI persona's process holds, and reports its
private memory (USS) after each stage:

1. the worker itself, before anything is imported: Ray's;
2. ``import openai``, the client as the provider builds it (aiohttp
   transport) and ``--conversations`` requests at once through its
   ``post``, as the SDK floor of ``scale.py`` makes them: the SDK's;
3. coterie's modules, those of ``import coterie.actors.persona`` and those
   Ray imports wherever a handle to an actor is made (a persona holds the
   router's, the audit log's and the memory store's; the scheduler's it
   makes at its first fire or reminder);
4. coterie's OpenAI provider over that same client (a persona holds one),
   the same number of requests through it, every built-in tool offered.

Then ``--personas`` real persona actors, each with ``--conversations``
conversations over ``--rounds`` bursts against the same server, and their
mean USS once quiet: what is above stage 4 is the persona's own state (its
conversations, audit buffer and spool, tool registry, its actor's
machinery). Then fresh personas take ``--wide`` conversations each at once:
their USS as the replies are in (the burst's high-water mark) and once they
have been quiet long enough for their heaps to be trimmed
(``runtime.heap``), each beside the first personas'. The last lines say
how much of the persona is coterie's against the issue 41 target of 70 MiB.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import psutil
import ray
from rich.table import Table

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks._procs import compile_coterie  # noqa: E402
from benchmarks.personas import (  # noqa: E402
    KEY_ENV,
    MiB,
    ask_all,
    console,
    fake_server,
    openai_persona,
    persona_pids,
    uss_mib,
    write_persona,
)
from coterie import Runtime  # noqa: E402
from coterie.runtime.heap import QUIET_FOR  # noqa: E402

TARGET = 70.0
#: The actor modules Ray loads in a persona's process, which holds a handle to
#: each (the scheduler's it makes at its first fire or reminder).
HANDLES = ("router", "audit", "memory")


class Stages:
    """One worker taking a persona's parts a stage at a time (async, as a persona is)."""

    def __init__(self, base_url: str, requests: int) -> None:
        self.base_url = base_url
        self.requests = requests
        self.client: Any = None
        self.model: Any = None

    async def uss(self) -> float:
        gc.collect()
        return float(psutil.Process().memory_full_info().uss / MiB)

    async def sdk(self) -> float:
        # The call of scale.py's SdkActor, written again here: a worker whose
        # class came from there would import scale.py and all it imports.
        import openai

        self.client = openai.AsyncOpenAI(
            api_key="sk-bench-dummy",
            base_url=self.base_url,
            max_retries=0,
            http_client=openai.DefaultAioHttpClient(timeout=60.0),
        )

        async def call(n: int) -> Any:
            body = {"model": "fake-model", "messages": [{"role": "user", "content": f"hi {n}"}]}
            return await self.client.post(
                "/chat/completions",
                body=body,
                cast_to=object,
                options={"security": {"bearer_auth": True}},
            )

        await asyncio.gather(*(call(n) for n in range(self.requests)))
        return await self.uss()

    async def coterie_modules(self) -> float:
        import importlib

        import coterie.actors.persona  # noqa: F401

        for name in HANDLES:
            importlib.import_module(f"coterie.actors.{name}")
        return await self.uss()

    async def provider(self) -> float:
        from coterie.runtime.config.models import OpenAIModelConfig
        from coterie.runtime.messages import ModelRequest, UserMessage
        from coterie.runtime.models import build_model
        from coterie.tools import builtin_registry

        os.environ[KEY_ENV] = "sk-bench-dummy"
        self.model = build_model(
            OpenAIModelConfig(
                provider="openai",
                name="fake-model",
                base_url=self.base_url,
                api_key_env=KEY_ENV,
                max_retries=0,
            )
        )
        # The floor's client, built as the provider builds its own: a persona
        # holds one, and its cost is the SDK's (counted in the stage before).
        self.model._client = self.client
        registry = builtin_registry()
        tools = [spec.definition() for spec in (registry.get(n) for n in registry.names()) if spec]
        requests = [
            ModelRequest(system="be brief", messages=[UserMessage(text=f"hi {n}")], tools=tools)
            for n in range(self.requests)
        ]
        await asyncio.gather(*(self.model.request(r) for r in requests))
        return await self.uss()


def lean_stages() -> Any:
    import coterie.actors._lean as lean

    return ray.remote(num_cpus=0)(type("LeanStages", (Stages,), {"_lean": lean}))


def personas_uss(
    base_url: str, personas: int, conversations: int, rounds: int
) -> tuple[float, float]:
    """Mean USS of ``personas`` OpenAI personas after ``rounds`` bursts of
    ``conversations`` conversations each: as the last burst's replies are in,
    and once they have been quiet for a while (their heaps trimmed,
    ``runtime.heap``)."""
    with tempfile.TemporaryDirectory() as tmp:
        home = Path(tmp)
        names = [f"mem-{i}" for i in range(personas)]
        body = openai_persona(base_url)
        body["tools"] = {"catalogue": "auto"}  # every built-in tool, as scale.py offers them
        for name in names:
            write_persona(home, name, body)
        rt = Runtime.start(home=home)
        try:
            pids: set[int] = set()
            for _ in range(rounds):
                asks = [(p, f"{p}:c{k}") for k in range(conversations) for p in names]
                _, _, replies = asyncio.run(ask_all(rt, asks))
                bad = [r.error for r in replies if r.status != "ok"]
                if bad:
                    raise RuntimeError(f"{len(bad)} turns failed: {bad[0]}")
                pids = pids or persona_pids(rt, names)
            # Within the trimmer's pause (QUIET_FOR): the burst's high-water mark.
            at_end = sum(uss_mib(pid) for pid in pids) / len(pids)
            rt.flush()
            time.sleep(QUIET_FOR + 1.5)  # the audit buffer's last flush, the trim
            quiet = sum(uss_mib(pid) for pid in pids) / len(pids)
            return at_end, quiet
        finally:
            rt.shutdown()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--personas", type=int, default=3)
    parser.add_argument("--conversations", type=int, default=10, help="per persona, at once")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument(
        "--wide", type=int, default=100, help="conversations per persona at once, the second burst"
    )
    args = parser.parse_args()
    console.print(compile_coterie())
    os.environ[KEY_ENV] = "sk-bench-dummy"  # persona actors inherit the driver's env
    os.environ.pop("RAY_ADDRESS", None)
    with fake_server(0.05) as server:
        base_url = server.base_url.removesuffix("/chat/completions")
        ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False)
        try:
            probe = lean_stages().remote(base_url, args.conversations)
            worker = ray.get(probe.uss.remote())
            sdk = ray.get(probe.sdk.remote())
            modules = ray.get(probe.coterie_modules.remote())
            provider = ray.get(probe.provider.remote())
            ray.kill(probe)
            ray.shutdown()
            _, persona = personas_uss(
                server.base_url, args.personas, args.conversations, args.rounds
            )
            wide_end, wide = personas_uss(server.base_url, args.personas, args.wide, 1)
        finally:
            if ray.is_initialized():
                ray.shutdown()
    rows = [
        ("a Ray worker built as coterie's actors", worker, worker, "Ray"),
        ("+ import openai, its client, requests through post", sdk, sdk - worker, "the SDK"),
        (
            "+ coterie's modules (persona, and the actors its handles load)",
            modules,
            modules - sdk,
            "coterie",
        ),
        (
            "+ coterie's OpenAI provider, every built-in tool offered",
            provider,
            provider - modules,
            "coterie",
        ),
        ("a persona actor after its turns (mean)", persona, persona - provider, "coterie"),
        (
            f"after {args.wide} conversations at once, as the replies are in",
            wide_end,
            wide_end - persona,
            "coterie",
        ),
        (f"the same, quiet for {QUIET_FOR:g} s (heap trimmed)", wide, wide - persona, "coterie"),
    ]
    table = Table(
        title=f"USS of one process, stage by stage ({args.conversations} requests at once; "
        f"{args.personas} personas, {args.conversations} conversations, {args.rounds} rounds)"
    )
    for column in ("stage", "USS MiB", "added MiB", "whose"):
        table.add_column(column, justify="left" if column in ("stage", "whose") else "right")
    for label, total, added, whose in rows:
        table.add_row(label, f"{total:.2f}", f"{added:+.2f}", whose)
    console.print(table)
    ours = persona - sdk
    console.print(
        f"floor (Ray + SDK): {sdk:.2f} MiB; persona {persona:.2f} MiB = {persona / sdk:.2f}x the "
        f"floor; coterie's share {ours:.2f} MiB (modules {modules - sdk:.2f}, provider "
        f"{provider - modules:.2f}, the persona's state {persona - provider:.2f}). "
        f"Target (issue 41): <= {TARGET:g} MiB: "
        + ("met" if persona <= TARGET else f"missed; the floor alone leaves {TARGET - sdk:.2f} MiB")
    )


if __name__ == "__main__":
    main()
