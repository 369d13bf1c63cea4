"""Which pod group a pod belongs to (gpu/groups.py): the gateway's annotations, Kueue's pod
groups, LeaderWorkerSet; a group named without a usable size says what to fix."""

from __future__ import annotations

from typing import Any

import pytest

from dra_gateway.gpu.groups import GroupError, PodGroup, group_key, group_of, holder_key


def pod(labels: dict[str, str] | None = None, annotations: dict[str, str] | None = None,
        namespace: str = "ml") -> dict[str, Any]:
    return {"metadata": {"name": "p", "namespace": namespace, "labels": labels or {},
                         "annotations": annotations or {}}}


def test_a_pod_without_a_group_has_none() -> None:
    assert group_of(pod({"app": "x"})) is None
    # A LeaderWorkerSet's name alone (no group index) is no group of ours.
    assert group_of(pod({"leaderworkerset.sigs.k8s.io/name": "llm"})) is None


def test_the_gateway_annotations_name_a_group_and_its_size() -> None:
    found = group_of(pod(annotations={"dra-gateway.io/group": "train",
                                      "dra-gateway.io/group-size": "4"}))
    assert found == PodGroup("ml", "train", 4, "dra-gateway",
                             "annotations dra-gateway.io/group=train, "
                             "dra-gateway.io/group-size=4")
    assert found.key == ("ml", "dra-gateway", "train")


def test_kueue_pod_groups_are_read_from_their_label_and_count() -> None:
    found = group_of(pod({"kueue.x-k8s.io/pod-group-name": "job-1"},
                         {"kueue.x-k8s.io/pod-group-total-count": "3"}))
    assert isinstance(found, PodGroup)
    assert (found.name, found.size, found.source) == ("job-1", 3, "kueue")


def test_each_leaderworkerset_replica_is_a_group_of_its_size() -> None:
    labels = {"leaderworkerset.sigs.k8s.io/name": "llm",
              "leaderworkerset.sigs.k8s.io/group-index": "2"}
    found = group_of(pod(labels, {"leaderworkerset.sigs.k8s.io/size": "4"}))
    assert isinstance(found, PodGroup)
    assert (found.name, found.size, found.source) == ("llm-2", 4, "leaderworkerset")


def test_the_gateway_annotation_wins_over_other_sources() -> None:
    found = group_of(pod({"kueue.x-k8s.io/pod-group-name": "job-1"},
                         {"kueue.x-k8s.io/pod-group-total-count": "3",
                          "dra-gateway.io/group": "mine", "dra-gateway.io/group-size": "2"}))
    assert isinstance(found, PodGroup)
    assert (found.name, found.source) == ("mine", "dra-gateway")


@pytest.mark.parametrize(("annotations", "message"), [
    ({"dra-gateway.io/group": "g"}, "dra-gateway.io/group-size is missing: pod group g needs "
                                    "the number of its members"),
    ({"dra-gateway.io/group": "g", "dra-gateway.io/group-size": "x"},
     "dra-gateway.io/group-size is 'x', not a number of members"),
    ({"dra-gateway.io/group": "g", "dra-gateway.io/group-size": "0"},
     "dra-gateway.io/group-size is 0: a group has 1 to 10000 members"),
])
def test_a_group_without_a_usable_size_says_which_field(annotations: dict[str, str],
                                                        message: str) -> None:
    found = group_of(pod(annotations=annotations))
    assert isinstance(found, GroupError)
    assert message in found.message


def test_a_group_keeps_to_one_model_unless_it_allows_any() -> None:
    grouped = {"dra-gateway.io/group": "train", "dra-gateway.io/group-size": "2"}
    default = group_of(pod(annotations=grouped))
    assert isinstance(default, PodGroup)
    assert default.same_model
    same = group_of(pod(annotations={**grouped, "dra-gateway.io/group-models": "Same"}))
    assert same == default
    mixed = group_of(pod({"kueue.x-k8s.io/pod-group-name": "j"}, {
        "kueue.x-k8s.io/pod-group-total-count": "2", "dra-gateway.io/group-models": "Any"}))
    assert isinstance(mixed, PodGroup)
    assert not mixed.same_model
    assert mixed.why.endswith("; dra-gateway.io/group-models=Any")
    wrong = group_of(pod(annotations={**grouped, "dra-gateway.io/group-models": "any"}))
    assert isinstance(wrong, GroupError)
    assert wrong.message == ("dra-gateway.io/group-models is 'any': set 'Same' (every member "
                             "on one GPU model, the default) or 'Any' (members on any models)")


def _podgroups(found: dict[tuple[str, str, str], dict[str, Any]]):  # type: ignore[no-untyped-def]
    return lambda source, namespace, name: found.get((source, namespace, name))


