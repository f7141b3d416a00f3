"""The ``kubernetes`` sandbox: each container one pod, driven through the Kubernetes API (issue 34).

**The pod.** :meth:`KubernetesSandbox.create` POSTs one pod per container into
``code_interpreter_k8s_namespace``: the image's ``python3`` as pid 1 (a reaper that only waits for
orphans), ``restartPolicy: Never``, no service account token, no service links, the pod and its
container non-root (uid/gid 65534), ``readOnlyRootFilesystem``, no privilege escalation, every
capability dropped, the runtime's default seccomp profile, ``runtimeClassName`` when set (e.g.
gVisor), memory and CPU requests and limits, ``activeDeadlineSeconds``, and four emptyDirs:
``/mnt/data`` (the container folder, ``sizeLimit`` ``Limits.folder_bytes``), ``/tmp``, ``/dev/shm`` and
``/run/out`` (memory, sized as the local backend sizes its tmpfs). Its labels are the ones the
NetworkPolicy of ``deploy/k8s/overlays/code-interpreter`` selects: no ingress, no egress. It waits
for the pod to run, bounded (``start_timeout_s``); an image that cannot be pulled or a pod that
fails ends the wait early with the reason the kubelet gave.

**The interpreter.** The REPL server of the local backend (:mod:`security.sandbox.repl_server`, the
same frames, the same rlimits) runs in the pod through the exec API: one WebSocket per interpreter
(``v5.channel.k8s.io``, else ``v4.channel.k8s.io``), its stdin channel (0) carrying the request
frames, its stdout channel (1) the replies, channel 3 the exit status when it ends. A run that
passes its wall time, and a reply that breaks the protocol, ends the interpreter: a second exec kills
every process of the pod but pid 1 (the pod's own pid namespace), and the next run starts a fresh
one (``state_lost``). The files in ``/mnt/data`` stay. A pod that is gone (deleted, evicted,
past its deadline) is created again at the next run: state and files lost, said in ``error``.

**Files.** Listed after each run by a short exec (regular files, no link followed, at most
:data:`MAX_FILES` entries and :data:`LIST_MAX_BYTES` of listing) and diffed against the previous
listing; read (:meth:`KubernetesContainer.read_file`) by another, the bytes on stdout, capped at the
bound asked. Every exec is bounded in time and in the bytes it may send back.

**Errors.** The API's answers (403: the RBAC of the gateway's service account; 404: the namespace
or the pod; 409: a pod of that name exists; 5xx; a timeout or a refused connection) become a
:class:`KubernetesError` naming the call and the status, never a hang: every request has a timeout
(``request_timeout_s``). ``available()`` checks the in-cluster credentials; :meth:`probe` asks the
API (a pod list in the namespace).

**Bounds, compared with local.** Memory is the pod's limit (every process, and the memory-backed
emptyDirs, together; the OOM killer ending the interpreter is reported as ``killed``); CPU the
pod's limit in cores, plus the REPL's per-run and whole-life ``RLIMIT_CPU``. ``RLIMIT_NPROC`` is
counted per uid on the node (every sandbox pod there runs as 65534 unless the pods get user
namespaces or gVisor), so it is set high (``nproc_rlimit``) and the process bound of a pod is the
kubelet's ``podPidsLimit``. The folder's size is bounded by the emptyDir's ``sizeLimit`` (the kubelet
evicts the pod past it) and checked after each run (``disk_full``).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import os
import ssl
import struct
import time
import uuid
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import quote, urlencode

import httpx

from security.sandbox.base import Availability, Failure, FileEntry, Limits, RunResult
from security.sandbox.folder import FileStat, diff
from security.sandbox.repl_server import OUT_DIR
from security.sandbox.reply import result_of

if TYPE_CHECKING:
    from gateway.base.settings import Settings

SERVER_SOURCE = (Path(__file__).parent / "repl_server.py").read_text()
DATA = "/mnt/data"
NOBODY = 65534
CONTAINER = "sandbox"  # the container's name in the pod
SA_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"
#: the labels of every sandbox pod; the NetworkPolicy selects the first
POD_LABELS = {"app.kubernetes.io/name": "respgate-sandbox", "app.kubernetes.io/managed-by": "respgate"}
ID_LABEL = "respgate.dev/container"
MAX_FILES = 10_000
LIST_MAX_BYTES = 4 << 20  # the most a file listing may send back
EXEC_MAX_FRAME = 1 << 20  # one WebSocket message from the API server
PID_FILE = OUT_DIR + "/.repl-pid"
_ENV = {
    "PATH": "/usr/local/bin:/usr/bin:/bin",
    "HOME": "/tmp",
    "LANG": "C.UTF-8",
    "MPLBACKEND": "Agg",
    "OPENBLAS_NUM_THREADS": "1",
    "OMP_NUM_THREADS": "1",
    "MKL_NUM_THREADS": "1",
}
#: channels of the exec stream (k8s.io/apimachinery/pkg/util/remotecommand)
STDIN, STDOUT, STDERR, STATUS, CLOSE = 0, 1, 2, 3, 255
SUBPROTOCOLS = ("v5.channel.k8s.io", "v4.channel.k8s.io")

# pid 1 of the pod: waits for the orphans an interpreter leaves (they are re-parented to it)
REAPER = """
import os, time
while True:
    try:
        os.wait()
    except ChildProcessError:
        time.sleep(1)
