"""`migrate plan`: namespaces, workloads, nodes, quotas and steps, from dumps or a live cluster."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest

from dra_gateway.cli import main
from dra_gateway.devkit.sim.memory import MemoryCluster
from dra_gateway.kube import names
from dra_gateway.kube.resources import by_kind
from dra_gateway.migrate.dumps import read_dumps
from dra_gateway.migrate.inventory import ClusterObjects
from dra_gateway.migrate.live import RESOURCE_QUOTAS, WORKLOAD_TYPES, read_cluster
from dra_gateway.migrate.plan import MigrationPlan, WorkloadPlan, build_plan
from dra_gateway.migrate.render import render_html, render_table
from dra_gateway.migrate.rules import rules_in_force
from dra_gateway.translator.explaining import MIG_SHARES_WHY
from dra_gateway.translator.rules import load_rules
from dra_gateway.translator.translate import translate

from .conftest import (
    LiveCluster,
    assert_valid_gpu_quota,
    deployment,
    namespace,
    pod,
    rules_config_map,
    scenario,
    write_dump,
)


def _plan(objects: list[dict[str, Any]], tmp_path: Path, **kwargs: Any) -> MigrationPlan:
    inventory = read_dumps([str(write_dump(tmp_path / "dump.yaml", objects))])
    return build_plan(inventory, rules_in_force(inventory.rule_config_maps), **kwargs)


def _workload(plan: MigrationPlan, ns: str, name: str) -> WorkloadPlan:
    (found,) = [w for w in plan.workloads if (w.namespace, w.name) == (ns, name)]
    return found


def test_each_namespace_has_its_mode_and_unlabelled_ones_the_default(tmp_path: Path) -> None:
    for default in ("enabled", "audit"):
        plan = _plan(scenario(), tmp_path, default_mode=default)
        modes = {n.name: (n.mode, n.source) for n in plan.namespaces}
        assert modes == {"ml": ("enabled", "label"), "team-a": (default, "default"),
                         "team-b": ("audit", "label"), "team-c": ("disabled", "label"),
                         "team-d": ("enabled", "label"), "team-e": ("unknown", "label")}


def test_an_unknown_mode_is_reported_with_its_fix(tmp_path: Path) -> None:
    plan = _plan(scenario(), tmp_path)
    problem = ("namespace team-e: label dra-gateway.io/translation='maybe' is none of enabled, "
               "audit, disabled; fix it: kubectl label namespace team-e "
               "dra-gateway.io/translation=audit --overwrite")
    assert problem in plan.notes
    odd = _workload(plan, "team-e", "odd")
    assert (odd.status, odd.why) == ("unknown-mode",
                                     f"admitted unchanged, with a warning: {problem}")


def test_pods_are_grouped_under_the_workload_that_owns_them(tmp_path: Path) -> None:
    plan = _plan(scenario(), tmp_path)
    infer = _workload(plan, "team-a", "infer")
    assert (infer.kind, infer.pods, infer.legacy_pods, infer.nodes) == (
        "Deployment", ("infer-7d9f-abcde",), ("infer-7d9f-abcde",), ("gpu-1",))
    # The Deployment is known, its ReplicaSet is not: the pod still lands under the Deployment.
    assert not [w for w in plan.workloads if w.kind == "ReplicaSet"]
    # A pod without GPU requests is no workload of the plan.
    assert not [w for w in plan.workloads if w.name == "web"]


def test_a_workload_says_which_pod_group_its_pods_belong_to(tmp_path: Path) -> None:
    objects = [namespace("ml"), pod("worker-0", "ml", {"nvidia.com/gpu": 2}, annotations={
        "kueue.x-k8s.io/pod-group-total-count": "3"},
        labels={"kueue.x-k8s.io/pod-group-name": "train"})]
    plan = _plan(objects, tmp_path)
    worker = _workload(plan, "ml", "worker-0")
    assert worker.group.startswith("pod group ml/train (kueue): 3 member(s) allocated together")
    text = render_table(plan)
    assert f"  {worker.group}\n" in text
    assert "pod group ml/train (kueue)" in render_html(plan)
    assert plan.to_dict()["workloads"][0]["group"] == worker.group


def test_the_dra_request_is_what_the_translator_makes_of_the_pod_template(
        tmp_path: Path) -> None:
    plan = _plan(scenario(), tmp_path)
    infer = _workload(plan, "team-a", "infer")
    (container,) = infer.containers
    assert container.legacy == {"nvidia.com/gpu": "1", "nvidia.com/gpumem": "4096",
                                "nvidia.com/gpucores": "30"}
    assert container.rule == "hami"
    template_pod = {"apiVersion": "v1", "kind": "Pod",
                    "metadata": {"name": "infer", "namespace": "team-a",
                                 "labels": {"app": "infer"}},
                    "spec": next(o for o in scenario() if o["kind"] == "Deployment")
                    ["spec"]["template"]["spec"]}
    (template,) = translate(template_pod, load_rules()).templates
    (request,) = template["spec"]["spec"]["devices"]["requests"]
    assert container.request == request["exactly"]
    assert infer.template == template["metadata"]["name"]
    assert (infer.status, infer.why) == (
        "translate", "translated into a DRA claim when its pods are created; 1 running pod(s) "
                     "were created before and keep their legacy requests until their controller "
                     "recreates them")


def test_a_namespace_whose_policy_serves_shares_with_mig_shows_mig_instances(
        tmp_path: Path) -> None:
    """As the webhook will translate them there: the HAMi share becomes the smallest MIG
    instances that hold it; a policy that does not parse is a note."""
    policy = {"apiVersion": names.API_VERSION, "kind": "GPUSharingPolicy",
              "metadata": {"name": "hardware"},
              "spec": {"namespaceSelector": {"matchLabels": {
                  "kubernetes.io/metadata.name": "team-a"}}, "shares": {"servedBy": "MIG"}}}
    broken = {**policy, "metadata": {"name": "broken"}, "spec": {"shares": {"servedBy": "X"}}}
    plan = _plan([*scenario(), policy, broken], tmp_path)
    (container,) = _workload(plan, "team-a", "infer").containers
    assert container.request["deviceClassName"] == names.MIG_CLASS
    assert MIG_SHARES_WHY in container.why
    assert any(n.startswith("GPUSharingPolicy broken: 1 error: spec.shares.servedBy")
               for n in plan.notes), plan.notes
    # Other namespaces keep their shares of a card.
    (other,) = _workload(_plan(scenario(), tmp_path), "team-a", "infer").containers
    assert other.request["deviceClassName"] == names.GPU_CLASS


@pytest.mark.parametrize(("ns", "name", "status", "why"), [
    ("team-b", "train", "audit", "admitted unchanged (audit mode)"),
    ("team-c", "old", "legacy", "namespace team-c is disabled: the webhook is never called; "
                                "once enabled it would be translated as shown"),
    ("team-d", "optout", "legacy", "its pods are annotated dra-gateway.io/translation: "
                                   "disabled: they stay legacy"),
    ("ml", "bad", "refused", 'pods are refused at creation: container "main": set '
                             "nvidia.com/gpumem or nvidia.com/gpumem-percentage, not both "
                             "(rule hami)"),
])
def test_what_stays_legacy_says_why(tmp_path: Path, ns: str, name: str, status: str,
                                    why: str) -> None:
    workload = _workload(_plan(scenario(), tmp_path), ns, name)
    assert workload.status == status
    assert workload.why.startswith(why)


def test_an_opt_out_the_namespace_does_not_grant_is_refused_at_creation(
        tmp_path: Path) -> None:
    objects = [namespace("a", "enabled"),
               pod("p", "a", {"nvidia.com/gpu": 1},
                   annotations={names.TRANSLATION_LABEL: "disabled"})]
    workload = _workload(_plan(objects, tmp_path), "a", "p")
    assert workload.status == "refused"
    assert workload.why == (
        'pods are refused at creation: pod a/p: metadata.annotations["dra-gateway.io/'
        'translation"] is "disabled", but namespace a does not let its pods opt out of '
        "translation (a legacy pod escapes the namespace's GPU policies); remove the "
        "annotation, or have a cluster administrator grant it: kubectl label namespace a "
        "dra-gateway.io/pod-opt-out=allowed")


def test_each_namespace_shows_what_its_pods_hold_in_each_world(tmp_path: Path) -> None:
    translated = pod("t", "a", {})
    translated["metadata"]["annotations"] = {names.ANNOTATION_TRANSLATED: json.dumps(
        {"containers": {"main": {"limits": {"nvidia.com/gpu": "2"}, "request": "main"}},
         "gated": True})}
    objects = [namespace("a", "enabled", opt_out=True), translated,
               pod("l", "a", {"nvidia.com/gpu": 1, "nvidia.com/gpumem": 4096,
                              "nvidia.com/gpucores": 30},
                   annotations={names.TRANSLATION_LABEL: "disabled"}),
               pod("done", "a", {"nvidia.com/gpu": 4}, phase="Succeeded")]
    plan = _plan(objects, tmp_path)
    (ns,) = [n for n in plan.namespaces if n.name == "a"]
    assert ns.legacy_usage == {"pods": 1, "devices": 1, "memory": 4096 << 20, "cores": 30}
    assert ns.translated_usage == {"pods": 1, "devices": 2, "memory": 0, "cores": 200}


@pytest.mark.parametrize(("mode", "annotation", "status", "why"), [
    ("enabled", "audit", "audit", "its pods are annotated dra-gateway.io/translation: audit"),
    ("audit", "enabled", "audit", "admitted unchanged (audit mode)"),
    ("enabled", "sometimes", "refused",
     # The webhook's own words.
     'pods are refused at creation: pod a/p: metadata.annotations["dra-gateway.io/translation"] '
     'is "sometimes", which is none of enabled, audit, disabled'),
    ("audit", "sometimes", "audit", "admitted unchanged (audit mode), with a warning"),
])
def test_a_pod_annotation_holds_its_own_pod_back_never_forward(
        tmp_path: Path, mode: str, annotation: str, status: str, why: str) -> None:
    objects = [namespace("a", mode, opt_out=True),
               pod("p", "a", {"nvidia.com/gpu": 1},
                   annotations={names.TRANSLATION_LABEL: annotation})]
    workload = _workload(_plan(objects, tmp_path), "a", "p")
    assert workload.status == status
    assert workload.why.startswith(why)


def test_a_rule_configmap_found_in_the_dump_is_in_force(tmp_path: Path) -> None:
    off = {"apiVersion": names.API_VERSION, "kind": "TranslationRules",
           "overrides": [{"rule": "nvidia-gpu", "enabled": False}]}
    objects = [*scenario(), rules_config_map("site", "dra-gateway", off)]
    plan = _plan(objects, tmp_path, rule_sources=("ConfigMap dra-gateway/site",))
    train = _workload(plan, "team-b", "train")
    assert train.status == "untranslated"
    (container,) = train.containers
    assert container.outcome == "no-rule"
    assert container.rule == ""


def test_nodes_show_legacy_plugins_pods_and_the_node_plugin_condition(tmp_path: Path) -> None:
    plan = _plan(scenario(), tmp_path)
    gpu1, gpu2 = plan.nodes
    assert (gpu1.name, gpu1.cut_over, dict(gpu1.legacy_plugins), gpu1.cards, gpu1.product) == (
        "gpu-1", False, {"nvidia.com/gpu": "8"}, 8, "H100")
    assert gpu1.legacy_pods == ("team-a/infer-7d9f-abcde", "team-c/old")
    assert gpu1.condition is None
    assert gpu2.done
    assert gpu2.condition == {"status": "True", "reason": "DRA",
                              "message": "every card published"}
    assert "cpu-1" not in [n.name for n in plan.nodes]


def test_the_steps_come_in_order_with_what_each_waits_for(tmp_path: Path) -> None:
    plan = _plan(scenario(), tmp_path, source="-f dump.yaml")
    audit, create, enable, cut = plan.steps
    assert [s.number for s in plan.steps] == [1, 2, 3, 4]
    # team-c is labelled disabled: kept out on purpose, the steps leave it so; team-a is
    # translated already by the webhook's default (enabled): it never goes back to audit.
    assert audit.actions == (
        "kubectl label namespace team-e dra-gateway.io/translation=audit --overwrite",)
    assert not any("team-c" in action for action in enable.actions)
    assert ("namespace team-c is labelled dra-gateway.io/translation=disabled and stays so in "
            "these steps; to move it too: kubectl label namespace team-c "
            "dra-gateway.io/translation=audit --overwrite, then enable it as step 3 says"
            ) in plan.notes
    assert ('fix Pod ml/bad, whose pods translation refuses: container "main": set '
            "nvidia.com/gpumem or nvidia.com/gpumem-percentage, not both (rule hami)"
            ) in audit.waits_for
    assert create.actions == ("dra-gateway migrate quotas -f dump.yaml | kubectl apply -f -",)
    assert create.waits_for[0] == ("GPUQuota team-a/gpus exists (kubectl get gpuquotas -n "
                                   "team-a)")
    assert "team-a: its GPUQuota exists (step 2)" in enable.waits_for
    assert cut.actions == ("dra-gateway migrate node gpu-1",)
    assert cut.waits_for[2] == ("gpu-1: 2 legacy pod(s) holding cards to end: "
                                "team-a/infer-7d9f-abcde, team-c/old")
    assert not any(s.done for s in plan.steps)


def test_a_cluster_moved_already_has_every_step_done(tmp_path: Path) -> None:
    objects = [namespace("a", "enabled"),
               pod("p", "a", {"nvidia.com/gpu": 1},
                   annotations={names.ANNOTATION_TRANSLATED: "{}"}),
               *[o for o in scenario() if o["metadata"]["name"] == "gpu-2"]]
    plan = _plan(objects, tmp_path)
    assert [s.done for s in plan.steps] == [True, True, True, True]
    assert _workload(plan, "a", "p").status == "translated"


def test_the_json_is_the_plan_and_its_gpu_quotas_are_valid(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    dump = write_dump(tmp_path / "dump.yaml", scenario())
    assert main(["migrate", "plan", "-f", str(dump), "-o", "json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert set(out) == {"defaultMode", "rules", "namespaces", "workloads", "nodes", "quotas",
                        "steps", "notes"}
    for quota in out["quotas"]["gpuQuotas"]:
        assert_valid_gpu_quota(quota)
    assert out["rules"] == ["built-in"]


def test_the_html_is_one_self_contained_page_with_everything_escaped(tmp_path: Path) -> None:
    objects = [*scenario(), namespace("x", "<script>alert(1)</script>"),
               pod("p", "x", {"nvidia.com/gpu": 1})]
    page = render_html(_plan(objects, tmp_path))
    assert page.startswith("<!DOCTYPE html>")
    assert "<script" not in page
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page
    assert not re.search(r"""(src|href)=|https?://|@import""", page)
    assert "team-a/infer-7d9f-abcde" in page
    assert "&amp;" not in page  # nothing escaped twice


