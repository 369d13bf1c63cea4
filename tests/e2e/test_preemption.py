"""The allocator's preemption for GPU claims on a real control plane
(allocator/eviction/preemption.py, on by default in the chart).

Eight one-card pods of the PriorityClass `e2e-low` (value 10) fill the demo's eight-card H100
node, `gpu-h100-1`; every pod here is pinned to that node by its hostname, so the A100 node's
free cards cannot place any of them. The API server fills each pod's `spec.priority` from its
PriorityClass, and the webhook translates its `nvidia.com/gpu` into a claim.

- A pod of `e2e-high` (1000, PreemptLowerPriority) asking for two cards is placed (allocated on
  two whole cards of the node, and bound there) after exactly two low pods leave: the two
  youngest, whom kube-scheduler's victim selection would pick (the oldest are reprieved first),
  each with an Event `Preempted` naming the preemptor, which gets an Event `Preempting`. The
  other six keep their cards; at every poll no card is held past its capacity and at least six
  low pods are live.
- A pod of `e2e-high-never` (1000, preemptionPolicy Never) asking for two cards, and one of
  `e2e-low` (the low pods' own priority) asking for one, both wait, gated and unbound, through
  three preemption rounds (2 s each): no low pod leaves, no preemption Event is written.
- Other queues first: a pod that Kueue still holds behind its gate `kueue.x-k8s.io/admission`
  (the webhook adds the gateway's own after it) gets no card although the node has them free,
  says so in its condition `dra-gateway.io/WaitingForGates`, and is placed within seconds of
  Kueue's gate being removed.

Each test has its own namespace (the webhook's template cache, see test_defrag.py) and removes
its pods, waits until their claims are released and the allocator has dropped its preemption's
hold, and deletes the namespace; the PriorityClasses are the module's and go at its end. The
tier's other modules see the installation, and every card of it free, as `install` made it.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator, Mapping
from typing import Any

import pytest

from dra_gateway.devkit.realcluster import Api, path_of
from dra_gateway.kube import names
from dra_gateway.kube.cluster.port import ApiError
from e2e.support import (
    NAMESPACE,
    Gateway,
    cards,
    free_capacity,
    over_capacity,
    placed_on_its_node,
    pod_devices,
    pods,
    wait_until,
)

JSON = dict[str, Any]
RESOURCE = "resource.k8s.io/v1"
SCHEDULING = "scheduling.k8s.io/v1"
PLACE_S = 60.0
NODE = "gpu-h100-1"  # the demo's eight-card node (examples/demo/gpu-h100-1.yaml)
CARDS = 8
LOW, HIGH, NEVER = "e2e-low", "e2e-high", "e2e-high-never"
CLASSES = {LOW: (10, "PreemptLowerPriority"), HIGH: (1000, "PreemptLowerPriority"),
           NEVER: (1000, "Never")}
EVICT_NS = "preempt-evict"
WAIT_NS = "preempt-wait"
QUEUE_NS = "queued-elsewhere"
KUEUE = "kueue.x-k8s.io/admission"
RECORDS = "dra-gateway-defrag"  # allocator/eviction/holds.py CONFIG_MAP: preemption's holds
ROUNDS_S = 6.0  # three of the allocator's preemption rounds (preemption_interval 2 s)


def _pod_path(namespace: str, name: str | None = None) -> str:
    return path_of("v1", "pods", namespace=namespace, name=name)


def _gpu_pod(name: str, namespace: str, priority_class: str, gpus: int) -> JSON:
    """A pod asking for `gpus` whole cards by their legacy name, pinned to NODE."""
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": namespace, "labels": {"app": name}},
            "spec": {"priorityClassName": priority_class,
                     "nodeSelector": {"kubernetes.io/hostname": NODE},
                     "terminationGracePeriodSeconds": 0,
                     "containers": [{"name": "main", "image": "example.com/cuda:1",
                                     "resources": {"limits": {"nvidia.com/gpu": str(gpus)}}}]}}


def _bound(pod: Mapping[str, Any]) -> bool:
    return bool((pod.get("spec") or {}).get("nodeName"))


def _gated(pod: Mapping[str, Any]) -> bool:
    return any(g.get("name") == names.SCHEDULING_GATE
               for g in (pod.get("spec") or {}).get("schedulingGates") or [])


def _live(pod: Mapping[str, Any]) -> bool:
    return not pod["metadata"].get("deletionTimestamp") and \
        (pod.get("status") or {}).get("phase") not in ("Succeeded", "Failed")


def _live_pods(api: Api, namespace: str, prefix: str) -> dict[str, JSON]:
    return {p["metadata"]["name"]: p for p in pods(api, namespace)
            if p["metadata"]["name"].startswith(prefix) and _live(p)}


def _events(api: Api, namespace: str) -> list[JSON]:
    return api.list(path_of("v1", "events", namespace=namespace))


def _no_over_capacity(gateway: Gateway) -> None:
    gateway.check()
    problems = over_capacity(gateway.api)
    assert problems == [], problems


def _free_cards(api: Api) -> int:
    """NODE's cards that no allocation holds any of."""
    published = cards(api)
    return sum(untouched for key, (_, _, untouched) in free_capacity(api).items()
               if published[key].node == NODE)


