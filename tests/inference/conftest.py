"""Fixtures for inference tests: one renderer per session (the encoding is process-wide anyway)
and a started simulated engine per test."""

from __future__ import annotations

from typing import AsyncIterator

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