def test_the_table_names_each_section(tmp_path: Path) -> None:
    table = render_table(_plan(scenario(), tmp_path))
    for heading in ("NAMESPACES", "WORKLOADS", "NODES", "QUOTAS", "STEPS", "NOTES"):
        assert f"\n{heading}\n" in table
    assert ("  container main: nvidia.com/gpu: 1, nvidia.com/gpucores: 30, nvidia.com/gpumem: "
            "4096 -> rule hami -> gpu.dra-gateway.io x1 memory=4Gi cores=30 "
            "enforcement=hami-core [translated]") in table


# Live -----------------------------------------------------------------------------------------


async def _load(memory: MemoryCluster, objects: list[dict[str, Any]]) -> None:
    types = {(rt.api_version, rt.kind): rt for rt in (RESOURCE_QUOTAS, *WORKLOAD_TYPES)}
    for obj in objects:
        rt = types.get((obj["apiVersion"], obj["kind"])) or by_kind(obj["apiVersion"],
                                                                    obj["kind"])
        await memory.create(rt, obj)


async def test_the_live_cluster_gives_the_plan_its_dump_gives(tmp_path: Path) -> None:
    memory = MemoryCluster()
    await _load(memory, scenario())
    live = await read_cluster(memory)
    await memory.close()
    dumped = read_dumps([str(write_dump(tmp_path / "dump.yaml", scenario()))])

    def plan_of(inventory: ClusterObjects) -> dict[str, Any]:
        return build_plan(inventory, rules_in_force(inventory.rule_config_maps)).to_dict()

    assert plan_of(live) == plan_of(dumped)