def _wait_for_free_cards(gateway: Gateway, api: Api) -> None:
    """Wait until NODE publishes its CARDS cards and no allocation holds any of them: the
    state each test starts from. An earlier test may have restarted the node plugin (its
    slices are published again) or released claims moments ago."""
    try:
        wait_until(f"{NODE}'s {CARDS} cards to be published and free",
                   lambda: _free_cards(api) == CARDS, PLACE_S, gateway.check)
    except AssertionError as exc:
        raise AssertionError(f"{exc}: {free_capacity(api)}") from None


@pytest.fixture(scope="module")
def priority_classes(gateway: Gateway) -> Iterator[None]:
    """The three PriorityClasses, once the API server's Priority admission resolves them (it
    reads them from its informer, a moment after they are stored); deleted at the end."""
    api = gateway.api
    try:
        for name, (value, policy) in CLASSES.items():
            api.create(path_of(SCHEDULING, "priorityclasses"), {
                "apiVersion": SCHEDULING, "kind": "PriorityClass", "metadata": {"name": name},
                "value": value, "preemptionPolicy": policy, "globalDefault": False})

        def resolved() -> bool:
            # A GPU-free pod (the webhook is not called for it), dry run: nothing stored.
            for name in CLASSES:
                try:
                    api.request("POST", _pod_path("default"), {
                        "apiVersion": "v1", "kind": "Pod",
                        "metadata": {"name": "priority-probe", "namespace": "default"},
                        "spec": {"priorityClassName": name,
                                 "containers": [{"name": "main", "image": "example.com/x:1"}]}},
                        query={"dryRun": "All"})
                except ApiError:
                    return False
            return True

        wait_until("the API server to resolve the PriorityClasses", resolved, 30,
                   gateway.check, poll_s=0.5)
        yield
    finally:
        for name in CLASSES:
            with contextlib.suppress(ApiError):
                api.delete(path_of(SCHEDULING, "priorityclasses", name=name))


@contextlib.contextmanager
def _scene(gateway: Gateway, namespace: str) -> Iterator[Api]:
    """An enabled namespace, and afterwards every pod in it gone, every claim released, the
    namespace deleted and the preemption holds dropped, failed or not."""
    api = gateway.api
    api.create(path_of("v1", "namespaces"), {
        "apiVersion": "v1", "kind": "Namespace",
        "metadata": {"name": namespace,
                     "labels": {names.TRANSLATION_LABEL: names.TRANSLATION_ENABLED}}})
    try:
        yield api
    finally:
        for pod in pods(api, namespace):
            with contextlib.suppress(ApiError):
                api.delete(_pod_path(namespace, pod["metadata"]["name"]), grace_period_s=0)

        def released() -> bool:
            return not pods(api, namespace) and not any(
                (c.get("status") or {}).get("allocation")
                for c in api.list(path_of(RESOURCE, "resourceclaims", namespace=namespace)))

        wait_until(f"the pods of {namespace} to be gone and their claims released", released,
                   PLACE_S, gateway.check)
        # The allocator drops a preemption's hold once its pod is placed or gone: none is left
        # for a new leader (test_security_and_failover restarts the allocator) to count.
        wait_until("the allocator to drop the holds of its preemptions", lambda: not _holds(api),
                   30, gateway.check)
        with contextlib.suppress(ApiError):
            api.delete(path_of("v1", "namespaces", name=namespace))
        wait_until(f"namespace {namespace} to be gone",
                   lambda: not api.exists(path_of("v1", "namespaces", name=namespace)), 120)


def _holds(api: Api) -> list[str]:
    """The hold records in the allocator's ConfigMap."""
    try:
        records = api.get(path_of("v1", "configmaps", namespace=NAMESPACE, name=RECORDS))
    except ApiError:
        return []
    return [k for k in records.get("data") or {} if k.startswith("hold.")]


