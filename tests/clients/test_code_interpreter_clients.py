"""``code_interpreter`` through the gateway, driven by UNMODIFIED real clients, on the real local
sandbox (issue 34, "Must show").

A CSV is uploaded through the Files API and named in ``container: {"type": "auto", "file_ids":
[...]}``; the simulated engine (scripted as gpt-oss: raw code to its built-in ``python``) writes
code that reads the CSV, computes a total, draws a bar chart into ``/mnt/data/chart.png`` and
prints the chart's sha256; the answer links the chart (``sandbox:/mnt/data/chart.png``). The
clients parse the ``code_interpreter_call``, its outputs and the ``container_file_citation``, and
fetch the chart through ``client.containers.files.content``: byte-identical to what the code
wrote (its sha256, computed inside the sandbox).

* **openai SDK**: ``responses.create`` with the tool as a dict, then streamed (every event typed
  exactly by the SDK's ``ResponseStreamEvent`` union).
* **openai-agents**: an ``Agent`` holding the SDK's own ``CodeInterpreterTool``, run by ``Runner.run``.

The chart is drawn with matplotlib when the sandbox's python has it (Debian's python3-matplotlib:
``make test`` and the Dockerfile install it), else written as a PNG by hand (zlib and struct); the
code prints which, and the test asserts a PNG either way.

The sandbox is the real local one (bubblewrap). Where it cannot start these tests fail with the
reason, unless ``RESPGATE_SANDBOX_OPTIONAL=1`` (as in ``tests/security/sandbox``), when they skip.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import io
import os
import re
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from openai import AsyncOpenAI
from openai.types.responses import Response, ResponseCodeInterpreterToolCall, ResponseOutputMessage

from gateway.base.settings import Settings
from inference.simulated import SimulatedEngine
from inference.simulated_script import ToolCall
from security.sandbox.local import LocalSandbox
from tests.conftest import MODEL, LiveGateway
from tests.gateway.tools.test_mcp_turns import _calls
from tests.schema_check import typed_exactly

pytestmark = pytest.mark.timeout(180)

OPTIONAL = os.environ.get("RESPGATE_SANDBOX_OPTIONAL") == "1"
CSV = b"month,amount\njan,10\nfeb,20\nmar,30\n"
CODE = """\
import csv, hashlib, os
rows = list(csv.DictReader(open('/mnt/data/sales.csv')))
total = sum(float(r['amount']) for r in rows)
print('total', total)
try:
    os.environ.setdefault('MPLCONFIGDIR', '/tmp')
    import matplotlib
    matplotlib.use('Agg')
    import matplotlib.pyplot as plt
    plt.bar([r['month'] for r in rows], [float(r['amount']) for r in rows])
    plt.title('sales')
    plt.savefig('/mnt/data/chart.png')
    how = 'matplotlib'