"""

# starts the REPL server in a session of its own, in /mnt/data, its pid where the killer finds it;
# the server's source comes first on stdin (4-byte length, then the text: a URL holds only so much)
LAUNCHER = """
import os, struct, sys
def take(n):
    buf = b""
    while len(buf) < n:
        chunk = os.read(0, n - len(buf))
        if not chunk:
            sys.exit(70)
        buf += chunk
    return buf
source = take(struct.unpack(">I", take(4))[0]).decode()
try:
    os.setsid()
except OSError:  # already a session leader
    pass
os.chdir(sys.argv[1])
with open(sys.argv[2], "w") as f:
    f.write(str(os.getpid()))
os.execv(sys.executable, [sys.executable, "-I", "-c", source, sys.argv[3]])
"""

# ends the interpreter and everything it started: every process of the pod's pid namespace but
# pid 1 (the reaper) and this one; run in the pod only (on a host it would signal the host's)
KILLER = """
import os, signal
me = os.getpid()
for name in os.listdir("/proc"):
    if name.isdigit() and int(name) not in (1, me):
        try:
            os.kill(int(name), signal.SIGKILL)
        except OSError:
            pass
"""

# lists the folder: {"files": {path: [size, mtime_ns, ino]}, "total": bytes}; no link followed
LISTER = """
import json, os, stat, sys
top, cap = sys.argv[1], int(sys.argv[2])
files, total = {}, 0
for root, dirs, names in os.walk(top, followlinks=False):
    for name in names + dirs:
        p = os.path.join(root, name)
        try:
            st = os.lstat(p)
        except OSError:
            continue
        if stat.S_ISREG(st.st_mode):
            total += st.st_blocks * 512
            if len(files) < cap:
                files[os.path.relpath(p, top)] = [st.st_size, st.st_mtime_ns, st.st_ino]
sys.stdout.write(json.dumps({"files": files, "total": total}))
"""

# the folder holding a path's last part, each folder on the way opened without following a link;
# exit 3 for a path that is empty or climbs (``..``). Shared by the scripts below, each run alone in the pod.
_WALK = """
import errno, os, stat, struct, sys
def parent(top, rel):
    parts = [p for p in rel.split("/") if p not in ("", ".")]
    if not parts or ".." in parts:
        sys.exit(3)
    fd = os.open(top, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    for part in parts[:-1]:
        nxt = os.open(part, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=fd)
        os.close(fd)
        fd = nxt
    return fd, parts[-1]
"""

# one regular file under the folder, opened component by component without following a link;
# exit 2: not found, 3: not a regular file or a link, 4: bigger than the bound
READER = (
    _WALK
    + """
top, rel, cap = sys.argv[1], sys.argv[2], int(sys.argv[3])
try:
    fd, name = parent(top, rel)
    leaf = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK, dir_fd=fd)
except OSError as e:
    sys.exit(2 if e.errno == errno.ENOENT else 3)
st = os.fstat(leaf)
if not stat.S_ISREG(st.st_mode):
    sys.exit(3)
if st.st_size > cap:
    sys.exit(4)
out = sys.stdout.buffer
left = cap + 1
while left > 0:
    chunk = os.read(leaf, min(left, 1 << 16))
    if not chunk:
        break
    out.write(chunk)
    left -= len(chunk)
out.flush()
"""
)


# writes a file under the folder from stdin (8-byte length, then the bytes), beside its name and
# renamed into place, no link followed; exit 2: a folder on the way is missing, 3: a bad path or the
# name is a folder, 5: the bytes ended early, 6: no room (the folder or the file size limit)
WRITER = (
    _WALK
    + """
top, rel = sys.argv[1], sys.argv[2]
def take(n):
    buf = b""
    while len(buf) < n:
        chunk = os.read(0, min(n - len(buf), 1 << 16))
        if not chunk:
            return None
        buf += chunk
    return buf
head = take(8)
if head is None:
    sys.exit(5)
left = struct.unpack(">Q", head)[0]
try:
    fd, name = parent(top, rel)
except OSError as e:
    sys.exit(2 if e.errno == errno.ENOENT else 3)
tmp = ".respgate-upload-%d" % os.getpid()
out = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644, dir_fd=fd)
try:
    while left > 0:
        chunk = take(min(left, 1 << 16))
        if chunk is None:
            raise EOFError
        view = memoryview(chunk)
        while view:
            view = view[os.write(out, view):]
        left -= len(chunk)
    os.close(out)
    try:
        if stat.S_ISDIR(os.lstat(name, dir_fd=fd).st_mode):
            raise IsADirectoryError
    except FileNotFoundError:
        pass
    os.rename(tmp, name, src_dir_fd=fd, dst_dir_fd=fd)
except BaseException as e:
    os.unlink(tmp, dir_fd=fd)
    if isinstance(e, EOFError):
        sys.exit(5)
    if isinstance(e, IsADirectoryError):
        sys.exit(3)
    if isinstance(e, OSError) and e.errno in (errno.ENOSPC, errno.EFBIG, errno.EDQUOT):
        sys.exit(6)
    raise
"""
)

# removes a file (or a link) under the folder, its folders opened without following links;
# exit 2: not found, 3: a bad path or a folder
DELETER = (
    _WALK
    + """
top, rel = sys.argv[1], sys.argv[2]
try:
    fd, name = parent(top, rel)
    if stat.S_ISDIR(os.lstat(name, dir_fd=fd).st_mode):
        sys.exit(3)
    os.unlink(name, dir_fd=fd)
