"""The ``kubernetes`` sandbox against a loopback stand-in of the Kubernetes API (issue 34).

The stand-in (:class:`FakeCluster`, served by uvicorn on 127.0.0.1) is the cluster: it records the
pods POSTed to it, answers their status (Pending first, then Running), deletes them, and serves the
exec WebSocket (``v5.channel.k8s.io`` or ``v4.channel.k8s.io``, as the test picks) by running the
command as a subprocess on this host: the REPL server on this python, the pod's ``/mnt/data`` and
``/run/out`` mapped to a temp folder per pod (in the arguments, and in the server's source the
launcher reads first on stdin). So the real protocol path runs: stdin frames on channel
0, replies on channel 1 in whatever chunks the pipe gives, the exit status on channel 3. The one
command it does not run as sent is the killer (it would signal this host's processes): it kills the
sessions it started for that pod instead, as the pod's own pid namespace would bound it. Faults
(403, 500, no answer, a pod that never runs) are switched on per test.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import struct
import sys
import threading
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs

import pytest
import uvicorn

from security.sandbox.base import Failure, FileChange, Limits
from security.sandbox.kubernetes import (
    DATA,
    ID_LABEL,
    KILLER,
    LAUNCHER,
    POD_LABELS,
    KubernetesError,
    KubernetesSandbox,
)
from security.sandbox.repl_server import OUT_DIR
from tests.conftest import free_port

TOKEN = "test-token"
NS = "sandboxes"


@dataclass
class FakeCluster:
    root: Path
    protocols: tuple[str, ...] = ("v5.channel.k8s.io", "v4.channel.k8s.io")
    pods: dict[str, dict[str, Any]] = field(default_factory=dict)
    created: list[dict[str, Any]] = field(default_factory=list)
    deleted: list[tuple[str, Any]] = field(default_factory=list)
    execs: list[list[str]] = field(default_factory=list)
    negotiated: list[str] = field(default_factory=list)
    pending_polls: int = 2  # GETs a new pod answers Pending before Running
    waiting_reason: str | None = None  # a pod that never runs: its container waits with this reason
    fail: dict[str, int | str] = field(default_factory=dict)  # "POST"/"GET"/"DELETE"/"EXEC" -> status or "hang"
    sessions: dict[str, list[asyncio.subprocess.Process]] = field(default_factory=dict)
    url: str = ""

    # -- ASGI ---------------------------------------------------------------------------------------

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            while (await receive())["type"] != "lifespan.shutdown":
                await send({"type": "lifespan.startup.complete"})
            await send({"type": "lifespan.shutdown.complete"})
            return
        headers = {k.decode(): v.decode() for k, v in scope["headers"]}
        if scope["type"] == "websocket":
            await self._exec(scope, headers, receive, send)
            return
        body = b""
        while True:
            msg = await receive()
            body += msg.get("body", b"")
            if not msg.get("more_body"):
                break
        if headers.get("authorization") != f"Bearer {TOKEN}":
            await _respond(send, 401, {"kind": "Status", "message": "Unauthorized"})
            return
        fault = self.fail.get(scope["method"])
        if fault == "hang":
            await asyncio.sleep(3600)
        if isinstance(fault, int):
            await _respond(send, fault, {"kind": "Status", "message": f"injected {fault}"})
            return
        status, doc = self._rest(scope["method"], scope["path"], json.loads(body) if body else None)
        await _respond(send, status, doc)

    def _rest(self, method: str, path: str, body: Any) -> tuple[int, dict[str, Any]]:
        parts = path.strip("/").split("/")  # api v1 namespaces NS pods [NAME]
        if parts[:5] != ["api", "v1", "namespaces", NS, "pods"]:
            return 404, {"kind": "Status", "message": f"namespaces {parts[3:4]} not found"}
        if method == "POST" and len(parts) == 5:
            name = body["metadata"]["name"]
            if name in self.pods:
                return 409, {"kind": "Status", "message": f'pods "{name}" already exists'}
            self.created.append(body)
            self.pods[name] = {"spec": body, "polls": 0}
            (self.root / name / "data").mkdir(parents=True)
            (self.root / name / "out").mkdir()
            return 201, body
        if method == "GET" and len(parts) == 5:
            return 200, {"kind": "PodList", "items": [p["spec"] for p in self.pods.values()]}
        name = parts[5]
        pod = self.pods.get(name)
        if pod is None:
            return 404, {"kind": "Status", "message": f'pods "{name}" not found'}
        if method == "GET":
            pod["polls"] += 1
            if self.waiting_reason:
                state = {"waiting": {"reason": self.waiting_reason, "message": "cannot pull image"}}
                return 200, {**pod["spec"], "status": {"phase": "Pending", "containerStatuses": [
                    {"name": "sandbox", "state": state}]}}  # fmt: skip
            if pod["polls"] <= self.pending_polls:
                return 200, {**pod["spec"], "status": {"phase": "Pending"}}
            return 200, {**pod["spec"], "status": {"phase": "Running", "containerStatuses": [
                {"name": "sandbox", "state": {"running": {}}}]}}  # fmt: skip
        if method == "DELETE":
            self.deleted.append((name, body))
            self.pods.pop(name)
            for proc in self.sessions.pop(name, []):
                _kill_session(proc)
            shutil.rmtree(self.root / name)  # its emptyDirs go with it
            return 200, {"kind": "Status", "status": "Success"}
        return 405, {"kind": "Status", "message": "method not allowed"}

    # -- exec ---------------------------------------------------------------------------------------

    async def _exec(self, scope: dict[str, Any], headers: dict[str, str], receive: Any, send: Any) -> None:
        await receive()  # websocket.connect
        parts = scope["path"].strip("/").split("/")
        name = parts[5]
        query = parse_qs(scope["query_string"].decode())
        fault = self.fail.get("EXEC")
        if headers.get("authorization") != f"Bearer {TOKEN}":
            fault = 401
        elif name not in self.pods:
            fault = 404
        if fault == "hang":
            await asyncio.sleep(3600)
        if fault is not None:
            await send({"type": "websocket.http.response.start", "status": fault, "headers": []})
            await send({"type": "websocket.http.response.body", "body": b'{"message": "refused"}'})
            return
        offered = [p.strip() for p in headers.get("sec-websocket-protocol", "").split(",")]
        proto = next(p for p in self.protocols if p in offered)
        self.negotiated.append(proto)
        await send({"type": "websocket.accept", "subprotocol": proto})
        command = query["command"]
        self.execs.append(command)
        if command[3:4] == [KILLER]:  # the pod's pid namespace: only the sessions started in this pod
            for proc in self.sessions.pop(name, []):
                _kill_session(proc)
            await self._status(send, 0)
            return
        home = self.root / name
        argv = [sys.executable if i == 0 else _map(a, home) for i, a in enumerate(command)]
        env = {e["name"]: e["value"] for e in self.pods[name]["spec"]["spec"]["containers"][0]["env"]}
        proc = await asyncio.create_subprocess_exec(
            *argv,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            cwd=home / "data",
            env=env,
        )
        self.sessions.setdefault(name, []).append(proc)
        if query.get("stdin") != ["true"]:
            assert proc.stdin is not None
            proc.stdin.close()

        async def pipe(stream: asyncio.StreamReader, channel: int) -> None:
            while chunk := await stream.read(7000):  # odd chunks: the client must reassemble frames
                await send({"type": "websocket.send", "bytes": bytes([channel]) + chunk})

        async def feed() -> None:
            assert proc.stdin is not None
            source: bytearray | None = bytearray() if command[3:4] == [LAUNCHER] else None
            while True:
                msg = await receive()
                if msg["type"] == "websocket.disconnect":
                    return
                data = msg.get("bytes") or b""
                if data[:1] == b"\x00" and source is not None:  # the server's source first: its OUT_DIR mapped
                    source += data[1:]
                    if len(source) >= 4 and len(source) >= 4 + (n := struct.unpack(">I", source[:4])[0]):
                        text = _map(source[4 : 4 + n].decode(), home).encode()
                        proc.stdin.write(struct.pack(">I", len(text)) + text + source[4 + n :])
                        source = None
                elif data[:1] == b"\x00":
                    proc.stdin.write(data[1:])
                    await proc.stdin.drain()
                elif data[:2] == b"\xff\x00" and proto.startswith("v5"):
                    proc.stdin.close()

        assert proc.stdout is not None and proc.stderr is not None
        feeder = asyncio.ensure_future(feed())
        try:
            await asyncio.gather(pipe(proc.stdout, 1), pipe(proc.stderr, 2))
            rc = await proc.wait()
            await self._status(send, rc)
        except Exception:
            pass
        finally:
            feeder.cancel()

    async def _status(self, send: Any, rc: int) -> None:
        if rc == 0:
            status: dict[str, Any] = {"metadata": {}, "status": "Success"}
        else:
            code = 128 - rc if rc < 0 else rc  # a signal, as the runtime reports it
            status = {
                "metadata": {},
                "status": "Failure",
                "message": f"command terminated with non-zero exit code: {code}",
                "reason": "NonZeroExitCode",
                "details": {"causes": [{"reason": "ExitCode", "message": str(code)}]},
            }
        await send({"type": "websocket.send", "bytes": b"\x03" + json.dumps(status).encode()})
        await send({"type": "websocket.close", "code": 1000})


def _map(arg: str, home: Path) -> str:
    """The pod's paths in an argument (the REPL server's source names OUT_DIR) to the pod's temp folder."""
    return arg.replace(DATA, str(home / "data")).replace(OUT_DIR, str(home / "out"))


