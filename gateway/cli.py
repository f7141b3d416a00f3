"""``respgate`` command line: ``respgate serve [--host H] [--port P] [--engine simulated]``, ``respgate usage``,
``respgate keys create|list|revoke``."""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys
import time

import uvicorn

from gateway.auth import KeyAuth, OpenModeRefused, build_key_store
from gateway.settings import Settings


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="respgate", description="OpenAI Responses API gateway in front of vLLM")
    sub = parser.add_subparsers(dest="command", required=True)
    serve = sub.add_parser("serve", help="run the gateway")
    serve.add_argument("--host", default=None)
    serve.add_argument("--port", type=int, default=None)
    serve.add_argument("--engine", choices=["auto", "simulated", "vllm", "remote-vllm"], default=None)
    serve.add_argument("--remote-url", default=None, help="remote-vllm: the vLLM server's base URL")
    serve.add_argument("--model-path", default=None, help="model folder, or packaged:<name> (default packaged:smollm2)")
    serve.add_argument("--model", action="append", dest="models", help="served model name (repeatable)")
    serve.add_argument("--models-file", default=None, help="JSON list of models, each with its own engine")
    serve.add_argument("--api-key", action="append", dest="api_keys",
                       help="static bearer key, KEY or TENANT:KEY (repeatable)")
    serve.add_argument("--open-mode", action="store_true", default=None,
                       help="with no API keys, serve without authentication even on a non-loopback address")
    serve.add_argument("--log-level", default=None)
    prep = sub.add_parser("prepare-model", help="convert a packaged model into a cached folder vLLM can load")
    prep.add_argument("name", nargs="?", default="smollm2")
    prep.add_argument("--cache-dir", default=None)
    usage = sub.add_parser("usage", help="usage report from the billing ledger (per key, model and day)")
    usage.add_argument("--redis-url", default=None, help="default: RESPGATE_REDIS_URL / REDIS_URL")
    usage.add_argument("--stream", default=None, help="ledger stream (default: RESPGATE_USAGE_STREAM or respgate:usage)")
    usage.add_argument("--json", action="store_true", help="JSON rows instead of a table")
    add_keys_parser(sub)
    args = parser.parse_args(argv)

    if args.command == "keys":
        return keys_command(args)

    if args.command == "usage":
        from billing.report import print_report, usage_report

        settings = Settings.from_env(redis_url=args.redis_url, usage_stream=args.stream)
        if not settings.redis_url:
            print("respgate usage: no ledger (set --redis-url or RESPGATE_REDIS_URL)", file=sys.stderr)
            return 2
        print_report(usage_report(settings.redis_url, settings.usage_stream), sys.stdout, as_json=args.json)
        return 0

    if args.command == "prepare-model":
        from inference.model_assets import prepare_model

        print(prepare_model(args.name, args.cache_dir, progress=True))
        return 0

    if args.command == "serve":
        settings = Settings.from_env(host=args.host, port=args.port, engine=args.engine, models=args.models,
                                     model_path=args.model_path, remote_url=args.remote_url,
                                     models_file=args.models_file,
                                     api_keys=args.api_keys, log_level=args.log_level, open_mode=args.open_mode)
        from security.redact import install as install_redaction

        # Before any logging is configured: every record from every logger is scrubbed of keys.
        install_redaction(KeyAuth(settings.api_keys).static_secrets)
        logging.basicConfig(level=settings.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s %(message)s")
        refusal = asyncio.run(_open_mode_refusal(settings))
        if refusal:
            print(f"respgate serve: {refusal}", file=sys.stderr)
            return 2
        from gateway.app import create_app, uvicorn_config_kwargs

        from gateway.server import GatewayServer

        app = create_app(settings)
        config = uvicorn.Config(app, host=settings.host, port=settings.port, log_level=settings.log_level,
                                **uvicorn_config_kwargs(settings))
        GatewayServer(config).run()
        return 0
    return 2


async def _open_mode_refusal(settings: Settings) -> str | None:
    """Why ``serve`` must not start (no keys and not loopback), checked before any engine loads."""
    auth = KeyAuth(settings.api_keys, build_key_store(settings.redis_url, settings.keys_file),
                   open_mode=settings.open_mode)
    try:
        await auth.check_startup(settings.host)
    except OpenModeRefused as exc:
        return str(exc)
    finally:
        await auth.close()
    return None


# -- respgate keys ------------------------------------------------------------------------------------


def add_keys_parser(sub: argparse._SubParsersAction) -> None:
    keys = sub.add_parser("keys", help="issue, list and revoke API keys (Redis with REDIS_URL, else a local file)")
    keys.add_argument("--redis-url", default=None, help="default: RESPGATE_REDIS_URL / REDIS_URL")
    keys.add_argument("--keys-file", default=None, help="default: RESPGATE_KEYS_FILE or <cache dir>/keys.json")
    ksub = keys.add_subparsers(dest="keys_command", required=True)
    create = ksub.add_parser("create", help="issue a key (printed once; only its hash is stored)")
    create.add_argument("--tenant", required=True, help="the tenant the key belongs to (responses are per tenant)")
    create.add_argument("--name", default="", help="a label for humans")
    create.add_argument("--rpm", type=int, default=None, help="requests per minute for this key")
    create.add_argument("--tpm", type=int, default=None, help="tokens per minute for this key")
    create.add_argument("--max-connections", type=int, default=None, help="concurrent WebSocket connections")
    ls = ksub.add_parser("list", help="list keys (never their secrets)")
    ls.add_argument("--json", action="store_true")
    revoke = ksub.add_parser("revoke", help="revoke a key by id (or by the key itself)")
    revoke.add_argument("key_id")


def keys_command(args: argparse.Namespace) -> int:
    from security.keys import KeyLimits, create_key

    settings = Settings.from_env(redis_url=args.redis_url, keys_file=args.keys_file)
    store = build_key_store(settings.redis_url, settings.keys_file)
    if store is None:
        print("respgate keys: no key store (set --keys-file or --redis-url)", file=sys.stderr)
        return 2
    where = "redis" if settings.redis_url else settings.keys_file

    async def run() -> int:
        try:
            if args.keys_command == "create":
                limits = KeyLimits(rpm=args.rpm, tpm=args.tpm, ws_connections=args.max_connections)
                try:
                    key, record = await create_key(store, args.tenant, args.name, limits)
                except ValueError as exc:
                    print(f"respgate keys create: {exc}", file=sys.stderr)
                    return 2
                print(key)
                print(f"created {record.id} for tenant {record.tenant} in {where}; "
                      "the key is shown only once", file=sys.stderr)
                return 0
            if args.keys_command == "list":
                records = await store.list()
                if args.json:
                    import json

                    for r in records:
                        row = r.to_json()
                        row.pop("hash")
                        print(json.dumps(row))
                    return 0
                print(f"{'id':22} {'tenant':20} {'name':16} {'created (UTC)':20} {'rpm':>7} {'tpm':>9} status")
                for r in records:
                    created = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(r.created_at))
                    lim = r.limits
                    print(f"{r.id:22} {r.tenant:20} {r.name:16} {created:20} {lim.rpm or '-':>7} {lim.tpm or '-':>9} "
                          f"{'active' if r.active else 'revoked'}")
                return 0
            record = await store.revoke(args.key_id)
            if record is None:
                print(f"respgate keys revoke: no key {args.key_id!r}", file=sys.stderr)
                return 1
            print(f"revoked {record.id} (tenant {record.tenant})")
            return 0
        finally:
            await store.close()

    return asyncio.run(run())


if __name__ == "__main__":
    sys.exit(main())
