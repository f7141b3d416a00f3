"""``respgate`` command line: ``respgate serve [--host H] [--port P] [--engine simulated]``."""

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
    serve.add_argument("--api-key", action="append", dest="api_keys", help="accepted bearer key (repeatable)")
    serve.add_argument("--log-level", default=None)
    prep = sub.add_parser("prepare-model", help="convert a packaged model into a cached folder vLLM can load")
    prep.add_argument("name", nargs="?", default="smollm2")
    prep.add_argument("--cache-dir", default=None)
    args = parser.parse_args(argv)

    if args.command == "prepare-model":
        from inference.model_assets import prepare_model

        print(prepare_model(args.name, args.cache_dir, progress=True))
        return 0

    if args.command == "serve":
        settings = Settings.from_env(host=args.host, port=args.port, engine=args.engine, models=args.models,
                                     model_path=args.model_path, remote_url=args.remote_url,
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