def _fill(gateway: Gateway, namespace: str) -> dict[str, str]:
    """Eight low pods on the eight cards of NODE, one whole card each, created one by one (so
    that their creation order is their age); their uids by name."""
    api = gateway.api
    _wait_for_free_cards(gateway, api)
    for index in range(CARDS):
        api.create(_pod_path(namespace), _gpu_pod(f"low-{index}", namespace, LOW, 1))
    wait_until(f"the {CARDS} low pods to be placed on {NODE}", lambda: sum(
        placed_on_its_node(api, p)
        for p in _live_pods(api, namespace, "low-").values()) == CARDS,
        PLACE_S, lambda: _no_over_capacity(gateway))
    low = _live_pods(api, namespace, "low-")
    assert {p["spec"]["nodeName"] for p in low.values()} == {NODE}
    assert {p["spec"].get("priority") for p in low.values()} == {CLASSES[LOW][0]}
    held = [d for p in low.values() for d in pod_devices(api, p)]
    assert len({d[1] for d in held}) == CARDS, held
    assert all(whole for _, _, whole in held), held
    assert _free_cards(api) == 0
    return {name: p["metadata"]["uid"] for name, p in low.items()}


def test_a_high_priority_pod_is_placed_after_exactly_two_low_priority_pods_are_preempted(
        gateway: Gateway, priority_classes: None) -> None:
    ns = EVICT_NS
    with _scene(gateway, ns) as api:
        low = _fill(gateway, ns)
        def watched() -> None:
            # At every poll: no card past its capacity, never fewer than six low pods live.
            _no_over_capacity(gateway)
            live = len(_live_pods(api, ns, "low-"))
            assert live >= CARDS - 2, f"{live} low pods left: more than two preempted"

        created = api.create(_pod_path(ns), _gpu_pod("high", ns, HIGH, 2))
        assert created["spec"].get("priority") == CLASSES[HIGH][0], created["spec"]
        assert created["spec"].get("resourceClaims"), created["spec"]
        started = time.monotonic()
        wait_until("the high-priority pod to be placed",
                   lambda: placed_on_its_node(api, api.get(_pod_path(ns, "high"))), PLACE_S,
                   watched)
        print(f"the high-priority pod was placed {time.monotonic() - started:.1f}s after its "
              "creation")
        high = api.get(_pod_path(ns, "high"))
        assert high["spec"]["nodeName"] == NODE
        devices = pod_devices(api, high)
        assert len(devices) == 2, devices
        assert all(n == NODE and whole for n, _, whole in devices), devices

        # Exactly two low pods left, the youngest two (kube-scheduler reprieves the oldest
        # first); the other six are the same pods, still bound and holding their cards.
        survivors = _live_pods(api, ns, "low-")
        victims = set(low) - set(survivors)
        assert victims == {f"low-{CARDS - 2}", f"low-{CARDS - 1}"}, sorted(survivors)
        for name, pod in survivors.items():
            assert pod["metadata"]["uid"] == low[name], name
            assert pod["spec"]["nodeName"] == NODE, name
            assert placed_on_its_node(api, pod), name
        assert not _gated(high)
        wait_until("the victims to be gone", lambda: not any(
            api.exists(_pod_path(ns, name)) for name in victims), 30, watched)

        # The Events naming who made room for whom.
        events = _events(api, ns)
        preempted = {e["involvedObject"]["name"]: e["message"] for e in events
                     if e.get("reason") == "Preempted"}
        assert preempted == dict.fromkeys(victims, f"Preempted by pod {ns}/high on node {NODE}"), \
            preempted
        (preempting,) = [e for e in events if e.get("reason") == "Preempting"]
        assert preempting["involvedObject"]["name"] == "high", preempting
        assert all(f"{ns}/{name}" in preempting["message"] for name in victims), preempting
        assert not [e for e in events if e.get("reason") == "PreemptionRefused"], events
        # The node is full again: the six survivors and the two cards of the high pod.
        assert _free_cards(api) == 0
        _no_over_capacity(gateway)


