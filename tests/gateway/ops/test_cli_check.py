"""``respgate check`` says what is wrong and how to fix it; ``--config`` files and environment values
that do not validate name the field and where the value came from; ``--help`` explains itself."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from gateway.base.settings import ConfigError, Settings
from gateway.ops.cli import main
from tests.conftest import free_port

REPO = Path(__file__).resolve().parents[3]


@pytest.fixture(autouse=True)
def clean_env(monkeypatch, tmp_path):
    for k in list(os.environ):
        if k.startswith("RESPGATE_") or k == "REDIS_URL":
            monkeypatch.delenv(k)
    monkeypatch.setenv("RESPGATE_USAGE_JOURNAL", str(tmp_path / "journal" / "usage.jsonl"))
    # in-process commands keep their output on this process's stderr, even when pytest runs on a
    # terminal with -s (on a terminal `check` would send it to a log file: tests/gateway/ops/test_cli_terminal.py)
    monkeypatch.setenv("RESPGATE_LOG_FILE", "-")


def run_check(capsys, *args: str) -> tuple[int, str]:
    code = main(["check", *args])
    out = capsys.readouterr()
    return code, out.out + out.err


def line(output: str, name: str) -> str:
    return next(x for x in output.splitlines() if x[7:].startswith(name + " ") or x[7:].strip() == name)


def test_a_healthy_deployment_passes_every_check(capsys, redis_url):
    code, out = run_check(capsys, "--engine", "simulated", "--redis-url", redis_url)
    assert code == 0, out
    for name in ("vocab", "models", "redis", "journal", "engine"):
        assert line(out, name).startswith("[ ok ]"), out
    assert "o200k_base" in line(out, "vocab") and "PING" in line(out, "redis")
    assert "generated" in line(out, "engine")
    assert "0 failed" in out


def test_unreachable_redis_fails_with_a_fix(capsys):
    url = f"redis://:secret@127.0.0.1:{free_port()}/0"
    code, out = run_check(capsys, "--engine", "simulated", "--redis-url", url, "--no-engine")
    assert code == 1
    assert line(out, "redis").startswith("[FAIL]") and "secret" not in out and ":***@" in out
    assert "fix: start Redis there, or point RESPGATE_REDIS_URL" in out
    assert "1 failed" in out


def test_no_redis_is_a_warning_not_a_failure(capsys):
    code, out = run_check(capsys, "--engine", "simulated", "--no-engine")
    assert code == 0 and line(out, "redis").startswith("[warn]") and "replicas" in out


def test_missing_model_folder_and_unwritable_journal_say_what_to_fix(capsys, monkeypatch, tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    monkeypatch.setenv("RESPGATE_USAGE_JOURNAL", str(blocker / "journal.jsonl"))
    code, out = run_check(capsys, "--engine", "vllm", "--model-path", str(tmp_path / "no-such-model"), "--no-engine")
    assert code == 1
    models = line(out, "models")
    assert models.startswith("[FAIL]")
    assert "no-such-model does not exist" in models or "vLLM is not installed" in models
    assert line(out, "journal").startswith("[FAIL]") and "not writable" in line(out, "journal")
    assert out.count("fix:") >= 2


def test_incomplete_model_folder_and_unreachable_remote_engine(capsys, tmp_path):
    folder = tmp_path / "model"
    folder.mkdir()
    code, out = run_check(capsys, "--engine", "remote-vllm", "--model-path", str(folder), "--no-engine")
    assert code == 1 and "lacks config.json, tokenizer.json" in line(out, "models")
    (folder / "config.json").write_text("{}")
    (folder / "tokenizer.json").write_text("{}")
    remote = f"http://127.0.0.1:{free_port()}"
    (tmp_path / "c.toml").write_text(f'remote_url = "{remote}"\n')
    code, out = run_check(
        capsys,
        "--config",
        str(tmp_path / "c.toml"),
        "--engine",
        "remote-vllm",
        "--model-path",
        str(folder),
        "--no-engine",
    )
    assert code == 1 and f"remote vLLM at {remote} is unreachable" in line(out, "models")
    assert "RESPGATE_REMOTE_URL" in out


def test_models_file_entries_are_each_checked(capsys, tmp_path):
    models = tmp_path / "models.json"
    models.write_text(
        '[{"name": "sim", "engine": "simulated"}, '
        f'{{"name": "big", "engine": "vllm", "model_path": "{tmp_path}/absent"}}]'
    )
    code, out = run_check(capsys, "--models-file", str(models), "--no-engine")
    assert code == 1 and line(out, "models").startswith("[FAIL]") and "big:" in line(out, "models")
    models.write_text('[{"name": "sim", "engine": "simulated"}, {"name": "sim2", "engine": "simulated"}]')
    code, out = run_check(capsys, "--models-file", str(models))
    assert code == 0, out
    assert "sim generated" in line(out, "engine") and "sim2 generated" in line(out, "engine")


# -- configuration -----------------------------------------------------------------------------------


def test_config_file_values_apply_and_environment_and_flags_override_them(tmp_path, monkeypatch):
    cfg = tmp_path / "respgate.toml"
    cfg.write_text(
        'port = 9001\nhost = "0.0.0.0"\nshutdown_grace_s = 12.5\nmodels = ["a", "b"]\n'
        "[ignored_table_is_rejected_below]\n"
    )
    with pytest.raises(ConfigError, match="ignored_table_is_rejected_below"):
        Settings.load(str(cfg))
    cfg.write_text('[respgate]\nport = 9001\nhost = "0.0.0.0"\nshutdown_grace_s = 12.5\nmodels = ["a", "b"]\n')
    s = Settings.load(str(cfg))
    assert (s.port, s.host, s.shutdown_grace_s, s.models) == (9001, "0.0.0.0", 12.5, ["a", "b"])
    monkeypatch.setenv("RESPGATE_PORT", "9002")
    assert Settings.load(str(cfg)).port == 9002
    assert Settings.load(str(cfg), port=9003).port == 9003
    monkeypatch.setenv("RESPGATE_CONFIG", str(cfg))
    assert Settings.from_env().host == "0.0.0.0"


def test_invalid_config_names_the_field_and_its_source(tmp_path, capsys, monkeypatch):
    cfg = tmp_path / "bad.toml"
    cfg.write_text('port = "eighty"\nreasoning_text = "loud"\n')
    assert main(["serve", "--config", str(cfg)]) == 2
    err = capsys.readouterr().err
    assert f"port ({cfg})" in err and "valid integer" in err
    assert f"reasoning_text ({cfg})" in err and "'raw' or 'hidden'" in err

    cfg.write_text("shutdown_grace = 5\n")
    assert main(["check", "--config", str(cfg)]) == 2
    assert "unknown setting(s): 'shutdown_grace' (did you mean 'shutdown_grace_s'?)" in capsys.readouterr().err

    cfg.write_text("port = [\n")
    assert main(["serve", "--config", str(cfg)]) == 2
    assert "not valid TOML" in capsys.readouterr().err

    monkeypatch.setenv("RESPGATE_WS_MAX_INFLIGHT", "many")
    assert main(["serve"]) == 2
    assert "ws_max_inflight (RESPGATE_WS_MAX_INFLIGHT)" in capsys.readouterr().err

    assert main(["serve", "--config", str(tmp_path / "absent.toml")]) == 2
    assert "absent.toml" in capsys.readouterr().err


def test_object_settings_come_from_json_in_the_environment_and_empty_is_unset(monkeypatch):
    """``web_search`` is a nested settings object: its variable is JSON, the way the settings page
    and the compose files spell it; empty (compose's ``${RESPGATE_WEB_SEARCH:-}`` with nothing
    set) is unset, so the compose files can pass it through without turning web search on."""
    monkeypatch.setenv("RESPGATE_WEB_SEARCH", '{"backend": "searxng", "url": "http://searxng:8080"}')
    monkeypatch.setenv("RESPGATE_WEB_SEARCH_TENANTS", '{"guests": null}')
    s = Settings.load(None)
    assert s.web_search is not None and (s.web_search.backend, s.web_search.url) == ("searxng", "http://searxng:8080")
    assert s.web_search_tenants == {"guests": None}
    for name in ("RESPGATE_WEB_SEARCH", "RESPGATE_WEB_SEARCH_TENANTS", "RESPGATE_MCP_SERVERS"):
        monkeypatch.setenv(name, "")
    s = Settings.load(None)
    assert s.web_search is None and s.web_search_tenants == {} and s.mcp_servers == {}
    monkeypatch.setenv("RESPGATE_WEB_SEARCH", "{searxng")
    with pytest.raises(ConfigError, match=r"web_search \(RESPGATE_WEB_SEARCH\): not JSON"):
        Settings.load(None)


@pytest.mark.parametrize(
    ("name", "value", "names"),
    [
        ("RESPGATE_WEB_SEARCH", '{"backend": "searxng", "api_key": "sk-LEAK"}', "needs its 'url'"),
        ("RESPGATE_WEB_SEARCH", '{"backend": "brave", "api_key": "sk-LEAK", "timeout_s": "x"}', "web_search.timeout_s"),
        ("RESPGATE_MCP_SERVERS", '{"d": {"url": 5, "headers": {"Authorization": "Bearer sk-LEAK"}}}', "mcp_servers.d"),
        ("RESPGATE_API_KEYS", '["team:sk-LEAK", 7]', "api_keys.1"),
        ("RESPGATE_WEB_SEARCH_TENANTS", '{"t": {"backend": "tavily", "api_key": "sk-LEAK", "x": 1}}', "tenants.t"),
    ],
)
def test_a_config_error_names_the_setting_but_never_echoes_a_credential(monkeypatch, name, value, names):
    """The message goes to stderr and to a container's log: it names the setting's path and where
    the value came from, and leaves out objects, lists and credential-named values."""
    monkeypatch.setenv(name, value)
    with pytest.raises(ConfigError) as caught:
        Settings.load(None)
    assert names in str(caught.value) and name in str(caught.value)
    assert "sk-LEAK" not in str(caught.value)


def test_serve_refuses_several_workers(capsys):
    assert main(["serve", "--workers", "2", "--engine", "simulated"]) == 2
    err = capsys.readouterr().err
    assert "--workers must be 1" in err and "replicas" in err


def test_help_texts_through_the_real_command():
    def helptext(*args: str) -> str:
        r = subprocess.run(
            [sys.executable, "-m", "gateway", *args, "--help"],
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=60,
            env={**os.environ, "PYTHONPATH": str(REPO)},
        )
        assert r.returncode == 0, r.stderr
        return r.stdout

    top = helptext()
    for cmd in ("serve", "prepare-model", "usage", "check"):
        assert cmd in top
    assert "RESPGATE_" in top and "--config" in top
    serve = helptext("serve")
    assert "1001" in serve and "--log-format" in serve and "--workers" in serve
    assert "Redis" in helptext("check") and "--no-engine" in helptext("check")
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "gateway",
            "check",
            "--engine",
            "simulated",
            "--no-engine",
            "--redis-url",
            f"redis://127.0.0.1:{free_port()}/0",
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    assert r.returncode == 1 and "[FAIL] redis" in r.stdout