except OSError as e:
    sys.exit(2 if e.errno == errno.ENOENT else 3)
"""
)


class KubernetesError(RuntimeError):
    """The Kubernetes API refused or did not answer: ``status`` is the HTTP status (None: no answer)."""

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


_HINTS = {
    401: "the service account token was refused",
    403: "the gateway's service account may not do this: apply deploy/k8s/overlays/code-interpreter's Role",
    404: "not found (the sandbox namespace exists? deploy/k8s/overlays/code-interpreter creates it)",
    409: "a pod of that name exists already",
    422: "the API rejected the pod spec",
}


def _quantity(n: int) -> str:
    """Bytes as a Kubernetes quantity, exact (Mi or Ki when it divides, else plain bytes)."""
    for unit, size in (("Gi", 1 << 30), ("Mi", 1 << 20), ("Ki", 1 << 10)):
        if n % size == 0:
            return f"{n // size}{unit}"
    return str(n)


class KubernetesSandbox:
    """Creates containers as pods in ``namespace`` through the API at ``api_url``."""

    def __init__(
        self,
        *,
        namespace: str,
        image: str,
        limits: Limits | None = None,
        runtime_class: str | None = None,
        api_url: str | None = None,
        token: str | None = None,
        token_file: str | None = None,
        ca_file: str | None = None,
        cpu_limit: str = "1",
        cpu_request: str = "100m",
        memory_request_bytes: int | None = None,
        max_lifetime_s: int = 24 * 3600 + 600,
        start_timeout_s: float = 120.0,
        request_timeout_s: float = 15.0,
        nproc_rlimit: int = 1 << 15,
        python: str = "python3",
    ) -> None:
        """``api_url``: ``https://HOST:PORT`` (in the cluster: :meth:`in_cluster`); the bearer is
        ``token`` or, re-read at every call (kubelet rotates it), ``token_file``; ``ca_file`` verifies
        the API's certificate. ``max_lifetime_s``: the pods' ``activeDeadlineSeconds``."""
        self.namespace = namespace
        self.image = image
        self.limits = limits or Limits()
        self.runtime_class = runtime_class
        self.api_url = api_url.rstrip("/") if api_url else None
        self._token = token
        self.token_file = token_file
        self.ca_file = ca_file
        self.cpu_limit = cpu_limit
        self.cpu_request = cpu_request
        self.memory_request_bytes = memory_request_bytes
        self.max_lifetime_s = max_lifetime_s
        self.start_timeout_s = start_timeout_s
        self.request_timeout_s = request_timeout_s
        self.nproc_rlimit = nproc_rlimit
        self.python = python
        self._ssl: ssl.SSLContext | None = None

    @classmethod
    def in_cluster(cls, **kwargs: Any) -> KubernetesSandbox:
        """The API and credentials a pod is given: ``KUBERNETES_SERVICE_HOST``/``_PORT``, the
        service account's token and CA under ``/var/run/secrets/kubernetes.io/serviceaccount``."""
        host, port = os.environ.get("KUBERNETES_SERVICE_HOST"), os.environ.get("KUBERNETES_SERVICE_PORT", "443")
        url = None
        if host:
            url = f"https://[{host}]:{port}" if ":" in host else f"https://{host}:{port}"
        kwargs.setdefault("api_url", url)
        kwargs.setdefault("token_file", f"{SA_DIR}/token")
        kwargs.setdefault("ca_file", f"{SA_DIR}/ca.crt")
        return cls(**kwargs)

    @classmethod
    def from_settings(cls, settings: Settings, limits: Limits) -> KubernetesSandbox:
        return cls.in_cluster(
            namespace=settings.code_interpreter_k8s_namespace,
            image=settings.code_interpreter_k8s_image,
            runtime_class=settings.code_interpreter_k8s_runtime_class,
            limits=limits,
        )

    # -- can it start here ------------------------------------------------------------------------

    def available(self) -> Availability:
        """Whether the credentials to reach the API are here (nothing is asked of the API: :meth:`probe`)."""
        details = {"namespace": self.namespace, "image": self.image, "api": self.api_url or "none"}
        if self.runtime_class:
            details["runtime_class"] = self.runtime_class
        if not self.api_url:
            return Availability(False, "no Kubernetes API: KUBERNETES_SERVICE_HOST is not set (not in a pod?)", details)
        if self._token is None:
            if not self.token_file:
                return Availability(False, "no service account token configured", details)
            try:
                if not Path(self.token_file).read_text().strip():
                    return Availability(False, f"the service account token {self.token_file} is empty", details)
            except OSError as e:
                return Availability(
                    False,
                    f"no service account token at {self.token_file} ({e.strerror}): "
                    "is automountServiceAccountToken off for the gateway's pod?",
                    details,
                )
        if self.api_url.startswith("https:") and self.ca_file and not os.path.isfile(self.ca_file):
            return Availability(False, f"no cluster CA at {self.ca_file}", details)
        return Availability(True, "", details)

    async def probe(self) -> Availability:
        """:meth:`available`, then a pod list in the namespace: an RBAC or namespace problem shows here."""
        found = self.available()
        if not found.ok:
            return found
        try:
            await self._api("GET", f"/api/v1/namespaces/{self.namespace}/pods?limit=1")
        except KubernetesError as e:
            return Availability(False, str(e), found.details)
        return found

    # -- the API ----------------------------------------------------------------------------------

    def _bearer(self) -> str:
        if self._token is not None:
            return self._token
        if not self.token_file:
            raise KubernetesError("no service account token configured")
        try:
            return Path(self.token_file).read_text().strip()
        except OSError as e:
            raise KubernetesError(f"cannot read the service account token {self.token_file}: {e}") from e

    def _ssl_context(self) -> ssl.SSLContext | None:
        if not self.api_url or not self.api_url.startswith("https:"):
            return None
        if self._ssl is None:
            self._ssl = (
                ssl.create_default_context(cafile=self.ca_file) if self.ca_file else ssl.create_default_context()
            )
        return self._ssl

    async def _api(self, method: str, path: str, body: dict[str, Any] | None = None) -> dict[str, Any]:
        """One API call; any answer but 2xx, and no answer in time, is a :class:`KubernetesError`."""
        if not self.api_url:
            raise KubernetesError("no Kubernetes API configured (KUBERNETES_SERVICE_HOST is not set)")
        what = f"{method} {path.split('?', 1)[0]}"
        verify: ssl.SSLContext | bool = self._ssl_context() or True
        try:
            async with httpx.AsyncClient(
                base_url=self.api_url, verify=verify, timeout=self.request_timeout_s, trust_env=False
            ) as client:
                r = await client.request(method, path, json=body, headers={"Authorization": f"Bearer {self._bearer()}"})
        except httpx.TimeoutException as e:
            raise KubernetesError(f"{what}: the Kubernetes API did not answer in {self.request_timeout_s:g} s") from e
        except httpx.HTTPError as e:
            raise KubernetesError(f"{what}: the Kubernetes API is unreachable: {e}") from e
        if r.status_code // 100 != 2:
            raise KubernetesError(f"{what}: {r.status_code} {_status_message(r)}", r.status_code)
        try:
            data = r.json()
        except ValueError as e:
            raise KubernetesError(f"{what}: the Kubernetes API answered {r.status_code} with no JSON") from e
        return data if isinstance(data, dict) else {}

    async def _exec(self, pod: str, command: list[str], *, stdin: bool) -> _ExecStream:
        if not self.api_url:
            raise KubernetesError("no Kubernetes API configured (KUBERNETES_SERVICE_HOST is not set)")
        import websockets
        from websockets.asyncio.client import connect
        from websockets.exceptions import InvalidStatus, WebSocketException
        from websockets.typing import Subprotocol

        query = [("command", c) for c in command]
        query += [("container", CONTAINER), ("stdin", "true" if stdin else "false")]
        query += [("stdout", "true"), ("stderr", "true"), ("tty", "false")]
        url = "ws" + self.api_url[4:] + f"/api/v1/namespaces/{self.namespace}/pods/{pod}/exec?" + urlencode(query)
        what = f"exec in pod {pod}"
        options: dict[str, Any] = {}
        if int(websockets.__version__.split(".")[0]) >= 15:
            options["proxy"] = None  # the API server is reached directly, never through HTTPS_PROXY
        try:
            ws = await connect(
                url,
                subprotocols=[Subprotocol(p) for p in SUBPROTOCOLS],
                additional_headers={"Authorization": f"Bearer {self._bearer()}"},
                ssl=self._ssl_context(),
                open_timeout=self.request_timeout_s,
                ping_interval=None,  # a run may be silent for its whole wall time
                max_size=EXEC_MAX_FRAME,
                compression=None,
                **options,
            )
        except InvalidStatus as e:
            status = e.response.status_code
            body = e.response.body.decode("utf-8", "replace")[:500] if e.response.body else ""
            raise KubernetesError(f"{what}: {status} {_message_of(body, status)}", status) from e
        except TimeoutError as e:
            raise KubernetesError(f"{what}: the Kubernetes API did not answer in {self.request_timeout_s:g} s") from e
        except (OSError, WebSocketException) as e:
            raise KubernetesError(f"{what}: {e}") from e
        return _ExecStream(ws)

    async def _run_once(
        self, pod: str, command: list[str], max_bytes: int, timeout: float, stdin: bytes | None = None
    ) -> tuple[bytes, int | None, str]:
        """An exec (``stdin`` written to it, in pieces, when given): (stdout, at most ``max_bytes`` + 1;
        the exit status, None when unknown; stderr's tail or the API's message)."""
        stream = await self._exec(pod, command, stdin=stdin is not None)
        try:
            async with asyncio.timeout(timeout):
                for at in range(0, len(stdin or b""), 256 << 10):
                    await stream.write((stdin or b"")[at : at + (256 << 10)])
                out = await stream.read_all(max_bytes + 1)
                rc = await stream.finished()
        except TimeoutError as e:
            raise KubernetesError(f"exec in pod {pod}: no answer in {timeout:g} s") from e
        finally:
            await stream.close()
        return out, rc, stream.error or stream.stderr_tail.decode("utf-8", "replace")

    # -- pods -------------------------------------------------------------------------------------

    def pod_name(self, container_id: str) -> str:
        return container_id.lower().replace("_", "-")

    def server_command(self) -> list[str]:
        cfg = {
            k: v
            for k, v in asdict(self.limits).items()
            if k in ("memory_bytes", "open_files", "file_bytes", "cpu_seconds_total", "output_bytes")
        }
        cfg["processes"] = self.nproc_rlimit  # per uid on the node, not per pod: see the module's doc
        return [self.python, "-I", "-c", LAUNCHER, DATA, PID_FILE, json.dumps(cfg)]

    def pod_spec(self, container_id: str) -> dict[str, Any]:
        lim = self.limits
        memory = _quantity(lim.memory_bytes)
        spec: dict[str, Any] = {
            "restartPolicy": "Never",
            "automountServiceAccountToken": False,
            "enableServiceLinks": False,
            "terminationGracePeriodSeconds": 0,
            "activeDeadlineSeconds": self.max_lifetime_s,
            "securityContext": {
                "runAsNonRoot": True,
                "runAsUser": NOBODY,
                "runAsGroup": NOBODY,
                "fsGroup": NOBODY,
                "seccompProfile": {"type": "RuntimeDefault"},
            },
            "containers": [
                {
                    "name": CONTAINER,
                    "image": self.image,
                    "imagePullPolicy": "IfNotPresent",
                    "command": [self.python, "-I", "-c", REAPER],
                    "workingDir": DATA,
                    "env": [{"name": k, "value": v} for k, v in _ENV.items()],
                    "resources": {
                        "requests": {
                            "cpu": self.cpu_request,
                            "memory": _quantity(self.memory_request_bytes or lim.memory_bytes),
                        },
                        "limits": {"cpu": self.cpu_limit, "memory": memory},
                    },
                    "securityContext": {
                        "runAsNonRoot": True,
                        "runAsUser": NOBODY,
                        "runAsGroup": NOBODY,
                        "readOnlyRootFilesystem": True,
                        "allowPrivilegeEscalation": False,
                        "privileged": False,
                        "capabilities": {"drop": ["ALL"]},
                        "seccompProfile": {"type": "RuntimeDefault"},
                    },
                    "volumeMounts": [
                        {"name": "data", "mountPath": DATA},
                        {"name": "tmp", "mountPath": "/tmp"},
                        {"name": "shm", "mountPath": "/dev/shm"},
                        {"name": "out", "mountPath": OUT_DIR},
                    ],
                }
            ],
            "volumes": [
                {"name": "data", "emptyDir": {"sizeLimit": _quantity(lim.folder_bytes)}},
                {"name": "tmp", "emptyDir": {"medium": "Memory", "sizeLimit": _quantity(lim.tmp_bytes)}},
                {"name": "shm", "emptyDir": {"medium": "Memory", "sizeLimit": _quantity(lim.shm_bytes)}},
                {
                    "name": "out",
                    "emptyDir": {"medium": "Memory", "sizeLimit": _quantity(4 * lim.output_bytes + (64 << 10))},
                },
            ],
        }
        if self.runtime_class:
            spec["runtimeClassName"] = self.runtime_class
        return {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "name": self.pod_name(container_id),
                "namespace": self.namespace,
                "labels": {**POD_LABELS, ID_LABEL: self.pod_name(container_id)},
            },
            "spec": spec,
        }

    async def _start_pod(self, container_id: str) -> str:
        """Create the pod and wait until its container runs; on any failure the pod is deleted."""
        name = self.pod_name(container_id)
        await self._api("POST", f"/api/v1/namespaces/{self.namespace}/pods", self.pod_spec(container_id))
        try:
            await self._wait_running(name)
        except BaseException:
            with contextlib.suppress(KubernetesError):
                await self._delete_pod(name)
            raise
        return name

    async def _wait_running(self, name: str) -> None:
        deadline = time.monotonic() + self.start_timeout_s
        delay = 0.05
        last = "Pending"
        while True:
            pod = await self._api("GET", f"/api/v1/namespaces/{self.namespace}/pods/{name}")
            status = pod.get("status") or {}
            phase = status.get("phase", "Pending")
            running, why = _container_state(status)
            if phase == "Running" and running:
                return
            if phase in ("Failed", "Succeeded"):
                raise KubernetesError(f"pod {name} ended before it ran: {phase} {why}".rstrip())
            if why and why.split(":")[0] in _FATAL_WAITING:
                raise KubernetesError(f"pod {name} cannot start: {why}")
            last = f"{phase} {why}".rstrip()
            if time.monotonic() + delay > deadline:
                raise KubernetesError(f"pod {name} did not start in {self.start_timeout_s:g} s (last: {last})")
            await asyncio.sleep(delay)
            delay = min(delay * 2, 1.0)

    async def _delete_pod(self, name: str) -> None:
        try:
            await self._api(
                "DELETE",
                f"/api/v1/namespaces/{self.namespace}/pods/{name}",
                {"apiVersion": "v1", "kind": "DeleteOptions", "gracePeriodSeconds": 0},
            )
        except KubernetesError as e:
            if e.status != 404:
                raise

    async def sweep(self) -> int:
        """Delete the sandbox pods that ended (past their deadline, evicted); returns how many."""
        selector = quote(",".join(f"{k}={v}" for k, v in POD_LABELS.items()))
        pods = await self._api("GET", f"/api/v1/namespaces/{self.namespace}/pods?labelSelector={selector}")
        gone = 0
        for pod in pods.get("items") or []:
            if (pod.get("status") or {}).get("phase") in ("Failed", "Succeeded"):
                await self._delete_pod(str(pod["metadata"]["name"]))
                gone += 1
        return gone

    # -- containers -------------------------------------------------------------------------------

    async def create(self, container_id: str | None = None) -> KubernetesContainer:
        cid = container_id or f"cntr_{uuid.uuid4().hex}"
        name = self.pod_name(cid)
        if not (0 < len(name) <= 63 and name.replace("-", "").isalnum() and name.isascii() and name[0].isalnum()):
            raise ValueError(f"bad container id {cid!r}")
        container = KubernetesContainer(self, cid)
        container._pod = await self._start_pod(cid)
        try:
            await container._start_repl()
        except BaseException:
            await container.close()
            raise
        return container


