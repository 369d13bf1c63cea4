"""The gateway's own GPU domain facts, beside the Kubernetes core: the legacy GPU resource names
and what each counts (`legacy_resources`), which pod group a pod belongs to and the sources it is
read from (`groups`: the gateway's annotations, upstream's PodGroup and Workload, Kueue,
LeaderWorkerSet and the others), the allocator's record of the shares a claim holds in its
allocation (`shares`), and a share's `memoryPercent` of a card in bytes (`memory_percent`). It
stands on `dra_gateway.kube` and imports no component; `dra_gateway.kube` does not import it.
"""
