"""The report: usage against quota, who holds each card, slivers, pending pods, the picture."""

from __future__ import annotations

import re
from typing import Any

import pytest

from dra_gateway.kube import names
from dra_gateway.policy.catalog import Catalog
from dra_gateway.policy.report import QUOTA_CONDITION, build_report, render_html, render_table

from .conftest import allocated, card, quota, share_spec


def _slice() -> dict[str, Any]:
    return {"spec": {"driver": names.DRIVER, "nodeName": "node-a",
                     "pool": {"name": "node-a", "generation": 1, "resourceSliceCount": 1},
                     "devices": [card("gpu-0"), card("gpu-1")]}}


def _claims() -> list[dict[str, Any]]:
    first = allocated(share_spec("70Gi", 50), ("gpu-0", {"memory": "70Gi", "cores": "50"}))
    first["metadata"].update(name="a", uid="a", ownerReferences=[{"kind": "Pod",
                                                                  "name": "train-0"}])
    second = allocated(share_spec("10Gi", 30), ("gpu-0", {"memory": "10Gi", "cores": "30"}),
                       namespace="team-b")
    second["metadata"].update(name="b", uid="b")
    return [first, second]


def _pending() -> tuple[dict[str, Any], dict[str, Any]]:
    pod = {"metadata": {"name": "train-1", "namespace": "team-a"},
           "spec": {"schedulingGates": [{"name": names.SCHEDULING_GATE}],
                    "resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": "t"}]},
           "status": {"phase": "Pending", "conditions": [
               {"type": QUOTA_CONDITION, "status": "True"}]}}
    template = {"metadata": {"name": "t", "namespace": "team-a"},
                "spec": {"spec": share_spec("20Gi", 30)}}
    return pod, template


def _report() -> dict[str, Any]:
    pod, template = _pending()
    return build_report(claims=_claims(), slices=[_slice()], pods=[pod], templates=[template],
                        catalog=Catalog.build(quotas=[quota(memory="80Gi", cores=100)]))


def test_the_report_counts_usage_holders_slivers_and_waits() -> None:
    report = _report()
    assert report["quotas"] == [{"namespace": "team-a", "name": "team-a-gpu",
                                 "hard": {"memory": "80Gi", "cores": 100},
                                 "used": {"memory": "70Gi", "cores": 50}}]
    gpu0, gpu1 = report["cards"]
    assert [(h["namespace"], h["pod"] or h["claim"]) for h in gpu0["holders"]] == [
        ("team-a", "train-0"), ("team-b", "b")]
    assert gpu0["free"] == {"memory": 0, "cores": 20}
    assert gpu1["holders"] == []
    # gpu-0 has 20% compute left and no memory: too small for the pending 20Gi share.
    assert report["fragmentation"]["slivers"] == [{"node": "node-a", "device": "gpu-0",
                                                   "memory": 0, "cores": 20}]
    assert report["pending"] == {"QuotaExceeded": 1}


def test_the_table_shows_used_over_hard() -> None:
    table = render_table(_report())
    assert "team-a               team-a-gpu               memory 70Gi/80Gi, cores 50/100" in table
    assert "PENDING: QuotaExceeded=1" in table


def test_the_html_is_self_contained_and_colours_shares_by_namespace() -> None:
    page = render_html(_report())
    assert re.findall(r'(?:src|href)="', page) == []
    assert "http" not in page.replace('xmlns="http://www.w3.org/2000/svg"', "")
    fills = set(re.findall(r'fill="(hsl\([^"]+\))"', page))
    assert len(fills) == 2  # team-a and team-b
    assert "team-a/train-0: 70Gi, 50% compute" in page


def test_fragmentation_per_node_counts_what_no_pending_request_can_use() -> None:
    frag = _report()["fragmentation"]
    assert frag["nodes"] == [{"node": "node-a", "freeMemory": 80 << 30, "freeCores": 120,
                              "strandedMemory": 0, "strandedCores": 20, "slivers": 1}]
    assert "STRANDED CORES" in render_table(_report())
    # Only whole cards pending: every free sliver of a held card is stranded.
    pod, _ = _pending()
    whole = {"metadata": {"name": "t", "namespace": "team-a"},
             "spec": {"spec": {"devices": {"requests": [{"name": "gpu", "exactly": {
                 "deviceClassName": names.GPU_CLASS, "count": 1}}]}}}}
    report = build_report(claims=_claims(), slices=[_slice()], pods=[pod], templates=[whole],
                          catalog=Catalog.build())
    assert report["fragmentation"]["slivers"] == [{"node": "node-a", "device": "gpu-0",
                                                   "memory": 0, "cores": 20}]
    # Nothing pending: nothing is stranded.
    idle = build_report(claims=_claims(), slices=[_slice()], pods=[], templates=[],
                        catalog=Catalog.build())
    assert idle["fragmentation"]["slivers"] == []
    # Zero memory still says its unit.
    assert "0 free slivers too small for the smallest pending share, 0Gi of GPU memory " \
           "stranded" in render_table(idle)


