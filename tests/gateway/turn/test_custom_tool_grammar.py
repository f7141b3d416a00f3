"""Grammar-enforced ``custom`` tools end to end (issue 13, item 6).

Codex's real ``apply_patch`` tool (its Lark grammar, from a recorded Codex CLI frame) on the CPU
engine: the model's call input parses against the grammar (checked by llguidance). A grammar the engine
cannot compile still answers, with the grammar in prose only, and moves
``respgate_grammar_fallbacks_total{syntax}`` — on the simulated engine (fast) and on vLLM.
"""

from __future__ import annotations

import json

import pytest

from tests.conftest import VLLM_MODEL, LiveGateway
from tests.inference.test_tool_grammar import APPLY_PATCH, BAD_LARK, CODEX_TOOLS, llguidance_accepts

FALLBACKS = "respgate_grammar_fallbacks_total"
CODEX_INSTRUCTIONS = "You are a coding agent. Edit files with apply_patch."
#: a Codex loop's second patch: one earlier apply_patch call and its output are in the history (the
#: 135M model copies that shape; with no example it fills the grammar with one endless file name)
PATCH_LOOP = [
    {"type": "message", "role": "user", "content": "Create the file a.txt containing the line 'hi'."},
    {
        "type": "custom_tool_call",
        "call_id": "call_0",
        "name": "apply_patch",
        "input": "*** Begin Patch\n*** Add File: a.txt\n+hi\n*** End Patch\n",
    },
    {
        "type": "custom_tool_call_output",
        "call_id": "call_0",
        "output": "Success. Updated the following files:\nA a.txt\n",
    },
    {"type": "message", "role": "assistant", "content": "Created a.txt."},
    {"type": "message", "role": "user", "content": "Create the file hello.txt containing the line 'hello world'."},
]


def codex_tools() -> list[dict]:
    """The frame's callable tools (Codex also sends hosted ones the engine does not see)."""
    return [t for t in CODEX_TOOLS if t["type"] in ("function", "custom")]


def test_an_uncompilable_grammar_still_answers_and_is_counted(gateway: LiveGateway):
    before = gateway.metric(FALLBACKS, {"syntax": "lark"})
    r = gateway.openai().responses.create(model="gpt-oss-sim", input="hello", tools=[BAD_LARK])
    assert r.status == "completed" and r.output
    assert gateway.metric(FALLBACKS, {"syntax": "lark"}) == before + 1
    r = gateway.openai().responses.create(model="gpt-oss-sim", input="hello", tools=[APPLY_PATCH])
    assert r.status == "completed"
    assert gateway.metric(FALLBACKS, {"syntax": "lark"}) == before + 1  # Codex's grammar compiles


@pytest.mark.slow
@pytest.mark.timeout(900)  # the first CPU-engine test of a session loads vLLM
def test_cpu_model_call_to_codex_apply_patch_parses_against_its_grammar(vllm_gateway: LiveGateway):
    r = vllm_gateway.openai().responses.create(
        model=VLLM_MODEL,
        instructions=CODEX_INSTRUCTIONS,
        input=PATCH_LOOP,
        tools=codex_tools(),
        tool_choice={"type": "custom", "name": "apply_patch"},
        temperature=0,
        max_output_tokens=160,
    )
    assert r.status == "completed", [o.model_dump() for o in r.output]
    calls = [o for o in r.output if o.type == "custom_tool_call"]
    assert len(calls) == 1 and calls[0].name == "apply_patch", r.output
    # checked by llguidance, not by the xgrammar conversion that constrained it (the ``lark`` package
    # refuses this grammar: its zero-width /(.*)/ terminals are llguidance's Lark dialect)
    assert llguidance_accepts(APPLY_PATCH["format"]["definition"], calls[0].input), calls[0].input


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_cpu_engine_turn_with_an_uncompilable_grammar_answers_in_prose(vllm_gateway: LiveGateway):
    before = vllm_gateway.metric(FALLBACKS, {"syntax": "lark"})
    r = vllm_gateway.openai().responses.create(
        model=VLLM_MODEL,
        input="Fix it.",
        tools=[BAD_LARK],
        tool_choice={"type": "custom", "name": "broken"},
        temperature=0,
        max_output_tokens=48,
    )
    assert r.status in ("completed", "incomplete"), r
    assert vllm_gateway.metric(FALLBACKS, {"syntax": "lark"}) == before + 1
    calls = [o for o in r.output if o.type == "custom_tool_call"]
    if r.status == "completed":  # the forced call still holds (its input is any JSON string)
        assert len(calls) == 1 and isinstance(calls[0].input, str), r.output
    json.dumps(r.model_dump())  # a well-formed Response either way


# -- the constraint is built once per tenant and tool set, and its first build is off the loop ----


def test_a_chain_re_sending_codex_tools_builds_their_constraint_once(gateway: LiveGateway):
    """Codex re-sends its tools (apply_patch's grammar among them) with every turn: the grammar is
    compiled and checked on the first turn only (it was ~2 ms of every continuation turn)."""
    import uuid

    cache = gateway.gw.pipeline.constraints
    client = gateway.openai()
    # a tool set no other test of this gateway sends, so its first turn must be the one that builds
    tools = [
        *codex_tools(),
        {"type": "function", "name": f"probe_{uuid.uuid4().hex[:8]}", "parameters": {"type": "object"}},
    ]
    hits, misses = cache.hits, cache.misses
    for i in range(4):  # (the simulated model answers with a call, so each turn starts a chain of its own)
        r = client.responses.create(model="gpt-oss-sim", input=f"step {i}", tools=tools, store=False)
        assert r.status == "completed"
    assert (cache.misses - misses, cache.hits - hits) == (1, 3)
    # what the turns got is what a fresh build gives
    from inference.harmony import HarmonyRenderer
    from inference.renderer import Prelude

    cached = list(cache.lru.values())[-1]  # the most recently used: this test's
    assert cached == HarmonyRenderer().constraint(Prelude(tools=tuple(tools)), None)


