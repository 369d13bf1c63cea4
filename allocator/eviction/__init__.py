"""Evictions on a live cluster, for preemption, cohort reclaim, defragmentation and the drain of
failed devices: who is chosen, how each pod is told and evicted, and the holds that keep the
devices freed for the pod they are for.

Who may leave, and why not, is decided by the pure planner (`allocator/planner/leaving.py`:
the rules; `planner/preemption.py` and `planner/defrag/`: the choice). This package carries it
out:

- `inputs.py` (pure): the cluster's objects to the planners' inputs: a `ClusterState`, the pods
  that wait (gated by the gateway, highest priority and longest wait first) and the pods placed,
  each with why it may not move and the PodDisruptionBudgets that select it;
- `holds.py` (pure): the records ConfigMap's format: the devices a plan frees, held for the pod
  they are for, and the pods moved;
- `store.py`: what the modes read and write through the cluster port (the snapshot, the records);
- `evict.py`: the one carry-out path (the `DisruptionTarget` condition, the Event, the fenced
  Eviction API call) and the one loop of rounds (`run_rounds`);
- `preemption.py`, `defrag.py` (with `moves.py`, the carrying out of a defrag plan, also used by
  `dra-gateway defrag apply`) and `drain.py`: the three modes the allocator's leader runs.
"""
