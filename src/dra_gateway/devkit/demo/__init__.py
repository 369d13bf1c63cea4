"""`dra-gateway demo`: the main job on the embedded default, no cluster needed.

It starts, as separate processes of the same Python interpreter, the embedded API server
(`cluster serve`, with its control-plane stand-in), the webhook, the allocator and one node
plugin per simulated GPU node, each against the served API through the same kubernetes-asyncio
code it uses in production; then it creates the example pods through that API, waits until
they are bound and shows what each asked for, the claim template it was translated to and the
GPU share it got. Playing the kubelet, it then asks each node plugin over its DRA gRPC socket to
prepare the claims of the pods bound to its node, and shows what a container would see (the CDI
devices and their environment). The embedded cluster runs no workload controllers, so for a
Deployment, Job, CronJob or training job the demo creates the pods such a controller would
(`<name>-<role>-<i>`).

With the bundled examples it then shows one GPUQuota at work (`examples/demo/quota.yaml`, served
with `cluster serve --policies`): of two pods of namespace quota-demo that the quota cannot hold
together, the second waits gated with the condition dra-gateway.io/QuotaExceeded and an Event
until the demo marks the first finished (phase Succeeded, as its kubelet would), then is placed.

Every child process is stopped (SIGTERM, then SIGKILL after a grace period) whatever happens,
errors and Ctrl-C included; each writes its log into the work directory, and a failure names
the step, the process and the tail of its log. This module decides nothing about pods: it
drives the components and reports what they did.

The package, one idea a module: `pods` (the pods to create, workloads expanded), `processes`
(the child processes and their readiness), `inspection` (what each pod asked for and got),
`quota` (one GPUQuota at work), `session` (one run, in order, and its output), `common`
(shared constants and DemoError). The command line imports this package for `register`, so it
must import the standard library only at module level: components are imported inside the
functions that use them.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from dra_gateway.devkit.demo.common import (
    DEFAULT_PODS,
    DEMO_DIR,
    EXAMPLES,
    GRACE_S,
    NAMESPACE,
    NODES,
    QUOTA_PODS,
    QUOTA_POLICIES,
    WEBHOOK_SERVICE,
    DemoError,
)
from dra_gateway.devkit.demo.inspection import (
    PodReport,
    claim_devices,
    create_pods,
    describe_devices,
    human_bytes,
    inspect,
    legacy_request,
    prepare_on_nodes,
    show_template,
    wait_bound,
)
from dra_gateway.devkit.demo.pods import MAX_PODS, DemoPod, pods_of, read_pods
from dra_gateway.devkit.demo.processes import (
    LOG_TAIL_LINES,
    Child,
    Children,
    Layout,
    allocator_leads,
    free_port,
    log_tail,
    prepare,
    slices_published,
    start_api,
    start_components,
    wait_for,
    webhook_ready,
)
from dra_gateway.devkit.demo.quota import QUOTA_CONDITION, QuotaReport, print_quota, show_quota
from dra_gateway.devkit.demo.session import DemoReport, demo, print_table, run
from dra_gateway.kube import arguments

__all__ = [
    "DEFAULT_PODS", "DEMO_DIR", "EXAMPLES", "GRACE_S", "LOG_TAIL_LINES", "MAX_PODS", "NAMESPACE",
    "NODES", "QUOTA_CONDITION", "QUOTA_PODS", "QUOTA_POLICIES", "WEBHOOK_SERVICE", "Child",
    "Children", "DemoError", "DemoPod", "DemoReport", "Layout", "PodReport", "QuotaReport",
    "allocator_leads", "claim_devices", "create_pods", "demo", "describe_devices", "free_port",
    "human_bytes", "inspect", "legacy_request", "log_tail", "pods_of", "prepare",
    "prepare_on_nodes", "print_quota", "print_table", "read_pods", "register", "run",
    "show_quota", "show_template", "slices_published", "start_api", "start_components",
    "wait_bound", "wait_for", "webhook_ready",
]


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = sub.add_parser(
        "demo", help="run the gateway end to end on an embedded cluster",
        description="Start the embedded API server, the webhook, the allocator and node plugins "
                    "for simulated GPU nodes as separate processes, create example pods that "
                    "ask for GPUs the legacy way, and show how each was translated and placed.")
    parser.add_argument("--pods", action="append", default=[], metavar="FILE", type=Path,
                        help="manifests to create instead of the bundled examples (Pods, or "
                             "workloads whose pods the demo creates; repeatable)")
    parser.add_argument("--timeout", type=arguments.positive_duration, default=120.0,
                        metavar="DURATION", help=arguments.duration_help(
                            "how long to wait for the pods to be placed", 120.0))
    parser.add_argument("--startup-timeout", type=arguments.positive_duration, default=120.0,
                        metavar="DURATION", help=arguments.duration_help(
                            "how long the components may take to start and become ready", 120.0))
    parser.add_argument("--keep", action="store_true",
                        help="keep the work directory (logs, kubeconfig, certificates) and "
                             "print where it is")
    parser.add_argument("--work-dir", type=Path, metavar="DIR",
                        help="work in DIR (created if missing, never removed) instead of a "
                             "temporary directory")
    parser.add_argument("--serve", action="store_true",
                        help="once the pods are placed, keep the embedded cluster and its "
                             "components running, print the kubeconfig and commands to try "
                             "(kubectl, report, migrate plan, defrag plan), and stop cleanly "
                             "on Ctrl-C")
    arguments.output_option(parser, "table", "json")
    parser.set_defaults(func=run)
