"""``file_search`` through the gateway, driven by UNMODIFIED real clients (issue 33, "Must show").

* **openai SDK 3.57**: a folder of real documents (``tests/corpus``: Markdown, text, HTML, PDF,
  code, JSON) uploaded with ``vector_stores.file_batches.upload_and_poll``, searched with
  ``vector_stores.search``, then a ``file_search`` response whose ``file_citation`` names the file
  that answers, over HTTP (``responses.create``, ``stream=True``) and WebSocket mode
  (``responses.connect()``, a continuation on one socket).
* **openai-agents 0.24**: an ``Agent`` holding the SDK's own ``FileSearchTool`` class, run by
  ``Runner.run``: the agent parses the gateway's ``file_search_call`` (with its results) and the
  answer's ``file_citation``.

The embedder is the simulated one (hashed words: keyword queries find their file); the engine is
the simulated one, scripted to call ``file_search.msearch`` and to cite the first passage it read
(``【0:0†…】``): which file that is, is the gateway's retrieval, checked against the corpus's labels.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from openai import AsyncOpenAI
from openai.types.responses import Response, ResponseFileSearchToolCall, ResponseOutputMessage

from gateway.base.settings import Settings
from inference.simulated import SimulatedEngine
from inference.simulated_embeddings import SimulatedEmbedder
from inference.simulated_script import ToolCall
from tests.conftest import MODEL, LiveGateway
from tests.gateway.tools.test_mcp_turns import _calls
from tests.schema_check import typed_exactly
from tests.turn_helpers import full_render_fallbacks

pytestmark = pytest.mark.timeout(180)

CORPUS = Path(__file__).resolve().parents[1] / "corpus"
#: a labelled keyword query and the file that answers it (tests/corpus/queries.json)
QUERY = "ERR_CONN_RESET_4412"
ANSWER = "incident_2024_checkout_outage.txt"


def _documents() -> list[Path]:
    names = json.loads((CORPUS / "queries.json").read_text())["documents"]
    return [CORPUS / name for name in names]


@pytest.fixture
def corpus_gateway(make_gateway: Any, tmp_path: Path) -> Iterator[tuple[LiveGateway, str, dict[str, str]]]:
    """A gateway whose tenant's vector store holds the whole corpus, uploaded as a folder would be:
    one batch, polled until every file is ingested."""
    script = _calls([ToolCall("msearch", {"queries": [QUERY]}, "file_search")], f"The cause is known.【0:0†{ANSWER}】")
    live: LiveGateway = make_gateway(
        Settings(files_dir=str(tmp_path / "files")),
        engine=SimulatedEngine(script=script, record_prompts=True),
        embedder=SimulatedEmbedder(),
    )
    client = live.openai(timeout=120)
    store = client.vector_stores.create(name="corpus")
    handles = [path.open("rb") for path in _documents()]
    try:
        batch = client.vector_stores.file_batches.upload_and_poll(store.id, files=handles, poll_interval_ms=100)
    finally:
        for h in handles:
            h.close()
    assert batch.status == "completed" and batch.file_counts.completed == len(handles), batch
    names = {f.id: client.files.retrieve(f.id).filename for f in client.vector_stores.files.list(store.id, limit=100)}
    yield live, store.id, {name: fid for fid, name in names.items()}


def _cites(message: Any, file_id: str) -> None:
    part = message.content[0]
    assert part.text == "The cause is known."
    (ann,) = part.annotations
    assert ann.type == "file_citation" and ann.file_id == file_id and ann.filename == ANSWER
    assert ann.index == len(part.text)


def test_sdk_search_then_create_cites_the_right_file(corpus_gateway: Any) -> None:
    live, store, ids = corpus_gateway
    client = live.openai()
    hits = client.vector_stores.search(store, query=QUERY, max_num_results=5)
    assert hits.data[0].filename == ANSWER and hits.data[0].file_id == ids[ANSWER]
    r = client.responses.create(
        model=MODEL,
        input="What caused the checkout outage?",
        tools=[{"type": "file_search", "vector_store_ids": [store], "max_num_results": 5}],
        include=["file_search_call.results"],
    )
    assert isinstance(r, Response) and r.status == "completed"
    (call,) = [o for o in r.output if isinstance(o, ResponseFileSearchToolCall)]
    assert call.status == "completed" and call.queries == [QUERY]
    assert call.results and call.results[0].filename == ANSWER
    message = r.output[-1]
    assert isinstance(message, ResponseOutputMessage)
    _cites(message, ids[ANSWER])


def test_sdk_stream_parses_every_file_search_event(corpus_gateway: Any) -> None:
    live, store, ids = corpus_gateway
    events = list(
        live.openai().responses.create(
            model=MODEL, input="?", tools=[{"type": "file_search", "vector_store_ids": [store]}], stream=True
        )
    )
    assert [(type(ev).__name__, ev.type) for ev in events if not typed_exactly(ev)] == []
    names = [ev.type for ev in events]
    for kind in (
        "response.file_search_call.in_progress",
        "response.file_search_call.searching",
        "response.file_search_call.completed",
        "response.output_text.annotation.added",
        "response.completed",
    ):
        assert kind in names, names
    _cites(events[-1].response.output[-1], ids[ANSWER])  # type: ignore[union-attr]


def test_sdk_websocket_continuation_searches_again(corpus_gateway: Any) -> None:
    """One socket: two turns, each searching and citing; the second appends to the first's
    history (the passages stay in the token state, never re-rendered)."""
    live, store, ids = corpus_gateway
    finals: list[Response] = []
    with live.openai().responses.connect() as conn:
        for text in ("what caused the outage?", "and again?"):
            extra = {"previous_response_id": finals[-1].id} if finals else {}
            tools = [{"type": "file_search", "vector_store_ids": [store]}]
            conn.response.create(model=MODEL, input=text, tools=tools, store=False, **extra)
            for ev in conn:
                assert ev.type != "error", ev
                assert typed_exactly(ev), (type(ev).__name__, ev.type)
                if ev.type in ("response.completed", "response.failed", "response.incomplete"):
                    finals.append(ev.response)
                    break
    for final in finals:
        assert final.status == "completed"
        assert sum(isinstance(o, ResponseFileSearchToolCall) for o in final.output) == 1
        _cites(final.output[-1], ids[ANSWER])
    assert full_render_fallbacks(live) == 0
    prompts = live.engine.stats.prompts
    assert prompts[2][: len(prompts[1])] == prompts[1]  # turn 2 extends turn 1's last pass


def test_agents_file_search_tool_runs_on_the_gateway(corpus_gateway: Any) -> None:
    from agents import (
        Agent,
        FileSearchTool,
        MessageOutputItem,
        OpenAIResponsesModel,
        Runner,
        ToolCallItem,
        set_tracing_disabled,
    )

    live, store, ids = corpus_gateway

    async def main() -> Any:
        set_tracing_disabled(True)  # otherwise traces go to the public API
        client = AsyncOpenAI(base_url=live.base_url, api_key="test-key", max_retries=0)
        agent = Agent(
            name="librarian",
            instructions="Search the files, then answer with citations.",
            model=OpenAIResponsesModel(model=MODEL, openai_client=client),
            tools=[FileSearchTool(vector_store_ids=[store], max_num_results=3, include_search_results=True)],
        )
        try:
            return await Runner.run(agent, "What caused the checkout outage?", max_turns=3)
        finally:
            await client.close()

    result = asyncio.run(asyncio.wait_for(main(), 60))
    calls = [i.raw_item for i in result.new_items if isinstance(i, ToolCallItem)]
    assert len(calls) == 1 and isinstance(calls[0], ResponseFileSearchToolCall)
    assert calls[0].status == "completed" and calls[0].queries == [QUERY]
    assert calls[0].results and calls[0].results[0].file_id == ids[ANSWER]  # include_search_results
    message = result.new_items[-1]
    assert isinstance(message, MessageOutputItem)
    _cites(message.raw_item, ids[ANSWER])
    assert result.final_output == "The cause is known." and live.engine.stats.requests == 2
