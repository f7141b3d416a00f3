"""Fixtures for inference tests: one renderer per session (the encoding is process-wide anyway)
and a started simulated engine per test."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from inference.harmony import HarmonyRenderer, harmony_encoding
from inference.simulated import SimulatedEngine


@pytest.fixture(scope="session")
def renderer() -> HarmonyRenderer:
    return HarmonyRenderer()


@pytest.fixture(scope="session")
def enc():
    return harmony_encoding()


@pytest.fixture
async def engine() -> AsyncIterator[SimulatedEngine]:
    eng = SimulatedEngine(record_prompts=True, cache_block_size=1)
    await eng.start()
    yield eng
    await eng.shutdown()


@pytest.fixture(scope="session")
def smollm2_dir():
    """SmolLM2-135M-Instruct as an HF folder vLLM/transformers can load. Prepared in the default
    cache dir ($RESPGATE_CACHE_DIR or ~/.cache/respgate) so later sessions reuse it: the first
    run converts (~30-45 s), every later one is a cache hit (~0.2 s)."""
    from inference.model_assets import prepare_model

    return prepare_model("smollm2")


# -- chat-template family (SmolLM2's own template; Qwen2.5's template on the same tokenizer) -----


@pytest.fixture(scope="session")
def smollm2_renderer(smollm2_dir):
    from inference.chat_template_render import ChatTemplateRenderer

    return ChatTemplateRenderer(smollm2_dir)


@pytest.fixture(scope="session")
def qwen25_renderer(smollm2_renderer):
    from inference.chat_template_render import ChatTemplateRenderer

    from .chat_template_support import QWEN25_TEMPLATE

    return ChatTemplateRenderer(tokenizer=smollm2_renderer.tokenizer, chat_template=QWEN25_TEMPLATE)


@pytest.fixture(params=["smollm2", "qwen25"])
def ct_renderer(request, smollm2_renderer, qwen25_renderer):
    """Each chat-template renderer under test, by template."""
    return smollm2_renderer if request.param == "smollm2" else qwen25_renderer
