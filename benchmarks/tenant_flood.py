"""Memory under a one-tenant flood: does the process stay within its configured bounds, and does the
other tenant keep what it stored? (issue 28 items 9 and 10)

A gateway of its own (a child process, simulated engine, two static keys: tenants ``a`` and ``b``)
with the memory stores bounded at ``--bound-mib`` each (responses, conversations; the other caches a
flood of distinct requests fills — rendered prefixes, checked items — at 1 MiB each). Tenant ``b``
stores 20 responses and 20 conversations; then tenant ``a`` creates ``--conversations`` empty
conversations with full metadata (16 keys of 64 characters, values of 512: the most the API
allows), then ``--responses`` ``store=true`` responses with the same metadata. The child's RSS is
read before and after each flood; the JSON says how much it grew against the bound, and how many of
``b``'s records are still there.

    python -m benchmarks.tenant_flood [--conversations 20000] [--responses 12000] [--bound-mib 16] [--out F]

``tests/cache/test_tenant_bounds.py`` runs it smaller and asserts the growth stays within the bounds plus a
fixed slack.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
from typing import Any

import httpx

from benchmarks.common import MODEL, ROOT, proc_rss_bytes, wait_healthy

KEYS = ["a:flood-key-a", "b:flood-key-b"]
METADATA = {f"key{i:02d}".ljust(64, "k"): "v" * 512 for i in range(16)}
#: what the caches other than the two stores may hold in the child (``serve``)
OTHER_CACHES = 2 * 1024 * 1024


def serve(port: int, bound: int) -> None:
    """The child: the gateway with the stores bounded at ``bound`` bytes each."""
    import uvicorn

    from gateway.app import create_app, uvicorn_config_kwargs
    from gateway.base.settings import Settings
    from gateway.ops.server import GatewayServer
    from inference.harmony import HarmonyRenderer
    from inference.registry import ModelRegistry, ModelRoute
    from inference.simulated import SimulatedEngine
    from inference.simulated_script import Turn

    settings = Settings(
        port=port,
        log_level="warning",
        usage_journal="",
        api_keys=KEYS,
        store_max_bytes=bound,
        conversation_store_max_bytes=bound,
        prefix_cache_bytes=OTHER_CACHES // 2,
        prefix_cache_tenant_bytes=OTHER_CACHES // 8,
        item_checks_bytes=OTHER_CACHES // 2,
    )
    engine = SimulatedEngine(script=lambda view: Turn(text="done"))
    registry = ModelRegistry(
        [ModelRoute(name=MODEL, engine=engine, renderer=HarmonyRenderer(), max_context=settings.max_context)]
    )
    config = uvicorn.Config(
        create_app(settings, registry=registry),
        host="127.0.0.1",
        port=port,
        log_level="warning",
        lifespan="on",
        **uvicorn_config_kwargs(settings),
    )
    GatewayServer(config).run()


def flood(conversations: int, responses: int, bound: int) -> dict[str, Any]:
    from tests.conftest import free_port

    port = free_port()
    url = f"http://127.0.0.1:{port}"
    proc = subprocess.Popen(
        [sys.executable, "-m", "benchmarks.tenant_flood", "--serve", str(port), "--bound-bytes", str(bound)],
        cwd=ROOT,
        start_new_session=True,
    )
    try:
        wait_healthy(proc, url, what="tenant_flood server", path="/readyz", timeout_s=120, poll_s=0.1)
        a = httpx.Client(base_url=url + "/v1", headers={"authorization": "Bearer flood-key-a"}, timeout=60)
        b = httpx.Client(base_url=url + "/v1", headers={"authorization": "Bearer flood-key-b"}, timeout=60)

        def ok(r: httpx.Response) -> dict[str, Any]:
            if r.status_code != 200:
                raise RuntimeError(f"{r.status_code}: {r.text[:300]}")
            return r.json()

        b_responses = [ok(b.post("/responses", json={"model": MODEL, "input": f"b{i}"}))["id"] for i in range(20)]
        b_convs = [ok(b.post("/conversations", json={"metadata": {"n": str(i)}}))["id"] for i in range(20)]
        for i in range(50):  # warm every path the floods take (imports, first allocations)
            ok(a.post("/conversations", json={"metadata": METADATA}))
            ok(a.post("/responses", json={"model": MODEL, "input": f"warm{i}", "metadata": METADATA}))
        rss0 = proc_rss_bytes(proc.pid)
        for _ in range(conversations):
            ok(a.post("/conversations", json={"metadata": METADATA}))
        rss1 = proc_rss_bytes(proc.pid)
        for i in range(responses):
            ok(a.post("/responses", json={"model": MODEL, "input": f"a{i}", "metadata": METADATA}))
        rss2 = proc_rss_bytes(proc.pid)
        b_kept = {
            "responses": sum(b.get(f"/responses/{rid}").status_code == 200 for rid in b_responses),
            "conversations": sum(b.get(f"/conversations/{cid}").status_code == 200 for cid in b_convs),
        }
        a.close()
        b.close()
    finally:
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGTERM)
            proc.wait(timeout=30)
    mib = 1024 * 1024
    return {
        "bound_mib_each": bound / mib,
        "other_caches_mib": OTHER_CACHES / mib,
        "conversations": conversations,
        "responses": responses,
        "rss_before_mib": rss0 / mib,
        "conversations_growth_mib": (rss1 - rss0) / mib,
        "responses_growth_mib": (rss2 - rss1) / mib,
        "total_growth_mib": (rss2 - rss0) / mib,
        "b_kept": b_kept,
        "b_stored": {"responses": 20, "conversations": 20},
    }


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--conversations", type=int, default=20_000)
    ap.add_argument("--responses", type=int, default=12_000)
    ap.add_argument("--bound-mib", type=float, default=16)
    ap.add_argument("--bound-bytes", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--serve", type=int, metavar="PORT", help=argparse.SUPPRESS)
    ap.add_argument("--out", help="write the JSON here too")
    args = ap.parse_args(argv)
    bound = args.bound_bytes or int(args.bound_mib * 1024 * 1024)
    if args.serve:
        serve(args.serve, bound)
        return
    result = flood(args.conversations, args.responses, bound)
    text = json.dumps(result, indent=2)
    print(text)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text + "\n")


if __name__ == "__main__":
    main()