def _kill_session(proc: asyncio.subprocess.Process) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)  # the launcher made its own session: the whole tree
    except (ProcessLookupError, PermissionError):
        pass


async def _respond(send: Any, status: int, doc: dict[str, Any]) -> None:
    body = json.dumps(doc).encode()
    await send({"type": "http.response.start", "status": status, "headers": [(b"content-type", b"application/json")]})
    await send({"type": "http.response.body", "body": body})


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[FakeCluster]:
    fake = FakeCluster(tmp_path / "pods")
    port = free_port()
    config = uvicorn.Config(
        fake,
        host="127.0.0.1",
        port=port,
        log_level="warning",
        lifespan="on",
        ws="websockets-sansio",
        timeout_graceful_shutdown=1,  # a hanging answer (the no-answer tests) is cut at the end, not waited for
    )
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, name="fake-kubernetes", daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        assert thread.is_alive() and time.monotonic() < deadline, "the fake Kubernetes API did not start"
        time.sleep(0.01)
    fake.url = f"http://127.0.0.1:{port}"
    yield fake
    for procs in fake.sessions.values():
        for proc in procs:
            _kill_session(proc)
    server.should_exit = True
    thread.join(timeout=30)


def _sandbox(cluster: FakeCluster, **kw: Any) -> KubernetesSandbox:
    kw.setdefault("limits", Limits(output_bytes=4096, default_timeout_s=20, folder_bytes=1 << 20, file_bytes=1 << 20))
    kw.setdefault("start_timeout_s", 20)
    kw.setdefault("request_timeout_s", 10)
    return KubernetesSandbox(namespace=NS, image="sandbox:test", api_url=cluster.url, token=TOKEN, **kw)