def test_a_pod_that_never_preempts_and_one_of_equal_priority_wait_and_preempt_nothing(
        gateway: Gateway, priority_classes: None) -> None:
    ns = WAIT_NS
    with _scene(gateway, ns) as api:
        low = _fill(gateway, ns)
        never = api.create(_pod_path(ns), _gpu_pod("never", ns, NEVER, 2))
        assert never["spec"].get("priority") == CLASSES[NEVER][0], never["spec"]
        assert never["spec"].get("preemptionPolicy") == "Never", never["spec"]
        equal = api.create(_pod_path(ns), _gpu_pod("equal", ns, LOW, 1))
        assert equal["spec"].get("priority") == CLASSES[LOW][0], equal["spec"]

        def unchanged() -> None:
            # At every poll: the eight low pods are the same, none being deleted.
            _no_over_capacity(gateway)
            live = _live_pods(api, ns, "low-")
            assert {n: p["metadata"]["uid"] for n, p in live.items()} == low, \
                f"low pods gone or replaced: {sorted(set(low) - set(live))}"

        # The allocator has looked at both and found no room ...
        def failed(name: str) -> bool:
            return any(e.get("reason") == "AllocationFailed" and
                       e["involvedObject"]["name"] == name for e in _events(api, ns))

        wait_until("the allocator to find no room for either waiting pod",
                   lambda: failed("never") and failed("equal"), PLACE_S, unchanged)
        # ... and through three preemption rounds nobody leaves for them.
        deadline = time.monotonic() + ROUNDS_S
        while time.monotonic() < deadline:
            unchanged()
            for name in ("never", "equal"):
                pod = api.get(_pod_path(ns, name))
                assert _gated(pod), (name, pod["spec"])
                assert not _bound(pod), (name, pod["spec"])
            time.sleep(0.5)
        reasons = {(e["involvedObject"]["name"], e.get("reason")) for e in _events(api, ns)}
        assert not {r for r in reasons if r[1] in ("Preempted", "Preempting",
                                                   "PreemptionRefused")}, reasons
        assert _free_cards(api) == 0


def test_a_pod_another_queue_holds_gets_no_card_until_its_gate_goes(
        gateway: Gateway, priority_classes: None) -> None:
    ns = QUEUE_NS
    with _scene(gateway, ns) as api:
        _wait_for_free_cards(gateway, api)
        queued = _gpu_pod("queued", ns, HIGH, 2)
        queued["spec"]["schedulingGates"] = [{"name": KUEUE}]
        created = api.create(_pod_path(ns), queued)
        assert [g["name"] for g in created["spec"]["schedulingGates"]] == [
            KUEUE, names.SCHEDULING_GATE], created["spec"]

        def says_so() -> bool:
            pod = api.get(_pod_path(ns, "queued"))
            return any(c.get("type") == "dra-gateway.io/WaitingForGates"
                       and c.get("status") == "True"
                       for c in (pod.get("status") or {}).get("conditions") or [])

        wait_until("the queued pod to say what it waits for", says_so, 30, gateway.check)
        deadline = time.monotonic() + ROUNDS_S
        while time.monotonic() < deadline:  # the cards are free: only the queue holds it back
            pod = api.get(_pod_path(ns, "queued"))
            assert pod_devices(api, pod) == [], pod_devices(api, pod)
            assert not _bound(pod)
            time.sleep(0.5)
        assert _free_cards(api) == CARDS
        # Kueue admits it: its gate goes, the gateway's is the last one left.
        gates = api.get(_pod_path(ns, "queued"))["spec"]["schedulingGates"]
        api.patch(_pod_path(ns, "queued"), {"spec": {"schedulingGates": [
            g for g in gates if g["name"] != KUEUE]}})
        admitted = time.monotonic()
        wait_until("the admitted pod to be placed",
                   lambda: placed_on_its_node(api, api.get(_pod_path(ns, "queued"))), 20,
                   gateway.check)
        print(f"placed {time.monotonic() - admitted:.1f}s after Kueue's gate went")
        assert len(pod_devices(api, api.get(_pod_path(ns, "queued")))) == 2


LENDER_NS, BORROWER_NS = "cohort-lender", "cohort-borrower"
COHORT = "e2e-research"
TABLE = "application/json;as=Table;v=v1;g=meta.k8s.io"


def _quota_path(namespace: str, name: str | None = None) -> str:
    return path_of(names.API_VERSION, "gpuquotas", namespace=namespace, name=name)