@pytest.mark.parametrize(("spec", "why"), [
    (share_spec("8Pi", 30), "request 'gpu' asks for 8Pi of memory per card; the largest card "
                            "published has 80Gi"),
    ({"devices": {"requests": [{"name": "gpu", "exactly": {
        "deviceClassName": names.GPU_CLASS, "count": 3}}]}},
     "it asks for 3 card(s) on one node; no node publishes as many that fit (at most 2 on one "
     "node)"),
])
def test_a_pod_that_can_never_fit_the_published_cards_is_named(spec: dict[str, Any],
                                                                why: str) -> None:
    pod, template = _pending()
    pod["status"]["conditions"] = []
    template["spec"]["spec"] = spec
    report = build_report(claims=[], slices=[_slice()], pods=[pod], templates=[template],
                          catalog=Catalog.build())
    assert report["pending"] == {"NeverFits": 1}
    assert report["pendingPods"] == [{"namespace": "team-a", "pod": "train-1",
                                      "reason": "NeverFits", "why": why}]
    table = render_table(report)
    assert "PENDING: NeverFits=1" in table
    assert "  team-a/train-1 can never fit the cards published: " + why.split(";")[0] in table
    # One that fits some node waits as usual.
    template["spec"]["spec"] = share_spec("20Gi", 30)
    fits = build_report(claims=[], slices=[_slice()], pods=[pod], templates=[template],
                        catalog=Catalog.build())
    assert fits["pending"] == {"WaitingForAllocation": 1}


def _cohort_report() -> dict[str, Any]:
    def member(namespace: str, min_memory: str) -> dict[str, Any]:
        q = quota(f"{namespace}-gpu", namespace, memory="160Gi", cores=200)
        q["spec"].update(min={"memory": min_memory}, cohort="research")
        return q

    events = [{"reason": "Preempted", "reportingComponent": names.ALLOCATOR_COMPONENT,
               "lastTimestamp": f"2026-12-04T05:0{i}:00Z", "message": f"Preempted by pod {i}",
               "involvedObject": {"namespace": "team-b", "name": f"b-{i}"}} for i in range(3)]
    events.append({"reason": "Preempted", "reportingComponent": "default-scheduler",
                   "lastTimestamp": "2026-12-04T06:00:00Z", "message": "by kube-scheduler",
                   "involvedObject": {"namespace": "x", "name": "y"}})
    # team-a holds 70Gi of its 40Gi (30Gi borrowed); team-b, 10Gi of its 100Gi, lends 30Gi.
    return build_report(claims=_claims(), slices=[_slice()], pods=[], events=events,
                        catalog=Catalog.build(quotas=[member("team-a", "40Gi"),
                                                      member("team-b", "100Gi")]))


def test_the_report_shows_each_cohort_who_borrows_and_the_last_preemptions() -> None:
    report = _cohort_report()
    (cohort,) = report["cohorts"]
    assert cohort["name"] == "research"
    assert cohort["guaranteed"] == {"memory": "140Gi"}
    assert cohort["used"] == {"memory": "80Gi"}
    a, b = cohort["members"]
    assert (a["namespace"], a["borrowed"], a["lent"]) == ("team-a", {"memory": "30Gi"},
                                                          {"memory": "0"})
    assert (b["namespace"], b["borrowed"], b["lent"]) == ("team-b", {"memory": "0"},
                                                          {"memory": "30Gi"})
    # 140Gi guaranteed on two cards of 80Gi: the cluster can meet it.
    assert cohort["warnings"] == []
    # The gateway's preemptions only, newest first.
    assert [e["pod"] for e in report["preemptions"]] == ["team-b/b-2", "team-b/b-1",
                                                         "team-b/b-0"]
    table = render_table(report)
    assert "COHORT research (used / guaranteed: memory 80Gi/140Gi)" in table
    assert "team-a               team-a-gpu               memory 70Gi/40Gi/160Gi, borrowed " \
           "30Gi, lent 0" in table
    assert "LAST PREEMPTIONS" in table
    assert "team-b/b-2" in table
    page = render_html(report)
    assert "<h2>Cohort research</h2>" in page
    assert "<h2>Last preemptions</h2>" in page


