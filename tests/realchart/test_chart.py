"""`helm install`, use, `helm upgrade` and `helm uninstall` of the gateway's chart on a real node.

The tests run in order on one cluster per setup, as a user's first day does: install, a legacy
HAMi pod created with kubectl, an upgrade while it runs, then the uninstall.
"""

from __future__ import annotations

import contextlib
import json
import re
import time
from pathlib import Path
from typing import Any

import yaml
from e2e.support import CHART, NAMESPACE, RELEASE, wait_until
from realnode.support import WORKLOADS, check_hami_share
from realnode.test_node import ENV_THEN_SLEEP, claim_specs, spec_names

from dra_gateway.devkit.realcluster import path_of
from dra_gateway.devkit.realnode import IMAGE
from dra_gateway.kube import names
from dra_gateway.kube.cluster.port import ApiError
from realchart.prometheus import Prometheus, scrape_job
from realchart.support import COMPONENTS, ChartCluster

# The image's own user (hack/build-image.sh); the node plugin runs as root (the kubelet's
# folders are root's).
IMAGE_USER = 65532
# A tenant namespace of the monitoring scenario, with a GPUQuota of its own.
TENANT = "team-metrics"


def _ready(pod: dict[str, object]) -> bool:
    status = pod.get("status") or {}
    assert isinstance(status, dict)
    return status.get("phase") == "Running" and all(
        c.get("ready") for c in status.get("containerStatuses") or [{}])


def test_helm_install_runs_every_component_with_its_probes(chart: ChartCluster) -> None:
    chart.helm_release("install", chart.values())
    for component in COMPONENTS:
        pods = chart.component_pods(component)
        assert pods, f"no {component} pod"
        for pod in pods:
            assert _ready(pod), f"{pod['metadata']['name']}: {pod.get('status')}"
            [container] = pod["spec"]["containers"]
            assert container.get("readinessProbe"), container
            assert container.get("livenessProbe"), container
            # The chart's pull policy; containerd pulled what hack/publish-image.sh pushed.
            assert container["imagePullPolicy"] == "IfNotPresent", container
            [status] = pod["status"]["containerStatuses"]
            assert status["imageID"] == chart.image.reference, status
            uid = status["user"]["linux"]["uid"] if "user" in status else None
            if component != "node-plugin" and uid is not None:
                assert uid == IMAGE_USER, status
    chart.wait_registered()
    devices = [d["name"] for s in chart.slices() for d in s["spec"].get("devices") or []]
    assert len(devices) == 8, devices
    # The DaemonSet's pod publishes them.
    [plugin] = chart.component_pods("node-plugin")
    assert plugin["spec"]["nodeName"] == chart.node.name


def test_helm_test_passes_through_the_api_server(chart: ChartCluster) -> None:
    """`helm test`: the chart's smoke pod, created by helm through the API server, pulls the
    image, resolves the webhook's Service by name and has it translate a legacy pod."""
    pod = f"{RELEASE}-smoke-test"
    try:
        out = chart.run_helm("test", RELEASE, "--namespace", NAMESPACE, "--timeout", "3m")
    except AssertionError as exc:
        log = chart.node.container_log(NAMESPACE, pod, "smoke")
        raise AssertionError(f"{exc}\n--- {pod} ---\n{log}\n{chart.pod_states()}\n"
                             f"{chart.logs()}") from None
    assert re.search(rf"TEST SUITE:\s+{pod}\n(.*\n)*?Phase:\s+Succeeded", out), out


def _legacy_pod(name: str) -> str:
    """A pod written for HAMi: one card, 8000 MiB of its memory and 30% of its compute."""
    return yaml.safe_dump({
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": WORKLOADS},
        "spec": {"terminationGracePeriodSeconds": 1, "containers": [{
            "name": "c0", "image": IMAGE, "imagePullPolicy": "Never",
            "command": ["sh", "-c", ENV_THEN_SLEEP],
            "resources": {"limits": {"nvidia.com/gpu": 1, "nvidia.com/gpumem": 8000,
                                     "nvidia.com/gpucores": 30}}}]}})


