"""The simulator: an in-memory Kubernetes API and the tooling around it, for the embedded default
(`dra-gateway cluster serve`, `dra-gateway demo`), the tests and the benchmarks.

`memory` is the store, a `Cluster` with Kubernetes semantics (it words refusals through
`errors`, applies patches through `patching`, checks writes through `validation` and filters
watches through `watching`; `selectors` parses label and field selectors); `server` serves any
cluster over loopback HTTP as the Kubernetes API, calling registered webhooks through
`admission`, with `openapi` (its OpenAPI v3 documents), `tables` (kubectl get's columns) and
`crds` with `structural` (the chart's CRDs, their schemas enforced); `controlplane` stands in for
the claim controller and scheduler the embedded default lacks; `manifests` reads seed files;
`bench` measures what the HTTP hop costs.

Production code (the components, `dra_gateway.kube.cluster`) must not import this package: an
import-linter contract says so. The command line (`dra_gateway.devkit.cli`, which offers it to
`connect` for `--cluster memory`), the rest of the development kit and the tests do.
"""

from dra_gateway.devkit.sim.memory import MemoryCluster

__all__ = ["MemoryCluster"]
