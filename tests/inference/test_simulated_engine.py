"""SimulatedEngine: the Engine protocol with scripted gpt-oss behaviour, read from token ids only."""

from __future__ import annotations

import asyncio
import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from inference.engine import Engine, EngineError, SamplingParams, TokenDelta
from inference.harmony import HarmonyRenderer, harmony_tokens
from inference.renderer import Prelude
from inference.simulated import SimulatedEngine
from inference.simulated_cache import BlockPrefixCache, KnownSequences
from inference.simulated_prompt import PromptView, parse_tool_declarations
from inference.simulated_script import ToolCall, Turn, turns_in_order

from .harmony_support import APPLY_PATCH, CONVERSATIONS, GET_WEATHER, MCP, NO_PARAMS, PRELUDES, items_from_events


def user(text: str) -> dict:
    return {"type": "message", "role": "user", "content": [{"type": "input_text", "text": text}]}


def prompt(renderer: HarmonyRenderer, prelude: Prelude, items: list[dict], calls: dict | None = None) -> list[int]:
    return renderer.render_prelude(prelude) + renderer.render_items(items, calls=calls) + renderer.generation_prompt()


async def run(engine: SimulatedEngine, ids: list[int], params: SamplingParams | None = None) -> list[TokenDelta]:
    return [d async for d in engine.generate("req", ids, params or SamplingParams())]


def parse(renderer: HarmonyRenderer, prelude: Prelude, deltas: list[TokenDelta]) -> list[dict]:
    parser = renderer.parser(prelude)
    events = [ev for d in deltas for ev in parser.feed(d.token_ids)] + parser.finish()
    return items_from_events(events)


def sampled(deltas: list[TokenDelta]) -> list[int]:
    return [t for d in deltas for t in d.token_ids]


async def test_is_an_engine(engine: SimulatedEngine) -> None:
    assert isinstance(engine, Engine)
    assert engine.ready()
    fresh = SimulatedEngine()
    assert not fresh.ready()
    with pytest.raises(EngineError):
        await run(fresh, [1, 2, 3])


async def test_default_calls_first_tool_with_schema_built_arguments(engine, renderer) -> None:
    prelude = Prelude(tools=(APPLY_PATCH, GET_WEATHER, NO_PARAMS))  # first non-freeform tool
    deltas = await run(engine, prompt(renderer, prelude, [user("Weather in Oslo?")]))
    items = parse(renderer, prelude, deltas)
    assert [it["type"] for it in items] == ["reasoning", "function_call"]
    call = items[1]
    assert call["name"] == "get_weather" and "namespace" not in call
    assert json.loads(call["arguments"]) == {
        "city": "Weather in Oslo?",
        "unit": "celsius",
        "days": 1,
        "detailed": True,
        "tags": ["Weather in Oslo?"],
        "where": {"lat": 1},
    }
    last = deltas[-1]
    assert last.finish_reason == "stop" and last.stop_token_id == harmony_tokens().call
    assert last.token_ids[-1] == harmony_tokens().call
    assert all(d.finish_reason is None for d in deltas[:-1])


