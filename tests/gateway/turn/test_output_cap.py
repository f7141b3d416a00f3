"""A served model's default output cap (``ModelRoute.max_output_tokens``, setting
``default_max_output_tokens``): applied when a request sets no ``max_output_tokens``, never over one."""

from __future__ import annotations

from gateway.base.settings import Settings
from inference.harmony import HarmonyRenderer
from inference.registry import ModelRegistry, ModelRoute
from inference.simulated import SimulatedEngine
from inference.simulated_script import Turn, turns_in_order
from tests.conftest import MODEL
from tests.http_helpers import create


def test_the_route_cap_bounds_a_request_without_its_own(make_gateway):
    engine = SimulatedEngine(script=turns_in_order([], then=lambda view: Turn(text="word " * 200)))
    registry = ModelRegistry(
        [ModelRoute(name=MODEL, engine=engine, renderer=HarmonyRenderer(), max_context=8192, max_output_tokens=24)]
    )
    live = make_gateway(Settings(), engine=engine, registry=registry)
    capped = create(live, input="talk")
    assert capped["status"] == "incomplete" and capped["incomplete_details"] == {"reason": "max_output_tokens"}
    assert capped["usage"]["output_tokens"] == 24 and capped["max_output_tokens"] is None
    own = create(live, input="talk", max_output_tokens=64)  # the request's own cap wins, above the default
    assert own["status"] == "incomplete" and own["usage"]["output_tokens"] == 64