@pytest.fixture
async def box(cluster: FakeCluster) -> AsyncIterator[Any]:
    container = await _sandbox(cluster, runtime_class="gvisor").create()
    yield container
    await container.close()


# -- the pod ------------------------------------------------------------------------------------------


async def test_the_pod_is_locked_down_and_sized_from_the_limits(cluster: FakeCluster) -> None:
    limits = Limits(memory_bytes=256 << 20, folder_bytes=8 << 20, tmp_bytes=16 << 20, shm_bytes=4 << 20)
    sb = _sandbox(cluster, limits=limits, runtime_class="gvisor", cpu_limit="500m", max_lifetime_s=3600)
    container = await sb.create("cntr_abc123")
    try:
        (pod,) = cluster.created
        assert pod["metadata"]["name"] == "cntr-abc123" and pod["metadata"]["namespace"] == NS
        assert POD_LABELS.items() <= pod["metadata"]["labels"].items()
        assert pod["metadata"]["labels"][ID_LABEL] == "cntr-abc123"
        spec = pod["spec"]
        assert spec["runtimeClassName"] == "gvisor"
        assert spec["automountServiceAccountToken"] is False and spec["enableServiceLinks"] is False
        assert spec["restartPolicy"] == "Never" and spec["activeDeadlineSeconds"] == 3600
        assert spec.get("hostNetwork") is None and spec.get("hostPID") is None and spec.get("hostIPC") is None
        psc = spec["securityContext"]
        assert psc["runAsNonRoot"] is True and psc["runAsUser"] == 65534
        assert psc["seccompProfile"] == {"type": "RuntimeDefault"}
        (c,) = spec["containers"]
        sc = c["securityContext"]
        assert sc["runAsNonRoot"] is True and sc["runAsUser"] == 65534 and sc["readOnlyRootFilesystem"] is True
        assert sc["allowPrivilegeEscalation"] is False and sc["capabilities"] == {"drop": ["ALL"]}
        assert sc["seccompProfile"] == {"type": "RuntimeDefault"} and sc["privileged"] is False
        assert c["resources"]["limits"] == {"memory": "256Mi", "cpu": "500m"}
        assert c["resources"]["requests"]["memory"] == "256Mi"
        mounts = {m["mountPath"]: m["name"] for m in c["volumeMounts"]}
        volumes = {v["name"]: v["emptyDir"] for v in spec["volumes"]}
        assert set(mounts) == {DATA, "/tmp", "/dev/shm", OUT_DIR} and set(volumes) == set(mounts.values())
        assert volumes[mounts[DATA]] == {"sizeLimit": "8Mi"}
        assert volumes[mounts["/tmp"]] == {"medium": "Memory", "sizeLimit": "16Mi"}
        assert volumes[mounts["/dev/shm"]] == {"medium": "Memory", "sizeLimit": "4Mi"}
        assert cluster.pods["cntr-abc123"]["polls"] > cluster.pending_polls  # it waited for Running
        assert container.python_version == sys.version.split()[0]
    finally:
        await container.close()
    assert cluster.deleted == [("cntr-abc123", {"apiVersion": "v1", "kind": "DeleteOptions", "gracePeriodSeconds": 0})]
    await container.close()  # idempotent
    assert len(cluster.deleted) == 1


