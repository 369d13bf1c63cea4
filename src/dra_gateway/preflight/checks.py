"""The preflight's judgement of what was read (`reading.Facts`): one `Check` per thing the gateway
needs, in a fixed order, each with a severity and, where something is missing, the fix.

Pure: data in, data out; it must not read the cluster.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final, Literal

from dra_gateway.kube import names, objects
from dra_gateway.kube.node_setup import node_setup, runtime_reads_cdi
from dra_gateway.kube.nodeselectors import node_selector_matches
from dra_gateway.kube.quantity import QuantityError, parse_quantity
from dra_gateway.migrate.node import holds_legacy_cards
from dra_gateway.migrate.rules import holds_devices
from dra_gateway.preflight.reading import CERT_MANAGER_CRDS, MONITORING_CRDS, Facts
from dra_gateway.translator.rules import RuleSet, load_rules

Severity = Literal["ok", "info", "warning", "error"]
SEVERITIES: Final[tuple[Severity, ...]] = ("ok", "info", "warning", "error")
EXIT_CODES: Final[Mapping[Severity, int]] = {"ok": 0, "info": 0, "warning": 3, "error": 4}
SUPPORTED: Final = ((1, 34), (1, 38))  # the releases tested end to end, oldest and newest

# The chart's defaults for the node plugin's pods (helm/dra-gateway/values.yaml, nodePlugin;
# tests/test_preflight.py holds them equal), used where the chart is not installed.
CHART_NODE_SELECTOR: Final[Mapping[str, str]] = {}
CHART_AFFINITY: Final[Mapping[str, Any]] = {"nodeAffinity": {
    "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
        {"matchExpressions": [{"key": "nvidia.com/gpu.present", "operator": "In",
                               "values": ["true"]}]},
        {"matchExpressions": [{"key": "feature.node.kubernetes.io/pci-10de.present",
                               "operator": "In", "values": ["true"]}]}]}}}
CHART_TOLERATIONS: Final[Sequence[Mapping[str, str]]] = (
    {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"},)

# Legacy GPU device plugins, by a word of their DaemonSet's name or image.
LEGACY_PLUGIN_WORDS: Final = ("nvidia-device-plugin", "k8s-device-plugin", "hami-device-plugin",
                              "volcano-device-plugin", "vgpu-device-plugin", "gpushare",
                              "koord-device", "qgpu", "device-plugin")
AUDIT_FIRST: Final = ('install in audit first (docs/install.md, step 3, and docs/migrate.md): '
                      '--set webhook.translation.default=audit')
_SHOWN = 5  # names listed in a summary before "and N more"


@dataclass(frozen=True, slots=True)
class Item:
    """One node's (or object's) part of a check."""

    name: str
    severity: Severity
    message: str


@dataclass(frozen=True, slots=True)
class Check:
    name: str  # stable identifier, e.g. "dra-api"
    title: str
    severity: Severity
    summary: str
    fix: str = ""
    items: tuple[Item, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "title": self.title, "severity": self.severity,
                "summary": self.summary, "fix": self.fix,
                "items": [{"name": i.name, "severity": i.severity, "message": i.message}
                          for i in self.items]}


def worst(severities: Iterable[Severity]) -> Severity:
    return max(severities, key=SEVERITIES.index, default="ok")


def _listed(names_: Sequence[str]) -> str:
    shown = ", ".join(names_[:_SHOWN])
    return shown + (f" and {len(names_) - _SHOWN} more" if len(names_) > _SHOWN else "")


def judge(facts: Facts) -> list[Check]:
    """Every check, in order."""
    return [dra_api(facts), server_version(facts), feature_gates(facts),
            node_plugin_nodes(facts), node_setup_check(facts), monitoring(facts),
            cert_manager(facts), legacy_device_plugins(facts), legacy_pods(facts)]


def dra_api(facts: Facts) -> Check:
    title = "DRA resource.k8s.io/v1 served"
    if facts.served is None:
        return Check("dra-api", title, "warning", "unknown: API discovery could not be read ("
                     f"{facts.unread.get('discovery', '')})",
                     "check with kubectl api-resources --api-group=resource.k8s.io")
    versions = facts.served.get("resource.k8s.io", [])
    if "v1" in versions:
        return Check("dra-api", title, "ok", "resource.k8s.io/v1 is served")
    return Check("dra-api", title, "error",
                 f"resource.k8s.io/v1 is not served (served: {', '.join(versions) or 'none'})",
                 "Kubernetes 1.34 or later serves DRA v1 (GA, on by default)")


def _minor(version: Mapping[str, Any]) -> tuple[int, int] | None:
    try:
        return int(str(version.get("major"))), int(str(version.get("minor")).rstrip("+"))
    except ValueError:
        git = str(version.get("gitVersion") or "").lstrip("v").split(".")
        try:
            return int(git[0]), int(git[1])
        except (ValueError, IndexError):
            return None


def server_version(facts: Facts) -> Check:
    title = "Kubernetes version within 1.34-1.38"
    if facts.version is None:
        return Check("server-version", title, "warning", "unknown: GET /version could not be "
                     f"read ({facts.unread.get('discovery', '')})", "check with kubectl version")
    shown = str(facts.version.get("gitVersion") or "?")
    minor = _minor(facts.version)
    if minor is None:
        return Check("server-version", title, "warning", f"{shown}: not a version read here")
    if minor < SUPPORTED[0]:
        return Check("server-version", title, "error", f"{shown} is older than 1.34",
                     "upgrade to Kubernetes 1.34 or later (DRA v1)")
    if minor > SUPPORTED[1]:
        return Check("server-version", title, "warning", f"{shown} is newer than 1.38, the "
                     "newest release tested", "expect differences; report what you find")
    return Check("server-version", title, "ok", f"{shown}")


_FEATURE_SAYS: Final = {
    "DRAConsumableCapacity": ("shares of a card are native (allowMultipleAllocations)",
                              "the allocator records shares of a card itself (1.34, 1.35)"),
    "DRADeviceTaints": ("a failing card is tainted", "a failing card is withheld from its "
                        "slice and its Node's condition GpuDevicesUnhealthy says why"),
    "DRAPartitionableDevices": ("counter sets are kept (MIG instances are still published as "
                                "devices of their own)", "counter sets are dropped; MIG "
                                "instances are published as devices of their own"),
}


def feature_gates(facts: Facts) -> Check:
    title = "Feature gates the components detect"
    if not facts.features:
        return Check("feature-gates", title, "info", "not probed: DRA v1 is not served")
    items = []
    for gate, found in facts.features.items():
        on, off = _FEATURE_SAYS[gate]
        if found is None:
            why = facts.unread.get(gate) or facts.unread.get("feature probes") or (
                "the dry-run probe slice was refused")
            items.append(Item(gate, "warning", f"unknown ({why}); the components detect it "
                                               "themselves at start"))
        else:
            items.append(Item(gate, "info", f"{'on' if found else 'off'}: {on if found else off}"))
    severity = worst(i.severity for i in items)
    summary = ", ".join(f"{i.name} {i.message.split(':')[0]}" for i in items)
    fix = ("the probes need create on resourceslices (a dry run: nothing is stored)"
           if severity == "warning" else "")
    return Check("feature-gates", title, severity, summary, fix, tuple(items))


def _pod_template(facts: Facts) -> tuple[Mapping[str, Any], str]:
    """The node plugin's pod spec, and where it comes from."""
    if facts.node_plugin is not None:
        template = ((facts.node_plugin.get("spec") or {}).get("template") or {}).get("spec") or {}
        return template, f"DaemonSet {facts.namespace}/{objects.name(facts.node_plugin)}"
    return {"nodeSelector": CHART_NODE_SELECTOR, "affinity": CHART_AFFINITY,
            "tolerations": list(CHART_TOLERATIONS)}, "the chart's defaults (not installed)"