def test_a_legacy_hami_pod_created_with_kubectl_runs_with_its_limits(
        chart: ChartCluster) -> None:
    # The API server calls the webhook's pods through its Service (their endpoints).
    assert "created" in chart.kubectl("create", "-f", "-", stdin=_legacy_pod("hami"))
    # The DaemonSet's plugin found HAMi-core through its hostPath mount; the runtime mounted it.
    pod = check_hami_share(chart, "hami", chart.hami_library)
    assert pod["spec"].get("resourceClaims"), "the webhook did not translate the pod"
    [claim] = chart.claims_of(pod)
    assert claim["status"]["allocation"]["devices"]["results"], claim["status"]
    assert claim_specs(chart, pod), [p.name for p in chart.cdi_specs()]


# Panels that must show data once a legacy pod was translated, allocated and prepared (the
# others count events this scenario does not cause: refusals, preemptions, quotas, faults).
PANELS_WITH_DATA = {
    "Reviews by outcome", "Answer time, 99th percentile", "Translations by rule",
    "Rules in force", "Leader", "Work queue and waiting pods", "Planning time, 99th percentile",
    "Allocations", "Published devices", "Claims prepared", "Registered with the kubelet",
    "Legacy coexistence", "Unhealthy devices"}


def _containers(pod: dict[str, Any]) -> list[tuple[str, int, str]]:
    """Each container's ID, restarts and start time: the same ones mean it kept running."""
    return [(c["containerID"], c["restartCount"], c["state"]["running"]["startedAt"])
            for c in pod["status"]["containerStatuses"]]


def _family(series: str) -> str:
    """The metric family a series name belongs to, as Prometheus' metadata names it."""
    for suffix in ("_bucket", "_sum", "_count"):
        if series.endswith(suffix):
            return series[: -len(suffix)]
    return series


def test_a_real_prometheus_scrapes_every_component_and_evaluates_the_dashboard_and_alerts(
        chart: ChartCluster, prometheus_binary: Path) -> None:
    rendered = chart.render(chart.values(monitoring={"podMonitors": True,
                                                     "prometheusRule": True}))
    monitors = [o for o in rendered if o["kind"] == "PodMonitor"]
    assert len(monitors) == len(COMPONENTS)
    [rule] = [o for o in rendered if o["kind"] == "PrometheusRule"]
    token = chart.work / "prometheus.token"
    token.write_text(chart.plane.admin_token)
    server = Prometheus(prometheus_binary, chart.work / "prometheus",
                        [scrape_job(m, chart.plane, token) for m in monitors],
                        rule["spec"]["groups"])
    server.start()
    try:
        pods = {p["metadata"]["name"] for c in COMPONENTS for p in chart.component_pods(c)}

        def all_up() -> bool:
            server.check()
            return {t["labels"].get("pod") for t in server.targets()
                    if t["health"] == "up"} == pods

        wait_until("Prometheus to scrape every gateway pod", all_up, 60, chart.check)
        _a_tenants_quota_keeps_its_namespace(chart, server)
        board = json.loads((CHART / "dashboards" / "dra-gateway.json").read_text())
        queries = [(p["title"], t["expr"]) for p in board["panels"]
                   for t in p.get("targets") or ()]
        alerts = [(r["alert"], r["expr"]) for g in rule["spec"]["groups"] for r in g["rules"]]
        # Every family the dashboard and the alerts read is one a scraped pod exports.
        known = set(server.api("metadata"))
        for name, expr in [*queries, *alerts]:
            used = {_family(s) for s in re.findall(r"\bdra_gateway_[a-z_]+", str(expr))}
            assert used <= known, (name, sorted(used - known))
        # Every panel's query evaluates there; those this scenario feeds return series.
        time.sleep(6)  # a few scrapes, so that rates have two samples
        with_data = {title for title, expr in queries if server.query(
            expr.replace("$__rate_interval", "1m").replace("$node", ".*"))}
        assert with_data >= PANELS_WITH_DATA, sorted(PANELS_WITH_DATA - with_data)
        print(f"panels without data in this scenario: "
              f"{sorted({t for t, _ in queries} - with_data)}")
        # The alerts are loaded and evaluated without error, and none fires on a healthy
        # gateway.
        states = {r["name"]: r for r in server.rules()}
        assert set(states) == {name for name, _ in alerts}
        assert all(r["health"] == "ok" for r in states.values()), states
        assert not [n for n, r in states.items() if r["state"] != "inactive"], states
        # A fault: the allocator stopped. Its alert goes pending (firing after its `for`).
        selector = "app.kubernetes.io/component=allocator"
        replicas = chart.kubectl("get", "deployment", "-n", NAMESPACE, "-l", selector, "-o",
                                 "jsonpath={.items[0].spec.replicas}")
        chart.kubectl("scale", "deployment", "-n", NAMESPACE, "-l", selector, "--replicas=0")

        def no_leader_alert() -> bool:
            rule = {r["name"]: r for r in server.rules()}["DraGatewayAllocatorNoLeader"]
            return rule["state"] in ("pending", "firing")

        wait_until("DraGatewayAllocatorNoLeader to fire", no_leader_alert, 60, chart.check)
        chart.kubectl("scale", "deployment", "-n", NAMESPACE, "-l", selector,
                      f"--replicas={replicas}")
        chart.kubectl("rollout", "status", "deployment", "-n", NAMESPACE, "-l", selector,
                      "--timeout=120s")
        wait_until("the alert to clear", lambda: not no_leader_alert(), 60, chart.check)
    finally:
        server.stop()


