"""deploy/Dockerfile (the CPU image) as compose.cpu.yaml runs it, emulated without Docker as far as
that goes, then ``respgate check`` in it: everything ok.

What is emulated, and how:

* the image's file system is a folder here; every absolute path the Dockerfile and the compose file
  name (``/var/cache/respgate``, ``/home/respgate``, ...) is mapped into it;
* each ``RUN`` step is interpreted: ``mkdir``, ``chown`` and ``respgate prepare-model`` really run;
  ``useradd`` becomes the user's uid and (with ``--create-home``) a home owned by it; the ``pip``
  steps install respgate itself (``--no-deps``) into a fresh virtual environment whose other
  packages are the pinned test environment's (a ``.pth`` file), and check that what the other
  steps install (the torch build, the packaged model) is what that environment has. A step this
  interpreter does not know fails the test, so a new step must be taught here;
* the named volume mounted at the journal folder starts as Docker starts one: with the image
  folder's owner when the image has that folder, else owned by root;
* the entrypoint runs as the ``USER`` (uid 10001, via setpriv), with the image's ``ENV`` and the
  compose service's environment, and a Redis of the test session instead of the ``redis`` service.
  The process keeps the right to *read* any file (so it can run the test environment's Python,
  which lives under /root here), never to write one it does not own.

What is not: the base image's own contents, and pip resolving inside the build (tests/deploy/test_install.py
covers the resolution).
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import sysconfig
import tempfile
from collections.abc import Iterator
from importlib import metadata
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
DOCKERFILE = REPO / "deploy" / "Dockerfile"
pytestmark = [pytest.mark.slow, pytest.mark.timeout(1500)]


def instructions(text: str) -> Iterator[tuple[str, str]]:
    """(INSTRUCTION, argument) pairs, continuation lines joined, comments dropped."""
    lines: list[str] = []
    for raw in text.splitlines():
        if raw.strip().startswith("#") or not raw.strip():
            continue
        lines.append(raw.rstrip())
        if not raw.rstrip().endswith("\\"):
            joined = " ".join(x.rstrip("\\").strip() for x in lines)
            lines = []
            word, _, rest = joined.partition(" ")
            yield word.upper(), rest.strip()


def env_pairs(arg: str) -> dict[str, str]:
    return dict(x.split("=", 1) for x in shlex.split(arg))


class Image:
    """The Dockerfile's effects on an emulated root file system."""

    def __init__(self, root: Path, context: Path, pinned_site: str) -> None:
        self.root, self.context, self.pinned_site = root, context, pinned_site
        self.env: dict[str, str] = {}
        self.args: dict[str, str] = {}
        self.users: dict[str, tuple[int, Path, bool]] = {}  # name -> (uid, home, home created)
        self.user: str | None = None
        self.entrypoint: list[str] = []
        self.cmd: list[str] = []
        self.workdir = "/"
        self.venv = root / "opt" / "venv"

    def path(self, p: str) -> Path:
        assert p.startswith("/"), p
        return self.root / p.lstrip("/")

    def mapped_env(self, env: dict[str, str]) -> dict[str, str]:
        return {
            k: re.sub(r"(?<![\w:])(/(?:var|home|app|opt|tmp)\b[^\s:,]*)", lambda m: str(self.path(m.group(1))), v)
            for k, v in env.items()
        }

    def build(self) -> None:
        subprocess.run([sys.executable, "-m", "venv", str(self.venv)], check=True, timeout=120)
        site = next((self.venv / "lib").glob("python3*/site-packages"))
        (site / "zz-pinned-environment.pth").write_text(self.pinned_site + "\n")
        for word, arg in instructions(DOCKERFILE.read_text()):
            getattr(self, f"do_{word.lower()}")(arg)

    # -- instructions ---------------------------------------------------------------------------

    def do_from(self, arg: str) -> None:
        assert arg.startswith("python:3.11"), arg  # the emulation runs this machine's Python 3.11
        assert sys.version_info[:2] == (3, 11)

    def do_env(self, arg: str) -> None:
        self.env.update(env_pairs(arg))

    def do_arg(self, arg: str) -> None:
        name, _, default = arg.partition("=")
        self.args[name] = default

    def do_workdir(self, arg: str) -> None:
        self.workdir = arg
        self.path(arg).mkdir(parents=True, exist_ok=True)

    def do_copy(self, arg: str) -> None:
        *sources, dest = shlex.split(arg)
        target = self.path(os.path.join(self.workdir, dest) if not dest.startswith("/") else dest)
        for src in sources:
            s = self.context / src
            if s.is_dir():
                shutil.copytree(s, target, dirs_exist_ok=True, ignore=shutil.ignore_patterns("__pycache__"))
            else:
                target.mkdir(parents=True, exist_ok=True)
                shutil.copy2(s, target / s.name)

    def do_user(self, arg: str) -> None:
        assert arg in self.users, f"USER {arg} was never created"
        self.user = arg

    def do_expose(self, arg: str) -> None:
        pass

    def do_healthcheck(self, arg: str) -> None:
        code = shlex.split(arg.split(" CMD ", 1)[1])
        assert code[:2] == ["python", "-c"]
        compile(code[2], "HEALTHCHECK", "exec")

    def do_entrypoint(self, arg: str) -> None:
        self.entrypoint = json.loads(arg)

    def do_cmd(self, arg: str) -> None:
        self.cmd = json.loads(arg)

    def do_run(self, arg: str) -> None:
        for name, value in self.args.items():
            arg = arg.replace("${" + name + "}", value).replace("$" + name, value)
        for step in (s.strip() for s in arg.split("&&")):
            self.run_step(step)

    # -- RUN steps ------------------------------------------------------------------------------

    def run_step(self, step: str) -> None:
        words = shlex.split(step.strip("()").split("||")[0])
        if words[:2] == ["pip", "install"] and "--extra-index-url" in words:
            (spec,) = [w for w in words[2:] if w.startswith("torch==")]
            assert f"torch=={metadata.version('torch')}" == spec  # provided by the pinned environment
        elif words[:2] == ["pip", "install"] and words[2:] == [".[cpu]"]:
            r = subprocess.run(
                [
                    str(self.venv / "bin/python"),
                    "-m",
                    "pip",
                    "install",
                    "-q",
                    "--no-deps",
                    str(self.path(self.workdir)),
                ],
                capture_output=True,
                text=True,
                timeout=600,
            )
            assert r.returncode == 0, r.stderr[-3000:]
            shutil.rmtree(self.path(self.workdir) / "build", ignore_errors=True)
        elif words[:3] == ["pip", "install", "--no-deps"]:
            for req in words[3:]:
                name, version = req.split("==")
                assert metadata.version(name) == version, req  # provided by the pinned environment
        elif words[:2] == ["pip", "uninstall"]:
            pass  # would change the shared test environment; what it removes is unused by check
        elif words[0] == "apt-get" or words[:2] == ["rm", "-rf"]:
            pass  # the base image's system packages: not emulated (this machine's are used)
        elif words[0] == "useradd":
            uid = int(words[words.index("--uid") + 1])
            home = words[words.index("--home-dir") + 1] if "--home-dir" in words else f"/home/{words[-1]}"
            created = "--create-home" in words or "-m" in words
            if created:
                self.path(home).mkdir(parents=True)
                os.chown(self.path(home), uid, uid)
            self.users[words[-1]] = (uid, self.path(home), created)
        elif words[:2] == ["mkdir", "-p"]:
            for p in words[2:]:
                self.path(p).mkdir(parents=True, exist_ok=True)
        elif words[0] == "chown" and words[1] == "-R":
            uid = self.users[words[2].split(":")[0]][0]
            top = self.path(words[3])
            for p in [top, *top.rglob("*")]:
                os.chown(p, uid, uid, follow_symlinks=False)
        elif words[0] == "respgate":
            r = subprocess.run(
                [str(self.venv / "bin" / "respgate"), *words[1:]],
                capture_output=True,
                text=True,
                timeout=900,
                env={**os.environ, **self.mapped_env(self.env)},
            )
            assert r.returncode == 0, r.stderr[-3000:]
        else:
            pytest.fail(f"deploy/Dockerfile: RUN step {step!r} is not emulated by this test")

    # -- running the container --------------------------------------------------------------------

    def mount_named_volume(self, target: str) -> None:
        """A new named volume takes the image folder's content and owner; none there: root's."""
        p = self.path(target)
        if not p.exists():
            p.mkdir(parents=True)
            os.chown(p, 0, 0)
            p.chmod(0o755)

    def run(self, args: list[str], env: dict[str, str], timeout: float) -> subprocess.CompletedProcess:
        assert self.user is not None, "the image runs as root"
        uid, home, _ = self.users[self.user]
        base = {k: v for k, v in os.environ.items() if k in ("PATH", "LANG", "LC_ALL", "TZ")}
        # Docker sets HOME from the user's passwd entry; getpass.getuser() is answered by USER there
        run_env = {
            **base,
            **self.mapped_env({**self.env, **env}),
            "HOME": str(home),
            "USER": self.user,
            "LOGNAME": self.user,
            "PATH": f"{self.venv / 'bin'}:{base.get('PATH', '/usr/bin:/bin')}",
        }
        argv = [*self.entrypoint, *args]
        argv[0] = str(self.venv / "bin" / argv[0])
        return subprocess.run(
            [
                "setpriv",
                f"--reuid={uid}",
                f"--regid={uid}",
                "--clear-groups",
                "--inh-caps=+dac_read_search",
                "--ambient-caps=+dac_read_search",
                *argv,
            ],
            cwd=self.path(self.workdir),
            capture_output=True,
            text=True,
            timeout=timeout,
            env=run_env,
        )