async def test_the_pod_spec_passes_the_kubernetes_schema_and_the_restricted_pod_security_standard() -> None:
    kubernetes_validate = pytest.importorskip("kubernetes_validate")
    sb = KubernetesSandbox(namespace=NS, image="sandbox:test", runtime_class="gvisor")
    pod = sb.pod_spec("cntr_x")
    kubernetes_validate.validate(pod, "1.33.0", strict=True)
    spec = pod["spec"]
    pod_runtime_class_free = {k: v for k, v in spec.items() if k != "runtimeClassName"}
    assert "runtimeClassName" not in KubernetesSandbox(namespace=NS, image="i").pod_spec("cntr_x")["spec"]
    assert pod_runtime_class_free["securityContext"]["seccompProfile"]["type"] == "RuntimeDefault"
    # the Pod Security Standard "restricted" (the namespace enforces it): every volume an emptyDir
    assert all(set(v) == {"name", "emptyDir"} for v in spec["volumes"])


# -- runs through the exec stream ------------------------------------------------------------------------


@pytest.mark.parametrize("protocol", ["v5.channel.k8s.io", "v4.channel.k8s.io"])
async def test_state_is_kept_between_runs_over_either_protocol(cluster: FakeCluster, protocol: str) -> None:
    cluster.protocols = (protocol,)
    container = await _sandbox(cluster).create()
    try:
        first = await container.run("x = 41\nprint('set')")
        assert first.ok and first.stdout == "set\n" and not first.state_lost
        second = await container.run("x + 1")
        assert second.ok and second.stdout == "42\n"
        raised = await container.run("import sys\nprint('out'); print('err', file=sys.stderr); 1/0")
        assert (
            raised.exit_status == 1 and raised.failure is None and raised.error == "ZeroDivisionError: division by zero"
        )
        assert raised.stdout == "out\n" and raised.stderr.startswith("err\n") and "ZeroDivisionError" in raised.stderr
        exited = await container.run("raise SystemExit(3)")
        assert exited.exit_status == 3 and exited.failure is None
        assert (await container.run("x")).stdout == "41\n"
        big = await container.run("print('y' * 3000)")  # a reply of several exec messages
        assert big.stdout == "y" * 3000 + "\n"
    finally:
        await container.close()
    assert set(cluster.negotiated) == {protocol}