_FATAL_WAITING = {
    "ErrImagePull",
    "ImagePullBackOff",
    "InvalidImageName",
    "CreateContainerConfigError",
    "CreateContainerError",
    "CrashLoopBackOff",
    "RunContainerError",
}


def _container_state(status: dict[str, Any]) -> tuple[bool, str]:
    """(the sandbox container runs, why not: ``Reason: message`` of its waiting or terminated state)."""
    for cs in status.get("containerStatuses") or []:
        if cs.get("name") != CONTAINER:
            continue
        state = cs.get("state") or {}
        if "running" in state:
            return True, ""
        for key in ("waiting", "terminated"):
            if key in state:
                s = state[key] or {}
                return False, f"{s.get('reason', key)}: {s.get('message', '')}".rstrip(": ")
    reasons = [
        f"{c.get('reason', '')}: {c.get('message', '')}" for c in status.get("conditions") or [] if c.get("reason")
    ]
    return False, "; ".join(reasons)[:500]


def _message_of(body: str, status: int) -> str:
    try:
        data = json.loads(body)
    except ValueError:
        data = None
    msg = data.get("message") if isinstance(data, dict) else None
    text = str(msg) if msg else body.strip()[:300]
    hint = _HINTS.get(status) or ("the Kubernetes API failed" if status >= 500 else "")
    return "; ".join(p for p in (text, hint) if p)