async def test_summary_request_gets_a_deterministic_summary_even_with_tools(engine, renderer) -> None:
    from inference.summary import SUMMARY_PREFIX, summary_message, summary_request

    prelude = Prelude(tools=(GET_WEATHER,))  # a plain user message would call the tool
    history = [
        summary_message("old stuff", "cmp_1"),
        user("Weather in Oslo tomorrow, please?"),
        {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Sunny."}]},
    ]
    ids = prompt(renderer, prelude, history + [summary_request()])
    first = parse(renderer, prelude, await run(engine, ids))
    again = parse(renderer, prelude, await run(engine, ids))
    assert first == again and [it["type"] for it in first] == ["reasoning", "message"]
    text = first[-1]["content"][0]["text"]
    assert text == "Compacted 2 messages and an earlier summary. The user asked: Weather in Oslo tomorro….", text
    assert "Sunny" not in text and SUMMARY_PREFIX not in text


async def test_text_answer_without_tools(engine, renderer) -> None:
    deltas = await run(engine, prompt(renderer, Prelude(), [user("héllo 🎉")]))
    items = parse(renderer, Prelude(), deltas)
    assert items[-1]["content"][0]["text"] == "You said: héllo 🎉"
    assert deltas[-1].stop_token_id == harmony_tokens().return_ == deltas[-1].token_ids[-1]


async def test_reasoning_comes_first_and_is_counted(engine, renderer) -> None:
    deltas = await run(engine, prompt(renderer, Prelude(), [user("hi")]))
    parser = renderer.parser(Prelude())
    events = [ev for d in deltas for ev in parser.feed(d.token_ids)]
    items = items_from_events(events + parser.finish())
    assert items[0]["type"] == "reasoning" and items[0]["content"][0]["text"]
    assert 0 < parser.reasoning_tokens < len(sampled(deltas))


async def test_answers_tool_output(engine, renderer) -> None:
    prelude = Prelude(tools=(GET_WEATHER,))
    call = {"type": "function_call", "call_id": "c1", "name": "get_weather", "arguments": "{}"}
    history = [user("weather?"), call, {"type": "function_call_output", "call_id": "c1", "output": "sunny, 21C"}]
    items = parse(renderer, prelude, await run(engine, prompt(renderer, prelude, history)))
    assert items[-1]["content"][0]["text"] == "Tool get_weather returned: sunny, 21C"


async def test_tool_choice_none_and_named(engine, renderer) -> None:
    none = Prelude(tools=(GET_WEATHER,), tool_choice="none")
    items = parse(renderer, none, await run(engine, prompt(renderer, none, [user("x")])))
    assert items[-1]["type"] == "message"
    named = Prelude(tools=(GET_WEATHER, MCP), tool_choice={"type": "function", "name": "read_file"})
    items = parse(renderer, named, await run(engine, prompt(renderer, named, [user("/etc/hosts")])))
    assert items[-1] == {
        "type": "function_call",
        "call_id": "c",
        "name": "read_file",
        "namespace": "mcp_fs",
        "arguments": '{"path":"/etc/hosts"}',
    }


async def test_freeform_only_tools_get_raw_input(engine, renderer) -> None:
    prelude = Prelude(tools=(APPLY_PATCH,))
    items = parse(renderer, prelude, await run(engine, prompt(renderer, prelude, [user("fix it")])))
    assert items[-1] == {"type": "custom_tool_call", "call_id": "c", "name": "apply_patch", "input": "fix it"}


async def test_max_tokens_gives_length(engine, renderer) -> None:
    deltas = await run(engine, prompt(renderer, Prelude(), [user("hi")]), SamplingParams(max_tokens=5))
    assert len(sampled(deltas)) == 5
    assert deltas[-1].finish_reason == "length" and deltas[-1].stop_token_id is None
    endless = SimulatedEngine(script=lambda v: Turn(reasoning="r", endless=True), tokens_per_delta=7)
    await endless.start()
    deltas = await run(endless, prompt(renderer, Prelude(), [user("hi")]), SamplingParams(max_tokens=300))
    assert len(sampled(deltas)) == 300 and deltas[-1].finish_reason == "length"
    items = parse(renderer, Prelude(), deltas)
    assert items[-1]["incomplete"] and "lorem ipsum" in items[-1]["content"][0]["text"]


async def test_aclose_counts_an_abort_and_frees_the_slot(renderer) -> None:
    engine = SimulatedEngine(script=lambda v: Turn(endless=True))
    await engine.start()
    agen = engine.generate("r", prompt(renderer, Prelude(), [user("go")]), SamplingParams())
    for _ in range(3):
        await agen.__anext__()
    assert engine.stats.running == 1
    await agen.aclose()
    assert engine.stats.running == 0 and engine.stats.aborts == 1


async def test_task_cancellation_counts_an_abort(renderer) -> None:
    engine = SimulatedEngine(script=lambda v: Turn(endless=True))
    await engine.start()
    got = asyncio.Event()

    async def consume() -> None:
        async for _ in engine.generate("r", prompt(renderer, Prelude(), [user("go")]), SamplingParams()):
            got.set()

    task = asyncio.create_task(consume())
    await got.wait()  # the endless generator keeps yielding to the loop, so this returns
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert engine.stats.aborts == 1 and engine.stats.running == 0


async def test_completed_requests_are_not_aborts(engine, renderer) -> None:
    await run(engine, prompt(renderer, Prelude(), [user("a")]))
    await run(engine, prompt(renderer, Prelude(), [user("b")]), SamplingParams(max_tokens=2))
    s = engine.stats
    assert (s.requests, s.aborts, s.running) == (2, 0, 0)
    assert s.generated_tokens > 2 and s.last_prompt_len == len(prompt(renderer, Prelude(), [user("b")]))


async def test_fail_after_tokens(renderer) -> None:
    engine = SimulatedEngine(script=lambda v: Turn(text="a long answer " * 5, fail_after_tokens=4))
    await engine.start()
    got: list[int] = []
    with pytest.raises(EngineError):
        async for d in engine.generate("r", prompt(renderer, Prelude(), [user("x")]), SamplingParams()):
            got += d.token_ids
    assert len(got) == 4
    assert engine.stats.aborts == 0 and engine.stats.running == 0
    broken = SimulatedEngine(script=lambda v: 1 / 0)
    await broken.start()
    with pytest.raises(EngineError):
        await run(broken, prompt(renderer, Prelude(), [user("x")]))


async def test_prefix_cache_reports_the_served_prefix(renderer) -> None:
    engine = SimulatedEngine(cache_block_size=1)
    await engine.start()
    first = prompt(renderer, Prelude(), [user("one")])
    d1 = await run(engine, first)
    assert d1[0].num_cached_tokens == 0
    assert all(d.num_cached_tokens is None for d in d1[1:])
    # the continuation: parent prompt + sampled history + new items + generation prompt
    second = (
        first
        + renderer.history_tokens(sampled(d1))
        + renderer.render_items([user("two")])
        + renderer.generation_prompt()
    )
    d2 = await run(engine, second)
    assert d2[0].num_cached_tokens == len(first) + len(sampled(d1)) - 1  # <|return|> became <|end|>
    assert engine.stats.cached_tokens == d2[0].num_cached_tokens
    # the same prompt again: everything but the last token (it is recomputed for logits)
    assert (await run(engine, second))[0].num_cached_tokens == len(second) - 1

    blocks = SimulatedEngine(cache_block_size=16)
    await blocks.start()
    d1 = await run(blocks, first)
    # vLLM's granularity: the parent's prompt + output but the last token, in whole 16-token blocks
    assert (await run(blocks, second))[0].num_cached_tokens == (len(first) + len(sampled(d1)) - 1) // 16 * 16
    off = SimulatedEngine(prefix_cache=False)
    await off.start()
    await run(off, first)
    assert (await run(off, first))[0].num_cached_tokens == 0


class ReferenceKV:
    """vLLM's prefix caching stated the slow, obvious way, to check the emulation against: every
    cached block is a whole prefix (salt, tokens[:k * block]); a request touches every block of
    its chain; eviction takes the least recently touched block that has no cached child, never
    one of the admitting request's prompt blocks."""

    def __init__(self, block: int, capacity_blocks: int) -> None:
        self.block, self.capacity = block, capacity_blocks
        self.stamps: dict[tuple, int] = {}
        self.clock = 0

    def _keys(self, salt, tokens: list[int]) -> list[tuple]:
        return [(salt, tuple(tokens[: k * self.block])) for k in range(1, len(tokens) // self.block + 1)]

    def _store(self, keys: list[tuple], pinned: set) -> None:
        self.clock += 1
        for key in keys:
            self.stamps[key] = self.clock
        while len(self.stamps) > self.capacity:
            parents = {(s, t[: -self.block]) for s, t in self.stamps}
            leaves = [k for k in self.stamps if k not in parents and k not in pinned]
            if not leaves:
                break
            del self.stamps[min(leaves, key=self.stamps.__getitem__)]

    def request(self, salt, prompt: list[int], output: list[int]) -> int:
        keys = self._keys(salt, prompt)
        hit = 0
        while hit < len(keys) and keys[hit] in self.stamps:
            hit += 1
        self._store(keys, set(keys))
        self._store(self._keys(salt, prompt + output), set())
        return min(hit, (len(prompt) - 1) // self.block) * self.block


def test_block_cache_reports_whole_blocks_never_the_whole_prompt() -> None:
    """vLLM's ``num_cached_tokens``: the leading full blocks already cached, and at most
    ``(n - 1) // block`` of them (the last prompt token is computed for its logits)."""
    cache = BlockPrefixCache(block_size=16)

    def request(prompt: list[int], output: list[int] = (), salt=None) -> int:
        adm = cache.admit(prompt, salt)
        cache.finish(adm, output)
        return adm.cached

    assert request(list(range(100))) == 0
    assert request(list(range(100)) + [5]) == 96  # 6 full blocks
    assert request(list(range(96))) == 80  # 6 cached, but never the whole prompt
    assert request(list(range(40)) + [-1] * 60) == 32  # a change in block 2 stops the hit there
    assert request(list(range(100)), salt="t1") == 0  # another salt never hits
    assert request(list(range(100)), salt="t1") == 96
    assert request(list(range(10))) == 0  # no full block
    # what a request computed after its prompt (output but the last token) is cached too
    assert request(list(range(200, 220)), output=list(range(220, 250))) == 0
    assert request(list(range(200, 260))) == 48  # 20 prompt + 29 output tokens held: 3 blocks


def test_block_cache_evicts_least_recently_used_leaves() -> None:
    cache = BlockPrefixCache(block_size=1, capacity_tokens=4)
    ref = ReferenceKV(1, 4)
    for prompt in ([1, 2, 3], [9, 9], [1, 2, 3, 4], [1, 2, 3, 4, 5], [9, 9, 1], [1, 2, 7]):
        adm = cache.admit(prompt)
        cache.finish(adm)
        assert adm.cached == ref.request(None, prompt, [])
        assert len(cache) == len(ref.stamps) <= 4
    assert cache.work.blocks_evicted > 0


OPS = st.lists(
    st.tuples(
        st.integers(0, 2),
        st.sampled_from(["turn", "turn", "turn", "retry", "fork"]),
        st.lists(st.integers(0, 2), max_size=12),
        st.lists(st.integers(0, 2), max_size=6),
    ),
    min_size=1,
    max_size=25,
)


@settings(max_examples=150, deadline=None)
@given(
    block=st.sampled_from([1, 2, 4, 16]),
    capacity=st.integers(1, 40),
    ops=OPS,
    salts=st.tuples(st.sampled_from([None, "a"]), st.sampled_from([None, "b"]), st.sampled_from([None, "a"])),
)
def test_block_cache_matches_the_reference_with_lists_and_views(block, capacity, ops, salts) -> None:
    """Random conversations (continued, retried from an earlier prompt, forked into a fresh
    buffer) over a tiny alphabet, so chains share prefixes: the emulation — given fresh lists, or
    append-only views whose old blocks it does not re-hash — reports what the reference does,
    and stays within its capacity (the admitting prompt's chain aside)."""
    from cache.seq import TokenSeq

    ref = ReferenceKV(block, capacity)
    lists = BlockPrefixCache(block, capacity * block)
    views = BlockPrefixCache(block, capacity * block)
    known = KnownSequences(limit=2)  # fewer than the conversations: forgotten ones are re-hashed
    convs: list[TokenSeq] = [TokenSeq([7]) for _ in range(3)]
    past: list[list[TokenSeq]] = [[] for _ in range(3)]
    for c, op, new, output in ops:
        if op == "fork":
            convs[c] = TokenSeq(convs[(c + 1) % 3].tolist()[: len(new) * 3 + 1])
        if op == "retry" and past[c]:
            prompt = past[c][len(new) % len(past[c])]
        else:
            prompt = convs[c] = convs[c].extend(new)
            past[c].append(prompt)
        expected = ref.request(salts[c], prompt.tolist(), output)
        for cache, p, memo in ((lists, prompt.tolist(), None), (views, prompt, known.find(prompt))):
            adm = cache.admit(p, salts[c], memo)
            cache.finish(adm, output)
            assert adm.cached == expected
            assert len(cache) <= max(capacity, len(prompt) // block)
        if prompt is convs[c] and output:
            convs[c] = convs[c].extend(output[:-1] + [9])  # the history: the last token as rendered
    assert views.work.tokens_hashed <= lists.work.tokens_hashed


async def test_scripts_and_turn_order(renderer) -> None:
    prelude = Prelude(tools=(GET_WEATHER, MCP, APPLY_PATCH))
    script = turns_in_order(
        [
            Turn(commentary="Reading.", tool_calls=(ToolCall("read_file", {"path": "/x"}, namespace="mcp_fs"),)),
            Turn(tool_calls=(ToolCall("apply_patch", "*** Begin Patch", custom=True),)),
            None,  # default behaviour for this one
        ]
    )
    engine = SimulatedEngine(script=script)
    await engine.start()
    ids = prompt(renderer, prelude, [user("go")])
    items = parse(renderer, prelude, await run(engine, ids))
    assert items == [
        {
            "type": "message",
            "role": "assistant",
            "phase": "commentary",
            "content": [{"type": "output_text", "text": "Reading."}],
        },
        {
            "type": "function_call",
            "call_id": "c",
            "name": "read_file",
            "namespace": "mcp_fs",
            "arguments": '{"path":"/x"}',
        },
    ]
    items = parse(renderer, prelude, await run(engine, ids))
    assert items == [{"type": "custom_tool_call", "call_id": "c", "name": "apply_patch", "input": "*** Begin Patch"}]
    assert parse(renderer, prelude, await run(engine, ids))[-1]["name"] == "get_weather"


async def test_stop_tokens_and_multiple_calls(renderer) -> None:
    two = Turn(tool_calls=(ToolCall("get_weather", {"city": "A"}), ToolCall("get_weather", {"city": "B"})))
    prelude = Prelude(tools=(GET_WEATHER,))
    ids = prompt(renderer, prelude, [user("x")])
    gpt_oss = SimulatedEngine(script=lambda v: two)  # <|call|> is an EOS, as for gpt-oss
    await gpt_oss.start()
    assert len(parse(renderer, prelude, await run(gpt_oss, ids))) == 1
    free = SimulatedEngine(script=lambda v: two, eos_token_ids=())
    await free.start()
    deltas = await run(free, ids)
    assert [json.loads(i["arguments"])["city"] for i in parse(renderer, prelude, deltas)] == ["A", "B"]
    assert deltas[-1].stop_token_id == harmony_tokens().call
    deltas = await run(free, ids, SamplingParams(stop_token_ids=renderer.stop_token_ids))
    assert len(parse(renderer, prelude, deltas)) == 1


async def test_tokens_per_delta_and_recorded_prompts(renderer) -> None:
    engine = SimulatedEngine(tokens_per_delta=5, record_prompts=True, decode_tps=1e6, ttft_s=0.0, prefill_tps=1e9)
    await engine.start()
    ids = prompt(renderer, Prelude(), [user("hello there")])
    deltas = await run(engine, ids)
    assert all(len(d.token_ids) == 5 for d in deltas[:-1]) and 1 <= len(deltas[-1].token_ids) <= 5
    assert engine.stats.prompts == [ids]


class TupleView(tuple):
    """A non-list sequence whose slices are tuples (the engine must still accept it)."""


async def test_accepts_any_sequence(engine, renderer) -> None:
    ids = prompt(renderer, Prelude(), [user("seq")])
    items = parse(renderer, Prelude(), await run(engine, TupleView(ids)))
    assert items[-1]["content"][0]["text"] == "You said: seq"
    assert engine.stats.prompts == [ids]


async def test_output_is_canonical_so_the_contract_holds(engine, renderer) -> None:
    """End to end over a tool loop: each turn's history equals the full render of all items."""
    prelude = Prelude(instructions="Be terse.", tools=(GET_WEATHER,))
    items = [user("Weather in Oslo?")]
    history = renderer.render_prelude(prelude) + renderer.render_items(items)
    for _ in range(2):
        deltas = await run(engine, history + renderer.generation_prompt())
        out = parse(renderer, prelude, deltas)
        history += renderer.generation_prompt() + renderer.history_tokens(sampled(deltas))
        items += out
        assert history == renderer.render_prelude(prelude) + renderer.render_items(items)
        if out[-1]["type"] == "function_call":
            new = [{"type": "function_call_output", "call_id": "c", "output": "cold"}]
            history += renderer.render_items(new, calls={"c": out[-1]})
            items += new
    assert out[-1]["content"][0]["text"] == "Tool get_weather returned: cold"


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture]
)
@given(prelude=PRELUDES, items=CONVERSATIONS)
def test_any_rendered_conversation_gets_a_canonical_answer(renderer, prelude: Prelude, items: list[dict]) -> None:
    """Whatever the renderer produced, the engine reads it and answers with tokens that parse,
    and the answer appends to the history exactly (contract (c))."""

    async def go() -> list[TokenDelta]:
        engine = SimulatedEngine()
        await engine.start()
        return await run(
            engine, prompt(renderer, prelude, items), SamplingParams(stop_token_ids=renderer.stop_token_ids)
        )

    deltas = asyncio.run(go())
    out = parse(renderer, prelude, deltas)
    assert out and out[0]["type"] == "reasoning" and out[-1]["type"] in ("message", "function_call", "custom_tool_call")
    assert renderer.generation_prompt() + renderer.history_tokens(sampled(deltas)) == renderer.render_items(out)
    if out[-1]["type"] == "message" and items and items[-1]["type"].endswith("_output"):
        assert out[-1]["content"][0]["text"].endswith(items[-1]["output"])


class CountingList(list):
    """A list that counts how many elements slices and index scans touch."""

    touched = 0

    def __getitem__(self, key):
        got = super().__getitem__(key)
        if isinstance(key, slice):
            CountingList.touched += len(got)
        return got

    def index(self, value, start=0, stop=None):
        stop = len(self) if stop is None else min(stop, len(self))
        try:
            at = super().index(value, start, stop)
        except ValueError:
            CountingList.touched += max(0, stop - start)
            raise
        CountingList.touched += at + 1 - start
        return at


def test_prompt_view_reads_only_tail_and_prelude(renderer) -> None:
    prelude = Prelude(tools=(GET_WEATHER,))
    filler = [user("lorem ipsum dolor " * 200)] * 60  # ~40k tokens of history
    ids = prompt(renderer, prelude, filler + [user("the question")])
    view = PromptView(CountingList(ids))
    CountingList.touched = 0
    assert view.last is not None and view.last.role == "user" and view.last.text == "the question"
    assert [t.name for t in view.tools] == ["get_weather"]
    prelude_len = len(renderer.render_prelude(prelude))
    assert CountingList.touched < 2 * prelude_len + 2 * 512
    assert len(ids) > 40 * CountingList.touched
    # full recall is available, but only when asked for
    assert [m.role for m in view.messages()][:3] == ["system", "developer", "user"]
    assert view.messages()[-1].text == "the question"


def test_prompt_view_reads_headers_not_a_huge_first_message(renderer) -> None:
    """The prelude walk reads a message's header before its body: a history that starts with one
    huge item (no developer message before it) is not scanned to that item's end."""
    ids = prompt(renderer, Prelude(), [user("lorem ipsum " * 20_000), user("the question")])
    view = PromptView(CountingList(ids))
    CountingList.touched = 0
    assert view.tools == () and view.tool_choice is None
    assert view.last is not None and view.last.text == "the question"
    assert CountingList.touched < 1_000 < len(ids) // 20
    assert view.tokens_read >= CountingList.touched  # the view's own count covers what it touched


async def test_a_megabyte_of_one_character_is_answered_not_a_panic(renderer) -> None:
    """harmony's renderer (Rust) overflows its stack on a ~1 MB run of one character — a
    ``PanicException`` out of the default script's echo — and takes quadratic time well before;
    the echo is cut at ``ECHO_LIMIT`` characters, whatever the input."""
    from inference.simulated_script import ECHO_LIMIT

    engine = SimulatedEngine()
    await engine.start()
    big = "x" * 1_000_000
    cut = "x" * ECHO_LIMIT + f"… ({len(big) - ECHO_LIMIT} more characters)"
    deltas = await run(engine, prompt(renderer, Prelude(), [user(big)]))
    assert parse(renderer, Prelude(), deltas)[-1]["content"][0]["text"] == "You said: " + cut
    prelude = Prelude(tools=(GET_WEATHER,))
    call = {"type": "function_call", "call_id": "c1", "name": "get_weather", "arguments": "{}"}
    history = [user("weather?"), call, {"type": "function_call_output", "call_id": "c1", "output": big}]
    items = parse(renderer, prelude, await run(engine, prompt(renderer, prelude, history)))
    assert items[-1]["content"][0]["text"] == "Tool get_weather returned: " + cut
    assert engine.stats.running == 0 and engine.stats.aborts == 0


def test_tool_declarations_parse_back(renderer, enc) -> None:
    schema = {
        "type": "object",
        "properties": {
            "u": {"oneOf": [{"type": "string"}, {"type": "integer"}]},
            "ty": {"type": ["string", "null"]},
            "url": {"type": "string", "enum": ["http://a//b", "x"], "default": "x"},
            "n": {"type": "integer", "enum": [3, 4]},
            "objs": {
                "type": "array",
                "items": {"type": "object", "properties": {"k": {"type": "string"}}, "required": ["k"]},
            },
            "free": {"type": "object"},
            "opt": {"type": "string"},
        },
        "required": ["u", "ty", "url", "n", "objs", "free"],
    }
    tools = (
        {"type": "function", "name": "weird", "description": "Line one\nline two", "parameters": schema},
        NO_PARAMS,
        MCP,
        APPLY_PATCH,
    )
    dev = renderer.prelude_messages(Prelude(tools=tools))[1]
    text = enc.decode(enc.render(dev)).split("<|message|>", 1)[1]
    specs = parse_tool_declarations(text)
    assert [(s.name, s.namespace, s.freeform) for s in specs] == [
        ("weird", None, False),
        ("ping", None, False),
        ("apply_patch", None, True),
        ("read_file", "mcp_fs", False),
        ("write_raw", "mcp_fs", True),
    ]
    assert specs[0].description == "Line one\nline two"
    assert specs[0].example_arguments("v") == {
        "u": "v",
        "ty": "v",
        "url": "http://a//b",
        "n": 1,
        "objs": [{"k": "v"}],
        "free": {},
    }
    assert specs[1].params is None and specs[1].example_arguments("v") == {}


async def test_paced_engine_samples_the_same_tokens(renderer) -> None:
    """``paced=True`` only changes *when* deltas fall due (a wall clock, as an engine in its own
    process), never what is sampled or its stop; a paced delta is one or more whole unpaced deltas
    (it merges those that fell due while the consumer was busy)."""
    turns = [Turn(reasoning="Think.", tool_calls=(ToolCall("get_weather", {"city": "Oslo"}),))]
    ids = prompt(renderer, Prelude(tools=(GET_WEATHER,)), [user("Weather in Oslo?")])
    outs = []
    for paced in (False, True):
        engine = SimulatedEngine(
            script=turns_in_order(turns), decode_tps=5000.0, prefill_tps=1e6, tokens_per_delta=3, paced=paced
        )
        await engine.start()
        outs.append(await run(engine, ids))
    plain, paced_deltas = outs
    assert sampled(plain) == sampled(paced_deltas)
    assert [(d.finish_reason, d.stop_token_id) for d in (plain[-1], paced_deltas[-1])] == [
        ("stop", plain[-1].stop_token_id)
    ] * 2
    cuts = {sum(len(d.token_ids) for d in plain[: i + 1]) for i in range(len(plain))}
    assert {sum(len(d.token_ids) for d in paced_deltas[: i + 1]) for i in range(len(paced_deltas))} <= cuts


async def test_paced_engine_merges_what_fell_due_while_the_consumer_was_busy(renderer) -> None:
    """A consumer slower than the engine gets several tokens per delta (vLLM's output collector
    does the same), never a token twice or out of order; ``finish_reason`` stays on the last."""
    ids = prompt(renderer, Prelude(), [user("Write.")])
    engine = SimulatedEngine(
        script=turns_in_order([Turn(text="word " * 200)]), decode_tps=20_000.0, tokens_per_delta=1, paced=True
    )
    await engine.start()
    deltas = []
    async for d in engine.generate("slow", ids, SamplingParams()):
        deltas.append(d)
        await asyncio.sleep(0.005)  # 5 ms per delta: ~100 tokens fall due meanwhile
    plain = SimulatedEngine(script=turns_in_order([Turn(text="word " * 200)]), tokens_per_delta=1)
    await plain.start()
    assert sampled(deltas) == sampled(await run(plain, ids))
    assert max(len(d.token_ids) for d in deltas) > 1 and len(deltas) < len(sampled(deltas))
    assert [d.finish_reason for d in deltas] == [None] * (len(deltas) - 1) + ["stop"]


async def test_paced_merge_hands_over_what_is_due_and_no_more(renderer) -> None:
    """After a long stall the next delta holds what fell due during it, not the rest of the plan
    (merging reads the clock once: it cannot chase a clock that moves while it merges)."""
    ids = prompt(renderer, Prelude(), [user("Write forever.")])
    engine = SimulatedEngine(
        script=turns_in_order([Turn(endless=True)]), decode_tps=50_000.0, tokens_per_delta=1, paced=True
    )
    await engine.start()
    gen = engine.generate("stall", ids, SamplingParams(max_tokens=200_000))
    first = await gen.__anext__()
    await asyncio.sleep(0.1)  # ~5,000 tokens fall due
    second = await gen.__anext__()
    await gen.aclose()
    assert len(first.token_ids) >= 1 and 1 < len(second.token_ids) < 100_000
    assert second.finish_reason is None
