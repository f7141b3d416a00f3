"""Replay real Codex CLI 0.171.0 WebSocket captures against the gateway (real-clients spec §4).

Each capture folder under ``/work/shared/fixtures/codex/`` holds the upgrade request headers and
the client frames Codex sent, in order: a ``generate:false`` warm-up, a chained turn carrying only
the new items, and a chained turn carrying only the tool output. We replay them over one socket,
exactly as recorded, except for what the recording server chose: each ``previous_response_id`` is
replaced by the id *our* gateway returned for the previous frame, and the tool output's
``call_id`` by the call id *our* model produced.

Besides "every turn completes", the replay checks that the continuation turns were rendered
incrementally: the ``append`` render counter grows by exactly the new items' tokens (derived from
``usage``: a turn's prompt = parent history + new items + the generation prompt), no ``full`` render
happens after the warm-up, and each prompt the engine got extends the previous one.
"""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest
from websockets.sync.client import connect

from gateway.base.settings import Settings
from inference.harmony import HarmonyRenderer
from inference.simulated import SimulatedEngine
from inference.simulated_prompt import PromptView
from inference.simulated_script import ToolCall, Turn, turns_in_order
from tests.conftest import SHARED
from tests.turn_helpers import full_render_fallbacks, render_tokens

pytestmark = pytest.mark.timeout(60)

FIXTURES = SHARED / "fixtures/codex"
TERMINAL = {"response.completed", "response.failed", "response.incomplete"}
# handshake headers the websockets client sets itself
HOP_HEADERS = {
    "host",
    "connection",
    "upgrade",
    "sec-websocket-version",
    "sec-websocket-key",
    "sec-websocket-extensions",
    "user-agent",
    "authorization",
}
GEN_PROMPT = len(HarmonyRenderer().generation_prompt())


def load(folder: str) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    d = FIXTURES / folder
    handshake = json.loads((d / "001-ws_handshake.json").read_text())
    frames = [json.loads((d / f"{n:03d}-ws_message.json").read_text())["body"] for n in (2, 3, 4)]
    return handshake, frames


def run_turn(ws, frame: dict[str, Any]) -> list[dict[str, Any]]:
    ws.send(json.dumps(frame))
    events = []
    while True:
        msg = ws.recv(timeout=30)
        assert isinstance(msg, str), "server frames must be text"
        ev = json.loads(msg)
        events.append(ev)
        if ev["type"] in TERMINAL or ev["type"] == "error":
            return events


def replay(live, folder: str, *, answer_kind: str) -> list[list[dict[str, Any]]]:
    """Replay one capture; returns the events of each of the three turns."""
    handshake, frames = load(folder)
    headers = {k: v for k, v in handshake["headers"].items() if k not in HOP_HEADERS}
    headers["Authorization"] = "Bearer test-key"
    url = live.url.replace("http://", "ws://") + handshake["path"]
    assert frames[0].get("generate") is False and "previous_response_id" not in frames[0]
    assert all(f["store"] is False and f["stream"] is True for f in frames)

    turns: list[list[dict[str, Any]]] = []
    prev_id: str | None = None
    call_id: str | None = None
    usage: list[dict[str, Any]] = []
    with connect(
        url, additional_headers=headers, user_agent_header=handshake["headers"]["user-agent"], max_size=None
    ) as ws:
        assert ws.response.status_code == 101
        for n, recorded in enumerate(frames):
            frame = copy.deepcopy(recorded)
            if "previous_response_id" in frame:
                frame["previous_response_id"] = prev_id
            for item in frame["input"]:
                if item.get("type") in ("function_call_output", "custom_tool_call_output"):
                    assert item["call_id"] != call_id
                    item["call_id"] = call_id
            append0, full0 = render_tokens(live)
            events = run_turn(ws, frame)
            append1, full1 = render_tokens(live)
            turns.append(events)

            types = [e["type"] for e in events]
            assert types[0] == "response.created", types
            assert types[-1] == "response.completed", events[-1]
            assert "error" not in types
            resp = events[-1]["response"]
            assert resp["status"] == "completed" and resp["model"] == frame["model"]
            assert resp["previous_response_id"] == (prev_id if n else None)
            assert [e["item"] for e in events if e["type"] == "response.output_item.done"] == resp["output"]
            usage.append(resp["usage"])

            if n == 0:  # the warm-up: full render of the prelude + developer message, no generation
                assert resp["output"] == [] and resp["usage"]["output_tokens"] == 0
                assert live.engine.stats.requests == 0
                assert append1 == append0 and full1 - full0 == resp["usage"]["input_tokens"]
            else:
                # incremental: parent history (its prompt + its sampled output) + new items + gen prompt
                parent = usage[n - 1]
                new_tokens = (
                    resp["usage"]["input_tokens"] - GEN_PROMPT - parent["input_tokens"] - parent["output_tokens"]
                )
                assert new_tokens > 0
                assert append1 - append0 == new_tokens
                assert full1 == full0, "a continuation turn was re-rendered in full"
            if n == 1:
                kinds = [o["type"] for o in resp["output"]]
                assert answer_kind in kinds, kinds
                call = next(o for o in resp["output"] if o["type"] == answer_kind)
                call_id = call["call_id"]
            prev_id = resp["id"]

    assert full_render_fallbacks(live) == 0
    # the engine got turn 3's prompt as an extension of turn 2's prompt + turn 2's output
    p2, p3 = live.engine.stats.prompts
    assert len(p3) == usage[2]["input_tokens"] and p3[: len(p2)] == p2
    return turns


