"""The Vercel AI SDK's tool loop end to end against a live gateway (issue 13.3, real-clients spec §5).

npm ``ai`` + ``@ai-sdk/openai`` (pinned in ``tests/clients/package-lock.json``; ``make test`` runs
``npm ci`` there) run ``streamText`` / ``generateText`` with one executed tool (get_weather) and up
to four steps, through ``tests/clients/aisdk_loop.mjs``, with the provider's defaults untouched:
``store: true`` and no ``previous_response_id``, so each step re-sends the conversation, the
earlier reasoning items as ``item_reference``s and the function calls whole (without their ids),
and the gateway must find the references among the stored responses and continue from the stored
parent (an append, not a full render). Also: the
``providerOptions.openai.store = false`` variant (earlier outputs re-sent in full), the WebSocket
transport (``@ai-sdk/openai`` has none of its own for the Responses API; Vercel's drop-in fetch
``@vercel/ai-sdk-openai-websocket-fetch`` routes the SDK's streaming requests over
``ws://…/v1/responses``), and one short HTTP loop against the real CPU engine.

What the client sent is recorded on the gateway side (``record_wire``), so the assertions are
about the wire.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

import httpx
import pytest

from inference.simulated import SimulatedEngine
from inference.simulated_prompt import PromptView
from inference.simulated_script import ToolCall, Turn
from tests.clients.test_real_clients import record_wire
from tests.conftest import MODEL, VLLM_MODEL, LiveGateway

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]

CLIENTS = Path(__file__).resolve().parent
LOOP = CLIENTS / "aisdk_loop.mjs"
PINNED = {"ai": "7.0.173", "@ai-sdk/openai": "4.0.118", "@vercel/ai-sdk-openai-websocket-fetch": "1.0.0"}


class WeatherScript:
    """The simulated model: the user asks -> reason, then call get_weather; the tool answered -> say
    what it said. Each call also snapshots the render counters: the script runs after the step's
    prompt was rendered, so consecutive snapshots give what each step rendered."""

    def __init__(self, arguments: Any = None) -> None:
        self.arguments = {"city": "Oslo"} if arguments is None else arguments
        self.live: LiveGateway | None = None
        self.marks: list[dict[str, float]] = []

    def __call__(self, view: PromptView) -> Turn | None:
        if self.live is not None:
            self.marks.append(counters(self.live) | {"prompt": view.prompt_len})
        last = view.last
        if last is not None and last.role == "tool":
            return Turn(reasoning="The tool answered; report it.", text=f"FINAL ANSWER: {last.text.strip()}")
        if last is not None and last.role == "user":
            return Turn(reasoning="I need the weather first.", tool_calls=(ToolCall("get_weather", self.arguments),))
        return None

    def step(self, n: int) -> dict[str, float]:
        """What step ``n`` (0-based) rendered and how its parent was found."""
        before = self.marks[n - 1] if n else {k: 0.0 for k in self.marks[0]}
        return {k: v - before[k] for k, v in self.marks[n].items() if k != "prompt"} | {
            "prompt": self.marks[n]["prompt"]
        }


def counters(live: LiveGateway) -> dict[str, float]:
    return {
        "append": live.metric("respgate_render_tokens_total", {"mode": "append"}),
        "full": live.metric("respgate_render_tokens_total", {"mode": "full"}),
        "items": live.metric("respgate_parent_resolution_total", {"source": "items"}),
    }


class StatusLog:
    """ASGI wrapper recording the status of every HTTP response (outside the WireLog)."""

    def __init__(self, app: Any) -> None:
        self.app = app
        self.statuses: list[tuple[str, str, int]] = []

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)

        async def logged_send(msg: dict[str, Any]) -> None:
            if msg["type"] == "http.response.start":
                self.statuses.append((scope["method"], scope["path"], msg["status"]))
            await send(msg)

        return await self.app(scope, receive, logged_send)


def record(live: LiveGateway) -> tuple[Any, StatusLog]:
    wire = record_wire(live)
    statuses = StatusLog(live.server.config.loaded_app)
    live.server.config.loaded_app = statuses
    return wire, statuses


def run_loop(live: LiveGateway, model: str = MODEL, **opts: Any) -> dict[str, Any]:
    node = shutil.which("node")
    if node is None or not (CLIENTS / "node_modules" / "ai").exists():
        pytest.fail(f"the AI SDK is not installed: run `npm ci --prefix {CLIENTS}` (make test does)")
    args = {"baseURL": live.base_url, "model": model, **opts}
    proc = subprocess.run([node, str(LOOP), json.dumps(args)], capture_output=True, text=True, timeout=180, cwd=CLIENTS)
    assert proc.returncode == 0, f"node exited {proc.returncode}\n{proc.stdout}\n{proc.stderr[-3000:]}"
    lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    assert lines, f"no summary\n{proc.stdout}\n{proc.stderr[-3000:]}"
    return json.loads(lines[-1])


def sim_gateway(make_gateway: Any, arguments: Any = None) -> tuple[LiveGateway, Any, StatusLog, WeatherScript]:
    script = WeatherScript(arguments)
    live = make_gateway(engine=SimulatedEngine(record_prompts=True, script=script))
    script.live = live
    wire, statuses = record(live)
    return live, wire, statuses, script


@pytest.fixture
def sim(make_gateway):
    return sim_gateway(make_gateway)


ANSWER = "FINAL ANSWER: sunny, 21C in Oslo"


def check_tool_loop(out: dict[str, Any]) -> None:
    """The tool ran once, and the final text is the model's answer to its result."""
    assert out["error"] is None, out["error"]
    assert out["executed"] == ["Oslo"], out
    first, second = out["steps"]
    assert first["finishReason"] == "tool-calls"
    assert [(c["toolName"], c["input"]) for c in first["toolCalls"]] == [("get_weather", {"city": "Oslo"})]
    assert first["toolResults"][0]["output"] == "sunny, 21C in Oslo"
    assert second["finishReason"] == "stop" and not second["toolCalls"]
    assert second["text"] == out["text"] == ANSWER
    assert first["responseId"] != second["responseId"]
    assert all(s["responseId"].startswith("resp_") for s in out["steps"])