def _missing_labels(spec: Mapping[str, Any], labels: Mapping[str, str]) -> list[str]:
    """What a node lacks for `spec` to select it, in words."""
    missing = [f"{k}={v}" for k, v in sorted((spec.get("nodeSelector") or {}).items())
               if labels.get(k) != v]
    required = (((spec.get("affinity") or {}).get("nodeAffinity") or {})
                .get("requiredDuringSchedulingIgnoredDuringExecution"))
    if required and not node_selector_matches(required, name="", labels=labels):
        terms = []
        for term in required.get("nodeSelectorTerms") or ():
            parts = []
            for req in term.get("matchExpressions") or ():
                values = ",".join(req.get("values") or ())
                parts.append(f"{req.get('key')}={values}" if req.get("operator") == "In"
                             else f"{req.get('key')} {req.get('operator')} {values}".strip())
            terms.append(" and ".join(parts) or "a term matching no node")
        missing.append(" or ".join(terms))
    return missing


def _untolerated(spec: Mapping[str, Any], node: Mapping[str, Any]) -> list[str]:
    """The node's taints that keep the pod off (a DaemonSet's pods tolerate node.kubernetes.io
    conditions by themselves)."""
    tolerations = spec.get("tolerations") or ()
    out = []
    for taint in (node.get("spec") or {}).get("taints") or ():
        key, effect = str(taint.get("key") or ""), str(taint.get("effect") or "")
        if effect not in ("NoSchedule", "NoExecute") or key.startswith("node.kubernetes.io/"):
            continue
        if not any(_tolerates(t, taint) for t in tolerations):
            value = taint.get("value")
            out.append(f"{key}{'=' + str(value) if value else ''}:{effect}")
    return out


