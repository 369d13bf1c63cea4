"""A real Kubernetes node on this machine: a kubelet with containerd, runc and CNI, for the
real-node tier (tests/realnode).

`NodeNetwork` makes a network namespace with a veth pair: the host keeps one end (the address the
control plane's API server binds, `ControlPlane(address=...)`), the node gets the other (its node
IP: a kubelet refuses a loopback one). `RealNode` starts, inside that namespace (`nsenter --net`,
which keeps the host's /sys and cgroup mounts, unlike `ip netns exec`):
- containerd 2.2 with CDI on (`cdi_spec_dirs` is the folder the node plugin writes), Debian's runc,
  a CNI bridge for the pods, `restrict_oom_score_adj` (a machine without CAP_SYS_RESOURCE refuses
  the kubelet's -998 otherwise), and a busybox image imported with `ctr` as the pod sandbox's;
  other images are imported (`import_image`) or pulled from registries on the node's network,
  served over plain HTTP (`insecure_registries`: a hosts.toml each in containerd's registry
  `config_path`);
- the kubelet of a release, with its own root folder, its cgroups under `CGROUP_ROOT` (cgroupfs
  driver: the machine has cgroup v1) and its pod logs in a folder of its own;
- with `kube_proxy`, that release's kube-proxy (iptables mode, its rules in the namespace only), so
  that the node's pods reach the API server through the `kubernetes` Service as in any cluster
  (`ControlPlane(in_cluster=True)`); with `cluster_dns`, pods resolve Services by name through the
  address given (`clusterdns.ClusterDNS` serves one on the host's end). The host routes the
  pods' subnet to the node, so the API server reaches webhooks served by the node's pods.

Everything it leaves is removed by `stop`, failed or not: pods through the CRI first, then the
kubelet and containerd, the mounts under its folders, its cgroups, the namespace, and the kernel
settings the kubelet changes (`vm.overcommit_memory`, `kernel.panic`, `kernel.panic_on_oops`),
put back as they were, and the device plugin folder the kubelet always makes at
/var/lib/kubelet/device-plugins. Only one such node runs on a machine at a time (the kubelet's
cgroups, kernel settings and device plugin folder are global): `start` first clears what a run
that was killed left.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from dra_gateway.devkit import ociarchive
from dra_gateway.devkit.realcluster import (
    ControlPlane,
    ControlPlaneError,
    Process,
    _Processes,
    log_tail,
    path_of,
)

# Where a node keeps its state: short paths (unix sockets) outside the caller's work folder, as a
# real node's are; one node per machine.
STATE_ROOT = Path("/var/lib/dra-gateway-node")
RUN_ROOT = Path("/run/dra-gateway-node")
CGROUP_ROOT = "dra-gateway-node"
CGROUP_FS = Path("/sys/fs/cgroup")
# The only image: busybox, also the pod sandbox's (pinned in containerd's config).
IMAGE = "dra-gateway.local/busybox:1"
CNI_BIN = Path("/usr/lib/cni")
RUNC = Path("/usr/sbin/runc")
BUSYBOX = Path("/bin/busybox")
# The kubelet serves device plugins here whatever its --root-dir (k8s.io/kubelet's
# DevicePluginPath), with its device manager's checkpoint beside.
DEVICE_PLUGINS = Path("/var/lib/kubelet/device-plugins")
# Kernel settings the kubelet writes at start (pkg/kubelet/cm: setupKernelTunables).
KERNEL_SETTINGS = ("vm/overcommit_memory", "kernel/panic", "kernel/panic_on_oops")
STOP_GRACE_S = 15.0
# The cluster's DNS domain, when the node has a cluster DNS (`RealNode.cluster_dns`).
CLUSTER_DOMAIN = "cluster.local"


class NodeError(ControlPlaneError):
    """A part of the node is missing, would not start, or stopped."""


def _run(argv: Sequence[str], *, timeout: float = 60.0, check: bool = True
         ) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout,
                            check=False)
    if check and result.returncode != 0:
        raise NodeError(f"`{' '.join(argv)}` failed ({result.returncode}): "
                        f"{(result.stderr or result.stdout).strip()[-2000:]}")
    return result


@dataclass(frozen=True)
class NodeBinaries:
    """Where a node's programs are: the kubelet's release folder (hack/build-node.sh) and
    Debian's runc, CNI plugins and busybox."""

    kubelet: Path
    kube_proxy: Path
    kubectl: Path  # that release's, for tests that drive the node as a user would
    containerd: Path  # folder with containerd, containerd-shim-runc-v2 and ctr
    crictl: Path

    @classmethod
    def of(cls, release_dir: Path) -> NodeBinaries:
        """The binaries hack/build-node.sh leaves for a release; NodeError naming what is
        missing and how to get it."""
        found = cls(kubelet=release_dir / "kubelet", kube_proxy=release_dir / "kube-proxy",
                    kubectl=release_dir / "kubectl",
                    containerd=release_dir / "containerd",
                    crictl=release_dir / "crictl" / "crictl")
        wanted = {
            found.kubelet: "hack/build-node.sh",
            found.kube_proxy: "hack/build-node.sh",
            found.kubectl: "hack/build-node.sh",
            found.containerd / "containerd": "hack/build-node.sh",
            found.containerd / "containerd-shim-runc-v2": "hack/build-node.sh",
            found.containerd / "ctr": "hack/build-node.sh",
            found.crictl: "hack/build-node.sh",
            RUNC: "apt-get install runc (hack/build-node.sh does)",
            CNI_BIN / "bridge": "apt-get install containernetworking-plugins",
            CNI_BIN / "host-local": "apt-get install containernetworking-plugins",
            CNI_BIN / "loopback": "apt-get install containernetworking-plugins",
            BUSYBOX: "apt-get install busybox-static",
        }
        missing = [f"{path} ({how})" for path, how in wanted.items() if not path.exists()]
        for tool in ("ip", "nsenter", "mount", "umount", "iptables"):
            if shutil.which(tool) is None:
                missing.append(f"{tool} (apt-get install iproute2 util-linux iptables)")
        if missing:
            raise NodeError("a real node needs: " + "; ".join(missing))
        return found