def shapes(items: list[dict[str, Any]]) -> list[str]:
    return [i.get("type", "message") + (f":{i['role']}" if "role" in i else "") for i in items]


def check_append(script: WeatherScript, live: LiveGateway) -> dict[str, float]:
    """Step 2 continued from step 1's stored response, found by its items: nothing re-rendered."""
    one, two = script.step(0), script.step(1)
    assert one["full"] > 0 and one["items"] == 0
    assert two["full"] == 0, f"step 2 rendered {two['full']} tokens in full"
    assert 0 < two["append"] < 40, two  # the tool output and the generation prompt
    assert two["items"] == 1
    p1, p2 = live.engine.stats.prompts[-2:]
    assert p2[: len(p1)] == p1
    print(f"\nAI SDK step 2: rendered {two['append']:.0f} tokens (append) of a {two['prompt']:.0f}-token prompt")
    return two


def test_pinned_versions():
    for name, version in PINNED.items():
        meta = json.loads((CLIENTS / "node_modules" / name / "package.json").read_text())
        assert meta["version"] == version, name


@pytest.mark.parametrize("mode", ["stream", "generate"])
def test_default_loop_over_http_appends_on_step_two(sim, mode):
    live, wire, statuses, script = sim
    out = run_loop(live, mode=mode)
    check_tool_loop(out)
    assert statuses.statuses == [("POST", "/v1/responses", 200)] * 2
    assert live.metric("respgate_turns_total", {"transport": "http", "status": "completed"}) == 2
    first, second = wire.http_bodies
    assert all("previous_response_id" not in b and "store" not in b for b in (first, second))
    assert all(b.get("stream", False) is (mode == "stream") for b in (first, second))
    # step 2 (defaults, store true): the question again, the reasoning item by reference, the call
    # in full (the SDK keeps no id for it), then the tool's result
    assert shapes(second["input"]) == ["message:user", "item_reference", "function_call", "function_call_output"]
    assert second["input"][1]["id"].startswith("rs_")
    assert "id" not in second["input"][2] and second["input"][2]["arguments"] == '{"city":"Oslo"}'
    check_append(script, live)


@pytest.mark.parametrize("transport", ["http", "ws"])
def test_store_false_loop(sim, transport):
    live, wire, statuses, script = sim
    out = run_loop(live, mode="stream", store=False, transport=transport)
    check_tool_loop(out)
    if transport == "http":
        assert statuses.statuses == [("POST", "/v1/responses", 200)] * 2
        first, second = wire.http_bodies
    else:
        assert ("POST", "/v1/responses") not in wire.http and wire.ws_connections == 1
        first, second = wire.ws_frames
    assert live.metric("respgate_turns_total", {"transport": transport, "status": "completed"}) == 2
    assert first["store"] is False and second["store"] is False
    assert "previous_response_id" not in second
    # nothing stored to refer to: the call comes back whole, the reasoning item not at all (the SDK
    # has no encrypted_content to send for it); step 1 rendered the question, so step 2 renders the
    # re-sent call and the tool output after it (the tenant's prefix cache, gateway.turn.prefix)
    assert shapes(second["input"]) == ["message:user", "function_call", "function_call_output"]
    two = script.step(1)
    assert two["items"] == 0 and two["full"] == 0 and 0 < two["append"] < 80, two
    assert live.metric("respgate_prefix_cache_lookups_total", {"outcome": "hit"}) == 1
    print(
        f"\nAI SDK step 2, store:false over {transport}: rendered {two['append']:.0f} tokens (append) of a "
        f"{two['prompt']:.0f}-token prompt"
    )