def _a_tenants_quota_keeps_its_namespace(chart: ChartCluster, server: Prometheus) -> None:
    """Scraped as the Prometheus Operator scrapes (`namespace` is the scraped pod's, without
    honorLabels), a tenant's GPUQuota series keep the tenant's namespace in `quota_namespace`,
    and no series of the gateway has a label of its own renamed `exported_namespace`."""
    api = chart.plane.api()
    quotas = path_of(names.API_VERSION, "gpuquotas", namespace=TENANT)
    api.create(path_of("v1", "namespaces"), {"apiVersion": "v1", "kind": "Namespace",
                                              "metadata": {"name": TENANT}})
    try:
        api.create(quotas, {"apiVersion": names.API_VERSION, "kind": "GPUQuota",
                            "metadata": {"name": "team", "namespace": TENANT},
                            "spec": {"hard": {"memory": "40Gi", "cores": 200}}})

        def series() -> list[dict[str, Any]]:
            server.check()
            return server.query(
                f'dra_gateway_allocator_quota_hard{{quota_namespace="{TENANT}"}}')

        wait_until("the tenant's quota series", lambda: len(series()) == 2, 60, chart.check)
        for one in series():
            labels = one["metric"]
            assert (labels["namespace"], labels["quota"]) == (NAMESPACE, "team"), labels
            assert labels["resource"] in ("memory", "cores"), labels
        assert server.query('{__name__=~"dra_gateway_.+", exported_namespace!=""}') == []
    finally:
        with contextlib.suppress(ApiError):
            api.delete(f"{quotas}/team")
        api.delete(path_of("v1", "namespaces", name=TENANT))