def _status_message(r: httpx.Response) -> str:
    return _message_of(r.text[:2000], r.status_code)


class _ExecStream:
    """One exec: stdin written as channel 0, stdout kept in a buffer, stderr's tail kept, the exit
    status read from channel 3. Nothing read is unbounded: each message is at most EXEC_MAX_FRAME and
    the caller says how much stdout it takes."""

    def __init__(self, ws: Any) -> None:
        self.ws = ws
        self.v5 = ws.subprotocol == "v5.channel.k8s.io"
        self.stdout = bytearray()
        self.stdout_limit = 16 << 20
        self.stderr_tail = b""
        self.status: dict[str, Any] | None = None
        self.error = ""
        self.ended = False
        self._data = asyncio.Event()
        self._pump = asyncio.ensure_future(self._read())

    async def _read(self) -> None:
        from websockets.exceptions import ConnectionClosed

        try:
            async for message in self.ws:
                if isinstance(message, str):
                    message = message.encode()
                if not message:
                    continue
                channel, data = message[0], message[1:]
                if channel == STDOUT:
                    if len(self.stdout) + len(data) > self.stdout_limit:
                        self.error = "the exec sent more than it may"
                        break
                    self.stdout += data
                elif channel == STDERR:
                    self.stderr_tail = (self.stderr_tail + data)[-4096:]
                elif channel == STATUS and data:
                    with contextlib.suppress(ValueError):
                        status = json.loads(data[:65536])
                        self.status = status if isinstance(status, dict) else None
                self._data.set()
        except ConnectionClosed:
            pass
        finally:
            self.ended = True
            self._data.set()

    async def _wait(self) -> None:
        self._data.clear()
        await self._data.wait()

    async def write(self, data: bytes) -> None:
        await self.ws.send(bytes([STDIN]) + data)

    async def read_exactly(self, n: int) -> bytes:
        """``n`` bytes of stdout; :class:`asyncio.IncompleteReadError` when the stream ends first."""
        while len(self.stdout) < n:
            if self.ended:
                raise asyncio.IncompleteReadError(bytes(self.stdout), n)
            await self._wait()
        out = bytes(self.stdout[:n])
        del self.stdout[:n]
        return out

    async def read_all(self, max_bytes: int) -> bytes:
        """stdout until the stream ends, or ``max_bytes`` of it (then the rest is not read)."""
        self.stdout_limit = max_bytes
        while not self.ended and len(self.stdout) < max_bytes:
            await self._wait()
        return bytes(self.stdout[:max_bytes])

    async def finished(self) -> int | None:
        """The exit status once the stream ends (None: the API gave none, ``error`` says why)."""
        while not self.ended:
            await self._wait()
        return self.exit_status()

    def exit_status(self) -> int | None:
        st = self.status
        if st is None:
            return None
        if st.get("status") == "Success":
            return 0
        causes = (st.get("details") or {}).get("causes") or []
        for cause in causes:
            if cause.get("reason") == "ExitCode":
                with contextlib.suppress(TypeError, ValueError):
                    return int(cause.get("message"))
        self.error = str(st.get("message") or st.get("reason") or "exec failed")[:500]
        return None

    async def close(self) -> None:
        with contextlib.suppress(Exception):
            await asyncio.wait_for(self.ws.close(), 5)
        self._pump.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await self._pump