def preflight() -> str:
    """Why no real node can run on this machine ("" when one can)."""
    if os.geteuid() != 0:
        return "a real node runs as root (kubelet, containerd, network namespaces, cgroups)"
    if not (CGROUP_FS / "memory").is_dir() and not (CGROUP_FS / "cgroup.controllers").exists():
        return f"no cgroup file system at {CGROUP_FS}"
    if shutil.which("ip") is None:
        return "ip (iproute2) not found"
    return ""


# The network -----------------------------------------------------------------------------------

# The host's end (the API server's address) and the node's end of the veth pair.
NODE_LINK = "10.201.0.0/30"


@dataclass
class NodeNetwork:
    """A network namespace for the node, joined to the host by a veth pair (`NODE_LINK`); the
    pods' bridge is made by CNI inside it."""

    name: str = "dra-gateway-node"
    host_ip: str = "10.201.0.1"
    node_ip: str = "10.201.0.2"
    prefix: int = 30
    pod_subnet: str = "10.202.0.0/24"

    @property
    def path(self) -> Path:
        return Path("/run/netns") / self.name

    @property
    def _host_link(self) -> str:
        return "dg-host0"

    def create(self) -> None:
        self.delete()
        _run(["ip", "netns", "add", self.name])
        try:
            _run(["ip", "link", "add", self._host_link, "type", "veth", "peer", "name",
                  "dg-node0", "netns", self.name])
            _run(["ip", "addr", "add", f"{self.host_ip}/{self.prefix}", "dev", self._host_link])
            _run(["ip", "link", "set", self._host_link, "up"])
            inside = ["ip", "-n", self.name]
            _run([*inside, "addr", "add", f"{self.node_ip}/{self.prefix}", "dev", "dg-node0"])
            _run([*inside, "link", "set", "dg-node0", "up"])
            _run([*inside, "link", "set", "lo", "up"])
            # Everything leaves the node towards the host end; nothing is forwarded further.
            _run([*inside, "route", "add", "default", "via", self.host_ip])
            # The host reaches the pods (the API server calls webhooks they serve) through the
            # node, which forwards between its end and the pods' bridge (a setting of the
            # namespace only).
            _run(["ip", "route", "add", self.pod_subnet, "via", self.node_ip,
                  "dev", self._host_link])
            _run([*self.enter(), "sysctl", "-q", "-w", "net.ipv4.ip_forward=1"])
        except BaseException:
            self.delete()
            raise

    def delete(self) -> None:
        _run(["ip", "link", "del", self._host_link], check=False)
        if self.path.exists():
            _run(["ip", "netns", "del", self.name], check=False)

    def enter(self) -> list[str]:
        """The command prefix that runs a program inside the namespace."""
        return ["nsenter", f"--net={self.path}", "--"]