def test_the_command_reads_a_live_cluster_through_its_kubeconfig(
        live_cluster: LiveCluster, capsys: pytest.CaptureFixture[str]) -> None:
    # The embedded API serves no ResourceQuotas nor apps/batch: the plan says what it missed.
    served = [o for o in scenario() if o["kind"] in ("Namespace", "Pod", "Node")]
    live_cluster.load(served)
    assert main(["migrate", "plan", "--kubeconfig", str(live_cluster.kubeconfig),
                 "-o", "json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert {(w["kind"], w["namespace"], w["name"]) for w in out["workloads"]} >= {
        ("Deployment", "team-a", "infer"), ("Pod", "ml", "bad")}
    assert [n["name"] for n in out["nodes"]] == ["gpu-1", "gpu-2"]
    (note,) = [n for n in out["notes"] if n.startswith("the API does not serve")]
    assert "resourcequotas" in note
    assert "deployments.apps" in note


def test_files_and_a_kubeconfig_together_are_refused(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    dump = write_dump(tmp_path / "dump.yaml", scenario())
    assert main(["migrate", "quotas", "-f", str(dump), "--kubeconfig", "kc"]) == 2
    assert capsys.readouterr().err == ("error: give either -f FILE "
                                       "(offline) or --kubeconfig (live), not both\n")


def test_a_kubeconfig_that_does_not_exist_is_one_line_and_exit_2(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    missing = tmp_path / "nope"
    assert main(["migrate", "plan", "--kubeconfig", str(missing)]) == 2
    assert capsys.readouterr().err.startswith(
        f"error: kubeconfig {missing} does not exist")


def test_the_scenario_is_made_of_objects_an_api_server_would_hand_out() -> None:
    # So the plan is tested on what a real cluster's dump holds, not on shapes it never sees.
    for obj in scenario():
        kubernetes_validate.validate(obj, "1.34", strict=True)


def test_a_replicaset_and_a_job_stand_aside_for_the_deployment_and_cronjob_owning_them(
        tmp_path: Path) -> None:
    rs = deployment("web-5c8", "a", {"nvidia.com/gpu": 1})
    rs.update(kind="ReplicaSet")
    rs["metadata"]["ownerReferences"] = [{"apiVersion": "apps/v1", "kind": "Deployment",
                                          "name": "web", "uid": "u1", "controller": True}]
    job = deployment("nightly-2900", "a", {"nvidia.com/gpu": 1})
    job.update(apiVersion="batch/v1", kind="Job")
    job["metadata"]["ownerReferences"] = [{"apiVersion": "batch/v1", "kind": "CronJob",
                                           "name": "nightly", "uid": "u2", "controller": True}]
    cron = {"apiVersion": "batch/v1", "kind": "CronJob",
            "metadata": {"name": "nightly", "namespace": "a"},
            "spec": {"schedule": "0 0 * * *", "jobTemplate": {"spec": {
                "template": deployment("x", "a", {"nvidia.com/gpu": 2})["spec"]["template"]}}}}
    objects = [namespace("a", "enabled"), rs, job, cron,
               pod("web-5c8-x1", "a", {"nvidia.com/gpu": 1}, owner=("ReplicaSet", "web-5c8")),
               pod("nightly-2900-y", "a", {"nvidia.com/gpu": 1}, owner=("Job", "nightly-2900"))]
    plan = _plan(objects, tmp_path)
    found = {(w.kind, w.name): w.pods for w in plan.workloads}
    assert found == {("Deployment", "web"): ("web-5c8-x1",),
                     ("CronJob", "nightly"): ("nightly-2900-y",)}
    # The CronJob's own template (two cards) is what its next pods become.
    (container,) = _workload(plan, "a", "nightly").containers
    assert container.legacy == {"nvidia.com/gpu": "2"}


def test_namespaces_the_webhooks_leave_out_stay_legacy_and_get_no_step(tmp_path: Path) -> None:
    objects = [namespace("kube-system"), namespace("gpu-system"), namespace("ops"),
               pod("exporter", "kube-system", {"nvidia.com/gpu": 1}),
               pod("agent", "gpu-system", {"nvidia.com/gpu": 1}),
               pod("job", "ops", {"nvidia.com/gpu": 1})]
    plan = _plan(objects, tmp_path, excluded=("kube-system", "gpu-system"))
    modes = {n.name: (n.mode, n.source) for n in plan.namespaces}
    assert modes["kube-system"] == modes["gpu-system"] == ("disabled", "excluded")
    assert modes["ops"] == ("enabled", "default")
    for ns, name in (("kube-system", "exporter"), ("gpu-system", "agent")):
        workload = _workload(plan, ns, name)
        assert workload.status == "legacy"
        assert workload.why.startswith(f"namespace {ns} is left out of the gateway's webhooks")
    commands = [c for step in plan.steps for c in step.actions]
    assert not any("kube-system" in c or "gpu-system" in c for c in commands)
    assert any("label namespace ops" in c for c in commands)


def test_a_namespace_translated_by_the_default_is_never_told_to_go_back_to_audit(
        tmp_path: Path) -> None:
    objects = [namespace("ops"), pod("job", "ops", {"nvidia.com/gpu": 1})]
    for default, audit in (("enabled", False), ("audit", True)):
        plan = _plan(objects, tmp_path, default_mode=default)
        step = plan.steps[0]
        labelled = any("label namespace ops" in c and "=audit" in c for c in step.actions)
        assert labelled is audit, (default, step.actions)
        assert step.done is not audit, (default, step)