class KubernetesContainer:
    """A pod and the REPL session in it; ``run`` calls are serialized; ``close`` deletes the pod."""

    def __init__(self, sandbox: KubernetesSandbox, cid: str) -> None:
        self._sandbox = sandbox
        self._id = cid
        self._pod: str | None = None
        self._repl: _ExecStream | None = None
        self._lock = asyncio.Lock()
        self._closed = False
        self._lost = False
        self._files: dict[str, FileStat] = {}  # the folder as the last listing saw it
        self.python_version = ""

    @property
    def id(self) -> str:
        return self._id

    @property
    def pod(self) -> str | None:
        return self._pod

    @property
    def folder(self) -> str:
        """A pod's folder is not on this host: read files with :meth:`read_file`."""
        raise NotImplementedError(f"container {self._id} is a pod: its folder ({DATA}) is not on this host")

    @property
    def _max_frame(self) -> int:
        return 12 * self._sandbox.limits.output_bytes + (64 << 10)

    async def _start_repl(self) -> None:
        sb = self._sandbox
        assert self._pod is not None
        self._repl = await sb._exec(self._pod, sb.server_command(), stdin=True)
        source = SERVER_SOURCE.encode()
        try:
            await self._repl.write(struct.pack(">I", len(source)) + source)
            hello = await asyncio.wait_for(self._read_frame(), sb.start_timeout_s)
        except Exception as e:  # no hello: timed out, the stream ended or broke, a bad frame
            repl, self._repl = self._repl, None
            why = (repl.error or repl.stderr_tail.decode("utf-8", "replace")) if repl else ""
            if repl is not None:
                await repl.close()
            raise KubernetesError(f"the interpreter in pod {self._pod} did not start: {why!r}") from e
        self.python_version = str(hello.get("python", ""))

    async def _read_frame(self) -> dict[str, Any]:
        assert self._repl is not None
        (n,) = struct.unpack(">I", await self._repl.read_exactly(4))
        if n > self._max_frame:
            raise ValueError(f"reply frame of {n} bytes")
        reply = json.loads(await self._repl.read_exactly(n))
        if not isinstance(reply, dict):
            raise ValueError("reply is not an object")
        return reply

    async def _end_repl(self) -> None:
        """End the interpreter and every process it started (the pod and its files stay)."""
        repl, self._repl = self._repl, None
        self._lost = True
        if repl is not None:
            await repl.close()
        if self._pod is not None:
            with contextlib.suppress(KubernetesError):
                await self._sandbox._run_once(self._pod, [self._sandbox.python, "-I", "-c", KILLER], 4096, 30)

    async def _ensure(self) -> str:
        """An interpreter ready to run: started again if it ended, in a new pod if the pod is gone."""
        if self._repl is not None and not self._repl.ended:
            return ""
        await self._end_repl()
        assert self._pod is not None
        try:
            await self._start_repl()
            return ""
        except KubernetesError as e:
            if e.status not in (404, 400) and "did not start" not in str(e):
                raise
        # the pod is gone or no longer runs: a new one, files lost
        with contextlib.suppress(KubernetesError):
            await self._sandbox._delete_pod(self._pod)
        self._pod = await self._sandbox._start_pod(self._id)
        self._files = {}
        await self._start_repl()
        return "the container's pod had ended and was created again: its files are gone"

    async def run(self, code: str, timeout: float | None = None) -> RunResult:
        if self._closed:
            raise RuntimeError(f"container {self._id} is closed")
        async with self._lock:
            return await self._run(code, self._sandbox.limits.default_timeout_s if timeout is None else timeout)

    async def _run(self, code: str, timeout: float) -> RunResult:
        started = time.monotonic()
        state_lost = self._lost
        try:
            note = await self._ensure()
        except KubernetesError as e:
            return RunResult("", "", None, Failure.CRASHED, f"the sandbox could not start: {e}", state_lost=True)
        if note:
            state_lost = True
        self._lost = False
        assert self._repl is not None
        body = json.dumps({"code": code, "cpu_s": max(1, int(timeout) + 1)}).encode()
        reply: dict[str, Any] | None = None
        failure: Failure | None = None
        error = ""
        try:
            async with asyncio.timeout(timeout):
                await self._repl.write(struct.pack(">I", len(body)) + body)
                reply = await self._read_frame()
        except TimeoutError:
            failure, error = Failure.TIMEOUT, f"wall time limit of {timeout:g} s reached"
        except asyncio.IncompleteReadError:
            repl = self._repl
            rc = None
            if repl is not None:
                with contextlib.suppress(TimeoutError):
                    rc = await asyncio.wait_for(repl.finished(), 5)
            failure, error = _exit_failure(rc, repl.error if repl else "")
        except (ValueError, UnicodeDecodeError) as e:
            failure, error = Failure.CRASHED, f"the interpreter broke the protocol: {e}"
        except Exception as e:  # the stream broke (the API server went away)
            failure, error = Failure.CRASHED, f"the connection to the interpreter broke: {e}"
        if reply is None:
            await self._end_repl()
            state_lost = True
        files, total = await self._list_files()
        if note:
            error = f"{error}; {note}" if error else note
        if reply is None:
            return RunResult(
                "", "", None, failure, error, files, state_lost=state_lost, duration_s=time.monotonic() - started
            )
        result = result_of(
            reply, files, total, self._sandbox.limits, state_lost=state_lost, took=time.monotonic() - started
        )
        if note and result.error is None:
            return _with_error(result, note)
        return result

    async def _list_files(self) -> tuple[tuple[FileEntry, ...], int]:
        """The folder's changes since the last listing, and its total bytes (0, no changes: unknown)."""
        sb = self._sandbox
        if self._pod is None:
            return (), 0
        try:
            out, rc, why = await sb._run_once(
                self._pod, [sb.python, "-I", "-c", LISTER, DATA, str(MAX_FILES)], LIST_MAX_BYTES, 60
            )
            if rc != 0 or len(out) > LIST_MAX_BYTES:
                return (), 0
            listing = json.loads(out)
            after = {
                str(p): FileStat(int(v[0]), int(v[1]), int(v[2]))
                for p, v in dict(listing["files"]).items()
                if isinstance(v, list) and len(v) == 3
            }
            total = int(listing["total"])
        except (KubernetesError, ValueError, KeyError, TypeError):
            return (), 0
        files = diff(self._files, after)
        self._files = after
        return files, total

    async def read_file(self, path: str, max_bytes: int = 64 << 20) -> bytes:
        """A file of the container folder (``path`` relative to ``/mnt/data``): regular files only, no
        link followed on the way, at most ``max_bytes``. FileNotFoundError or ValueError as local's."""
        if self._closed or self._pod is None:
            raise RuntimeError(f"container {self._id} is closed")
        parts = [p for p in path.split("/") if p not in ("", ".")]
        if not parts or ".." in parts:
            raise ValueError(f"bad path {path!r}")
        sb = self._sandbox
        command = [sb.python, "-I", "-c", READER, DATA, "/".join(parts), str(max_bytes)]
        out, rc, why = await sb._run_once(self._pod, command, max_bytes, 60 + max_bytes / (1 << 20))
        if rc == 2:
            raise FileNotFoundError(path)
        if rc == 3:
            raise ValueError(f"{path!r} is not a regular file")
        if rc == 4 or len(out) > max_bytes:
            raise ValueError(f"{path!r} is over {max_bytes} bytes")
        if rc != 0:
            raise KubernetesError(f"reading {path!r} in pod {self._pod} failed: {rc} {why}".rstrip())
        return out

    async def write_file(self, path: str, data: bytes) -> None:
        """Put ``data`` at ``path`` (relative to ``/mnt/data``; its folders must exist), replacing a
        file there, through an exec: for the Containers API's uploads, which a pod's folder cannot take
        on this host. The file counts as there before the next run (not reported by it).
        FileNotFoundError (a folder on the way is missing), ValueError (a bad path, a folder there, no
        room), :class:`KubernetesError`."""
        if len(data) > self._sandbox.limits.file_bytes:
            raise ValueError(f"{len(data)} bytes, over the file size limit of {self._sandbox.limits.file_bytes}")
        rel = _relpath(path)
        async with self._lock:
            pod = self._open_pod()
            sb = self._sandbox
            command = [sb.python, "-I", "-c", WRITER, DATA, rel]
            payload = struct.pack(">Q", len(data)) + data
            _, rc, why = await sb._run_once(pod, command, 4096, 60 + len(data) / (1 << 20), stdin=payload)
            if rc == 2:
                raise FileNotFoundError(path)
            if rc in (3, 6):
                raise ValueError(f"{path!r}: " + ("no room in the container" if rc == 6 else "not a file name"))
            if rc != 0:
                raise KubernetesError(f"writing {path!r} in pod {pod} failed: {rc} {why}".rstrip())
            await self._list_files()  # the upload is not the next run's doing

    async def delete_file(self, path: str) -> None:
        """Remove the file (or link) at ``path``; FileNotFoundError, ValueError (a folder, a bad path)."""
        rel = _relpath(path)
        async with self._lock:
            pod = self._open_pod()
            sb = self._sandbox
            _, rc, why = await sb._run_once(pod, [sb.python, "-I", "-c", DELETER, DATA, rel], 4096, 60)
            if rc == 2:
                raise FileNotFoundError(path)
            if rc == 3:
                raise ValueError(f"{path!r} is not a file")
            if rc != 0:
                raise KubernetesError(f"deleting {path!r} in pod {pod} failed: {rc} {why}".rstrip())
            await self._list_files()

    def _open_pod(self) -> str:
        if self._closed or self._pod is None:
            raise RuntimeError(f"container {self._id} is closed")
        return self._pod

    async def close(self) -> None:
        """Delete the pod (grace 0); idempotent. A run in progress sees its stream end (``killed``)."""
        self._closed = True
        repl, self._repl = self._repl, None
        if repl is not None:
            await repl.close()
        pod, self._pod = self._pod, None
        if pod is not None:
            try:
                await self._sandbox._delete_pod(pod)
            except BaseException:
                self._pod = pod  # a later close tries again
                raise


def _relpath(path: str) -> str:
    parts = [p for p in path.split("/") if p not in ("", ".")]
    if not parts or ".." in parts:
        raise ValueError(f"bad path {path!r}")
    return "/".join(parts)


def _with_error(result: RunResult, note: str) -> RunResult:
    return dataclasses.replace(result, error=note)


def _exit_failure(rc: int | None, why: str) -> tuple[Failure, str]:
    """The interpreter's exec ended without a reply: why, from its exit status (128+n: signal n)."""
    if rc is not None and rc > 128:
        sig = rc - 128
        if sig == 9:
            return Failure.KILLED, "the interpreter was killed (SIGKILL: the pod's memory limit or the CPU hard limit)"
        if sig == 24:  # SIGXCPU
            return Failure.TIMEOUT, "CPU time limit reached"
        return Failure.CRASHED, f"the interpreter died of signal {sig}"
    if rc is None:
        return Failure.CRASHED, f"the interpreter's stream ended: {why or 'no exit status'}"
    return Failure.CRASHED, f"the interpreter exited with status {rc}"