# The node --------------------------------------------------------------------------------------

@dataclass
class RealNode:
    """containerd and a kubelet of `binaries`, registered with `plane` as Node `name`."""

    name: str
    plane: ControlPlane
    binaries: NodeBinaries
    network: NodeNetwork
    work: Path  # configs and logs
    feature_gates: Mapping[str, bool] = field(default_factory=dict)
    labels: Mapping[str, str] = field(default_factory=dict)
    # 3: the kubelet logs "Registered DRA plugin" (with the gRPC service it chose)
    kubelet_verbosity: int = 3
    # Run kube-proxy beside the kubelet (pods that talk to the API server need it).
    kube_proxy: bool = False
    # Registries ("HOST:PORT") containerd pulls from over plain HTTP (a hosts.toml each under
    # its `config_path`), as a node is set up for a registry inside the cluster's network.
    insecure_registries: Sequence[str] = ()
    # The address of the cluster's DNS (`clusterdns.ClusterDNS`) the kubelet gives pods, with
    # the search path of `CLUSTER_DOMAIN`; None: pods get no resolver.
    cluster_dns: str | None = None

    _processes: _Processes = field(init=False)
    _kernel: dict[str, str] = field(init=False, default_factory=dict)
    _kubelet: Process | None = field(init=False, default=None)
    _containerd: Process | None = field(init=False, default=None)
    _kube_proxy: Process | None = field(init=False, default=None)

    def __post_init__(self) -> None:
        self.work.mkdir(parents=True, exist_ok=True)
        (self.work / "logs").mkdir(exist_ok=True)
        self._processes = _Processes(self.work / "logs")

    # Paths a test or the node plugin needs

    @property
    def root_dir(self) -> Path:
        """The kubelet's --root-dir."""
        return STATE_ROOT / "kubelet"

    @property
    def plugins_dir(self) -> Path:
        return self.root_dir / "plugins"

    @property
    def registry_dir(self) -> Path:
        return self.root_dir / "plugins_registry"

    @property
    def pod_resources_socket(self) -> Path:
        return self.root_dir / "pod-resources" / "kubelet.sock"

    @property
    def cdi_dir(self) -> Path:
        """The folder containerd reads CDI specs from."""
        return STATE_ROOT / "cdi"

    @property
    def pod_logs_dir(self) -> Path:
        return STATE_ROOT / "pod-logs"

    @property
    def containerd_socket(self) -> Path:
        return RUN_ROOT / "containerd.sock"

    def log(self, name: str) -> Path:
        return self.work / "logs" / f"{name}.log"

    # Start and stop

    def __enter__(self) -> RealNode:
        try:
            self.start()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self, timeout_s: float = 120.0) -> None:
        if (RUN_ROOT / "containerd.sock").exists() or self._kubelet_cgroups_exist() or \
                DEVICE_PLUGINS.exists():
            # A node left by a run that was killed: clear it first (one node per machine; a
            # device manager checkpoint of another run would hand out its devices).
            self.cleanup()
        for folder in (STATE_ROOT, RUN_ROOT, self.cdi_dir, self.pod_logs_dir, self.root_dir):
            folder.mkdir(parents=True, exist_ok=True)
        self._make_cgroup_root()
        self._remember_kernel_settings()
        deadline = time.monotonic() + timeout_s
        self._start_containerd(deadline)
        self._import_image()
        self.start_kubelet(timeout_s=max(1.0, deadline - time.monotonic()))
        if self.kube_proxy:
            self._start_kube_proxy(deadline)

    def stop(self) -> None:
        """Stop everything and leave the machine as it was; never raises."""
        with contextlib.suppress(Exception):
            self.stop_kubelet()
        with contextlib.suppress(Exception):
            self.remove_all_pods()
        self._processes.stop(STOP_GRACE_S)
        self._containerd = self._kube_proxy = None
        self.cleanup()

    def cleanup(self) -> None:
        """Remove what a kubelet and containerd leave: shims, mounts, cgroups, folders, the
        kernel settings the kubelet changed."""
        self._kill_shims()
        self._unmount_under(STATE_ROOT, RUN_ROOT)
        self._remove_cgroups()
        for folder in (RUN_ROOT, STATE_ROOT, DEVICE_PLUGINS):
            shutil.rmtree(folder, ignore_errors=True)
        with contextlib.suppress(OSError):
            DEVICE_PLUGINS.parent.rmdir()  # only when nothing else is there
        self._restore_kernel_settings()

    def check(self) -> None:
        """Raise if containerd, the kubelet or kube-proxy exited."""
        for process in (self._containerd, self._kubelet, self._kube_proxy):
            if process is not None and process.popen.poll() is not None:
                raise NodeError(f"{process.name} exited with code {process.popen.returncode}",
                                log=process.log)

    # containerd

    def _containerd_config(self) -> Path:
        cni_dir = self.work / "cni"
        cni_dir.mkdir(exist_ok=True)
        (cni_dir / "10-dra-gateway-node.conflist").write_text(json.dumps({
            "cniVersion": "1.0.0", "name": "dra-gateway-node-pods",
            "plugins": [{
                "type": "bridge", "bridge": "dg-pods0", "isGateway": True, "ipMasq": False,
                "ipam": {"type": "host-local", "ranges": [[{"subnet": self.network.pod_subnet}]],
                         "routes": [{"dst": "0.0.0.0/0"}],
                         "dataDir": str(STATE_ROOT / "cni-ipam")},
            }]}, indent=2))
        runtime = "plugins.'io.containerd.cri.v1.runtime'"
        images = "plugins.'io.containerd.cri.v1.images'"
        text = f"""version = 3
root = "{STATE_ROOT / 'containerd'}"
state = "{RUN_ROOT / 'containerd'}"
disabled_plugins = ["io.containerd.nri.v1.nri"]

[grpc]
  address = "{self.containerd_socket}"

[ttrpc]
  address = "{RUN_ROOT / 'containerd.sock.ttrpc'}"

[{runtime}]
  enable_cdi = true
  cdi_spec_dirs = ["{self.cdi_dir}"]
  restrict_oom_score_adj = true
  netns_mounts_under_state_dir = true

[{runtime}.containerd]
  default_runtime_name = "runc"

[{runtime}.containerd.runtimes.runc]
  runtime_type = "io.containerd.runc.v2"

[{runtime}.containerd.runtimes.runc.options]
  BinaryName = "{RUNC}"
  SystemdCgroup = false

[{runtime}.cni]
  bin_dirs = ["{CNI_BIN}"]
  conf_dir = "{cni_dir}"

[{images}.pinned_images]
  sandbox = "{IMAGE}"

[{images}.registry]
  config_path = "{self._registry_hosts()}"
"""
        path = self.work / "containerd.toml"
        path.write_text(text)
        return path

    def _registry_hosts(self) -> Path:
        """containerd's registry hosts folder: `HOST:PORT/hosts.toml` for each insecure
        registry, pulled from over plain HTTP (other registries: containerd's defaults)."""
        folder = self.work / "certs.d"
        shutil.rmtree(folder, ignore_errors=True)
        folder.mkdir()
        for host in self.insecure_registries:
            (folder / host).mkdir()
            (folder / host / "hosts.toml").write_text(
                f'server = "http://{host}"\n\n'
                f'[host."http://{host}"]\n'
                '  capabilities = ["pull", "resolve"]\n'
                '  skip_verify = true\n')
        return folder

    def _start_containerd(self, deadline: float) -> None:
        config = self._containerd_config()
        env = {"PATH": f"{self.binaries.containerd}:{os.environ.get('PATH', '')}"}
        self._containerd = self._processes.start("containerd", [
            *self.network.enter(), str(self.binaries.containerd / "containerd"),
            "--config", str(config), "--log-level", "info"], env=env)
        self._wait("containerd's CRI", deadline, lambda: self.crictl(
            "info", check=False).returncode == 0)

    def ctr(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        return _run([str(self.binaries.containerd / "ctr"), "--address",
                     str(self.containerd_socket), "--namespace", "k8s.io", *args],
                    timeout=120, check=check)

    def crictl(self, *args: str, check: bool = True, timeout: float = 60.0
               ) -> subprocess.CompletedProcess[str]:
        return _run([str(self.binaries.crictl), "--runtime-endpoint",
                     f"unix://{self.containerd_socket}", "--timeout", "30s", *args],
                    timeout=timeout, check=check)

    def _import_image(self) -> None:
        archive = self.work / "busybox.oci.tar"
        if not archive.exists():
            ociarchive.busybox_image(archive, IMAGE, busybox=BUSYBOX)
        self.import_image(archive)

    def import_image(self, archive: Path) -> None:
        """Import an OCI archive into the node's image store (the CRI's namespace)."""
        self.ctr("images", "import", "--no-unpack=false", str(archive))

    # The kubelet

    def _kubelet_config(self) -> Path:
        config: dict[str, Any] = {
            "apiVersion": "kubelet.config.k8s.io/v1beta1", "kind": "KubeletConfiguration",
            "address": self.network.node_ip, "readOnlyPort": 0,
            "healthzBindAddress": "127.0.0.1", "healthzPort": 10248,
            # Only the host reaches the node's address, and the API server calls it without a
            # client certificate (`kubectl logs`): the kubelet's own API lets anyone in.
            "authentication": {"anonymous": {"enabled": True}, "webhook": {"enabled": False}},
            "authorization": {"mode": "AlwaysAllow"},
            "cgroupDriver": "cgroupfs", "cgroupRoot": f"/{CGROUP_ROOT}", "failSwapOn": False,
            "containerRuntimeEndpoint": f"unix://{self.containerd_socket}",
            "podLogsDir": str(self.pod_logs_dir), "resolvConf": "",
            # The machine's disk may be nearly full: never evict or collect images for it.
            "evictionHard": {"memory.available": "50Mi", "nodefs.available": "0%",
                             "imagefs.available": "0%", "nodefs.inodesFree": "0%"},
            "imageGCHighThresholdPercent": 100, "imageGCLowThresholdPercent": 99,
            "featureGates": dict(self.feature_gates),
            "syncFrequency": "5s", "nodeStatusUpdateFrequency": "4s",
            # cgroup v1 machines: from 1.35 the kubelet refuses them unless told.
            "failCgroupV1": False,
        }
        if self.cluster_dns is not None:
            config.update(clusterDNS=[self.cluster_dns], clusterDomain=CLUSTER_DOMAIN)
        path = self.work / "kubelet.yaml"
        path.write_text(yaml.safe_dump(config))
        return path

    def start_kubelet(self, timeout_s: float = 90.0) -> None:
        """Start (or start again) the kubelet and wait until its Node is Ready."""
        if self._kubelet is not None and self._kubelet.running():
            raise NodeError("the kubelet is already running")
        config = self._kubelet_config()
        labels = ",".join(f"{k}={v}" for k, v in sorted(self.labels.items()))
        self._kubelet = self._processes.start("kubelet", [
            *self.network.enter(), str(self.binaries.kubelet), "--config", str(config),
            "--kubeconfig", str(self.plane.admin_kubeconfig), "--hostname-override", self.name,
            "--node-ip", self.network.node_ip, "--root-dir", str(self.root_dir),
            "--cert-dir", str(self.work / "kubelet-pki"),
            *(["--node-labels", labels] if labels else []),
            f"--v={self.kubelet_verbosity}"], append=True)
        self._wait(f"Node {self.name} to be Ready", time.monotonic() + timeout_s,
                   self.node_ready, process=self._kubelet)

    def stop_kubelet(self) -> None:
        process = self._kubelet
        if process is None:
            return
        if process.popen.poll() is None:
            process.popen.send_signal(signal.SIGTERM)
            try:
                process.popen.wait(timeout=STOP_GRACE_S)
            except subprocess.TimeoutExpired:
                process.popen.kill()
                process.popen.wait()
        self._kubelet = None

    # kube-proxy

    def _start_kube_proxy(self, deadline: float) -> None:
        config = self.work / "kube-proxy.yaml"
        config.write_text(yaml.safe_dump({
            "apiVersion": "kubeproxy.config.k8s.io/v1alpha1", "kind": "KubeProxyConfiguration",
            "clientConnection": {"kubeconfig": str(self.plane.admin_kubeconfig)},
            "mode": "iptables", "hostnameOverride": self.name,
            "clusterCIDR": self.network.pod_subnet, "bindAddress": self.network.node_ip,
            "healthzBindAddress": "127.0.0.1:10256", "metricsBindAddress": "127.0.0.1:10249",
            # Connection tracking limits and timeouts are the machine's, not the namespace's:
            # leave them as they are.
            "conntrack": {"maxPerCore": 0, "min": 0, "tcpEstablishedTimeout": "0s",
                          "tcpCloseWaitTimeout": "0s"},
            "iptables": {"localhostNodePorts": False},
        }))
        process = self._processes.start("kube-proxy", [
            *self.network.enter(), str(self.binaries.kube_proxy), "--config", str(config),
            "--v=2"])
        self._kube_proxy = process

        def serving() -> bool:
            rules = _run([*self.network.enter(), "iptables", "-t", "nat", "-S", "KUBE-SERVICES"],
                         check=False).stdout
            return "default/kubernetes:https" in rules

        self._wait("kube-proxy's rules for the kubernetes Service", deadline, serving,
                   process=process)

    def kubelet_running(self) -> bool:
        return self._kubelet is not None and self._kubelet.running()

    def node_ready(self) -> bool:
        try:
            node = self.plane.api().get(path_of("v1", "nodes", name=self.name))
        except Exception:
            return False
        return any(c.get("type") == "Ready" and c.get("status") == "True"
                   for c in (node.get("status") or {}).get("conditions") or [])

    def kubelet_log(self) -> str:
        return self.log("kubelet").read_text(errors="replace")

    def logs(self) -> Iterator[tuple[str, Path]]:
        for name in ("containerd", "kubelet", "kube-proxy"):
            if self.log(name).exists():
                yield name, self.log(name)

    # Pods

    def container_log(self, namespace: str, pod: str, container: str) -> str:
        """What the container printed, read from the kubelet's pod log files (all restarts)."""
        found = sorted(self.pod_logs_dir.glob(f"{namespace}_{pod}_*/{container}/*.log"))
        lines: list[str] = []
        for path in found:
            for line in path.read_text(errors="replace").splitlines():
                # CRI log format: "<time> <stream> <P|F> <text>"
                parts = line.split(" ", 3)
                lines.append(parts[3] if len(parts) == 4 else "")
        return "\n".join(lines)

    def remove_all_pods(self) -> None:
        self.crictl("rmp", "--all", "--force", check=False, timeout=120)

    # Cleanup helpers

    def _wait(self, what: str, deadline: float, ready: Any, process: Process | None = None
              ) -> None:
        while True:
            self.check()
            if ready():
                return
            if time.monotonic() > deadline:
                log = (process or self._containerd)
                raise NodeError(f"timed out waiting for {what}", log=log.log if log else None)
            time.sleep(0.3)

    def _kill_shims(self) -> None:
        """containerd's shims outlive it by design; end those of this node (their pid files
        are in its state folder)."""
        tasks = RUN_ROOT / "containerd" / "io.containerd.runtime.v2.task"
        for name in ("shim.pid", "init.pid"):
            for pid_file in tasks.glob(f"*/*/{name}"):
                with contextlib.suppress(ValueError, OSError):
                    os.kill(int(pid_file.read_text().strip()), signal.SIGKILL)

    @staticmethod
    def _mount_points() -> list[str]:
        points = []
        with open("/proc/self/mountinfo") as f:
            for line in f:
                points.append(line.split()[4].replace("\\040", " "))
        return points

    def _unmount_under(self, *folders: Path) -> None:
        prefixes = tuple(f"{folder}/" for folder in folders)
        for _ in range(3):
            points = [p for p in self._mount_points()
                      if p.startswith(prefixes) or p in {str(f) for f in folders}]
            if not points:
                return
            for point in sorted(set(points), key=len, reverse=True):
                _run(["umount", "--lazy", point], check=False)

    def _cgroup_dirs(self) -> list[Path]:
        return [d / CGROUP_ROOT for d in CGROUP_FS.iterdir()
                if d.is_dir() and not d.is_symlink() and (d / CGROUP_ROOT).is_dir()]

    def _kubelet_cgroups_exist(self) -> bool:
        return CGROUP_FS.is_dir() and bool(self._cgroup_dirs())

    def _make_cgroup_root(self) -> None:
        for hierarchy in CGROUP_FS.iterdir():
            if not hierarchy.is_dir() or hierarchy.is_symlink() or \
                    not (hierarchy / "cgroup.procs").exists():
                continue
            folder = hierarchy / CGROUP_ROOT
            folder.mkdir(exist_ok=True)
            for name in ("cpuset.cpus", "cpuset.mems"):
                # cgroup v1's cpuset starts empty: a cgroup with no CPUs takes no process.
                if (folder / name).exists() and not (folder / name).read_text().strip():
                    (folder / name).write_text((hierarchy / name).read_text())

    def _remove_cgroups(self) -> None:
        for root in self._cgroup_dirs():
            folders = sorted((p for p in root.rglob("*") if p.is_dir()),
                             key=lambda p: len(p.parts), reverse=True)
            for folder in [*folders, root]:
                for _ in range(20):
                    try:
                        folder.rmdir()
                        break
                    except FileNotFoundError:
                        break
                    except OSError:
                        # Processes still leaving it: wait a little and retry.
                        time.sleep(0.1)

    def _remember_kernel_settings(self) -> None:
        for name in KERNEL_SETTINGS:
            with contextlib.suppress(OSError):
                self._kernel[name] = (Path("/proc/sys") / name).read_text().strip()

    def _restore_kernel_settings(self) -> None:
        for name, value in self._kernel.items():
            with contextlib.suppress(OSError):
                (Path("/proc/sys") / name).write_text(value)


def node_problems(node: RealNode) -> str:
    """The tails of the node's logs, for a failure message."""
    return "\n".join(f"--- {name} ---\n{log_tail(path, 25)}" for name, path in node.logs())