def _cohort_quota(namespace: str, *, hard: int = CARDS, min_: int = CARDS // 2) -> JSON:
    return {"apiVersion": names.API_VERSION, "kind": "GPUQuota",
            "metadata": {"name": "gpus", "namespace": namespace},
            "spec": {"hard": {"devices": hard}, "min": {"devices": min_}, "cohort": COHORT}}


def _quota_status(api: Api, namespace: str) -> JSON:
    return api.get(_quota_path(namespace, "gpus")).get("status") or {}


def _devices_held(api: Api, namespace: str) -> int:
    return sum(len(((c.get("status") or {}).get("allocation") or {}).get("devices", {}).get(
        "results") or ()) for c in api.list(path_of(RESOURCE, "resourceclaims",
                                                  namespace=namespace)))


def test_a_lender_takes_back_its_guarantee_from_a_borrower_of_its_cohort(
        gateway: Gateway, priority_classes: None) -> None:
    """Two namespaces of one cohort, each guaranteed four cards and allowed eight. The borrower
    fills the node (four cards its own, four borrowed, marked so on their claims and in both
    quotas' status); a pod of the lender asking for two cards, of the borrower's own priority,
    is placed once exactly two borrowed pods (the newest) are preempted. A quota whose min is
    above its hard is refused by the API server."""
    with _scene(gateway, LENDER_NS) as api, _scene(gateway, BORROWER_NS):
        with pytest.raises(ApiError) as refused:
            api.create(_quota_path(LENDER_NS), _cohort_quota(LENDER_NS, hard=2, min_=3))
        assert refused.value.code == 422, refused.value
        assert "min.devices must be at most hard.devices" in str(refused.value), refused.value
        for ns in (LENDER_NS, BORROWER_NS):
            api.create(_quota_path(ns), _cohort_quota(ns))
        wait_until("the allocator to count the cohort's quotas", lambda: all(
            _quota_status(api, ns).get("min") == {"devices": CARDS // 2}
            for ns in (LENDER_NS, BORROWER_NS)), 30, gateway.check)

        def bounded() -> None:
            # At every poll: no card past its capacity, neither namespace past its hard, and
            # the cohort within its guarantees (what is borrowed is what the lender leaves).
            _no_over_capacity(gateway)
            lender, borrower = (_devices_held(api, ns) for ns in (LENDER_NS, BORROWER_NS))
            assert lender <= CARDS, (lender, borrower)
            assert borrower <= CARDS, (lender, borrower)
            assert lender + borrower <= CARDS, (lender, borrower)

        low = _fill(gateway, BORROWER_NS)
        claims = api.list(path_of(RESOURCE, "resourceclaims", namespace=BORROWER_NS))
        marked = [c for c in claims if (c["metadata"].get("annotations") or {}).get(
            names.ANNOTATION_BORROWED) == COHORT]
        assert len(marked) == CARDS // 2, [c["metadata"].get("annotations") for c in claims]
        wait_until("the quotas' status to say what is borrowed and lent", lambda: (
            _quota_status(api, BORROWER_NS).get("borrowed") == {"devices": CARDS // 2}
            and _quota_status(api, LENDER_NS).get("lent") == {"devices": CARDS // 2}),
            30, bounded)
        table = api.request("GET", _quota_path(BORROWER_NS), accept=TABLE)
        columns = [c["name"] for c in table["columnDefinitions"]]
        (row,) = table["rows"]
        shown = dict(zip(columns, row["cells"], strict=True))
        assert shown["Cohort"] == COHORT, shown
        assert shown["Devices-Borrowed"] == CARDS // 2, shown

        started = time.monotonic()
        api.create(_pod_path(LENDER_NS), _gpu_pod("lender", LENDER_NS, LOW, 2))
        wait_until("the lender's pod to be placed", lambda: placed_on_its_node(
            api, api.get(_pod_path(LENDER_NS, "lender"))), PLACE_S, bounded)
        print(f"the lender's pod was placed {time.monotonic() - started:.1f}s after its "
              "creation")
        lender = api.get(_pod_path(LENDER_NS, "lender"))
        devices = pod_devices(api, lender)
        assert len(devices) == 2, devices
        assert all(n == NODE and w for n, _, w in devices), devices
        survivors = _live_pods(api, BORROWER_NS, "low-")
        victims = set(low) - set(survivors)
        # Of equal priority, the newest go first: low-6 and low-7 were created last.
        assert victims == {f"low-{CARDS - 2}", f"low-{CARDS - 1}"}, sorted(survivors)
        for name, pod in survivors.items():
            assert pod["metadata"]["uid"] == low[name], name
        events = _events(api, BORROWER_NS)
        preempted = {e["involvedObject"]["name"]: e["message"] for e in events
                     if e.get("reason") == "Preempted"}
        assert preempted == dict.fromkeys(victims, (
            f"Preempted by pod {LENDER_NS}/lender: it takes back the guarantee lent to cohort "
            f"{COHORT}, which this pod's namespace borrowed")), preempted
        (preempting,) = [e for e in _events(api, LENDER_NS) if e.get("reason") == "Preempting"]
        assert f"cohort {COHORT}" in preempting["message"], preempting
        wait_until("the quotas' status to count the guarantee taken back", lambda: (
            _quota_status(api, LENDER_NS).get("used") == {"devices": 2}
            and _quota_status(api, BORROWER_NS).get("borrowed") == {"devices": 2}
            and _quota_status(api, LENDER_NS).get("lent") == {"devices": 2}), 30, bounded)
        assert _free_cards(api) == 0
