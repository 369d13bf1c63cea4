"""The benchmarks, in one package.

- `trace`: the trace library (an openb trace read, the simulated cluster, the translated pods and
  their claims, the replay primitives); it imports no other module of the package.
- `groups`, `preemption`, `defrag`: the variants of `dra-gateway bench allocator` (`--groups`,
  `--preemption`, `--defrag-moves`), on the trace library.
- Entry points: `allocator` (`dra-gateway bench allocator`, which dispatches to the variants),
  `topology` (`dra-gateway bench topology`), and the benchmarks run as modules,
  `.venv/bin/python -m dra_gateway.devkit.bench.NAME`: `cel`, `translator`, `webhook`, `e2e`,
  `realnode` (the last two with the end-to-end and real-node tiers' helpers under tests/) and
  `speedlayer` (`plan_pod` against the plain `dra_gateway.devkit.reference_planner` on the
  trace, on the trace library: what the node classes, memo and rankings buy) and `mig` (MIG
  placement, the gateway's rule against first fit, on a stream of its own).

`.importlinter` holds them to these layers: entry points above variants above the trace library.
"""