@pytest.fixture
def image_root() -> Iterator[Path]:
    if os.geteuid() != 0 or shutil.which("setpriv") is None:
        pytest.skip("emulating the image user needs root and setpriv")
    root = Path(tempfile.mkdtemp(prefix="respgate-image-", dir="/tmp"))
    root.chmod(0o755)
    try:
        yield root
    finally:
        shutil.rmtree(root, ignore_errors=True)


def compose_service(name: str = "respgate") -> dict:
    exe = shutil.which("docker-compose")
    assert exe, "docker-compose is missing"
    env = {k: v for k, v in os.environ.items() if not k.startswith("RESPGATE_")}
    r = subprocess.run(
        [exe, "-f", str(REPO / "deploy/compose.cpu.yaml"), "config"],
        capture_output=True,
        text=True,
        timeout=120,
        env={**env, "RESPGATE_API_KEYS": "team:sekrit"},
    )
    assert r.returncode == 0, r.stderr
    return yaml.safe_load(r.stdout)["services"][name]


def test_the_cpu_image_as_compose_runs_it_passes_respgate_check(image_root, redis_url):
    pytest.importorskip("vllm")
    image = Image(image_root, REPO, sysconfig.get_paths()["purelib"])
    image.build()
    assert image.user == "respgate" and image.users["respgate"][0] == 10001
    assert image.users["respgate"][2], "the image user has no home: vLLM logs errors writing ~/.cache"

    service = compose_service()
    for volume in service["volumes"]:
        source, target = volume.split(":")[:2]
        assert not source.startswith("/"), "bind mounts are not emulated"
        image.mount_named_volume(target)
        # a volume whose folder the image lacks is root's: the gateway could not write there
        assert image.path(target).stat().st_uid == 10001, f"the {source} volume would be root's"
    env = {k: str(v) for k, v in service["environment"].items()}
    env["RESPGATE_REDIS_URL"] = redis_url  # the test session's Redis stands in for the `redis` service
    journal = Path(image.mapped_env({"j": env["RESPGATE_USAGE_JOURNAL"]})["j"])
    assert journal.parent.stat().st_uid == 10001, "the journal volume would be root's: every WAL append fails"

    r = image.run(["check"], env, timeout=1200)
    out = r.stdout + r.stderr
    assert r.returncode == 0, out[-4000:]
    for name in ("vocab", "models", "redis", "journal", "engine"):
        assert re.search(rf"^\[ ok \] {name} ", r.stdout, re.M), out[-4000:]
    assert "0 warning(s), 0 failed" in r.stdout, out[-4000:]
    assert not [x for x in out.splitlines() if re.search(r"\bERROR\b", x)], out[-4000:]
    assert str(journal.parent) in r.stdout
