"""The development kit: what runs the gateway without a cluster, measures it and shows it, kept
apart from the production components (an import-linter contract: they never import it).

`sim/` is the simulator (an in-memory Kubernetes API served over loopback HTTP, with stand-ins
for the claim controller and the scheduler), `realcluster` starts a real control plane on
loopback for the end-to-end tier and the benchmarks, `demo/` is `dra-gateway demo`, `bench/`
holds every benchmark (`bench allocator`, a trace replayed through the planner, among them), and
`cli` registers the kit's subcommands (`cluster serve`, `bench cluster`, `bench allocator`) and
offers the simulator to every component's `--cluster memory`. It ships in the same distribution
as the components, so that the README's `dra-gateway demo` works from an ordinary install.
"""
