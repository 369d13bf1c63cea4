"""A pod that does not fit is planned again on its backoff schedule, whatever the event traffic.

On a busy cluster every pending pod sees a stream of events: its own labels and status change,
its claims are touched, slices and classes are republished, other pods come and go. Each of
those used to queue the pod at once, so a pod that cannot fit was planned as often as the
cluster talked about it. The controller now keeps each unplaceable pod's earliest next attempt:
an event may bring a retry forward to the unplaceable retry interval, never below the pod's
backoff, and never more often than that.
"""

from __future__ import annotations

import asyncio

from testkit import eventually

from dra_gateway.allocator.controller import ControllerSettings
from dra_gateway.devkit.sim.memory import MemoryCluster
from dra_gateway.kube.resources import DEVICE_CLASSES, PODS, RESOURCE_CLAIMS, RESOURCE_SLICES

from .conftest import NAMESPACE, World, running_controller, ungated
from .conftest import whole_claim_spec as whole

SETTINGS = ControllerSettings(base_delay=0.05, max_delay=0.4, retry_unplaceable_after=0.01,
                              unplaceable_retry_interval=0.2, resync_period=60.0,
                              identity="backoff-test", event_interval=60.0)


def most_attempts(settings: ControllerSettings, within: float) -> int:
    """How many plans the backoff schedule allows one failing pod in `within` seconds.

    After its k-th failure a pod waits at least min(base * 2**(k-1), max, interval): the
    timer waits out the backoff, and an event may shorten that to the retry interval.
    """
    attempts, elapsed = 1, 0.0
    while True:
        wait = min(settings.base_delay * 2 ** (attempts - 1), settings.max_delay,
                   settings.unplaceable_retry_interval)
        if elapsed + wait > within:
            return attempts
        elapsed += wait
        attempts += 1


async def chatter(memory: MemoryCluster, pod: str, claim: str, stop: asyncio.Event) -> int:
    """Every kind of event a pending pod sees on a busy cluster, every 5 ms; returns how many."""
    n = 0
    slice_name = memory.objects(RESOURCE_SLICES)[0]["metadata"]["name"]
    while not stop.is_set():
        n += 1
        label = {"metadata": {"labels": {"tick": str(n)}}}
        await memory.patch(PODS, pod, label, namespace=NAMESPACE)
        await memory.patch(PODS, pod, {"status": {"conditions": [{
            "type": "PodScheduled", "status": "False", "reason": "SchedulingGated",
            "message": f"tick {n}"}]}}, namespace=NAMESPACE, subresource="status")
        await memory.patch(RESOURCE_CLAIMS, claim, label, namespace=NAMESPACE)
        await memory.patch(RESOURCE_SLICES, slice_name, label)
        await memory.patch(DEVICE_CLASSES, "gpu.dra-gateway.io", label)
        bystander = f"bystander-{n}"
        await memory.create(PODS, {"apiVersion": "v1", "kind": "Pod",
                                   "metadata": {"name": bystander, "namespace": NAMESPACE},
                                   "spec": {"containers": [{"name": "c", "image": "x"}]}},
                            namespace=NAMESPACE)
        await memory.delete(PODS, bystander, namespace=NAMESPACE)
        await asyncio.sleep(0.005)
    return n


async def test_event_traffic_does_not_replan_a_pod_faster_than_its_backoff(
        memory_cluster: MemoryCluster, world: World) -> None:
    await world.setup(nodes=1, gpus=1)
    async with running_controller(memory_cluster, SETTINGS) as controller:
        await world.gated_pod("holder", [whole()])
        await eventually(lambda: ungated(world, "holder"))
        await world.gated_pod("waiting", [whole()])
        await eventually(lambda: controller.stats.failures > 0)
        claim = (await world.claims_of("waiting"))[0]["metadata"]["name"]
        loop = asyncio.get_running_loop()
        before, started = controller.stats.plans, loop.time()
        stop = asyncio.Event()
        traffic = asyncio.create_task(chatter(memory_cluster, "waiting", claim, stop))
        try:
            await asyncio.sleep(2.0)
        finally:
            stop.set()
            events = await traffic
        attempts = controller.stats.plans - before
        # Measured over the time that really passed (a loaded machine wakes the test late).
        # The schedule counts from the pod's first failure and measuring starts later: a plan
        # due just before the window may land in it, hence one more.
        elapsed = loop.time() - started
        allowed = most_attempts(SETTINGS, elapsed) + 1
        assert events > 50, "the chatter did not run: the check proves nothing"
        assert attempts <= allowed, (
            f"{attempts} plans of one pending pod in {elapsed:.1f} s under {events} rounds of "
            f"events; its backoff allows {allowed}")
        assert attempts >= 3, "the pending pod was not retried at all"
        # The waiting pod still takes the card as soon as it frees.
        await memory_cluster.delete(PODS, "holder", namespace=NAMESPACE)
        await eventually(lambda: ungated(world, "waiting"), within=5)


async def test_a_pod_that_fits_after_a_change_is_not_held_back_by_its_backoff(
        memory_cluster: MemoryCluster, world: World) -> None:
    # Backoff limits wasted plans; it must not keep a pod the cluster can now hold waiting for
    # its long timer: the change that freed the card brings the retry forward.
    settings = ControllerSettings(base_delay=0.05, max_delay=30.0, retry_unplaceable_after=0.01,
                                  unplaceable_retry_interval=0.2, resync_period=60.0,
                                  identity="backoff-test", event_interval=60.0)
    await world.setup(nodes=1, gpus=1)
    async with running_controller(memory_cluster, settings) as controller:
        await world.gated_pod("holder", [whole()])
        await eventually(lambda: ungated(world, "holder"))
        await world.gated_pod("waiting", [whole()])
        # Six failures: its next timer retry is 1.6 s away, the one after 3.2 s.
        await eventually(lambda: controller.stats.failures >= 6, within=10)
        await memory_cluster.delete(PODS, "holder", namespace=NAMESPACE)
        await eventually(lambda: ungated(world, "waiting"), within=1.0)
