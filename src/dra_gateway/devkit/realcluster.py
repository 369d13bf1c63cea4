"""A real Kubernetes control plane on loopback, for the end-to-end tests and the demo.

`ControlPlane` starts, from binaries that `hack/build-control-plane.sh` builds from the Go module
proxy (one folder per Kubernetes version), etcd, kube-apiserver, kube-controller-manager,
kube-scheduler and KWOK as child processes bound to 127.0.0.1, waits until each is up, and stops
them again (SIGTERM, then SIGKILL, by the process ids it started) however the caller leaves.

- The API server authenticates with a static token file (an admin in `system:masters`),
  authorizes with RBAC and signs ServiceAccount tokens, so `service_account_kubeconfig` can mint
  a kubeconfig for any ServiceAccount through the TokenRequest API: a component run with it has
  exactly the rights its RBAC grants. Its serving certificate is signed by a CA made here; the
  kubeconfigs carry that CA.
- The controller manager runs the controllers workloads and DRA need (ResourceClaims from
  templates, garbage collection, namespaces, ServiceAccounts, Deployments, ReplicaSets, Jobs,
  CronJobs); the scheduler runs its default profile, DRA included.
- KWOK plays the kubelet of the Nodes made by `add_node` (annotated `kwok.x-k8s.io/node: fake`,
  the only ones it manages): it marks them Ready, starts the pods bound to them, completes those
  of Jobs and finishes graceful deletions, as a kubelet would, without containers. A real kubelet
  may join beside them (`dra_gateway.devkit.realnode`); KWOK leaves its Node alone.
- The API server listens on `address` (loopback unless a real node, in a network namespace of its
  own, must reach it); its serving certificate names that address, localhost and 127.0.0.1.
- `in_cluster` makes it the control plane of pods that run on a real node
  (`dra_gateway.devkit.realnode` with kube-proxy), such as the chart's own: ServiceAccount tokens
  are mounted, the `kubernetes` Service has endpoints and its names in the serving certificate,
  the controllers of DaemonSets, endpoints and the root CA ConfigMap run, and webhooks are
  called at their Service's endpoints.

`Api` is a small synchronous REST client of that API server (JSON over HTTPS with a bearer
token, the standard library only), enough for tests and the demo to create, read, patch and
delete objects; an error answer raises the cluster port's `ApiError` (`code`: the HTTP status).
This module decides nothing about the gateway; it only runs Kubernetes.

The small client that drives the control plane lives with it.
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import shutil
import signal
import socket
import ssl
import subprocess
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator, Mapping, MutableSequence, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from dra_gateway.kube.cluster.port import ApiError

# What the build script leaves in each version's folder.
BINARIES = ("etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "kwok")
KWOK_STAGES = "kwok-stages.yaml"
# The annotation that marks the Nodes KWOK plays the kubelet of.
KWOK_NODE_ANNOTATION = "kwok.x-k8s.io/node"
# Controllers of kube-controller-manager this control plane runs.
CONTROLLERS = (
    "resourceclaim-controller", "garbage-collector-controller", "namespace-controller",
    "serviceaccount-controller", "deployment-controller", "replicaset-controller",
    "job-controller", "cronjob-controller",
    # Deletes the pods whose devices carry a NoExecute taint their claims do not tolerate (from
    # 1.36 on by default; kube-controller-manager skips it where its feature gate is off).
    "device-taint-eviction-controller",
    # Fills the rules of the bootstrap roles admin, edit and view (tenants are bound to them).
    "clusterrole-aggregation-controller",
)
# And those a cluster whose pods run on real nodes needs (`ControlPlane(in_cluster=True)`): the
# `kube-root-ca.crt` ConfigMap every ServiceAccount token volume projects, Services' endpoints
# (the API server calls webhooks at them), DaemonSets and PodDisruptionBudgets.
IN_CLUSTER_CONTROLLERS = (
    "root-ca-certificate-publisher-controller", "endpoints-controller",
    "endpointslice-controller", "daemonset-controller", "disruption-controller",
)
ADMIN_USER = "admin"
# Services' cluster IPs; the first is the `kubernetes` Service's.
SERVICE_CIDR = "10.0.0.0/24"
KUBERNETES_SERVICE_IP = "10.0.0.1"
KUBERNETES_SERVICE_NAMES = ("kubernetes", "kubernetes.default", "kubernetes.default.svc",
                            "kubernetes.default.svc.cluster.local")
GRACE_S = 10.0
_POLL_S = 0.2

JSON = dict[str, Any]


def cache_dir(version: str) -> Path:
    """Where `hack/build-control-plane.sh` puts the binaries of Kubernetes `version`."""
    base = os.environ.get("DRA_GATEWAY_KUBE_CACHE")
    if base:
        return Path(base) / version.removeprefix("v")
    xdg = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(xdg) / "dra-gateway" / "kube" / version.removeprefix("v")


def missing_binaries(bin_dir: Path) -> list[str]:
    """The files of a version's folder that are not there (empty: the folder is complete)."""
    wanted = [*BINARIES, KWOK_STAGES]
    return [name for name in wanted if not (bin_dir / name).is_file()]


