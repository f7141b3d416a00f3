"""Model registry: a served model name -> its engine, renderer and context length."""

from __future__ import annotations

from dataclasses import dataclass

from inference.engine import Engine
from inference.renderer import Renderer


@dataclass(frozen=True, slots=True)
class ModelRoute:
    name: str
    engine: Engine
    renderer: Renderer
    max_context: int = 131_072
    owned_by: str = "respgate"
    #: the output cap of a request that sets no ``max_output_tokens`` (None: only the context bounds it);
    #: chosen per served model by ``gateway/engines.py`` (setting ``default_max_output_tokens``)
    max_output_tokens: int | None = None
    #: the ``temperature`` / ``top_p`` of a request that sets none (None: OpenAI's 1.0); per served
    #: model from ``gateway/engines.py`` (settings ``default_temperature`` / ``default_top_p``)
    default_temperature: float | None = None
    default_top_p: float | None = None


class ModelRegistry:
    def __init__(self, routes: list[ModelRoute] | None = None) -> None:
        self._routes: dict[str, ModelRoute] = {}
        for r in routes or []:
            self.add(r)

    def add(self, route: ModelRoute) -> None:
        self._routes[route.name] = route

    def get(self, name: str) -> ModelRoute | None:
        return self._routes.get(name)

    def names(self) -> list[str]:
        return list(self._routes)

    def routes(self) -> list[ModelRoute]:
        return list(self._routes.values())

    def engines(self) -> list[Engine]:
        seen: dict[int, Engine] = {}
        for r in self._routes.values():
            seen.setdefault(id(r.engine), r.engine)
        return list(seen.values())
