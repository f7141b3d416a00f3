"""The real Codex CLI across a WebSocket that drops between two turns of one task (issue 17 item 4).

``codex exec`` runs a tool loop against the in-process gateway (the scripted simulated engine asks
for a shell command, Codex runs it and sends its output as the next turn; see
tests/clients/test_real_clients.py). A test-only ASGI wrapper lets the turn that asks for the last command
finish — its ``response.completed`` reaches Codex — then takes the socket away before the command's
output comes: a close 1001 (a rolling update's goodbye) or a cut TCP connection (the network went).
The wrapper records every socket: the client's frames, the server's frame types and completed
response ids, and the gateway's render counters at the moment the socket opened.

What Codex CLI 0.171 does, on the wire: it opens a new socket for the next turn and sends the
**whole history** (its messages, reasoning, every function call and output) in one
``response.create`` **without** ``previous_response_id`` and without a new warm-up; the task
completes and Codex reports no error. So it never asks to resume: with ``ws_resume_window_s`` on,
the closed socket's lane is parked and never claimed; with it off there is no
``previous_response_not_found`` either. What the retry costs is decided by full-history reuse
(gateway/turn/prefix.py): every turn — the warm-up (no parent) and each chained turn (its digest
folded from its parent's) — leaves its token view under the digest of its whole input, so the
reconnect finds the dropped socket's last turn, checks that the re-sent reasoning and call render
to the tokens the model sampled, and renders only the tool output that is new: O(new input), and
the engine's KV prefix still matches. With the prefix cache off it renders the whole conversation,
resume on or not.
"""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from billing.usage import UsageRecord
from gateway.base.settings import Settings
from gateway.transport.corked import TEXT_FRAMES
from inference.simulated import SimulatedEngine
from inference.simulated_prompt import PromptView
from inference.simulated_script import ToolCall, Turn
from tests.clients.test_codex_replay import GEN_PROMPT
from tests.clients.test_real_clients import CODEX_MODEL, MARKER, run_codex
from tests.conftest import LiveGateway, stop_gateway
from tests.gateway.sessions.test_ws_resume import resumable
from tests.http_helpers import wait_for
from tests.turn_helpers import full_render_fallbacks, render_tokens

#: slow: a real external client (pyproject's marker), though the file runs in about 10 s
pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]


@dataclass
class Socket:
    """What one WebSocket carried, and the work counters when it opened."""

    counters_at_open: dict[str, float]
    client: list[dict[str, Any]] = field(default_factory=list)
    server: list[str] = field(default_factory=list)
    completed: list[str] = field(default_factory=list)  # ids of the responses it completed
    dropped: bool = False


class DropAfterFirstTurn:
    """ASGI wrapper (test only): records each socket and drops the first one right after its
    ``nth`` ``response.completed`` (1: Codex's ``generate:false`` warm-up; 2: its first real turn;
    n+1: the n-th).

    The gateway writes frames through the ``TEXT_FRAMES`` extension (gateway/transport/corked.py)
    when it can and through ASGI ``send`` otherwise; both are watched. The drop is scheduled on the
    loop once the terminal frame is written, so the client has that frame in full."""

    def __init__(self, live: LiveGateway, how: str, nth: int) -> None:
        self.app, self.live, self.how, self.nth = live.server.config.loaded_app, live, how, nth
        self.sockets: list[Socket] = []
        live.server.config.loaded_app = self  # uvicorn reads it per new connection

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "websocket":
            return await self.app(scope, receive, send)
        sock = Socket(counters_at_open=work(self.live))
        self.sockets.append(sock)
        first = len(self.sockets) == 1
        loop = asyncio.get_running_loop()
        ext = scope.get("extensions") or {}
        writer = (ext.get(TEXT_FRAMES) or {}).get("frames")

        async def drop() -> None:
            if self.how == "close_1001":
                await send({"type": "websocket.close", "code": 1001, "reason": "going away"})
            else:  # no close frame: the TCP connection is just gone
                protocol = writer._protocol if writer is not None else send.__self__
                protocol.transport.abort()

        def seen(payload: str | bytes) -> None:
            ev = json.loads(payload)
            sock.server.append(ev["type"])
            if ev["type"] == "response.completed":
                sock.completed.append(ev["response"]["id"])
                if first and len(sock.completed) == self.nth and not sock.dropped:
                    sock.dropped = True
                    loop.call_soon(lambda: loop.create_task(drop()))

        async def logged_receive() -> dict[str, Any]:
            msg = await receive()
            if msg["type"] == "websocket.receive" and msg.get("text"):
                sock.client.append(json.loads(msg["text"]))
            return msg

        async def logged_send(msg: dict[str, Any]) -> None:
            await send(msg)
            if msg["type"] == "websocket.send" and msg.get("text"):
                seen(msg["text"])

        if writer is not None:
            ext[TEXT_FRAMES] = {"frames": WatchedFrames(writer, seen)}
        return await self.app(scope, logged_receive, logged_send)


