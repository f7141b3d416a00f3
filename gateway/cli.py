"""``respgate`` command line: ``respgate serve [--host H] [--port P] [--engine simulated]``, ``respgate usage``."""

from __future__ import annotations

import argparse
import logging
import sys

import uvicorn

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
    serve.add_argument("--api-key", action="append", dest="api_keys", help="accepted bearer key (repeatable)")
    serve.add_argument("--log-level", default=None)
    prep = sub.add_parser("prepare-model", help="convert a packaged model into a cached folder vLLM can load")
    prep.add_argument("name", nargs="?", default="smollm2")
    prep.add_argument("--cache-dir", default=None)
    usage = sub.add_parser("usage", help="usage report from the billing ledger (per key, model and day)")
    usage.add_argument("--redis-url", default=None, help="default: RESPGATE_REDIS_URL / REDIS_URL")
    usage.add_argument("--stream", default=None, help="ledger stream (default: RESPGATE_USAGE_STREAM or respgate:usage)")
    usage.add_argument("--json", action="store_true", help="JSON rows instead of a table")
    args = parser.parse_args(argv)

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
                                     api_keys=args.api_keys, log_level=args.log_level)
        logging.basicConfig(level=settings.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s %(message)s")
        from gateway.app import create_app, uvicorn_config_kwargs

        from gateway.server import GatewayServer

        app = create_app(settings)
        config = uvicorn.Config(app, host=settings.host, port=settings.port, log_level=settings.log_level,
                                **uvicorn_config_kwargs(settings))
        GatewayServer(config).run()
        return 0
    return 2


if __name__ == "__main__":
    sys.exit(main())