def test_helm_upgrade_rolls_every_component_without_losing_a_claim(chart: ChartCluster) -> None:
    before = {c: {p["metadata"]["uid"] for p in chart.component_pods(c)} for c in COMPONENTS}
    pod = chart.pod("hami")
    [claim] = chart.claims_of(pod)
    since = chart.kubelet_log_size()
    chart.helm_release("upgrade", chart.values(
        webhook={"logLevel": "debug"}, nodePlugin={"logLevel": "DEBUG"},
        allocator={"podAnnotations": {"dra-gateway.io/upgraded": "yes"}}))
    # `helm upgrade --wait` returns once the new pods are ready; the old ones then terminate.
    for component in COMPONENTS:
        def rolled(component: str = component) -> bool:
            now = {p["metadata"]["uid"] for p in chart.component_pods(component)}
            return bool(now) and not now & before[component]

        wait_until(f"every {component} pod to be replaced", rolled, 90, chart.check)
    # The new plugin pod registered beside the old one; the kubelet switched to it.
    chart.wait_registered(since)
    # The pod kept running on the same claim and allocation, never restarted. (Its device's
    # health in the status may read Unknown for a moment: a kubelet 1.37 clears the driver's
    # health when the old pod's stream ends, although the new pod's is open, until the new
    # one resends, every 2 s while its stream is new.)
    after = chart.pod("hami")
    assert _containers(after) == _containers(pod)
    [same] = chart.claims_of(after)
    assert same["metadata"]["uid"] == claim["metadata"]["uid"]
    assert same["status"]["allocation"] == claim["status"]["allocation"]
    specs = claim_specs(chart, after)
    assert specs
    # The new plugin serves the claim the old one prepared: deleting the pod unprepares it.
    chart.kubectl("delete", "pod", "hami", "--namespace", WORKLOADS, "--wait=false")
    wait_until("the new plugin to unprepare the claim",
               lambda: not specs & spec_names(chart), 60, chart.check)
    chart.delete_pod("hami")
    # And it prepares new ones.
    chart.kubectl("create", "-f", "-", stdin=_legacy_pod("hami-after"))
    chart.wait_running("hami-after")


def test_helm_uninstall_leaves_no_gateway_object_and_no_gated_pod(chart: ChartCluster) -> None:
    running = chart.pod("hami-after")
    chart.run_helm("uninstall", RELEASE, "--namespace", NAMESPACE, "--wait", "--timeout", "4m")
    api = chart.api
    # The chart's own objects are gone (the pre-delete Job stays for its report, as designed).
    instance = f"app.kubernetes.io/instance={RELEASE}"
    for version, plural in (("apps/v1", "deployments"), ("apps/v1", "daemonsets"),
                            ("v1", "services"), ("v1", "configmaps"), ("v1", "secrets"),
                            ("v1", "serviceaccounts"),
                            ("admissionregistration.k8s.io/v1", "mutatingwebhookconfigurations"),
                            ("admissionregistration.k8s.io/v1",
                             "validatingwebhookconfigurations"),
                            ("rbac.authorization.k8s.io/v1", "clusterroles"),
                            ("resource.k8s.io/v1", "deviceclasses")):
        left = [o["metadata"]["name"] for o in api.list(path_of(version, plural),
                                                         labelSelector=instance)]
        assert not left, f"{plural} left: {left}"
    def components_gone() -> bool:
        pods = api.list(path_of("v1", "pods", namespace=NAMESPACE), labelSelector=instance)
        return all("batch.kubernetes.io/job-name" in p["metadata"]["labels"] for p in pods)

    wait_until("the gateway's pods to be gone", components_gone, 60, chart.check)
    # No claim keeps the allocator's finalizer; the running pod keeps its card, and the
    # uninstall's report (the pre-delete Job's log) names it.
    for claim in api.list(path_of("resource.k8s.io/v1", "resourceclaims")):
        assert names.FINALIZER not in (claim["metadata"].get("finalizers") or []), claim
    assert chart.pod("hami-after")["status"]["phase"] == "Running"
    report = chart.kubectl("logs", f"job/{RELEASE}-allocator-release", "--namespace", NAMESPACE)
    assert f"{WORKLOADS}/hami-after on node {chart.node.name}" in report, report
    # No pod is left behind the gateway's scheduling gate.
    gated = [p["metadata"]["name"] for p in api.list(path_of("v1", "pods"))
             if any(g.get("name") == names.SCHEDULING_GATE
                    for g in p["spec"].get("schedulingGates") or [])]
    assert not gated, gated
    # The kubelet deletes the departed plugin's slices (after its 30 s grace).
    wait_until("the node's ResourceSlices to be deleted", lambda: not chart.slices(), 90,
               chart.check)
    assert running["metadata"]["uid"] == chart.pod("hami-after")["metadata"]["uid"]