except ImportError:  # a sandbox python without matplotlib: a PNG by hand, one bar per row
    import struct, zlib
    w, h = 3 * len(rows), 30
    top = max(float(r['amount']) for r in rows)
    def px(x, y):
        return 0 if h - y <= 30 * float(rows[x // 3]['amount']) / top else 255
    raw = b''.join(b'\\0' + bytes(px(x, y) for x in range(w)) for y in range(h))
    def chunk(kind, data):
        body = kind + data
        return struct.pack('>I', len(data)) + body + struct.pack('>I', zlib.crc32(body))
    png = b'\\x89PNG\\r\\n\\x1a\\n' + chunk(b'IHDR', struct.pack('>IIBBBBB', w, h, 8, 0, 0, 0, 0))
    png += chunk(b'IDAT', zlib.compress(raw)) + chunk(b'IEND', b'')
    open('/mnt/data/chart.png', 'wb').write(png)
    how = 'zlib'
print('chart', how, hashlib.sha256(open('/mnt/data/chart.png', 'rb').read()).hexdigest())
"""
ANSWER = "The total is 60. Here is the chart: [chart](sandbox:/mnt/data/chart.png)"
MARK = "sandbox:/mnt/data/chart.png"


@pytest.fixture
def ci_gateway(make_gateway: Any) -> Iterator[tuple[LiveGateway, str]]:
    """A gateway with ``code_interpreter=local`` and a CSV in the tenant's Files API."""
    availability = LocalSandbox(tempfile.gettempdir()).available()
    if not availability.ok:
        if OPTIONAL:
            pytest.skip(f"RESPGATE_SANDBOX_OPTIONAL=1 and the sandbox cannot start: {availability.reason}")
        pytest.fail(f"the local sandbox cannot start here: {availability.reason}")
    # not pytest's tmp_path: its parents are 0700 root, and the containers run as other uids
    base = Path(tempfile.mkdtemp(prefix="respgate-ci-clients-"))
    base.chmod(0o711)
    try:
        live: LiveGateway = make_gateway(
            Settings(
                code_interpreter="local",
                files_dir=str(base / "files"),
                containers_dir=str(base / "containers"),
                container_run_timeout_s=120,
            ),
            engine=SimulatedEngine(script=_calls([ToolCall("python", CODE, "python", custom=True)], ANSWER)),
        )
        csv = live.openai().files.create(file=("sales.csv", io.BytesIO(CSV)), purpose="user_data")
        yield live, csv.id
    finally:
        shutil.rmtree(base, ignore_errors=True)


def _tool(csv_id: str) -> dict[str, Any]:
    return {"type": "code_interpreter", "container": {"type": "auto", "file_ids": [csv_id]}}


def _chart_sha(logs: str) -> tuple[str, str]:
    m = re.search(r"chart (matplotlib|zlib) ([0-9a-f]{64})", logs)
    assert m is not None, logs
    return m.group(1), m.group(2)


def _check_answer_and_fetch(live: LiveGateway, call: ResponseCodeInterpreterToolCall, message: Any) -> bytes:
    """The answer's citation names the chart the run wrote; the chart, fetched through the
    Containers API, is the bytes the code wrote."""
    part = message.content[0]
    assert part.text == ANSWER
    (ann,) = part.annotations
    assert ann.type == "container_file_citation" and ann.container_id == call.container_id
    assert ann.filename == "chart.png" and part.text[ann.start_index : ann.end_index] == MARK
    client = live.openai()
    listed = {f.id: f for f in client.containers.files.list(call.container_id)}
    assert listed[ann.file_id].path == "/mnt/data/chart.png" and listed[ann.file_id].source == "assistant"
    data = client.containers.files.content.retrieve(ann.file_id, container_id=call.container_id).read()
    assert data.startswith(b"\x89PNG\r\n\x1a\n")
    return data


def test_sdk_csv_analysed_and_chart_fetched(ci_gateway: Any) -> None:
    live, csv_id = ci_gateway
    client = live.openai(timeout=150)
    r = client.responses.create(
        model=MODEL,
        input="Total the sales and chart them.",
        tools=[_tool(csv_id)],
        include=["code_interpreter_call.outputs"],
    )
    assert isinstance(r, Response) and r.status == "completed", r
    (call,) = [o for o in r.output if isinstance(o, ResponseCodeInterpreterToolCall)]
    assert call.status == "completed" and call.code == CODE and call.container_id.startswith("cntr_")
    assert call.outputs is not None
    logs = call.outputs[0]
    assert logs.type == "logs" and "total 60.0" in logs.logs
    how, sha = _chart_sha(logs.logs)
    (image,) = [o for o in call.outputs if o.type == "image"]
    message = r.output[-1]
    assert isinstance(message, ResponseOutputMessage)
    data = _check_answer_and_fetch(live, call, message)
    assert hashlib.sha256(data).hexdigest() == sha, how
    assert image.url == "data:image/png;base64," + base64.b64encode(data).decode()
    # the uploaded CSV is in the container too, as the user's
    files = {f.path: f for f in client.containers.files.list(call.container_id)}
    assert files["/mnt/data/sales.csv"].source == "user"
    print(f"chart drawn with {how}")


def test_sdk_stream_parses_every_code_interpreter_event(ci_gateway: Any) -> None:
    live, csv_id = ci_gateway
    events = list(live.openai(timeout=150).responses.create(model=MODEL, input="?", tools=[_tool(csv_id)], stream=True))
    assert [(type(ev).__name__, ev.type) for ev in events if not typed_exactly(ev)] == []
    names = [ev.type for ev in events]
    order = [
        "response.code_interpreter_call.in_progress",
        "response.code_interpreter_call_code.delta",
        "response.code_interpreter_call_code.done",
        "response.code_interpreter_call.interpreting",
        "response.code_interpreter_call.completed",
        "response.output_text.annotation.added",
        "response.completed",
    ]
    positions = [names.index(n) for n in order]
    assert positions == sorted(positions), names
    final = events[-1].response
    (call,) = [o for o in final.output if isinstance(o, ResponseCodeInterpreterToolCall)]
    assert call.outputs is None  # not included
    _check_answer_and_fetch(live, call, final.output[-1])


def test_agents_code_interpreter_tool_runs_on_the_gateway(ci_gateway: Any) -> None:
    from agents import (
        Agent,
        CodeInterpreterTool,
        MessageOutputItem,
        OpenAIResponsesModel,
        Runner,
        ToolCallItem,
        set_tracing_disabled,
    )

    live, csv_id = ci_gateway

    async def main() -> Any:
        set_tracing_disabled(True)  # otherwise traces go to the public API
        client = AsyncOpenAI(base_url=live.base_url, api_key="test-key", max_retries=0, timeout=150)
        agent = Agent(
            name="analyst",
            instructions="Analyse the CSV with python and chart it.",
            model=OpenAIResponsesModel(model=MODEL, openai_client=client),
            tools=[CodeInterpreterTool(tool_config=_tool(csv_id))],  # type: ignore[arg-type]
        )
        try:
            return await Runner.run(agent, "Total the sales and chart them.", max_turns=3)
        finally:
            await client.close()

    result = asyncio.run(asyncio.wait_for(main(), 150))
    calls = [i.raw_item for i in result.new_items if isinstance(i, ToolCallItem)]
    assert len(calls) == 1 and isinstance(calls[0], ResponseCodeInterpreterToolCall)
    assert calls[0].status == "completed" and calls[0].code == CODE
    message = result.new_items[-1]
    assert isinstance(message, MessageOutputItem)
    _check_answer_and_fetch(live, calls[0], message.raw_item)
    assert result.final_output == ANSWER and live.engine.stats.requests == 2


def test_a_run_the_real_sandbox_ends_is_a_failed_call_not_a_5xx(make_gateway: Any) -> None:
    """An endless loop in the real sandbox: the run is ended at ``container_run_timeout_s``, the
    call is ``failed``, the model reads why, and the response completes (the state is lost, the
    container lives on: the next run in it works)."""
    availability = LocalSandbox(tempfile.gettempdir()).available()
    if not availability.ok:
        if OPTIONAL:
            pytest.skip(f"RESPGATE_SANDBOX_OPTIONAL=1 and the sandbox cannot start: {availability.reason}")
        pytest.fail(f"the local sandbox cannot start here: {availability.reason}")
    base = Path(tempfile.mkdtemp(prefix="respgate-ci-clients-"))
    base.chmod(0o711)
    try:
        calls = [ToolCall("python", "while True:\n    pass", "python", custom=True)]
        calls.append(ToolCall("python", "print('alive')", "python", custom=True))
        live: LiveGateway = make_gateway(
            Settings(
                code_interpreter="local",
                files_dir=str(base / "files"),
                containers_dir=str(base / "containers"),
                container_run_timeout_s=2,
            ),
            engine=SimulatedEngine(script=_calls(calls, "Done."), record_prompts=True),
        )
        r = live.openai(timeout=60).responses.create(
            model=MODEL, input="loop", tools=[_tool_auto()], include=["code_interpreter_call.outputs"]
        )
        assert r.status == "completed"
        looped, alive = [o for o in r.output if isinstance(o, ResponseCodeInterpreterToolCall)]
        assert looped.status == "failed" and alive.status == "completed"
        assert alive.outputs is not None and alive.outputs[0].type == "logs" and alive.outputs[0].logs == "alive\n"
        from inference.harmony_core import harmony_encoding

        prompts = live.engine.stats.prompts
        seen = harmony_encoding().decode(list(prompts[1][len(prompts[0]) :]))
        assert "Error: the run took longer than its time limit" in seen, seen
    finally:
        shutil.rmtree(base, ignore_errors=True)


def _tool_auto() -> dict[str, Any]:
    return {"type": "code_interpreter", "container": {"type": "auto"}}