def _tolerates(toleration: Mapping[str, Any], taint: Mapping[str, Any]) -> bool:
    if toleration.get("effect") and toleration.get("effect") != taint.get("effect"):
        return False
    if toleration.get("operator") == "Exists":
        return not toleration.get("key") or toleration.get("key") == taint.get("key")
    return (toleration.get("key") == taint.get("key")
            and str(toleration.get("value") or "") == str(taint.get("value") or ""))


def _looks_like_gpu_node(node: Mapping[str, Any]) -> bool:
    status = node.get("status") or {}
    amounts = {**(status.get("capacity") or {}), **(status.get("allocatable") or {})}
    return any(k.startswith("nvidia.com/") for k in objects.labels(node)) or any(
        k.startswith("nvidia.com/") for k in amounts)


def selected_nodes(facts: Facts) -> tuple[list[str], list[Item], str]:
    """The nodes the node plugin's pods go to, an item per node, and where the placement was
    read from."""
    spec, source = _pod_template(facts)
    selected, items = [], []
    for node in sorted(facts.nodes, key=objects.name):
        name = objects.name(node)
        why = _missing_labels(spec, objects.labels(node))
        untolerated = _untolerated(spec, node)
        if not why and not untolerated:
            selected.append(name)
            items.append(Item(name, "ok", "selected"))
            continue
        reasons = ([f"missing label {' and '.join(why)}"] if why else []) + (
            [f"taint {', '.join(untolerated)} not tolerated"] if untolerated else [])
        severity: Severity = "warning" if _looks_like_gpu_node(node) else "info"
        items.append(Item(name, severity, "not selected: " + "; ".join(reasons)
                          + ("; it looks like a GPU node" if severity == "warning" else "")))
    return selected, items, source


