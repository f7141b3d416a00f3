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
    {"type": "custom_tool_call", "call_id": "call_0", "name": "apply_patch",
     "input": "*** Begin Patch\n*** Add File: a.txt\n+hi\n*** End Patch\n"},
    {"type": "custom_tool_call_output", "call_id": "call_0", "output": "Success. Updated the following files:\nA a.txt\n"},
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
        model=VLLM_MODEL, instructions=CODEX_INSTRUCTIONS, input=PATCH_LOOP, tools=codex_tools(),
        tool_choice={"type": "custom", "name": "apply_patch"}, temperature=0, max_output_tokens=160)
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
        model=VLLM_MODEL, input="Fix it.", tools=[BAD_LARK], tool_choice={"type": "custom", "name": "broken"},
        temperature=0, max_output_tokens=48)
    assert r.status in ("completed", "incomplete"), r
    assert vllm_gateway.metric(FALLBACKS, {"syntax": "lark"}) == before + 1
    calls = [o for o in r.output if o.type == "custom_tool_call"]
    if r.status == "completed":  # the forced call still holds (its input is any JSON string)
        assert len(calls) == 1 and isinstance(calls[0].input, str), r.output
    json.dumps(r.model_dump())  # a well-formed Response either way