def test_a_cohort_guaranteeing_more_than_the_cluster_publishes_is_warned_of() -> None:
    q = quota("big", "team-a", devices=8)
    q["spec"].update(min={"devices": 6}, cohort="research")
    report = build_report(claims=[], slices=[_slice()], pods=[],
                          catalog=Catalog.build(quotas=[q]))
    (cohort,) = report["cohorts"]
    assert cohort["warnings"] == [
        "its guarantees of devices (6) exceed what the cluster publishes (2): not every "
        "guarantee can be met at once"]
    assert "warning: its guarantees of devices (6)" in render_table(report)


def test_a_claim_holding_what_1_38_refuses_is_named_and_counted_as_the_whole_card() -> None:
    bad = allocated(share_spec("10Gi", 30), ("gpu-1", {"memory": "-10Gi", "cores": "30"}),
                    namespace="team-b")
    bad["metadata"].update(name="odd", uid="odd")
    report = build_report(claims=iter([*_claims(), bad]), slices=[_slice()], pods=[],
                          catalog=Catalog.build())
    assert report["invalidClaims"] == [{
        "namespace": "team-b", "claim": "odd", "problems": [
            "status.allocation.devices.results[0].consumedCapacity[memory]: -10Gi must be "
            "greater than or equal to 0"]}]
    gpu1 = report["cards"][1]
    assert gpu1["free"] == {"memory": 0, "cores": 0}
    assert gpu1["holders"][0]["whole"] is True
    table = render_table(report)
    assert "INVALID CLAIM: team-b/odd: status.allocation.devices.results[0].consumedCapacity" \
        "[memory]: -10Gi" in table.replace("\n               ", " ")
    assert "<h2>Invalid claims</h2>" in render_html(report)
    assert _report()["invalidClaims"] == []
    assert "Invalid claims" not in render_html(_report())


def test_a_card_cut_on_demand_is_one_card_holding_its_instances() -> None:
    """A MIG card cut on demand publishes the whole card and 25 placements: the report shows
    one card, with the instances allocated on its placements as its holders and what they
    leave free (memory, compute slices as cores), not 26 cards."""
    from dra_gateway.devkit.migcards import MODELS
    from dra_gateway.node_plugin.devices import DeviceOptions, counter_sets_of, devices_of
    from dra_gateway.node_plugin.facts import GpuFacts, NodeFacts
    from dra_gateway.node_plugin.publish import build_slices

    h100 = MODELS["NVIDIA H100 80GB HBM3"]
    facts = NodeFacts(gpus=(GpuFacts(index=0, uuid="GPU-0", product_name=h100.name,
                                     memory=h100.memory_mib << 20, mig_enabled=True,
                                     mig_geometry=h100.geometry()),))
    slices = build_slices(node_name="node-a", driver=names.DRIVER,
                          devices=devices_of(facts, DeviceOptions(partitionable_devices=True)),
                          generation=1, node_uid=None, max_devices=64,
                          counter_sets=counter_sets_of(facts), counters_apart=True)
    spec = {"devices": {"requests": [{"name": "mig", "exactly": {
        "deviceClassName": names.MIG_CLASS}}]}}
    three_g = allocated(spec, ("gpu-0-mig-3g40gb-9-4", None))
    one_g = allocated(spec, ("gpu-0-mig-1g10gb-19-0", None))
    one_g["metadata"].update(name="d", uid="d")
    report = build_report(claims=[three_g, one_g], slices=slices, pods=[], templates=[],
                          catalog=Catalog.build())
    (card_,) = report["cards"]
    assert card_["device"] == "gpu-0"
    assert sorted(h["memory"] for h in card_["holders"]) == [9984 << 20, 40448 << 20]
    assert card_["free"] == {"memory": (81559 - 9984 - 40448) << 20, "cores": 100 - 42 - 14}
