"""Real third-party clients end to end against a live gateway (real-clients spec §2-§4).

* **Codex CLI** (npm ``@openai/codex``, pinned in ``tests/clients/package-lock.json``; ``make test``
  runs ``npm ci`` there) runs ``codex exec`` non-interactively. The simulated engine is scripted to
  call Codex's ``exec_command`` tool with a shell command and, once the command's output comes
  back, to answer with it. Codex really runs the command. Over WebSocket the test checks what the
  gateway received: a ``generate:false`` warm-up, turns chained with ``previous_response_id`` and
  ``store:false`` carrying only new items, and no ``POST /v1/responses`` (no fallback to HTTP);
  over HTTP, full history on every POST.
* **openai-agents** ``responses_websocket_session``: an agent with a function tool, chained runs.
* **openai SDK** async WebSocket client (``AsyncOpenAI().responses.connect()``): a tool loop.

What the gateway saw is recorded by an ASGI wrapper around the running app (method + path of every
HTTP request, every WebSocket text frame), so the assertions are about the wire, not the client's
own report of it.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest

from gateway.base.settings import Settings
from inference.simulated import SimulatedEngine
from inference.simulated_prompt import PromptView
from inference.simulated_script import ToolCall, Turn

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]

CLIENTS = Path(__file__).resolve().parent
CODEX_BIN = CLIENTS / "node_modules" / ".bin" / "codex"
CODEX_MODEL = "gpt-5.5"  # a slug bundled with Codex 0.171: its known request shape (spec §4)
MARKER = "respgate-e2e-7f3a"
DEAD_PROXY = "http://127.0.0.1:9"  # the discard port: nothing listens on loopback


class WireLog:
    """ASGI wrapper that records what reached the gateway: HTTP requests and WS client frames."""

    def __init__(self, app: Any) -> None:
        self.app = app
        self.http: list[tuple[str, str]] = []
        self.http_bodies: list[dict[str, Any]] = []  # JSON bodies of POST /v1/responses
        self.ws_frames: list[dict[str, Any]] = []
        self.ws_connections = 0

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "http":
            self.http.append((scope["method"], scope["path"]))
            if scope["method"] == "POST" and scope["path"] == "/v1/responses":
                chunks: list[bytes] = []

                async def body_receive() -> dict[str, Any]:
                    msg = await receive()
                    if msg["type"] == "http.request":
                        chunks.append(msg.get("body", b""))
                        if not msg.get("more_body"):
                            self.http_bodies.append(json.loads(b"".join(chunks)))
                    return msg

                return await self.app(scope, body_receive, send)
        elif scope["type"] == "websocket":
            self.ws_connections += 1

            async def logged_receive() -> dict[str, Any]:
                msg = await receive()
                if msg["type"] == "websocket.receive" and msg.get("text"):
                    self.ws_frames.append(json.loads(msg["text"]))
                return msg

            return await self.app(scope, logged_receive, send)
        return await self.app(scope, receive, send)


def record_wire(live: Any) -> WireLog:
    """Wrap the running server's app; uvicorn reads ``config.loaded_app`` per new connection."""
    log = WireLog(live.server.config.loaded_app)
    live.server.config.loaded_app = log
    return log


def shell_then_answer(command: str, tool: str = "exec_command", arg: str = "cmd"):
    """Script: after the user speaks, run ``command`` through ``tool``; after a tool output, answer
    with that output (so the test can see the command's result travelled model -> client -> model)."""

    def script(view: PromptView) -> Turn | None:
        last = view.last
        if last is not None and last.role == "tool":
            return Turn(
                reasoning="The command ran; report its output.",
                text=f"FINAL ANSWER. The command printed: {last.text.strip()[-200:]}",
            )
        if last is not None and last.role == "user":
            return Turn(reasoning="I should run the command first.", tool_calls=(ToolCall(tool, {arg: command}),))
        return None

    return script


# ---------------------------------------------------------------------------------------------
# Codex CLI
# ---------------------------------------------------------------------------------------------


def codex_config(base_url: str, *, websockets: bool) -> str:
    return f"""model = "{CODEX_MODEL}"
model_provider = "respgate"
approval_policy = "never"
sandbox_mode = "danger-full-access"
check_for_update_on_startup = false
chatgpt_base_url = "{base_url}"

[analytics]
enabled = false

[otel]
exporter = "none"

[model_providers.respgate]
name = "respgate under test"
base_url = "{base_url}"
wire_api = "responses"
env_key = "RESPGATE_TEST_KEY"
supports_websockets = {"true" if websockets else "false"}
request_max_retries = 0
stream_max_retries = 0
stream_idle_timeout_ms = 60000
"""


