"""The pure planner: claims, slices, classes and nodes in; allocations or reasons out.

Contract with the controller (and the benchmark):

- `PlannerSettings(default_strategy="default", consumable_capacity=True)`;
- `ClusterState(settings)` with `set_slice/remove_slice(name)`, `set_device_class/
  remove_device_class(name)`, `set_node/remove_node(name)`, `set_pod/remove_pod(uid)`,
  `set_claim/remove_claim(uid)` (records status.allocation by ANY writer: consumedCapacity, or
  the fallback annotation dra-gateway.io/shares), `assume(pod, plan)` / `forget(pod, plan)`,
  `set_workload(Workload)` to score `default` against a given distribution;
- `PodPlan(node_name, allocations, annotations, reason)`;
- `plan_pod(state, pod, claims, *, strategy=None) -> PodPlan`, `strategy` one of
  `STRATEGIES` (how pods are packed: `default`, `binpack`, `spread`, `first-fit`).

Everything here is pure: no asyncio, no I/O, no cluster port, no logging, no clock.
"""

from dra_gateway.allocator.planner.allocation import PodPlan
from dra_gateway.allocator.planner.fragmentation import TaskType, Workload
from dra_gateway.allocator.planner.plan import plan_pod
from dra_gateway.allocator.planner.settings import (
    BINPACK,
    DEFAULT,
    FIRST_FIT,
    SPREAD,
    STRATEGIES,
    PlannerSettings,
)
from dra_gateway.allocator.planner.state import ClusterState

__all__ = ["BINPACK", "DEFAULT", "FIRST_FIT", "SPREAD", "STRATEGIES", "ClusterState",
           "PlannerSettings", "PodPlan", "TaskType", "Workload", "plan_pod"]