def test_volcano_and_coscheduling_pods_are_sized_by_their_podgroups_min_member() -> None:
    lookup = _podgroups({("volcano", "ml", "train"): {"spec": {"minMember": 4}},
                         ("coscheduling", "ml", "infer"): {"spec": {"minMember": 2}},
                         ("volcano", "ml", "solo"): {"spec": {}}})
    volcano = pod(annotations={"scheduling.k8s.io/group-name": "train"})
    found = group_of(volcano, lookup)
    assert found == PodGroup("ml", "train", 4, "volcano",
                             "annotation scheduling.k8s.io/group-name=train, PodGroup ml/train "
                             "(scheduling.volcano.sh/v1beta1) spec.minMember=4")
    assert group_key(volcano) == ("ml", "volcano", "train")
    cosched = group_of(pod({"scheduling.x-k8s.io/pod-group": "infer"}), lookup)
    assert isinstance(cosched, PodGroup)
    assert (cosched.size, cosched.source) == (2, "coscheduling")
    assert "(scheduling.x-k8s.io/v1alpha1) spec.minMember=2" in cosched.why
    # No minMember (or 0): one member, as both schedulers read it.
    solo = group_of(pod(annotations={"scheduling.k8s.io/group-name": "solo"}), lookup)
    assert isinstance(solo, PodGroup)
    assert solo.size == 1
    assert solo.why.endswith("spec.minMember=unset (one member)")


def test_a_podgroup_that_is_missing_or_odd_says_what_to_fix() -> None:
    missing = group_of(pod(annotations={"scheduling.k8s.io/group-name": "gone"}),
                       _podgroups({}))
    assert missing == GroupError(
        "the pod's annotation scheduling.k8s.io/group-name=gone names PodGroup ml/gone "
        "(scheduling.volcano.sh/v1beta1), which does not exist: create it (with "
        "spec.minMember), or remove the pod's annotation scheduling.k8s.io/group-name")
    # Without a lookup (no cluster to read it from) the PodGroup is missing too.
    assert isinstance(group_of(pod({"scheduling.x-k8s.io/pod-group": "x"})), GroupError)
    odd = group_of(pod({"scheduling.x-k8s.io/pod-group": "x"}),
                   _podgroups({("coscheduling", "ml", "x"): {"spec": {"minMember": "many"}}}))
    assert isinstance(odd, GroupError)
    assert "PodGroup ml/x (scheduling.x-k8s.io/v1alpha1) spec.minMember is 'many', not a " \
        "number of members" in odd.message
    negative = group_of(pod({"scheduling.x-k8s.io/pod-group": "x"}),
                        _podgroups({("coscheduling", "ml", "x"): {"spec": {"minMember": -2}}}))
    assert isinstance(negative, GroupError)
    assert "spec.minMember is -2: a group has 1 to 10000 members" in negative.message


def test_a_group_may_require_one_node_domain() -> None:
    grouped = {"dra-gateway.io/group": "train", "dra-gateway.io/group-size": "2"}
    found = group_of(pod(annotations={**grouped,
                                      "dra-gateway.io/group-domain": "example.com/rack"}))
    assert isinstance(found, PodGroup)
    assert found.domain == "example.com/rack"
    assert found.why.endswith("; dra-gateway.io/group-domain=example.com/rack")
    wrong = group_of(pod(annotations={**grouped, "dra-gateway.io/group-domain": "a rack"}))
    assert isinstance(wrong, GroupError)
    assert "dra-gateway.io/group-domain is 'a rack', not a node label key" in wrong.message


def test_label_keys_as_the_api_server_takes_them() -> None:
    from dra_gateway.kube.objects import is_label_key

    for good in ("zone", "topology.kubernetes.io/zone", "example.com/rack-1", "a.b/C_d.e"):
        assert is_label_key(good), good
    for bad in ("", "a rack", "Example.com/rack", "/zone", "zone/", "-x", "a" * 64,
                "x" * 254 + "/zone"):
        assert not is_label_key(bad), bad


def test_upstream_pod_groups_are_sized_by_their_gang_policy() -> None:
    lookup = _podgroups({
        ("podgroup", "ml", "train"): {"spec": {"schedulingPolicy": {"gang": {"minCount": 4}}}},
        ("podgroup", "ml", "loose"): {"spec": {"schedulingPolicy": {"basic": {}}}},
        ("workload", "ml", "job"): {"spec": {"podGroups": [
            {"name": "workers", "policy": {"gang": {"minCount": 3}}},
            {"name": "driver", "policy": {"basic": {}}}]}}})
    # 1.36 on: the pod names its PodGroup.
    named = {"metadata": {"name": "p", "namespace": "ml"},
             "spec": {"schedulingGroup": {"podGroupName": "train"}}}
    found = group_of(named, lookup)
    assert found == PodGroup("ml", "train", 4, "podgroup",
                             "spec.schedulingGroup.podGroupName=train, PodGroup ml/train "
                             "(scheduling.k8s.io) spec.schedulingPolicy.gang.minCount=4")
    assert holder_key(named) == ("ml", "podgroup", "train")
    loose = group_of({**named, "spec": {"schedulingGroup": {"podGroupName": "loose"}}}, lookup)
    assert isinstance(loose, PodGroup)
    assert loose.size == 1
    # 1.35: the pod names its Workload and one of its pod groups, per replica.
    ref = {"metadata": {"name": "p", "namespace": "ml"}, "spec": {"workloadRef": {
        "name": "job", "podGroup": "workers", "podGroupReplicaKey": "r1"}}}
    workers = group_of(ref, lookup)
    assert isinstance(workers, PodGroup)
    assert (workers.name, workers.size, workers.source) == ("job/workers/r1", 3, "workload")
    assert group_key(ref) == ("ml", "workload", "job/workers/r1")
    assert holder_key(ref) == ("ml", "workload", "job")
    # The gateway's own annotations come first, Kueue's after upstream's.
    assert holder_key(pod(annotations={"dra-gateway.io/group": "x",
                                       "dra-gateway.io/group-size": "2"})) is None
    both = {**ref, "metadata": {**ref["metadata"],
                                "labels": {"kueue.x-k8s.io/pod-group-name": "k"}}}
    assert group_key(both) == ("ml", "workload", "job/workers/r1")