class WatchedFrames:
    """The ``TEXT_FRAMES`` writer, reporting each frame it wrote."""

    def __init__(self, inner: Any, seen: Callable[[bytes], None]) -> None:
        self._inner, self._seen = inner, seen
        self._protocol = inner._protocol

    def try_send(self, payload: bytes) -> bool:
        return self.try_send_many([payload])

    def try_send_many(self, payloads: list[bytes]) -> bool:
        if not self._inner.try_send_many(payloads):
            return False
        for payload in payloads:
            self._seen(payload)
        return True

    async def send(self, payload: bytes) -> None:
        await self._inner.send(payload)
        self._seen(payload)


class ListSink:
    """Every usage record the ledger was handed, duplicates included (MemorySink keys them by id)."""

    durable = False

    def __init__(self) -> None:
        self.records: list[UsageRecord] = []

    async def write_batch(self, records: Any) -> None:
        self.records.extend(records)


def work(live: LiveGateway) -> dict[str, float]:
    """What the gateway rendered so far: appended to a parent's (or a cached prefix's) tokens,
    rendered in full, and taken from the prefix cache without rendering."""
    appended, full = render_tokens(live)
    return {
        "appended": appended,
        "full": full,
        "reused": live.metric("respgate_prefix_cache_reused_tokens_total"),
        "hits": live.metric("respgate_prefix_cache_lookups_total", {"outcome": "hit"}),
    }


def shell_steps(steps: int):
    """Script: run ``echo MARKER step-1``, then after each output the next step, up to ``steps``;
    after the last output, answer with it (a tool loop of ``steps`` + 1 model turns)."""

    def call(k: int) -> Turn:
        return Turn(
            reasoning=f"Step {k}: run the command.",
            tool_calls=(ToolCall("exec_command", {"cmd": f"echo {MARKER} step-{k}"}),),
        )

    def script(view: PromptView) -> Turn | None:
        last = view.last
        if last is not None and last.role == "user":
            return call(1)
        if last is not None and last.role == "tool":
            done = max(int(k) for k in re.findall(r"step-(\d+)", last.text))
            if done < steps:
                return call(done + 1)
            return Turn(
                reasoning="All steps ran; report.",
                text=f"FINAL ANSWER. The command printed: {last.text.strip()[-200:]}",
            )
        return None

    return script


@dataclass
class Run:
    live: LiveGateway
    wire: DropAfterFirstTurn
    billed: list[UsageRecord]  # in the order the turns completed
    prompts: list[list[int]]  # what the engine was asked, per generating turn

    @property
    def reconnect(self) -> dict[str, Any]:
        """The new socket's only frame."""
        (frame,) = self.wire.sockets[1].client
        return frame

    def by_reconnect(self) -> dict[str, float]:
        """The work counters' movement since the new socket opened: only its turn ran since."""
        before, after = self.wire.sockets[1].counters_at_open, work(self.live)
        return {k: after[k] - before[k] for k in after}


def codex_across_a_drop(make_gateway: Any, tmp_path: Path, how: str, steps: int = 1, **settings: Any) -> Run:
    """One ``codex exec`` task of ``steps`` tool calls whose socket drops after the turn that asks
    for the last one; the gateway is stopped afterwards, so the ledger has every record it will get."""
    engine = SimulatedEngine(record_prompts=True, script=shell_steps(steps))
    sink = ListSink()
    live = make_gateway(Settings(models=[CODEX_MODEL], **settings), engine=engine, usage_sink=sink)
    wire = DropAfterFirstTurn(live, how, nth=steps + 1)
    events = run_codex(
        tmp_path, live.base_url, f"Run `echo {MARKER} step-1` and the steps it leads to.", websockets=True
    )
    check_task(events, steps)
    assert engine.stats.requests == steps + 1  # the warm-up generates nothing
    wait_for(lambda: live.metric("respgate_ws_connections") == 0, what="both sockets to be closed")
    stop_gateway(live)  # drains the usage queue into the sink
    run = Run(live, wire, list(sink.records), engine.stats.prompts)
    check_wire(run, steps)
    return run


def check_task(events: list[dict[str, Any]], steps: int) -> None:
    """What the user sees: every command ran, the answer carries the last one's output, no error."""
    errors = [
        e for e in events if e.get("type") in ("error", "turn.failed") or e.get("item", {}).get("type") == "error"
    ]
    assert not errors, errors
    done = [e["item"] for e in events if e["type"] == "item.completed"]
    commands = [i for i in done if i["type"] == "command_execution"]
    assert [(c["exit_code"], f"{MARKER} step-{k}" in c["aggregated_output"]) for k, c in enumerate(commands, 1)] == [
        (0, True)
    ] * steps, done
    messages = [i["text"] for i in done if i["type"] == "agent_message"]
    assert messages and "FINAL ANSWER" in messages[-1] and f"step-{steps}" in messages[-1], messages
    assert events[-1]["type"] == "turn.completed"