def free_port() -> int:
    """A loopback port free right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class ControlPlaneError(Exception):
    """The control plane could not be started; `log` is the log of the process at fault."""

    def __init__(self, message: str, *, log: Path | None = None) -> None:
        super().__init__(message + (f"\n--- last lines of {log} ---\n{log_tail(log)}"
                                    if log is not None else ""))
        self.log = log


def log_tail(path: Path, lines: int = 30) -> str:
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return f"(no log at {path})"
    return "\n".join(text.rstrip("\n").splitlines()[-lines:]) or "(empty log)"


# The REST client -------------------------------------------------------------------------------

def _api_error(code: int, body: JSON | None, method: str, path: str) -> ApiError:
    """The cluster port's error for an error answer: `code` the HTTP status, `reason` and
    `message` from the Status the API server sent (`status`, when it sent one); the request is
    in a note, so a traceback shows what was asked."""
    body = body or {}
    reason = str(body.get("reason") or "")
    error = ApiError(str(body.get("message") or f"HTTP {code}"), code=code, reason=reason,
                     status=body if body.get("kind") == "Status" else None)
    error.add_note(f"{method} {path}: {code} {reason}".rstrip())
    return error


_CORE_KINDS_WITHOUT_GROUP = "v1"


def path_of(api_version: str, plural: str, *, namespace: str | None = None,
            name: str | None = None, subresource: str | None = None) -> str:
    """The REST path of a resource: ("apps/v1", "deployments", namespace="x") ->
    /apis/apps/v1/namespaces/x/deployments."""
    prefix = "/api/v1" if api_version == _CORE_KINDS_WITHOUT_GROUP else f"/apis/{api_version}"
    parts = [prefix]
    if namespace is not None:
        parts.append(f"namespaces/{urllib.parse.quote(namespace, safe='')}")
    parts.append(plural)
    if name is not None:
        parts.append(urllib.parse.quote(name, safe=""))
    if subresource is not None:
        parts.append(subresource)
    return "/".join(parts)


def _warning_text(header: str) -> str:
    """The text of a `Warning: 299 - "text"` header (RFC 7234), as kubectl prints it."""
    parts = header.split(" ", 2)
    if len(parts) == 3 and parts[0] == "299":
        text = parts[2]
        if len(text) >= 2 and text[0] == '"' and text[-1] == '"':
            return text[1:-1].replace('\\"', '"').replace("\\\\", "\\")
        return text
    return header


@dataclass(frozen=True)
class Api:
    """JSON REST calls to the API server as one user (a bearer token)."""

    server: str
    token: str
    ca_file: Path
    timeout_s: float = 30.0
    _context: ssl.SSLContext = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_context", ssl.create_default_context(cafile=str(self.ca_file)))

    def request(self, method: str, path: str, body: Any = None, *,
                query: Mapping[str, str] | None = None,
                content_type: str = "application/json", accept: str = "application/json",
                warnings: MutableSequence[str] | None = None) -> JSON:
        """One call; the API server's warnings (admission webhooks' among them) are appended to
        `warnings` when given. `accept`: what to answer in (a Table, as kubectl get asks)."""
        url = self.server + path
        if query:
            url += "?" + urllib.parse.urlencode(query)
        # Compact, as kubectl sends it: the API server keeps an opaque config's parameters as
        # the bytes it was sent and compares them byte for byte when the object is written
        # again, so a claim created with spaced JSON could never be updated by any client.
        data = None if body is None else json.dumps(body, separators=(",", ":")).encode()
        headers = {"Authorization": f"Bearer {self.token}", "Accept": accept}
        if data is not None:
            headers["Content-Type"] = content_type
        request = urllib.request.Request(url, data=data, method=method, headers=headers)
        try:
            with urllib.request.urlopen(request, context=self._context,
                                        timeout=self.timeout_s) as response:
                raw = response.read()
                if warnings is not None:
                    warnings.extend(_warning_text(h) for h in
                                    response.headers.get_all("Warning") or ())
        except urllib.error.HTTPError as exc:
            raw = exc.read()
            exc.close()
            try:
                parsed = json.loads(raw) if raw else None
            except ValueError:
                parsed = {"message": raw.decode(errors="replace")}
            raise _api_error(exc.code, parsed if isinstance(parsed, dict) else None, method,
                             path) from None
        if not raw:
            return {}
        try:
            answer = json.loads(raw)
        except ValueError:
            return {"text": raw.decode(errors="replace")}
        return answer if isinstance(answer, dict) else {"items": answer}

    def get(self, path: str, **query: str) -> JSON:
        return self.request("GET", path, query=query or None)

    def list(self, path: str, **query: str) -> list[JSON]:
        items = self.request("GET", path, query=query or None).get("items") or []
        return [item for item in items if isinstance(item, dict)]

    def create(self, path: str, body: Mapping[str, Any], *,
               warnings: MutableSequence[str] | None = None) -> JSON:
        return self.request("POST", path, dict(body), warnings=warnings)

    def apply_status(self, path: str, patch: Mapping[str, Any]) -> JSON:
        return self.request("PATCH", path + "/status", dict(patch),
                            content_type="application/merge-patch+json")

    def patch(self, path: str, patch: Mapping[str, Any]) -> JSON:
        return self.request("PATCH", path, dict(patch),
                            content_type="application/merge-patch+json")

    def delete(self, path: str, *, grace_period_s: int | None = None,
               propagation: str | None = None) -> JSON:
        options: JSON = {"apiVersion": "v1", "kind": "DeleteOptions"}
        if grace_period_s is not None:
            options["gracePeriodSeconds"] = grace_period_s
        if propagation is not None:
            options["propagationPolicy"] = propagation
        return self.request("DELETE", path, options)

    def exists(self, path: str) -> bool:
        try:
            self.get(path)
        except ApiError as exc:
            if exc.code == 404:
                return False
            raise
        return True


def kubeconfig_document(server: str, ca_pem: bytes, user: str, token: str) -> JSON:
    """A kubeconfig with one cluster, one user (a bearer token) and a current context."""
    return {
        "apiVersion": "v1", "kind": "Config", "preferences": {},
        "clusters": [{"name": "local", "cluster": {
            "server": server,
            "certificate-authority-data": base64.b64encode(ca_pem).decode("ascii")}}],
        "users": [{"name": user, "user": {"token": token}}],
        "contexts": [{"name": user, "context": {"cluster": "local", "user": user}}],
        "current-context": user,
    }


# Processes -------------------------------------------------------------------------------------

@dataclass
class Process:
    name: str
    argv: list[str]
    log: Path
    popen: subprocess.Popen[bytes]

    def running(self) -> bool:
        return self.popen.poll() is None


@dataclass
class _Processes:
    log_dir: Path
    started: list[Process] = field(default_factory=list)

    def start(self, name: str, argv: Sequence[str], env: Mapping[str, str] | None = None,
              *, append: bool = False) -> Process:
        """Start `argv` with its output in logs/<name>.log (after what an earlier run of that
        name wrote there, with `append`)."""
        log = self.log_dir / f"{name}.log"
        with log.open("ab" if append else "wb") as out:
            out.write(("$ " + " ".join(argv) + "\n").encode())
            out.flush()
            popen = subprocess.Popen(list(argv), stdin=subprocess.DEVNULL, stdout=out,
                                     stderr=subprocess.STDOUT,
                                     env={**os.environ, **(env or {})})
        process = Process(name, list(argv), log, popen)
        self.started.append(process)
        return process

    def stop(self, grace_s: float = GRACE_S) -> list[str]:
        """Stop every process, the last started first; the names of those that had to be
        killed."""
        killed: list[str] = []
        for process in reversed(self.started):
            if process.popen.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    process.popen.send_signal(signal.SIGTERM)
                try:
                    process.popen.wait(timeout=grace_s)
                except subprocess.TimeoutExpired:
                    killed.append(process.name)
                    with contextlib.suppress(ProcessLookupError):
                        process.popen.kill()
                    process.popen.wait()
        self.started.clear()
        return killed


# The control plane -----------------------------------------------------------------------------

def _write(path: Path, text: str | bytes, mode: int = 0o600) -> Path:
    data = text.encode() if isinstance(text, str) else text
    path.write_bytes(data)
    path.chmod(mode)
    return path


def _gates(feature_gates: Mapping[str, bool]) -> list[str]:
    if not feature_gates:
        return []
    joined = ",".join(f"{k}={'true' if v else 'false'}" for k, v in sorted(feature_gates.items()))
    return [f"--feature-gates={joined}"]


@dataclass
class ControlPlane:
    """etcd, kube-apiserver, kube-controller-manager, kube-scheduler and KWOK on loopback.

    Use as a context manager, or call `start` and (always) `stop`. `work_dir` holds the logs
    (`logs/<process>.log`), certificates and kubeconfigs; a temporary one is removed by `stop`
    unless `keep` is set.
    """

    bin_dir: Path
    feature_gates: Mapping[str, bool] = field(default_factory=dict)
    work_dir: Path | None = None
    keep: bool = False
    startup_timeout_s: float = 120.0
    # Extra flags per process name ("kube-apiserver", ...).
    extra_args: Mapping[str, Sequence[str]] = field(default_factory=dict)
    # The IP address the API server binds and advertises.
    address: str = "127.0.0.1"
    # Pods on a real node (dra_gateway.devkit.realnode, with kube-proxy) are clients and servers
    # of this control plane, as in any cluster: the ServiceAccount admission plugin mounts their
    # tokens, the `kubernetes` Service's endpoints name `address` (which must not be loopback),
    # and the API server calls webhooks at their Service's endpoints (aggregator routing: the
    # host has no kube-proxy, only a route to the node's pods). Off, pods get no token and
    # reach nothing: KWOK's do not run.
    in_cluster: bool = False

    root: Path = field(init=False)
    server: str = field(init=False, default="")
    admin_token: str = field(init=False, default="")
    _processes: _Processes = field(init=False)
    _remove_root: bool = field(init=False, default=False)

    def __post_init__(self) -> None:
        if self.work_dir is None:
            self.root = Path(tempfile.mkdtemp(prefix="dra-gateway-kube-"))
            self._remove_root = not self.keep
        else:
            self.root = self.work_dir.resolve()
            self.root.mkdir(parents=True, exist_ok=True)
        if self.in_cluster and self.address.startswith("127."):
            raise ControlPlaneError("in_cluster needs an address that pods reach, not loopback")
        for folder in ("logs", "pki", "etcd", "kcm", "scheduler"):
            (self.root / folder).mkdir(exist_ok=True)
        self._processes = _Processes(self.root / "logs")

    # Paths

    @property
    def ca_file(self) -> Path:
        return self.root / "pki" / "ca.crt"

    @property
    def admin_kubeconfig(self) -> Path:
        return self.root / "admin.kubeconfig"

    def log(self, name: str) -> Path:
        return self.root / "logs" / f"{name}.log"

    @property
    def processes(self) -> list[Process]:
        return list(self._processes.started)

    def __enter__(self) -> ControlPlane:
        try:
            self.start()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # Start and stop

    def start(self) -> None:
        missing = missing_binaries(self.bin_dir)
        if missing:
            raise ControlPlaneError(f"{self.bin_dir} lacks {', '.join(missing)}: build them with "
                                    "hack/build-control-plane.sh")
        deadline = time.monotonic() + self.startup_timeout_s
        self._pki()
        etcd_url = self._start_etcd(deadline)
        self._start_apiserver(etcd_url, deadline)
        kubeconfig = self.admin_kubeconfig
        self._start_controller_manager(kubeconfig, deadline)
        self._start_scheduler(kubeconfig, deadline)
        self._start_kwok(kubeconfig)

    def stop(self) -> list[str]:
        """Stop every process started (SIGTERM, SIGKILL after a grace period) and remove a
        temporary work directory; the names of the processes that had to be killed."""
        killed = self._processes.stop()
        if self._remove_root:
            shutil.rmtree(self.root, ignore_errors=True)
        return killed

    def check(self) -> None:
        """Raise if a process of the control plane has exited."""
        for process in self._processes.started:
            code = process.popen.poll()
            if code is not None:
                raise ControlPlaneError(f"{process.name} exited with code {code}",
                                        log=process.log)

    def _pki(self) -> None:
        from cryptography.hazmat.primitives import serialization
        from cryptography.hazmat.primitives.asymmetric import ec

        from dra_gateway.certs.generate import make_bundle, write_bundle

        pki = self.root / "pki"
        dns_names, addresses = ["localhost"], {"127.0.0.1", self.address}
        if self.in_cluster:  # pods reach it as the `kubernetes` Service
            dns_names += KUBERNETES_SERVICE_NAMES
            addresses.add(KUBERNETES_SERVICE_IP)
        bundle = make_bundle(dns_names=dns_names, ip_addresses=sorted(addresses))
        write_bundle(bundle, pki)
        key = ec.generate_private_key(ec.SECP256R1())
        _write(pki / "service-account.key", key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption()))
        _write(pki / "service-account.pub", key.public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo), 0o644)
        self.admin_token = base64.urlsafe_b64encode(os.urandom(24)).decode("ascii").rstrip("=")
        _write(pki / "tokens.csv", f'{self.admin_token},{ADMIN_USER},{ADMIN_USER},'
                                   '"system:masters"\n')

    def _wait(self, what: str, process: Process | None, deadline: float,
              ready: Callable[[], bool]) -> None:
        while True:
            self.check()
            with contextlib.suppress(OSError, ApiError, ValueError):
                if ready():
                    return
            if time.monotonic() > deadline:
                raise ControlPlaneError(f"timed out waiting for {what}",
                                        log=process.log if process else None)
            time.sleep(_POLL_S)

    def _start_etcd(self, deadline: float) -> str:
        client, peer = free_port(), free_port()
        client_url, peer_url = f"http://127.0.0.1:{client}", f"http://127.0.0.1:{peer}"
        process = self._processes.start("etcd", [
            str(self.bin_dir / "etcd"), "--name", "default",
            "--data-dir", str(self.root / "etcd"),
            "--listen-client-urls", client_url, "--advertise-client-urls", client_url,
            "--listen-peer-urls", peer_url, "--initial-advertise-peer-urls", peer_url,
            "--initial-cluster", f"default={peer_url}",
            "--unsafe-no-fsync", "--log-level", "warn",
            *self.extra_args.get("etcd", ()),
        ])

        def healthy() -> bool:
            with urllib.request.urlopen(f"{client_url}/health", timeout=2) as response:
                return bool(json.loads(response.read()).get("health") == "true")

        self._wait("etcd's /health", process, deadline, healthy)
        return client_url

    def _start_apiserver(self, etcd_url: str, deadline: float) -> None:
        port = free_port()
        self.server = f"https://{self.address}:{port}"
        pki = self.root / "pki"
        process = self._processes.start("kube-apiserver", [
            str(self.bin_dir / "kube-apiserver"),
            "--etcd-servers", etcd_url,
            "--bind-address", self.address, "--advertise-address", self.address,
            "--secure-port", str(port),
            "--tls-cert-file", str(pki / "tls.crt"), "--tls-private-key-file", str(pki / "tls.key"),
            "--cert-dir", str(pki / "apiserver"),
            "--service-cluster-ip-range", SERVICE_CIDR,
            "--authorization-mode", "RBAC",
            "--token-auth-file", str(pki / "tokens.csv"),
            "--service-account-issuer", self.server,
            "--service-account-key-file", str(pki / "service-account.pub"),
            "--service-account-signing-key-file", str(pki / "service-account.key"),
            # No node lifecycle controller lifts the not-ready taint: KWOK and a real kubelet
            # mark their nodes Ready.
            "--disable-admission-plugins", ",".join(
                ("TaintNodesByCondition",) if self.in_cluster
                # No kubelet mounts tokens.
                else ("ServiceAccount", "TaintNodesByCondition")),
            "--allow-privileged=true",
            # 1.36+ refuses a loopback advertise address in the `kubernetes` Service's
            # endpoints; without pods that dial that Service, it has none.
            *(("--enable-aggregator-routing=true",) if self.in_cluster
              else ("--endpoint-reconciler-type=none",)),
            "--profiling=false",
            # Nodes are reached at their IP (`kubectl logs`, `exec`): no DNS names them.
            "--kubelet-preferred-address-types=InternalIP",
            *_gates(self.feature_gates),
            *self.extra_args.get("kube-apiserver", ()),
        ])
        _write(self.admin_kubeconfig, yaml.safe_dump(kubeconfig_document(
            self.server, self.ca_file.read_bytes(), ADMIN_USER, self.admin_token)))
        api = self.api()

        def ready() -> bool:
            return bool(api.request("GET", "/readyz").get("text", "").strip() == "ok")

        self._wait("the API server's /readyz", process, deadline, ready)

    def _component_flags(self, folder: str, kubeconfig: Path) -> tuple[int, list[str]]:
        """A free port and the serving, authentication and gate flags the controller manager
        and the scheduler share (their /healthz is open to anyone)."""
        port = free_port()
        return port, [
            "--authentication-kubeconfig", str(kubeconfig),
            "--authorization-kubeconfig", str(kubeconfig),
            "--bind-address", "127.0.0.1", "--secure-port", str(port),
            "--cert-dir", str(self.root / folder),
            *_gates(self.feature_gates),
        ]

    def _healthz(self, port: int) -> Callable[[], bool]:
        context = ssl.create_default_context()
        # Self-signed by the component itself, on loopback, for a health check only.
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE

        def healthy() -> bool:
            with urllib.request.urlopen(f"https://127.0.0.1:{port}/healthz", context=context,
                                        timeout=2) as response:
                return bool(response.status == 200)

        return healthy

    def _start_controller_manager(self, kubeconfig: Path, deadline: float) -> None:
        port, flags = self._component_flags("kcm", kubeconfig)
        process = self._processes.start("kube-controller-manager", [
            str(self.bin_dir / "kube-controller-manager"), "--kubeconfig", str(kubeconfig),
            *flags,
            "--controllers", ",".join(
                (*CONTROLLERS, *IN_CLUSTER_CONTROLLERS) if self.in_cluster else CONTROLLERS),
            "--root-ca-file", str(self.ca_file),
            "--leader-elect=false", "--use-service-account-credentials=false",
            "--kube-api-qps", "200", "--kube-api-burst", "400",
            *self.extra_args.get("kube-controller-manager", ()),
        ])
        self._wait("kube-controller-manager's /healthz", process, deadline,
                   self._healthz(port))

    def _start_scheduler(self, kubeconfig: Path, deadline: float) -> None:
        port, flags = self._component_flags("scheduler", kubeconfig)
        config = _write(self.root / "scheduler" / "config.yaml", yaml.safe_dump({
            "apiVersion": "kubescheduler.config.k8s.io/v1",
            "kind": "KubeSchedulerConfiguration",
            "clientConnection": {"kubeconfig": str(kubeconfig), "qps": 200, "burst": 400},
            "leaderElection": {"leaderElect": False},
        }))
        process = self._processes.start("kube-scheduler", [
            str(self.bin_dir / "kube-scheduler"), "--config", str(config), *flags,
            *self.extra_args.get("kube-scheduler", ()),
        ])
        self._wait("kube-scheduler's /healthz", process, deadline, self._healthz(port))

    def _start_kwok(self, kubeconfig: Path) -> None:
        self._processes.start("kwok", [
            str(self.bin_dir / "kwok"), "--kubeconfig", str(kubeconfig),
            # Only the Nodes add_node makes: a real kubelet's Node is its own.
            "--manage-all-nodes=false",
            f"--manage-nodes-with-annotation-selector={KWOK_NODE_ANNOTATION}=fake",
            "--config", str(self.bin_dir / KWOK_STAGES),
            "--server-address", f"127.0.0.1:{free_port()}",
            *self.extra_args.get("kwok", ()),
        ])

    # Using it

    def api(self, token: str | None = None) -> Api:
        """A REST client as the admin, or as the holder of `token`."""
        return Api(self.server, token or self.admin_token, self.ca_file)

    def version(self) -> str:
        return str(self.api().get("/version").get("gitVersion"))

    def service_account_token(self, namespace: str, name: str, *,
                              expiration_s: int = 24 * 3600,
                              bound_pod: Mapping[str, Any] | None = None) -> str:
        """A token of ServiceAccount namespace/name from the TokenRequest API.

        With `bound_pod` (a Pod object of that ServiceAccount), the token is bound to the pod
        as the kubelet's projected tokens are: the API server then names the pod's node in the
        user's extra `authentication.kubernetes.io/node-name`, which node-scoped admission
        policies read.
        """
        spec: JSON = {"expirationSeconds": expiration_s}
        if bound_pod is not None:
            meta = bound_pod["metadata"]
            spec["boundObjectRef"] = {"apiVersion": "v1", "kind": "Pod", "name": meta["name"],
                                      "uid": meta["uid"]}
        answer = self.api().create(
            path_of("v1", "serviceaccounts", namespace=namespace, name=name,
                    subresource="token"),
            {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": spec})
        return str(answer["status"]["token"])

    def service_account_kubeconfig(self, namespace: str, name: str, path: Path | None = None,
                                   *, expiration_s: int = 24 * 3600,
                                   bound_pod: Mapping[str, Any] | None = None) -> Path:
        """Write a kubeconfig holding a token of ServiceAccount namespace/name (bound to
        `bound_pod`, if given); its path."""
        token = self.service_account_token(namespace, name, expiration_s=expiration_s,
                                           bound_pod=bound_pod)
        path = path or self.root / f"{namespace}-{name}.kubeconfig"
        user = f"system:serviceaccount:{namespace}:{name}"
        _write(path, yaml.safe_dump(kubeconfig_document(self.server, self.ca_file.read_bytes(),
                                                        user, token)))
        return path

    def add_node(self, name: str, *, labels: Mapping[str, str] | None = None,
                 cpu: str = "64", memory: str = "512Gi", pods: str = "110") -> JSON:
        """Create a Node that KWOK plays the kubelet of, with this much allocatable."""
        resources = {"cpu": cpu, "memory": memory, "pods": pods}
        node = {
            "apiVersion": "v1", "kind": "Node",
            "metadata": {"name": name, "labels": {
                "kubernetes.io/hostname": name, "kubernetes.io/os": "linux",
                "kubernetes.io/arch": "amd64", "type": "kwok", **(labels or {})},
                "annotations": {KWOK_NODE_ANNOTATION: "fake"}},
            "status": {"capacity": resources, "allocatable": resources},
        }
        api = self.api()
        created = api.create(path_of("v1", "nodes"), node)
        # Creation drops the status; KWOK's node stage keeps what it finds there.
        api.apply_status(path_of("v1", "nodes", name=name),
                         {"status": {"capacity": resources, "allocatable": resources}})
        return created

    def wait_nodes_ready(self, names: Sequence[str], timeout_s: float = 60.0) -> None:
        api = self.api()
        kwok = next((p for p in self._processes.started if p.name == "kwok"), None)

        def ready() -> bool:
            for name in names:
                node = api.get(path_of("v1", "nodes", name=name))
                conditions = (node.get("status") or {}).get("conditions") or []
                if not any(c.get("type") == "Ready" and c.get("status") == "True"
                           for c in conditions):
                    return False
            return True

        self._wait(f"nodes {', '.join(names)} to be Ready (KWOK)", kwok,
                   time.monotonic() + timeout_s, ready)

    def logs(self) -> Iterator[tuple[str, Path]]:
        for process in self._processes.started:
            yield process.name, process.log