def test_an_upstream_group_that_is_missing_says_what_to_fix() -> None:
    missing = group_of({"metadata": {"name": "p", "namespace": "ml"},
                        "spec": {"schedulingGroup": {"podGroupName": "gone"}}}, _podgroups({}))
    assert missing == GroupError(
        "the pod's spec.schedulingGroup.podGroupName=gone names PodGroup ml/gone "
        "(scheduling.k8s.io), which does not exist: create it (with its gang policy's "
        "minCount), or remove the pod's spec.schedulingGroup.podGroupName")
    lookup = _podgroups({("workload", "ml", "job"): {"spec": {"podGroups": [
        {"name": "workers", "policy": {"gang": {"minCount": 0}}}]}}})
    ref = {"metadata": {"name": "p", "namespace": "ml"},
           "spec": {"workloadRef": {"name": "job", "podGroup": "driver"}}}
    no_member = group_of(ref, lookup)
    assert isinstance(no_member, GroupError)
    assert "names pod group driver, which Workload ml/job (scheduling.k8s.io/v1alpha1) does " \
        "not have: add it to spec.podGroups" in no_member.message
    zero = group_of({**ref, "spec": {"workloadRef": {"name": "job", "podGroup": "workers"}}},
                    lookup)
    assert isinstance(zero, GroupError)
    assert "policy.gang.minCount is 0: a group has 1 to 10000 members" in zero.message


def test_jobsets_and_kubeflow_jobs_are_sized_by_their_objects() -> None:
    lookup = _podgroups({
        ("jobset", "ml", "train"): {"spec": {"replicatedJobs": [
            {"name": "driver", "template": {"spec": {}}},
            {"name": "workers", "replicas": 2, "template": {"spec": {"parallelism": 4}}}]}},
        ("pytorchjob", "ml", "bert"): {"spec": {"pytorchReplicaSpecs": {
            "Master": {"replicas": 1}, "Worker": {"replicas": 3}}}},
        ("mpijob", "ml", "hpc"): {"spec": {"mpiReplicaSpecs": {
            "Launcher": {}, "Worker": {"replicas": 2}}}}})
    jobset = pod({"jobset.sigs.k8s.io/jobset-name": "train",
                  "jobset.sigs.k8s.io/restart-attempt": "0"})
    found = group_of(jobset, lookup)
    assert isinstance(found, PodGroup)
    assert (found.name, found.size, found.source) == ("train", 9, "jobset")
    assert found.why.endswith("JobSet ml/train (jobset.x-k8s.io/v1alpha2) spec.replicatedJobs: "
                              "9 pod(s) in all")
    # A restarted JobSet's pods are a group of their own, sized by the same JobSet.
    restarted = pod({"jobset.sigs.k8s.io/jobset-name": "train",
                     "jobset.sigs.k8s.io/restart-attempt": "2"})
    assert group_key(restarted) == ("ml", "jobset", "train/attempt-2")
    assert holder_key(restarted) == ("ml", "jobset", "train")

    def kubeflow(kind: str, job: str) -> dict[str, Any]:
        worker = pod({"training.kubeflow.org/job-name": job,
                      "training.kubeflow.org/replica-type": "worker"})
        worker["metadata"]["ownerReferences"] = [
            {"apiVersion": "kubeflow.org/v1", "kind": kind, "name": job, "controller": True}]
        return worker

    bert = group_of(kubeflow("PyTorchJob", "bert"), lookup)
    assert isinstance(bert, PodGroup)
    assert (bert.size, bert.source) == (4, "pytorchjob")
    hpc = group_of(kubeflow("MPIJob", "hpc"), lookup)
    assert isinstance(hpc, PodGroup)
    assert hpc.size == 3  # the launcher counts once by default
    # The label alone, without a Kubeflow controller, is no group.
    assert group_of(pod({"training.kubeflow.org/job-name": "bert"}), lookup) is None
    missing = group_of(kubeflow("TFJob", "gone"), lookup)
    assert isinstance(missing, GroupError)
    assert "names TFJob ml/gone (kubeflow.org/v1), which does not exist (or is not served)" \
        in missing.message