def test_constraints_are_kept_per_tenant_model_and_tool_set():
    from types import SimpleNamespace

    from gateway.turn.sampling import ConstraintCache
    from inference.renderer import Prelude

    built = []

    class Renderer:
        def constraint(self, prelude, text_format):
            built.append((prelude.tools, text_format))
            return {"n": len(built)}

    cache = ConstraintCache(max_entries=3)
    route = SimpleNamespace(name="m", renderer=Renderer())
    turn = lambda tools: SimpleNamespace(prelude=Prelude(tools=tools))  # noqa: E731
    t1, t2 = ({"type": "function", "name": "a"},), ({"type": "function", "name": "b"},)
    assert cache.constraint(route, turn(t1), None, "tenant-a") == {"n": 1}
    assert cache.constraint(route, turn(t1), None, "tenant-a") == {"n": 1}  # hit
    assert cache.constraint(route, turn(t1), None, "tenant-b") == {"n": 2}  # another tenant builds its own
    assert cache.constraint(route, turn(t2), None, "tenant-a") == {"n": 3}  # other tools
    assert cache.constraint(route, turn(t1), {"type": "json_object"}, "tenant-a") == {"n": 4}  # other format
    assert len(cache.lru) == 3  # bounded: the oldest went
    assert cache.constraint(route, turn(t1), None, "tenant-b") == {"n": 2}
    assert cache.constraint(route, turn(t1), None, "tenant-a") == {"n": 5}  # evicted: built again
    assert cache.constraint(route, turn(()), None, "tenant-a") == {"n": 6}  # no tools: not cached
    assert cache.constraint(route, turn(()), None, "tenant-a") == {"n": 7}


def test_the_first_grammar_turn_is_prepared_off_the_event_loop(gateway: LiveGateway, monkeypatch):
    """Importing xgrammar takes seconds (torch): a small body that would pay it is prepared in the
    worker pool, not inline on the loop that streams every other client's tokens."""
    import threading

    from inference import tool_grammar

    monkeypatch.setattr(tool_grammar, "_LOADED", threading.Event())  # as if no grammar was built yet
    offload = gateway.gw.pipeline.offload
    client = gateway.openai()
    before = offload.offloaded
    assert client.responses.create(model="gpt-oss-sim", input="hi", tools=codex_tools()).status == "completed"
    assert offload.offloaded == before + 1 and tool_grammar.grammar_library_ready()
    assert client.responses.create(model="gpt-oss-sim", input="hi", tools=[BAD_LARK]).status == "completed"
    assert client.responses.create(model="gpt-oss-sim", input="hi").status == "completed"
    assert offload.offloaded == before + 1  # loaded now, and a turn without grammars never needed it
    assert tool_grammar.needs_grammar_library(codex_tools())
    assert not tool_grammar.needs_grammar_library([t for t in codex_tools() if t["type"] == "function"])


def test_a_gateway_in_front_of_a_real_model_imports_the_grammar_library_at_start(make_gateway, monkeypatch):
    """Not under its first Codex turn: the import runs in a background thread from start-up (the
    simulated engine's gateways — tests, benchmarks — leave it to the first grammar)."""
    import threading
    import time

    from inference import tool_grammar
    from tests.turn_helpers import TokenScriptEngine

    monkeypatch.setattr(tool_grammar, "_LOADED", threading.Event())
    make_gateway()  # simulated: nothing preloaded
    assert not any(t.name == "respgate-grammar-preload" for t in threading.enumerate())
    assert not tool_grammar.grammar_library_ready()
    make_gateway(engine=TokenScriptEngine([[1]]))
    deadline = time.monotonic() + 120
    while not tool_grammar.grammar_library_ready() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert tool_grammar.grammar_library_ready()


def test_the_constraint_cache_is_bounded_in_bytes():
    """A constraint embeds its tools' schemas and grammars (up to 512 × 128 KiB): the cache holds at
    most max_bytes of them, and keeps none bigger than a quarter of that."""
    from types import SimpleNamespace

    from gateway.turn.sampling import ConstraintCache
    from inference.renderer import Prelude

    class Renderer:
        def constraint(self, prelude, text_format):
            return {"structural_tag": "x" * prelude.tools[0]["size"]}

    cache = ConstraintCache(max_entries=100, max_bytes=40_000)
    route = SimpleNamespace(name="m", renderer=Renderer())

    def ask(i, size):
        return cache.constraint(
            route, SimpleNamespace(prelude=Prelude(tools=({"name": f"t{i}", "size": size},))), None, "tenant"
        )

    for i in range(10):
        ask(i, 5_000)
    assert cache.nbytes <= 40_000 and len(cache.lru) == 7  # the oldest went, by bytes
    ask(99, 20_000)  # over a quarter: not kept
    assert cache.nbytes <= 40_000 and len(cache.lru) == 7
    misses = cache.misses
    ask(99, 20_000)
    assert cache.misses == misses + 1  # built again, every time
    ask(9, 5_000)
    assert cache.misses == misses + 1  # a kept one is still a hit