def run_codex(tmp_path: Path, base_url: str, prompt: str, *, websockets: bool) -> list[dict[str, Any]]:
    if not CODEX_BIN.exists():
        pytest.fail(f"Codex CLI is not installed: run `npm ci --prefix {CLIENTS}` (make test does)")
    home = tmp_path / "codex-home"
    work = tmp_path / "work"
    home.mkdir()
    work.mkdir()
    (home / "config.toml").write_text(codex_config(base_url, websockets=websockets))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OPENAI_", "CODEX_"))}
    env.update(CODEX_HOME=str(home), RESPGATE_TEST_KEY="test-key", NO_COLOR="1", HOME=str(tmp_path))
    # Loopback only. Codex 0.171 looks up api.github.com (release check) and chatgpt.com on its own;
    # every such request is sent to a closed loopback port instead (connection refused at once), and
    # only the gateway is exempt.
    for var in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY"):
        env[var] = env[var.lower()] = DEAD_PROXY
    env["NO_PROXY"] = env["no_proxy"] = "127.0.0.1,localhost"
    cmd = [str(CODEX_BIN), "exec", "--skip-git-repo-check", "--ephemeral", "--json", "-C", str(work), prompt]
    # Codex retries forever when the server is unreachable (spec §4): the subprocess timeout bounds it
    proc = subprocess.run(cmd, stdin=subprocess.DEVNULL, capture_output=True, text=True, env=env, cwd=work, timeout=180)
    events = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    assert proc.returncode == 0, (
        f"codex exited {proc.returncode}\nstdout:\n{proc.stdout}\nstderr:\n{proc.stderr[-3000:]}"
    )
    return events


def check_codex_run(events: list[dict[str, Any]], engine: SimulatedEngine) -> None:
    errors = [
        e for e in events if e.get("type") in ("error", "turn.failed") or e.get("item", {}).get("type") == "error"
    ]
    assert not errors, errors  # includes "Falling back from WebSockets to HTTPS transport"
    done = [e["item"] for e in events if e["type"] == "item.completed"]
    commands = [i for i in done if i["type"] == "command_execution"]
    assert len(commands) == 1 and MARKER in commands[0]["command"], done
    assert commands[0]["exit_code"] == 0 and MARKER in commands[0]["aggregated_output"]
    messages = [i["text"] for i in done if i["type"] == "agent_message"]
    assert messages and "FINAL ANSWER" in messages[-1] and MARKER in messages[-1], messages
    assert events[-1]["type"] == "turn.completed" and events[-1]["usage"]["input_tokens"] > 0
    assert engine.stats.requests == 2  # the call, then the answer (the warm-up generates nothing)