def node_plugin_nodes(facts: Facts) -> Check:
    title = "Nodes the node plugin's DaemonSet selects"
    selected, items, source = selected_nodes(facts)
    if not selected:
        return Check("node-plugin-nodes", title, "error",
                     f"no node of {len(items)} is selected ({source})",
                     "label the GPU nodes: kubectl label node NODE nvidia.com/gpu.present=true, "
                     "or set nodePlugin.affinity and nodePlugin.nodeSelector to labels they "
                     "have", tuple(items))
    return Check("node-plugin-nodes", title, worst(i.severity for i in items),
                 f"{len(selected)} of {len(items)} node(s) selected ({source})",
                 "label GPU nodes nvidia.com/gpu.present=true (or tolerate their taints: "
                 "nodePlugin.tolerations)" if any(i.severity == "warning" for i in items)
                 else "", tuple(items))


def node_setup_check(facts: Facts) -> Check:
    title = "CDI and HAMi-core on the node plugin's nodes"
    selected, _, _ = selected_nodes(facts)
    by_name = {objects.name(n): n for n in facts.nodes}
    # Where the plugin runs: the nodes its pods go to, and any node a plugin reported on.
    running = sorted(set(selected) | {n for n, node in by_name.items()
                                      if node_setup(node) is not None})
    items = []
    for name in running:
        node = by_name[name]
        setup = node_setup(node)
        if setup is None:
            items.append(Item(name, "warning" if facts.chart_installed else "info",
                              "unknown: no node plugin reported here (condition "
                              "DraGatewayNodeSetup)"))
            continue
        runtime = str(((node.get("status") or {}).get("nodeInfo") or {})
                      .get("containerRuntimeVersion") or "")
        reads, why = runtime_reads_cdi(runtime, setup.cdi_dir)
        parts = [f"cdi {setup.cdi_dir} " + ("writable" if setup.cdi_writable else
                                            f"not writable ({setup.cdi_problem})"), why,
                 f"hami-core {setup.hami_core}" + (f" at {setup.hami_library}"
                                                   if setup.hami_core == "missing" else "")]
        severity: Severity = "ok"
        if not setup.cdi_writable or reads is False:
            severity = "error"
        elif reads is None:
            severity = "warning"
        elif setup.hami_core == "missing":
            severity = "info"
        items.append(Item(name, severity, "; ".join(parts)))
    if not items:
        return Check("node-setup", title, "info", "no node selected", items=())
    reported = sum(1 for i in items if not i.message.startswith("unknown"))
    severity = worst(i.severity for i in items)
    fix = {"error": "give the runtime CDI (containerd 2.0+, containerd 1.7 with enable_cdi, "
                    "CRI-O) reading nodePlugin.cdiDir, writable by the plugin",
           "warning": "install the chart (the node plugin reports each node), and check the "
                      "runtime's CDI configuration where it is not known",
           "info": "install HAMi-core's libvgpu.so at nodePlugin.hamiCore.hostPath on nodes "
                   "that take HAMi-core shares"}.get(severity, "")
    return Check("node-setup", title, severity,
                 f"{reported} of {len(items)} node(s) reported by the node plugin", fix,
                 tuple(items))


def _values(facts: Facts) -> Mapping[str, Any] | None:
    return (facts.release or {}).get("values") if facts.release else None


def _crds_check(name: str, title: str, facts: Facts, crds: Mapping[str, str], used: bool | None,
                what: str, fix: str) -> Check:
    present = {kind: facts.crds.get(crd) for kind, crd in crds.items()}
    missing = [crds[k] for k, found in present.items() if found is False]
    unknown = [crds[k] for k, found in present.items() if found is None]
    state = ("missing " + ", ".join(missing) if missing else
             "unknown (" + ", ".join(unknown) + " could not be read)" if unknown else
             "CRDs present")
    if used is None:
        return Check(name, title, "info", f"chart not installed; {state}",
                     f"{fix}, only where you set {what}" if missing else "")
    if not used:
        return Check(name, title, "info", f"not used by the installed chart ({what} unset); "
                                          f"{state}")
    if missing:
        return Check(name, title, "error", f"the installed chart uses {what}; {state}", fix)
    if unknown:
        return Check(name, title, "warning", f"the installed chart uses {what}; {state}")
    return Check(name, title, "ok", f"the installed chart uses {what}; {state}")