async def test_a_run_past_its_wall_time_is_a_timeout_and_the_next_run_starts_fresh(
    box: Any, cluster: FakeCluster
) -> None:
    await box.run("x = 1")
    spun = await box.run(
        "import subprocess, sys\n"
        "child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)'])\n"
        "while True: pass",
        timeout=1,
    )
    assert spun.failure is Failure.TIMEOUT and spun.exit_status is None and spun.state_lost
    assert "wall time" in (spun.error or "")
    assert any(cmd[3:4] == [KILLER] for cmd in cluster.execs), "the interpreter was not ended"
    after = await box.run("print(x)")
    assert after.state_lost and after.exit_status == 1 and (after.error or "").startswith("NameError")
    again = await box.run("print('alive')")
    assert again.ok and again.stdout == "alive\n" and not again.state_lost


async def test_output_past_the_cap_is_cut_and_said(box: Any) -> None:
    result = await box.run("print('z' * 20000)")
    assert result.failure is Failure.OUTPUT_TOO_LARGE and result.stdout_truncated
    assert result.stdout == "z" * 4096 and not result.stderr_truncated


async def test_an_interpreter_that_dies_is_reported_and_replaced(box: Any) -> None:
    await box.run("x = 1")
    died = await box.run("import os, signal\nos.kill(os.getpid(), signal.SIGKILL)")
    assert died.failure is Failure.KILLED and died.state_lost and "SIGKILL" in (died.error or "")
    exited = await box.run("import os\nos._exit(7)")
    assert exited.failure is Failure.CRASHED and "status 7" in (exited.error or "")
    assert (await box.run("print(1)")).stdout == "1\n"


async def test_files_created_are_listed_and_read_back_without_following_links(box: Any) -> None:
    made = await box.run(
        "open('report.txt', 'w').write('hello')\nimport os\nos.makedirs('sub')\n"
        "open('sub/b.bin','wb').write(b'\\0' * 10)"
    )
    assert made.ok
    assert [(f.path, f.change, f.size) for f in made.files] == [
        ("report.txt", FileChange.CREATED, 5),
        ("sub/b.bin", FileChange.CREATED, 10),
    ]
    assert await box.read_file("report.txt") == b"hello"
    assert await box.read_file("sub/b.bin") == b"\0" * 10
    changed = await box.run(
        "open('report.txt', 'a').write('!')\nimport os\nos.remove('sub/b.bin')\nos.symlink('/etc/passwd', 'link')"
    )
    assert [(f.path, f.change) for f in changed.files] == [
        ("report.txt", FileChange.MODIFIED),
        ("sub/b.bin", FileChange.DELETED),
    ]
    assert (await box.run("print(1)")).files == ()  # nothing changed: nothing listed
    with pytest.raises(FileNotFoundError):
        await box.read_file("missing.txt")
    with pytest.raises(ValueError, match="not a regular file"):
        await box.read_file("link")
    with pytest.raises(ValueError, match="over 3 bytes"):
        await box.read_file("report.txt", max_bytes=3)
    with pytest.raises(ValueError, match="bad path"):
        await box.read_file("../etc/passwd")
    with pytest.raises(NotImplementedError, match="not on this host"):
        _ = box.folder


async def test_a_folder_past_its_quota_is_disk_full(box: Any) -> None:
    result = await box.run("for n in range(3): open(f'big{n}', 'wb').write(b'x' * (600 << 10))")
    assert result.failure is Failure.DISK_FULL and "passed" in (result.error or "")


async def test_a_pod_that_is_gone_is_created_again_and_the_loss_said(box: Any, cluster: FakeCluster) -> None:
    await box.run("x = 1\nopen('f', 'w').write('1')")
    cluster._rest("DELETE", f"/api/v1/namespaces/{NS}/pods/{box.pod}", None)  # evicted, behind its back
    while not box._repl.ended:  # the interpreter's stream ends with the pod (before the next run)
        await asyncio.sleep(0.01)
    result = await box.run("print('again')")
    assert result.ok and result.stdout == "again\n" and result.state_lost
    assert "created again" in (result.error or "") and "files are gone" in (result.error or "")
    assert len(cluster.created) == 2 and box.pod in cluster.pods


