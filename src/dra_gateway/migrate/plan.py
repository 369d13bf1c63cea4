"""`migrate plan`: what the cluster's move to the gateway looks like before anything changes.

From a `ClusterObjects` and the rules in force it says, per namespace, its translation mode (label
`dra-gateway.io/translation`, else the chart's default); per workload (pods grouped by their
controller), each container's legacy requests, the rule that translates them and the DRA request
it would get, computed by the real translator (`translate` then `explain`), or why it stays
legacy; per node, the legacy device plugins, the legacy pods holding cards and the node
plugin's condition; the GPUQuota each legacy ResourceQuota becomes; and the steps in order, each
with what it waits for.

Pure: it reads data and returns data. It must not read files or a cluster, nor render.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import Any, Literal

from dra_gateway.kube import names, objects
from dra_gateway.migrate.inventory import WORKLOAD_KINDS, ClusterObjects, Object, namespace_of
from dra_gateway.migrate.node import NodeState, node_state, pod_legacy_requests
from dra_gateway.migrate.quotas import QuotaMigration, migrate_quotas
from dra_gateway.migrate.usage import usage_by_world
from dra_gateway.policy.catalog import Catalog
from dra_gateway.translator.explaining import ContainerExplanation, explain
from dra_gateway.translator.manifests import pod_specs
from dra_gateway.translator.rules import RuleSet
from dra_gateway.translator.translate import translate
from dra_gateway.webhook.translation import held_back

Mode = Literal["enabled", "audit", "disabled", "unknown"]
# The namespaces the chart's webhook configurations always leave out (with the release's own).
DEFAULT_EXCLUDED = ("kube-system", names.GATEWAY_NAMESPACE)
Status = Literal["translate", "audit", "legacy", "refused", "untranslated", "translated",
                 "unknown-mode"]


@dataclass(frozen=True, slots=True)
class NamespacePlan:
    name: str
    mode: Mode
    # Where the mode comes from: the label, the default, or the webhook configurations, which
    # leave kube-system, the gateway's own namespace and webhook.excludeNamespaces out (mode
    # "disabled").
    source: Literal["label", "default", "excluded"]
    label: str | None = None  # the label's value as written
    problem: str = ""  # an unknown label value, and the fix
    workloads: int = 0  # workloads with legacy GPU requests
    gpu_quotas: tuple[str, ...] = ()  # names of the GPUQuotas that exist
    # Whether its pods may hold themselves back from translation (label
    # dra-gateway.io/pod-opt-out=allowed, or the chart's webhook.translation.podOptOut).
    opt_out: bool = False
    # What its live GPU pods hold in GPUQuota terms, in each world: the pods a legacy device
    # plugin serves, and those translated into claims (policy.legacyusage, the rules in force).
    legacy_usage: Mapping[str, int] = field(default_factory=dict)
    translated_usage: Mapping[str, int] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class ContainerMigration:
    """What moving its namespace to translation does to one container asking for legacy
    resources (from the translator's explanation)."""

    name: str
    kind: str
    legacy: Mapping[str, str]  # legacy resource -> value (the limit, else the request)
    outcome: str  # the translator's: translated, shares-request, no-rule, refused...
    rule: str = ""
    request: Mapping[str, Any] | None = None  # the DRA request (`exactly`) it gets
    config: Mapping[str, Any] | None = None  # its GpuShareConfig parameters
    why: str = ""
    left: Mapping[str, str] = field(default_factory=dict)  # resource -> why it stays


@dataclass(frozen=True, slots=True)
class WorkloadPlan:
    namespace: str
    kind: str  # Deployment, StatefulSet, Job, CronJob, DaemonSet, ReplicaSet or Pod
    name: str
    status: Status
    why: str
    pods: tuple[str, ...] = ()  # its pods that run now
    legacy_pods: tuple[str, ...] = ()  # those of them still holding legacy requests
    nodes: tuple[str, ...] = ()
    template: str = ""  # the ResourceClaimTemplate its pods would use
    refusal: str = ""  # why a rule refuses its pods, whatever the namespace's mode
    containers: tuple[ContainerMigration, ...] = ()
    warnings: tuple[str, ...] = ()
    group: str = ""  # the pod group its pods belong to and why (gpu.groups.describe)


@dataclass(frozen=True, slots=True)
class Step:
    number: int
    title: str
    done: bool
    actions: tuple[str, ...]  # commands, in order
    waits_for: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class MigrationPlan:
    default_mode: str
    rules: tuple[str, ...]
    namespaces: tuple[NamespacePlan, ...]
    workloads: tuple[WorkloadPlan, ...]
    nodes: tuple[NodeState, ...]
    quotas: QuotaMigration
    steps: tuple[Step, ...]
    notes: tuple[str, ...] = ()
    gpu_quotas: tuple[Object, ...] = ()  # the GPUQuotas that exist

    def to_dict(self) -> dict[str, Any]:
        return {
            "defaultMode": self.default_mode,
            "rules": list(self.rules),
            "namespaces": [asdict(n) for n in self.namespaces],
            "workloads": [asdict(w) for w in self.workloads],
            "nodes": [n.to_dict() for n in self.nodes],
            "quotas": {**self.quotas.to_dict(),
                       "existing": [{"namespace": objects.namespace(q), "name": objects.name(q),
                                     "hard": objects.spec(q).get("hard")}
                                    for q in self.gpu_quotas]},
            "steps": [asdict(s) for s in self.steps],
            "notes": list(self.notes),
        }


def namespace_mode(name: str, ns: Mapping[str, Any] | None, default: str, *,
                   excluded: Collection[str] = (), pod_opt_out: str = "labelled"
                   ) -> NamespacePlan:
    """A namespace's translation mode: none where the webhooks never look (`excluded`), else
    its label, else the chart's default; `pod_opt_out` is the chart's
    webhook.translation.podOptOut (`labelled` or `everywhere`)."""
    labels = objects.labels(ns) if ns is not None else {}
    label = labels.get(names.TRANSLATION_LABEL)
    opt_out = pod_opt_out == "everywhere" or \
        labels.get(names.POD_OPT_OUT_LABEL) == names.POD_OPT_OUT_ALLOWED
    if name in excluded:
        return NamespacePlan(name, "disabled", "excluded", label, opt_out=opt_out)
    if label is None:
        return NamespacePlan(name, _mode(default), "default", opt_out=opt_out)
    if label in names.TRANSLATION_MODES:
        return NamespacePlan(name, _mode(label), "label", label, opt_out=opt_out)
    return NamespacePlan(
        name, "unknown", "label", label, opt_out=opt_out,
        problem=f"namespace {name}: label {names.TRANSLATION_LABEL}={label!r} is none of "
                f"{', '.join(names.TRANSLATION_MODES)}; fix it: kubectl label namespace {name} "
                f"{names.TRANSLATION_LABEL}=audit --overwrite")


def _mode(value: str) -> Mode:
    if value == names.TRANSLATION_ENABLED:
        return "enabled"
    if value == names.TRANSLATION_AUDIT:
        return "audit"
    if value == names.TRANSLATION_DISABLED:
        return "disabled"
    return "unknown"


def build_plan(inventory: ClusterObjects, rules: RuleSet, *, default_mode: str = "enabled",
               rule_sources: Sequence[str] = (), source: str = "",
               excluded: Collection[str] = DEFAULT_EXCLUDED,
               pod_opt_out: str = "labelled") -> MigrationPlan:
    """The plan for the cluster `inventory` describes, under `rules`.

    `source` is how the command line named the cluster (`-f dump.yaml`, `--kubeconfig FILE`),
    repeated in the commands the steps give; `excluded`: the namespaces the webhook
    configurations leave out (kube-system, the gateway's own, webhook.excludeNamespaces)."""
    listed = {objects.name(ns): ns for ns in inventory.namespaces}
    modes = {n: namespace_mode(n, listed.get(n), default_mode, excluded=excluded,
                               pod_opt_out=pod_opt_out)
             for n in inventory.namespace_names()}
    # Where the sharing policies serve shares with MIG instances, the webhook translates them
    # so (a policy that does not parse is in the notes, as the webhook logs it).
    sharing = Catalog.build(sharing=inventory.sharing_policies, namespaces=inventory.namespaces)
    mig_namespaces = frozenset(n for n in inventory.namespace_names()
                               if sharing.sharing_for(n).mig_shares)
    workloads = _workloads(inventory, rules, modes, mig_namespaces)
    quotas = migrate_quotas(inventory, rules)
    gpu_quotas: dict[str, list[str]] = {}
    for q in inventory.gpu_quotas:
        gpu_quotas.setdefault(namespace_of(q), []).append(objects.name(q))
    usage = usage_by_world(inventory.pods, rules)
    namespaces = tuple(
        replace(p, workloads=sum(1 for w in workloads if w.namespace == p.name),
                gpu_quotas=tuple(sorted(gpu_quotas.get(p.name, ()))),
                legacy_usage=usage.get((p.name, "legacy"), {}),
                translated_usage=usage.get((p.name, "translated"), {}))
        for p in modes.values())
    nodes = _nodes(inventory, rules)
    steps = _steps(namespaces, workloads, nodes, quotas, source)
    notes = list(inventory.notes)
    notes.extend(sharing.errors)
    notes.extend(p.problem for p in namespaces if p.problem)
    notes.extend(
        f"namespace {p.name} is labelled {names.TRANSLATION_LABEL}={names.TRANSLATION_DISABLED} "
        f"and stays so in these steps; to move it too: "
        f"{_label(p.name, names.TRANSLATION_AUDIT)}, then enable it as step 3 says"
        for p in namespaces if p.workloads and p.source == "label" and p.mode == "disabled")
    return MigrationPlan(default_mode=default_mode, rules=tuple(rule_sources),
                         namespaces=namespaces, workloads=workloads, nodes=nodes, quotas=quotas,
                         steps=steps, notes=tuple(notes),
                         gpu_quotas=tuple(sorted(inventory.gpu_quotas,
                                                 key=objects.namespace_name)))


# Workloads ------------------------------------------------------------------------------------


def _controller(obj: Mapping[str, Any]) -> tuple[str, str] | None:
    refs = objects.owner_references(obj)
    chosen = next((r for r in refs if r.get("controller")), refs[0] if refs else None)
    if chosen is None:
        return None
    return str(chosen.get("kind") or ""), str(chosen.get("name") or "")


def _owner(pod: Mapping[str, Any], known: Mapping[tuple[str, str, str], Object]
           ) -> tuple[str, str]:
    """The workload a pod belongs to: its controller's controller where there is one
    (ReplicaSet -> Deployment, Job -> CronJob), else the pod itself."""
    ns = namespace_of(pod)
    owner = _controller(pod)
    if owner is None:
        return "Pod", objects.name(pod)
    kind, name = owner
    if kind in ("ReplicaSet", "Job"):
        parent_obj = known.get((ns, kind, name))
        parent = _controller(parent_obj) if parent_obj is not None else None
        if parent is not None:
            return parent
        template_hash = objects.labels(pod).get("pod-template-hash")
        if kind == "ReplicaSet" and template_hash and name.endswith(f"-{template_hash}"):
            # The ReplicaSet itself is not in the dump: its name is the Deployment's and hash.
            return "Deployment", name[:-len(template_hash) - 1]
    return kind, name


def _newest(workload: Mapping[str, Any]) -> tuple[int, str]:
    """Sorts a controller's children oldest first: by Deployment revision, then creation."""
    revision = objects.annotations(workload).get("deployment.kubernetes.io/revision", "")
    return (int(revision) if revision.isdigit() else 0,
            str(objects.meta(workload).get("creationTimestamp") or ""))


def _template_pod(workload: Object) -> Object | None:
    """A pod as the workload's controller would create it (the first pod template)."""
    for _, template in pod_specs(workload):
        meta = dict(template.get("metadata") or {})
        meta["name"] = objects.name(workload)
        meta["namespace"] = namespace_of(workload)
        return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": template["spec"]}
    return None


def _workloads(inventory: ClusterObjects, rules: RuleSet,
               modes: Mapping[str, NamespacePlan],
               mig_namespaces: Collection[str] = frozenset()) -> tuple[WorkloadPlan, ...]:
    known = {(namespace_of(w), str(w.get("kind")), objects.name(w)): w
             for w in inventory.workloads}
    pods_of: dict[tuple[str, str, str], list[Object]] = {}
    for pod in inventory.pods:
        if objects.status(pod).get("phase") in ("Succeeded", "Failed"):
            continue
        kind, name = _owner(pod, known)
        pods_of.setdefault((namespace_of(pod), kind, name), []).append(pod)
    keys = set(pods_of)
    templates: dict[tuple[str, str, str], Object] = {}
    for key, workload in sorted(known.items(), key=lambda kv: _newest(kv[1])):
        owner = _controller(workload)
        if owner is not None and owner[0] in WORKLOAD_KINDS:
            # A Deployment's ReplicaSet, a CronJob's Job: its owner stands for it, and when the
            # owner is not in the inventory the newest child's template is the owner's.
            target = (key[0], *owner)
            keys.add(target)
            if target not in known:
                templates[target] = workload
            continue
        keys.add(key)
        templates[key] = workload
    out = []
    for key in sorted(keys):
        pods = sorted(pods_of.get(key, ()), key=objects.name)
        owner_obj = templates.get(key)
        sample = _template_pod(owner_obj) if owner_obj is not None else None
        if sample is None and pods:
            sample = pods[0]
        if sample is None:
            continue
        plan = _workload(key, sample, pods, rules, modes[key[0]],
                         mig_shares=key[0] in mig_namespaces)
        if plan is not None:
            out.append(plan)
    return tuple(out)


def _workload(key: tuple[str, str, str], sample: Object, pods: Sequence[Object],
              rules: RuleSet, mode: NamespacePlan, *,
              mig_shares: bool = False) -> WorkloadPlan | None:
    ns, kind, name = key
    translation = translate(sample, rules, mig_shares=mig_shares)
    explanation = explain(sample, rules, plan=translation)
    containers = tuple(_container(c, sample, rules) for c in explanation.containers)
    containers = tuple(c for c in containers if c.legacy)
    legacy_pods = tuple(objects.name(p) for p in pods
                        if names.ANNOTATION_TRANSLATED not in objects.annotations(p)
                        and pod_legacy_requests(p, rules))
    if not containers and explanation.outcome != "translated-before" and not legacy_pods:
        return None  # no GPU requests the gateway knows of
    status, why = _status(mode, sample, explanation.outcome, explanation.refusal, containers)
    if legacy_pods and status == "translate":
        why += (f"; {len(legacy_pods)} running pod(s) were created before and keep their legacy "
                "requests until their controller recreates them")
    return WorkloadPlan(
        namespace=ns, kind=kind, name=name, status=status, why=why,
        pods=tuple(objects.name(p) for p in pods), legacy_pods=legacy_pods,
        nodes=tuple(sorted({str(objects.spec(p).get("nodeName")) for p in pods
                            if objects.spec(p).get("nodeName")})),
        template=explanation.template, refusal=explanation.refusal, containers=containers,
        warnings=tuple(translation.warnings), group=explanation.group)


def _container(explained: ContainerExplanation, pod: Mapping[str, Any],
               rules: RuleSet) -> ContainerMigration:
    legacy: dict[str, str] = {}
    for key in ("initContainers", "containers"):
        for c in objects.spec(pod).get(key) or ():
            if str(c.get("name", "")) == explained.name:
                legacy.update(pod_legacy_requests({"spec": {"containers": [c]}}, rules))
    return ContainerMigration(
        name=explained.name, kind=explained.kind, legacy=legacy, outcome=explained.outcome,
        rule=explained.rule, request=explained.device, config=explained.config,
        why=explained.why, left={x.resource: x.reason for x in explained.left})


def _status(mode: NamespacePlan, sample: Mapping[str, Any], outcome: str, refusal: str,
            containers: Sequence[ContainerMigration]) -> tuple[Status, str]:
    """What happens to the workload's pods, decided as the webhook decides (`held_back`), so
    that the plan cannot disagree with admission."""
    if outcome == "translated-before":
        return "translated", (f"already translated (annotation {names.ANNOTATION_TRANSLATED}): "
                              "its pods use DRA claims")
    if mode.source == "excluded":
        return "legacy", (f"namespace {mode.name} is left out of the gateway's webhooks "
                          "(kube-system, the gateway's own namespace and "
                          "webhook.excludeNamespaces): its pods stay legacy")
    if mode.mode == "disabled":
        return "legacy", (f"namespace {mode.name} is disabled: the webhook is never called; "
                          f"once enabled it would {_would(outcome, refusal, containers)}")
    held = held_back(sample, mode.name, mode.mode, namespace_label=mode.label,
                     opt_out=mode.opt_out)
    if held.refusal is not None:
        return "refused", f"pods are refused at creation: {held.refusal}"
    if mode.mode == "unknown":
        return "unknown-mode", f"admitted unchanged, with a warning: {mode.problem}"
    if held.mode == names.TRANSLATION_DISABLED:
        return "legacy", (f"its pods are annotated {names.TRANSLATION_LABEL}: "
                          f"{names.TRANSLATION_DISABLED}: they stay legacy")
    if held.bad_annotation:
        return "audit", f"admitted unchanged (audit mode), with a warning: {held.bad_annotation}"
    if outcome == "refused":
        when = ("pods are refused at creation" if held.mode == names.TRANSLATION_ENABLED else
                "admitted now (audit); refused at creation once the namespace is enabled")
        return "refused", f"{when}: {refusal}"
    if outcome != "translated":
        return "untranslated", _would(outcome, refusal, containers)
    if mode.mode == names.TRANSLATION_AUDIT:
        return "audit", ("admitted unchanged (audit mode); the webhook's warnings say what "
                         "enabling the namespace makes of it, as shown here")
    if held.mode == names.TRANSLATION_AUDIT:
        return "audit", (f"its pods are annotated {names.TRANSLATION_LABEL}: "
                         f"{names.TRANSLATION_AUDIT}: admitted unchanged, the webhook's "
                         "warnings say what translation would make of them, as shown here")
    return "translate", "translated into a DRA claim when its pods are created"


def _would(outcome: str, refusal: str, containers: Sequence[ContainerMigration]) -> str:
    if outcome == "refused":
        return f"be refused: {refusal}"
    if outcome == "translated":
        return "be translated as shown"
    whys = [f"{c.name}: {c.why}" for c in containers if c.why]
    return "stay legacy: " + ("; ".join(whys) if whys else "no rule translates it")


# Nodes ----------------------------------------------------------------------------------------


def _nodes(inventory: ClusterObjects, rules: RuleSet) -> tuple[NodeState, ...]:
    by_node: dict[str, list[Object]] = {}
    for pod in inventory.pods:
        node = objects.spec(pod).get("nodeName")
        if node:
            by_node.setdefault(str(node), []).append(pod)
    out = []
    for node in sorted(inventory.nodes, key=objects.name):
        state = node_state(node, by_node.get(objects.name(node), ()), rules)
        if state.relevant:
            out.append(state)
    return tuple(out)


# Steps ----------------------------------------------------------------------------------------


def _label(ns: str, mode: str) -> str:
    return f"kubectl label namespace {ns} {names.TRANSLATION_LABEL}={mode} --overwrite"


def _steps(namespaces: Sequence[NamespacePlan], workloads: Sequence[WorkloadPlan],
           nodes: Sequence[NodeState], quotas: QuotaMigration, source: str
           ) -> tuple[Step, ...]:
    # A namespace labelled disabled was kept out on purpose (step 1 of the walk in
    # docs/migrate.md): the steps leave it so, and the plan's notes say how to move it when its
    # administrator wants.
    moving = [n for n in namespaces if n.workloads and n.source != "excluded"
              and not (n.source == "label" and n.mode == "disabled")]
    refused = [w for w in workloads
               if (w.refusal or w.status == "refused") and w.status != "translated"]
    refusals = tuple(f"fix {w.kind} {w.namespace}/{w.name}, whose pods translation refuses: "
                     f"{w.refusal or w.why}" for w in refused)

    # A namespace translated already (labelled enabled, or by an enabled default) never goes
    # back to audit; one in audit by the default gets the label, so the default may change.
    to_audit = [n for n in moving if n.mode != "enabled"
                and (n.mode != "audit" or n.source == "default")]
    audit = Step(1, "Put the namespaces in audit mode", not to_audit,
                 tuple(_label(n.name, names.TRANSLATION_AUDIT) for n in to_audit),
                 ("the webhook's warnings on new pods in each namespace match this plan",
                  *refusals))

    to_create = [c for c, e in zip(quotas.conversions, quotas.existing, strict=True)
                 if c.gpu_quota is not None and (e is None or objects.spec(e).get("hard")
                                                 != c.gpu_quota["spec"]["hard"])]
    create = Step(
        2, "Create the GPUQuotas", not to_create,
        (" ".join(p for p in ("dra-gateway migrate quotas", source, "| kubectl apply -f -") if p),)
        if to_create else (),
        tuple(f"GPUQuota {c.namespace}/{c.name} exists (kubectl get gpuquotas -n {c.namespace})"
              for c in to_create)
        + tuple(f"review: {w}" for w in quotas.warnings))

    to_enable = [n for n in moving if n.mode != "enabled" or n.source == "default"]
    quota_namespaces = {c.namespace for c in to_create}
    enable_waits: list[str] = []
    for n in to_enable:
        if n.name in quota_namespaces:
            enable_waits.append(f"{n.name}: its GPUQuota exists (step 2)")
        blocked = [w for w in refused if w.namespace == n.name]
        if blocked:
            enable_waits.append(f"{n.name}: {len(blocked)} workload(s) whose pods translation "
                                "refuses are fixed")
    enable_waits.append("translated pods wait, gated, until a cut-over node publishes cards "
                        "to the gateway (step 4)")
    enable = Step(3, "Enable translation namespace by namespace", not to_enable,
                  tuple(_label(n.name, names.TRANSLATION_ENABLED) for n in to_enable),
                  tuple(enable_waits))

    pending = [n for n in nodes if not n.done]
    cut = Step(4, "Cut the nodes over one by one", not pending,
               tuple(f"dra-gateway migrate node {n.name}" for n in pending),
               tuple(f"{n.name}: {w}" for n in pending for w in n.waits_for))
    return (audit, create, enable, cut)