def monitoring(facts: Facts) -> Check:
    values = _values(facts)
    used = None
    if values is not None:
        wanted = values.get("monitoring") or {}
        used = bool(wanted.get("podMonitors") or wanted.get("prometheusRule"))
    return _crds_check("prometheus-operator", "Prometheus Operator CRDs", facts,
                       MONITORING_CRDS, used, "monitoring.podMonitors or "
                       "monitoring.prometheusRule", "install the Prometheus Operator's CRDs "
                       "(kube-prometheus-stack) or turn those values off")


def cert_manager(facts: Facts) -> Check:
    values = _values(facts)
    used = None
    if values is not None:
        used = (values.get("certificates") or {}).get("mode") == "cert-manager"
    return _crds_check("cert-manager", "cert-manager CRDs", facts, CERT_MANAGER_CRDS, used,
                       "certificates.mode=cert-manager", "install cert-manager first, or "
                       "use certificates.mode=helm")


def _legacy_amounts(amounts: Mapping[str, Any]) -> list[str]:
    out = []
    for key, value in sorted(amounts.items()):
        if not holds_devices(_rules(), str(key)):
            continue
        try:
            positive = parse_quantity(str(value)).sign() > 0
        except (QuantityError, ValueError):
            positive = False
        if positive:
            out.append(f"{key}: {value}")
    return out


@functools.cache
def _rules() -> RuleSet:
    """The built-in rules: which names a legacy device plugin offers."""
    return load_rules()


def legacy_device_plugins(facts: Facts) -> Check:
    title = "Legacy GPU device plugins"
    items = []
    for node in sorted(facts.nodes, key=objects.name):
        offered = _legacy_amounts((node.get("status") or {}).get("allocatable") or {})
        if offered and names.NODE_CUT_OVER_LABEL not in objects.labels(node):
            items.append(Item(objects.name(node), "warning", "offers " + ", ".join(offered)))
    for ds in sorted(facts.daemon_sets or (), key=objects.namespace_name):
        if objects.labels(ds).get("app.kubernetes.io/name") == "dra-gateway":
            continue
        containers = ((((ds.get("spec") or {}).get("template") or {}).get("spec") or {})
                      .get("containers") or ())
        words = [objects.name(ds), *(str(c.get("image") or "") for c in containers)]
        if any(w in text for w in LEGACY_PLUGIN_WORDS for text in words):
            image = words[1] if len(words) > 1 else "-"
            items.append(Item("/".join(objects.namespace_name(ds)), "warning",
                              f"DaemonSet of a device plugin ({image})"))
    unread = "" if facts.daemon_sets is not None else (
        f"; DaemonSets not read ({facts.unread.get('DaemonSets', '')})")
    if not items:
        return Check("legacy-device-plugins", title, "ok" if not unread else "info",
                     "no node offers a legacy GPU resource" + unread)
    return Check("legacy-device-plugins", title, "warning",
                 f"{len(items)} node(s) or DaemonSet(s) of a legacy device plugin" + unread,
                 AUDIT_FIRST, tuple(items))


def legacy_pods(facts: Facts) -> Check:
    title = "Pods holding legacy GPU resources"
    if facts.pods is None:
        return Check("legacy-pods", title, "warning",
                     f"unknown: pods not read ({facts.unread.get('pods', '')})")
    holding = sorted("/".join(objects.namespace_name(p)) for p in facts.pods
                     if holds_legacy_cards(p, _rules()))
    if not holding:
        return Check("legacy-pods", title, "ok", "no running pod holds a legacy GPU resource")
    return Check("legacy-pods", title, "warning",
                 f"{len(holding)} pod(s) hold legacy GPU resources: {_listed(holding)}",
                 AUDIT_FIRST)