# -- the API's refusals -------------------------------------------------------------------------------------


@pytest.mark.parametrize(("status", "words"), [(403, "Role"), (500, "failed"), (422, "pod spec")])
async def test_a_refused_pod_creation_is_a_clear_error(cluster: FakeCluster, status: int, words: str) -> None:
    cluster.fail["POST"] = status
    with pytest.raises(KubernetesError, match=rf"POST /api/v1/namespaces/{NS}/pods: {status} injected") as e:
        await _sandbox(cluster).create()
    assert e.value.status == status and words in str(e.value)


async def test_an_api_that_does_not_answer_is_a_timeout_not_a_hang(cluster: FakeCluster) -> None:
    cluster.fail["POST"] = "hang"
    with pytest.raises(KubernetesError, match="did not answer in 0.5 s"):
        await _sandbox(cluster, request_timeout_s=0.5).create()


async def test_a_name_in_use_is_a_409(cluster: FakeCluster) -> None:
    first = await _sandbox(cluster).create("cntr_same")
    try:
        with pytest.raises(KubernetesError, match="already exists") as e:
            await _sandbox(cluster).create("cntr_same")
        assert e.value.status == 409
    finally:
        await first.close()


async def test_a_pod_whose_image_cannot_be_pulled_fails_early_and_is_deleted(cluster: FakeCluster) -> None:
    cluster.waiting_reason = "ImagePullBackOff"
    with pytest.raises(KubernetesError, match="cannot start: ImagePullBackOff: cannot pull image"):
        await _sandbox(cluster, start_timeout_s=600).create("cntr_nopull")
    assert [name for name, _ in cluster.deleted] == ["cntr-nopull"] and not cluster.pods


async def test_a_pod_that_never_runs_is_bounded_and_deleted(cluster: FakeCluster) -> None:
    cluster.pending_polls = 10**9
    with pytest.raises(KubernetesError, match=r"did not start in 0.3 s \(last: Pending\)"):
        await _sandbox(cluster, start_timeout_s=0.3).create("cntr_slow")
    assert [name for name, _ in cluster.deleted] == ["cntr-slow"]


@pytest.mark.parametrize("fault", [403, 500])
async def test_a_refused_exec_fails_creation_and_deletes_the_pod(cluster: FakeCluster, fault: int) -> None:
    cluster.fail["EXEC"] = fault
    with pytest.raises(KubernetesError, match=f"exec in pod cntr-noexec: {fault}") as e:
        await _sandbox(cluster).create("cntr_noexec")
    assert e.value.status == fault and not cluster.pods


async def test_an_exec_refused_later_is_a_crashed_run_not_an_exception(box: Any, cluster: FakeCluster) -> None:
    await box.run("x = 1", timeout=1)
    await box.run("while True: pass", timeout=1)  # the interpreter ends; the next run needs a new exec
    cluster.fail["EXEC"] = 403
    result = await box.run("print(1)")
    assert result.failure is Failure.CRASHED and "403" in (result.error or "") and result.state_lost


async def test_a_failed_delete_is_raised_and_close_can_be_retried(cluster: FakeCluster) -> None:
    container = await _sandbox(cluster).create()
    cluster.fail["DELETE"] = 500
    with pytest.raises(KubernetesError, match="500"):
        await container.close()
    del cluster.fail["DELETE"]
    await container.close()
    assert not cluster.pods
    with pytest.raises(RuntimeError, match="closed"):
        await container.run("1")


# -- credentials and the probe -------------------------------------------------------------------------------


