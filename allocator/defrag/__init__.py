"""Defragmentation on a live cluster: who waits, who may move, the holds on freed devices, and
the evictions that carry a plan out.

- `view.py` (pure): the cluster's objects to the planner's inputs: a `ClusterState`, the pods
  that wait (gated by the gateway, highest priority and longest wait first) and the pods placed,
  each with why it may not move (no controller re-creates it, `dra-gateway.io/defrag: never`,
  moved within the window) and the PodDisruptionBudgets that select it;
- `holds.py` (pure): the ConfigMap in which a plan holds the devices it frees for the pod they
  are for, and remembers the pods it moved; the allocator reads it and lets nobody else take
  those devices;
- `act.py`: reads the cluster through the port, and carries a plan out: holds written first,
  then evictions through the Eviction API, at most N in flight, each re-placement checked
  before the next;
- `mode.py`: the allocator's own defrag (`--defrag`), for pods waiting longer than a threshold,
  with a cap on moves per hour.

The choice of moves is the pure planner's (`allocator/planner/defrag/`).
"""