def check_wire(run: Run, steps: int) -> None:
    """The first socket: the warm-up, then each turn chained to the one before, dropped after the
    last call; the second: the whole history again, naming no parent. Each turn billed once."""
    assert len(run.wire.sockets) == 2, [s.client for s in run.wire.sockets]
    first, second = run.wire.sockets
    assert first.dropped and not second.dropped and "error" not in first.server + second.server
    warmup, *chained = first.client  # the last tool output never went to the dead socket
    assert warmup["generate"] is False and "previous_response_id" not in warmup
    assert [f["previous_response_id"] for f in chained] == first.completed[:-1] and len(chained) == steps
    frame = run.reconnect
    assert frame["type"] == "response.create" and frame["store"] is False and "generate" not in frame
    assert "previous_response_id" not in frame  # Codex does not ask to resume
    kinds = [i.get("type", "message") for i in frame["input"]]
    assert kinds.count("function_call_output") == kinds.count("function_call") == steps
    assert kinds[-3:] == ["reasoning", "function_call", "function_call_output"]
    assert f"step-{steps}" in frame["input"][-1]["output"]
    # the ledger: one record per response the sockets completed, each once, in that order
    ids = first.completed + second.completed
    assert len(ids) == steps + 2 and sorted(r.response_id for r in run.billed) == sorted(ids)
    run.billed.sort(key=lambda r: ids.index(r.response_id))
    assert all(r.status == "completed" and r.transport == "ws" for r in run.billed)
    # the reconnect's prompt extends the dropped socket's last prompt: the engine's KV still serves it
    before, last = run.prompts[-2:]
    assert last[: len(before)] == before and run.billed[-1].input_tokens == len(last)
    assert run.billed[-1].cached_tokens >= len(before)


@pytest.mark.parametrize("how", ["close_1001", "tcp_cut"])
def test_codex_reconnect_with_resume_on(make_gateway, tmp_path, how):
    """The task completes across the drop; both sockets' lanes are parked and neither is ever
    claimed; the reconnect renders only its new item: the prefix cache has the last turn's view."""
    run = codex_across_a_drop(make_gateway, tmp_path, how, ws_resume_window_s=60)
    live = run.live
    # parked at each close (the dropped socket's, then the one Codex closed on exit), never claimed
    assert resumable(live, "kept") == 2 and resumable(live, "claimed") == 0
    moved = run.by_reconnect()
    assert moved["full"] == 0 and full_render_fallbacks(live) == 0 and moved["hits"] == 1
    check_only_the_new_item_rendered(run, moved)


def test_codex_reconnect_with_resume_off_is_the_same_wire(make_gateway, tmp_path):
    """Off (the default): nothing kept, nothing refused — Codex never names the lost response."""
    run = codex_across_a_drop(make_gateway, tmp_path, "close_1001")
    assert run.live.gw.resumable is None
    moved = run.by_reconnect()
    assert full_render_fallbacks(run.live) == 0
    check_only_the_new_item_rendered(run, moved)


def check_only_the_new_item_rendered(run: Run, moved: dict[str, float]) -> None:
    """The reconnect reused the dropped socket's last turn whole — its prompt and the tokens the
    model sampled — and rendered only what follows: the tool output Codex had not sent yet."""
    before, reconnect, last_turn = run.prompts[-2], run.billed[-1], run.billed[-2]
    assert moved["full"] == 0 and moved["hits"] == 1
    assert moved["reused"] >= len(before) + last_turn.output_tokens - 1  # the last sampled token is fed back
    assert moved["reused"] + moved["appended"] + GEN_PROMPT == reconnect.input_tokens
    output = run.reconnect["input"][-1]["output"]
    assert moved["appended"] < len(output)  # the new tool output's tokens (and its markers), nothing older


def test_codex_reconnect_late_in_a_long_loop_renders_only_the_new_item(make_gateway, tmp_path):
    """Four tool calls chained on one socket, the drop after the fourth: the reconnect's prompt is
    all history, yet only the last tool output is rendered — each chained turn left a prefix-cache
    entry under the digest a full-history re-send names (O(new input), not O(history)), though
    Codex names no parent a resume could find."""
    run = codex_across_a_drop(make_gateway, tmp_path, "close_1001", steps=4, ws_resume_window_s=60)
    assert resumable(run.live, "kept") == 2 and resumable(run.live, "claimed") == 0
    check_only_the_new_item_rendered(run, run.by_reconnect())


def test_codex_reconnect_without_the_prefix_cache_renders_in_full_even_with_resume(make_gateway, tmp_path):
    """Resume on, prefix cache off: the reconnect's turn renders the whole conversation — resume
    cannot help a request that names no parent."""
    run = codex_across_a_drop(make_gateway, tmp_path, "close_1001", ws_resume_window_s=60, prefix_cache_bytes=0)
    assert resumable(run.live, "kept") == 2 and resumable(run.live, "claimed") == 0
    moved = run.by_reconnect()
    assert moved["appended"] == 0 and moved["reused"] == 0
    assert moved["full"] == run.billed[-1].input_tokens - GEN_PROMPT