def test_available_checks_the_in_cluster_credentials(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    off = KubernetesSandbox.in_cluster(namespace=NS, image="i").available()
    assert not off.ok and "KUBERNETES_SERVICE_HOST" in off.reason
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "10.0.0.1")
    monkeypatch.setenv("KUBERNETES_SERVICE_PORT", "6443")
    no_token = KubernetesSandbox.in_cluster(namespace=NS, image="i", token_file=str(tmp_path / "token"))
    assert no_token.api_url == "https://10.0.0.1:6443"
    assert not no_token.available().ok and "automountServiceAccountToken" in no_token.available().reason
    (tmp_path / "token").write_text("t")
    no_ca = KubernetesSandbox.in_cluster(
        namespace=NS, image="i", token_file=str(tmp_path / "token"), ca_file=str(tmp_path / "ca.crt")
    )
    assert not no_ca.available().ok and "CA" in no_ca.available().reason
    (tmp_path / "ca.crt").write_text("x")
    assert no_ca.available().ok
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "fd00::1")
    assert KubernetesSandbox.in_cluster(namespace=NS, image="i").api_url == "https://[fd00::1]:6443"


async def test_probe_says_what_the_api_refused(cluster: FakeCluster) -> None:
    assert (await _sandbox(cluster).probe()).ok
    cluster.fail["GET"] = 403
    found = await _sandbox(cluster).probe()
    assert not found.ok and "403" in found.reason and "Role" in found.reason
    wrong = await KubernetesSandbox(namespace=NS, image="i", api_url=cluster.url, token="nope").probe()
    assert not wrong.ok and "401" in wrong.reason


def test_build_sandbox_makes_the_kubernetes_one_from_the_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    from gateway.base.settings import Settings

    build_sandbox = pytest.importorskip("gateway.containers.registry").build_sandbox

    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "10.0.0.1")
    settings = Settings(
        code_interpreter="kubernetes",
        code_interpreter_k8s_namespace="boxes",
        code_interpreter_k8s_image="py:1",
        code_interpreter_k8s_runtime_class="gvisor",
        container_memory_bytes=512 << 20,
    )
    sb = build_sandbox(settings)
    assert isinstance(sb, KubernetesSandbox)
    pod = sb.pod_spec("cntr_a")
    assert pod["metadata"]["namespace"] == "boxes" and pod["spec"]["runtimeClassName"] == "gvisor"
    assert pod["spec"]["containers"][0]["image"] == "py:1"
    assert pod["spec"]["containers"][0]["resources"]["limits"]["memory"] == "512Mi"


async def test_an_exec_that_is_never_answered_is_a_timeout_and_the_pod_is_deleted(cluster: FakeCluster) -> None:
    cluster.fail["EXEC"] = "hang"
    with pytest.raises(KubernetesError, match="exec in pod cntr-hung: the Kubernetes API did not answer in 0.5 s"):
        await _sandbox(cluster, request_timeout_s=0.5).create("cntr_hung")
    assert [name for name, _ in cluster.deleted] == ["cntr-hung"] and not cluster.pods


async def test_files_written_and_deleted_through_exec_replace_links_and_are_not_a_runs_doing(
    box: Any, tmp_path: Path
) -> None:
    outside = tmp_path / "outside.txt"
    outside.write_text("keep")
    assert (await box.run(f"import os\nos.mkdir('in')\nos.symlink({str(outside)!r}, 'link')")).ok
    data = bytes(range(256)) * 2000  # 512000 bytes: several stdin messages
    await box.write_file("in/upload.bin", data)
    await box.write_file("link", b"new")  # the link is replaced, its target untouched
    assert outside.read_text() == "keep"
    seen = await box.run("print(len(open('in/upload.bin','rb').read()), open('link').read())")
    assert seen.stdout == "512000 new\n" and seen.files == ()  # uploads are not the run's files
    assert await box.read_file("in/upload.bin") == data
    with pytest.raises(FileNotFoundError):
        await box.write_file("nowhere/x", b"1")
    with pytest.raises(ValueError, match="not a file name"):
        await box.write_file("in", b"1")
    with pytest.raises(ValueError, match="over the file size limit"):
        await box.write_file("big", b"x" * (box._sandbox.limits.file_bytes + 1))
    await box.delete_file("in/upload.bin")
    with pytest.raises(FileNotFoundError):
        await box.delete_file("in/upload.bin")
    with pytest.raises(ValueError, match="not a file"):
        await box.delete_file("in")
    assert (await box.run("import os\nprint(sorted(os.listdir('in')))")).stdout == "[]\n"