def test_default_loop_over_websocket_appends_on_step_two(sim):
    live, wire, statuses, script = sim
    out = run_loop(live, mode="stream", transport="ws")
    check_tool_loop(out)
    assert ("POST", "/v1/responses") not in wire.http, wire.http
    assert wire.ws_connections == 1 and len(wire.ws_frames) == 2, wire.ws_frames
    assert live.metric("respgate_turns_total", {"transport": "ws", "status": "completed"}) == 2
    first, second = wire.ws_frames
    assert all(
        f["type"] == "response.create" and "stream" not in f and "previous_response_id" not in f
        for f in (first, second)
    )
    assert shapes(second["input"]) == ["message:user", "item_reference", "function_call", "function_call_output"]
    check_append(script, live)


def test_default_loop_appends_when_the_model_spaces_its_arguments(make_gateway):
    live, wire, statuses, script = sim_gateway(make_gateway, arguments='{"city": "Oslo"}')
    out = run_loop(live, mode="stream")
    check_tool_loop(out)
    assert statuses.statuses == [("POST", "/v1/responses", 200)] * 2
    call = wire.http_bodies[1]["input"][2]
    assert call["type"] == "function_call" and call["arguments"] == '{"city":"Oslo"}'  # not as sampled
    check_append(script, live)


@pytest.mark.timeout(900)  # the first vLLM test of the session loads the engine
def test_http_loop_on_the_cpu_engine(vllm_gateway: LiveGateway):
    """Two steps on SmolLM2 (chat template, no reasoning items): the SDK sends no reference at all on
    step 2 (the call comes back whole, without its id, arguments re-serialized), so the call id the
    gateway issued names the stored parent. The step still renders in full here, counted as
    ``prelude_changed``: step 1's ``tool_choice: "required"`` (SmolLM2-135M calls no tool under
    "auto") puts a line in the system prompt that step 2's "auto" does not have."""
    live = vllm_gateway
    wire, statuses = record(live)
    try:
        full0 = live.metric("respgate_render_tokens_total", {"mode": "full"})
        items0 = live.metric("respgate_parent_resolution_total", {"source": "items"})
        fallbacks0 = live.metric("respgate_render_full_fallbacks_total", {"reason": "prelude_changed"})
        out = run_loop(
            live,
            model=VLLM_MODEL,
            mode="generate",
            steps=2,
            maxOutputTokens=48,
            temperature=0,
            firstToolChoice="required",
        )  # SmolLM2-135M calls no tool under "auto"
        assert out["error"] is None, out["error"]
        assert statuses.statuses == [("POST", "/v1/responses", 200)] * 2
        first, second = out["steps"]
        assert [c["toolName"] for c in first["toolCalls"]] == ["get_weather"] and len(out["executed"]) == 1
        assert first["toolResults"][0]["output"].startswith("sunny, 21C in ")
        assert not second["toolCalls"] and second["text"] and second["text"] == out["text"]
        body = wire.http_bodies[-1]
        assert shapes(body["input"]) == ["message:user", "function_call", "function_call_output"]
        kept = httpx.get(f"{live.base_url}/responses/{first['responseId']}").json()
        sampled = next(o for o in kept["output"] if o["type"] == "function_call")["arguments"]
        rendered = live.metric("respgate_render_tokens_total", {"mode": "full"}) - full0
        usage = second["usage"] or {}
        print(
            f"\nAI SDK on the CPU engine: step 1 prompt {first['usage']['inputTokens']} tokens, step 2 prompt "
            f"{usage.get('inputTokens')} tokens ({usage.get('inputTokenDetails')}); {rendered:.0f} tokens rendered "
            f"in full over both steps; call arguments sampled {sampled!r}, re-sent {body['input'][1]['arguments']!r}"
        )
        assert live.metric("respgate_parent_resolution_total", {"source": "items"}) == items0 + 1
        assert live.metric("respgate_render_full_fallbacks_total", {"reason": "prelude_changed"}) >= fallbacks0 + 1
    finally:
        live.server.config.loaded_app = wire.app  # the session's gateway is shared: unwrap