def tool_output_items(bodies: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [
        item
        for b in bodies
        for item in b.get("input", [])
        if isinstance(item, dict) and item.get("type") == "function_call_output"
    ]


@pytest.fixture
def codex_gateway(make_gateway):
    engine = SimulatedEngine(record_prompts=True, script=shell_then_answer(f"echo {MARKER}"))
    live = make_gateway(Settings(models=[CODEX_MODEL]), engine=engine)
    return live, record_wire(live), engine


def test_codex_exec_over_websocket(codex_gateway, tmp_path):
    live, wire, engine = codex_gateway
    events = run_codex(
        tmp_path, live.base_url, f"Run the shell command `echo {MARKER}` and tell me what it printed.", websockets=True
    )
    check_codex_run(events, engine)

    # the wire: one socket, warm-up then chained store=false frames with only new items; no HTTP turn
    assert ("POST", "/v1/responses") not in wire.http, wire.http
    assert live.metric("respgate_turns_total", {"transport": "http", "status": "completed"}) == 0
    frames = wire.ws_frames
    assert wire.ws_connections == 1 and len(frames) == 3, [f.get("type") for f in frames]
    assert all(f["type"] == "response.create" and f["store"] is False for f in frames)
    warmup, ask, answer = frames
    assert warmup.get("generate") is False and "previous_response_id" not in warmup
    assert ask["previous_response_id"] and answer["previous_response_id"]
    assert answer["previous_response_id"] != ask["previous_response_id"]
    # the tool output travels alone in the last frame: the call itself lives in the chained parent
    outputs = tool_output_items([answer])
    assert len(answer["input"]) == 1 and len(outputs) == 1 and MARKER in outputs[0]["output"]
    assert live.metric("respgate_parent_resolution_total", {"source": "connection"}) == 2
    assert live.metric("respgate_turns_total", {"transport": "ws", "status": "completed"}) == 3


def test_codex_exec_over_http(codex_gateway, tmp_path):
    live, wire, engine = codex_gateway
    events = run_codex(
        tmp_path, live.base_url, f"Run the shell command `echo {MARKER}` and tell me what it printed.", websockets=False
    )
    check_codex_run(events, engine)
    assert wire.ws_connections == 0 and wire.http.count(("POST", "/v1/responses")) == 2, wire.http
    assert live.metric("respgate_turns_total", {"transport": "http", "status": "completed"}) == 2
    # stateless (spec §4): no chaining; the second POST replays the whole history, the call included
    first, second = wire.http_bodies
    assert all(b["store"] is False and "previous_response_id" not in b for b in (first, second))
    kinds = [i.get("type", "message") for i in second["input"]]
    assert kinds[: len(first["input"])] == [i.get("type", "message") for i in first["input"]]
    assert "function_call" in kinds and MARKER in tool_output_items([second])[0]["output"]
    # the engine got the whole conversation again, and it extends the first prompt
    prompts = engine.stats.prompts
    assert len(prompts) == 2 and prompts[1][: len(prompts[0])] == prompts[0]


# ---------------------------------------------------------------------------------------------
# openai-agents: responses_websocket_session with a function tool
# ---------------------------------------------------------------------------------------------


def test_openai_agents_websocket_session_with_function_tool(make_gateway):
    import agents  # the test extra pins it
    from agents import Agent, function_tool, responses_websocket_session, set_tracing_disabled

    engine = SimulatedEngine(record_prompts=True, script=shell_then_answer("Lisbon", tool="get_weather", arg="city"))
    live = make_gateway(engine=engine)
    wire = record_wire(live)
    seen: list[str] = []

    @function_tool
    def get_weather(city: str) -> str:
        """Current weather for a city."""
        seen.append(city)
        return f"{city}: 21C and sunny ({MARKER})"

    async def main() -> tuple[Any, Any]:
        set_tracing_disabled(True)
        agent = Agent(
            name="weather", instructions="Use the tool, then answer.", model="gpt-oss-sim", tools=[get_weather]
        )
        async with responses_websocket_session(base_url=live.base_url, api_key="test-key") as ws:
            first = await ws.run(agent, "What is the weather in Lisbon?", auto_previous_response_id=True)
            second = await ws.run(
                agent,
                [{"role": "user", "content": "And in Lisbon again?"}],
                previous_response_id=first.last_response_id,
                auto_previous_response_id=True,
            )
        return first, second

    first, second = asyncio.run(asyncio.wait_for(main(), 120))
    assert agents.__version__ == "0.24.0"
    assert seen == ["Lisbon", "Lisbon"]
    for result in (first, second):
        assert "FINAL ANSWER" in result.final_output and MARKER in result.final_output
    # one socket for both runs; after the first model call every frame chains and carries only new items
    assert wire.ws_connections == 1 and ("POST", "/v1/responses") not in wire.http
    frames = wire.ws_frames
    assert len(frames) == 4 and "previous_response_id" not in frames[0]
    assert all(f.get("previous_response_id") for f in frames[1:])
    assert [i["type"] for i in frames[1]["input"]] == ["function_call_output"]
    assert MARKER in frames[1]["input"][0]["output"]
    assert engine.stats.requests == 4


# ---------------------------------------------------------------------------------------------
# openai SDK: the async WebSocket client
# ---------------------------------------------------------------------------------------------

TOOLS = [
    {
        "type": "function",
        "name": "get_weather",
        "description": "Weather for a city.",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    }
]


def test_openai_sdk_async_websocket_tool_loop(make_gateway):
    from openai import AsyncOpenAI

    engine = SimulatedEngine(record_prompts=True, script=shell_then_answer("Oslo", tool="get_weather", arg="city"))
    live = make_gateway(engine=engine)
    wire = record_wire(live)

    async def main() -> list[Any]:
        client = AsyncOpenAI(base_url=live.base_url, api_key="test-key", max_retries=0)
        done: list[Any] = []
        async with client.responses.connect() as conn:
            new_input: list[dict[str, Any]] = [{"role": "user", "content": "Weather in Oslo?"}]
            prev = None
            for _ in range(2):
                kw = {"previous_response_id": prev.id} if prev else {}
                await conn.response.create(model="gpt-oss-sim", input=new_input, tools=TOOLS, store=False, **kw)
                async for ev in conn:
                    if ev.type == "error":
                        raise AssertionError(ev)
                    if ev.type in ("response.completed", "response.failed", "response.incomplete"):
                        prev = ev.response
                        break
                done.append(prev)
                calls = [o for o in prev.output if o.type == "function_call"]
                new_input = [
                    {
                        "type": "function_call_output",
                        "call_id": c.call_id,
                        "output": f"{json.loads(c.arguments)['city']}: 4C ({MARKER})",
                    }
                    for c in calls
                ]
        await client.close()
        return done

    first, second = asyncio.run(asyncio.wait_for(main(), 60))
    assert first.status == "completed" and second.status == "completed"
    call = next(o for o in first.output if o.type == "function_call")
    assert call.name == "get_weather" and json.loads(call.arguments) == {"city": "Oslo"}
    assert MARKER in second.output_text and "FINAL ANSWER" in second.output_text
    assert second.previous_response_id == first.id
    assert len(wire.ws_frames) == 2 and wire.ws_frames[1]["previous_response_id"] == first.id
    assert live.metric("respgate_parent_resolution_total", {"source": "connection"}) == 1
    # the continuation's prompt extends the first one: the gateway appended, it did not rebuild
    assert engine.stats.prompts[1][: len(engine.stats.prompts[0])] == engine.stats.prompts[0]