def tool_result_reporter(view: PromptView) -> Turn:
    last = view.last
    assert last is not None and last.role == "tool", last
    return Turn(reasoning="The tool ran.", text=f"[{last.author}] {last.text.strip().splitlines()[-1]}")


def test_codex_ws_gpt55_replay(make_gateway):
    script = turns_in_order(
        [Turn(reasoning="I will run it.", tool_calls=(ToolCall("exec_command", {"cmd": "echo hi"}),))],
        then=tool_result_reporter,
    )
    live = make_gateway(Settings(models=["gpt-5.5"]), engine=SimulatedEngine(script=script, record_prompts=True))
    turns = replay(live, "ws-gpt-5.5", answer_kind="function_call")
    call = next(o for o in turns[1][-1]["response"]["output"] if o["type"] == "function_call")
    assert call["name"] == "exec_command" and json.loads(call["arguments"]) == {"cmd": "echo hi"}
    # Codex reads reasoning.encrypted_content (it asked for it via include)
    rs = [o for o in turns[1][-1]["response"]["output"] if o["type"] == "reasoning"]
    assert rs and all(o.get("encrypted_content") for o in rs)
    final = turns[2][-1]["response"]
    assert final["output"][-1]["type"] == "message"
    assert final["output"][-1]["content"][0]["text"] == "[functions.exec_command] hi"


def test_codex_ws_apply_patch_replay(make_gateway):
    patch = "*** Begin Patch\n*** Add File: hello.txt\n+hello\n*** End Patch\n"
    script = turns_in_order(
        [Turn(reasoning="Create the file.", tool_calls=(ToolCall("apply_patch", patch, custom=True),))],
        then=tool_result_reporter,
    )
    live = make_gateway(Settings(models=["gpt-5.5"]), engine=SimulatedEngine(script=script, record_prompts=True))
    turns = replay(live, "ws-apply-patch", answer_kind="custom_tool_call")
    call = next(o for o in turns[1][-1]["response"]["output"] if o["type"] == "custom_tool_call")
    assert call["name"] == "apply_patch" and call["input"] == patch
    types = [e["type"] for e in turns[1]]
    assert "response.custom_tool_call_input.done" in types
    assert turns[2][-1]["response"]["output"][-1]["content"][0]["text"] == "[functions.apply_patch] A hello.txt"


def test_codex_ws_unknown_model_namespace_tool_replay(make_gateway):
    script = turns_in_order(
        [
            Turn(
                reasoning="Spawn a helper.",
                tool_calls=(ToolCall("close_agent", {"target": "agent-1"}, namespace="multi_agent_v1"),),
            )
        ],
        then=tool_result_reporter,
    )
    live = make_gateway(Settings(models=["stub-model"]), engine=SimulatedEngine(script=script, record_prompts=True))
    turns = replay(live, "ws-unknown-model", answer_kind="function_call")
    call = next(o for o in turns[1][-1]["response"]["output"] if o["type"] == "function_call")
    assert call["name"] == "close_agent" and call["namespace"] == "multi_agent_v1"
    assert json.loads(call["arguments"]) == {"target": "agent-1"}
    assert turns[2][-1]["response"]["output"][-1]["content"][0]["text"] == "[multi_agent_v1.close_agent] hi"
