"""Webhook throughput and latency against a bare aiohttp TLS handler, side by side, one run.

    .venv/bin/python -m dra_gateway.devkit.bench.webhook [--requests 3000] [--connections 8]
        [--server-core 1] [--client-core 0]

Both servers run, one after the other, in a separate process pinned to one core
(os.sched_setaffinity) and serve TLS on loopback with the same kind of certificate:
- bare: an aiohttp handler that parses the AdmissionReview with orjson and answers `allowed`;
- webhook: `dra-gateway`'s app (built-in rules, in-memory cluster) mutating a realistic HAMi
  pod of a Deployment (each request with its own UID, as the API server sends them).
The client (pinned to another core) is a minimal asyncio TLS client with keep-alive, so that it
costs as little as possible and the server is what is measured. It reports AdmissionReviews per
second and p50/p99 latency with one connection (sequential requests) and the throughput with
several connections, then the webhook/bare ratios. Because a shared machine's load disturbs
wall-clock figures, it also reports reviews per server CPU-second (from /proc), which is what one
dedicated core would sustain. Goal: at least 0.85x the bare throughput and p99 under 1 ms with
one connection.

    .venv/bin/python -m dra_gateway.devkit.bench.webhook --mode validate [--status-writes 20]

`--mode validate` measures /validate instead, the webhook against itself: pods at CREATE (the
HAMi pod above as /mutate left it, in a namespace that has a GPUQuota and a sharing policy)
with no GPU policies in the cluster, and with the 200 GPUQuotas, 50 GPUSharingPolicies and 200
Namespaces of `dra-gateway bench allocator --gpu-policies`, alternated round by round; both
publish 64 nodes of eight A100s or H100s, and the pod's sharing policy allows A100s only, so
its selectors are judged on the cards (allowedModels) in the policies run. With
`--status-writes N` the policies run also has N GPUQuota status writes every 2 s, as the
allocator makes them, each a watched change the webhook's policy cache takes in. Goal: p99 with
policies within 10% of p99 without.
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing
import os
import socket
import ssl
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import orjson


def hami_deployment_pod() -> dict[str, Any]:
    """A pod as a ReplicaSet controller creates it: labels, owner, probes, env, volumes."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "generateName": "llm-serve-7d9c8b6f5-",
            "namespace": "inference",
            "labels": {"app": "llm-serve", "pod-template-hash": "7d9c8b6f5",
                       "app.kubernetes.io/part-of": "inference-platform"},
            "annotations": {"nvidia.com/use-gputype": "A100,H100",
                            "hami.io/gpu-scheduler-policy": "binpack",
                            "prometheus.io/scrape": "true", "prometheus.io/port": "8000"},
            "ownerReferences": [{"apiVersion": "apps/v1", "kind": "ReplicaSet",
                                 "name": "llm-serve-7d9c8b6f5",
                                 "uid": "0c7a3f4e-5b1d-4e8a-9f2c-3d6e7a8b9c0d",
                                 "controller": True, "blockOwnerDeletion": True}],
        },
        "spec": {
            "containers": [{
                "name": "server",
                "image": "vllm/vllm-openai:v0.6.3",
                "args": ["--model", "/models/llama-3-8b", "--gpu-memory-utilization", "0.9",
                         "--max-model-len", "8192", "--port", "8000"],
                "ports": [{"name": "http", "containerPort": 8000, "protocol": "TCP"}],
                "env": [{"name": "HF_HOME", "value": "/models/cache"},
                        {"name": "VLLM_LOGGING_LEVEL", "value": "INFO"},
                        {"name": "POD_NAME", "valueFrom": {"fieldRef": {
                            "apiVersion": "v1", "fieldPath": "metadata.name"}}}],
                "resources": {
                    "limits": {"cpu": "8", "memory": "32Gi", "nvidia.com/gpu": "1",
                               "nvidia.com/gpumem": "8000", "nvidia.com/gpucores": "30"},
                    "requests": {"cpu": "4", "memory": "16Gi"},
                },
                "readinessProbe": {"httpGet": {"path": "/health", "port": 8000,
                                               "scheme": "HTTP"},
                                   "periodSeconds": 10, "timeoutSeconds": 1,
                                   "successThreshold": 1, "failureThreshold": 3},
                "volumeMounts": [
                    {"name": "models", "mountPath": "/models", "readOnly": True},
                    {"name": "kube-api-access-x7k2p", "readOnly": True,
                     "mountPath": "/var/run/secrets/kubernetes.io/serviceaccount"}],
                "terminationMessagePath": "/dev/termination-log",
                "terminationMessagePolicy": "File",
                "imagePullPolicy": "IfNotPresent",
            }],
            "volumes": [
                {"name": "models", "persistentVolumeClaim": {"claimName": "models"}},
                {"name": "kube-api-access-x7k2p", "projected": {"defaultMode": 420, "sources": [
                    {"serviceAccountToken": {"expirationSeconds": 3607, "path": "token"}},
                    {"configMap": {"name": "kube-root-ca.crt",
                                   "items": [{"key": "ca.crt", "path": "ca.crt"}]}}]}}],
            "restartPolicy": "Always",
            "terminationGracePeriodSeconds": 30,
            "dnsPolicy": "ClusterFirst",
            "serviceAccountName": "default",
            "schedulerName": "default-scheduler",
            "enableServiceLinks": True,
            "preemptionPolicy": "PreemptLowerPriority",
            "priority": 0,
            "tolerations": [
                {"key": "node.kubernetes.io/not-ready", "operator": "Exists",
                 "effect": "NoExecute", "tolerationSeconds": 300},
                {"key": "node.kubernetes.io/unreachable", "operator": "Exists",
                 "effect": "NoExecute", "tolerationSeconds": 300}],
        },
    }


def review_body(pod: dict[str, Any], namespace: str = "inference") -> bytes:
    uid = str(uuid.uuid4())
    return orjson.dumps({
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": uid,
            "kind": {"group": "", "version": "v1", "kind": "Pod"},
            "resource": {"group": "", "version": "v1", "resource": "pods"},
            "requestKind": {"group": "", "version": "v1", "kind": "Pod"},
            "requestResource": {"group": "", "version": "v1", "resource": "pods"},
            "namespace": namespace,
            "operation": "CREATE",
            "userInfo": {"username": "system:serviceaccount:kube-system:replicaset-controller",
                         "uid": "4b0c2f7e-1111-4222-8333-944455566677",
                         "groups": ["system:serviceaccounts", "system:serviceaccounts:kube-system",
                                    "system:authenticated"]},
            "object": pod,
            "oldObject": None,
            "dryRun": False,
            "options": {"kind": "CreateOptions", "apiVersion": "meta.k8s.io/v1",
                        "fieldManager": "kube-controller-manager"},
        },
    })


def http_request(path: str, body: bytes) -> bytes:
    return (f"POST {path} HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n"
            f"Accept: application/json\r\nContent-Length: {len(body)}\r\n\r\n").encode() + body


# ---- servers (each in its own pinned process) ------------------------------------------------


def _pin(core: int) -> None:
    os.sched_setaffinity(0, {core})


def _bare_server(tls_dir: str, port: int, core: int) -> None:
    _pin(core)
    from aiohttp import web

    from dra_gateway.certs.tls import server_context

    async def handle(request: web.Request) -> web.Response:
        review = orjson.loads(await request.read())
        return web.Response(body=orjson.dumps({
            "apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
            "response": {"uid": review["request"]["uid"], "allowed": True}}),
            content_type="application/json")

    app = web.Application(client_max_size=3 * 1024 * 1024)
    app.router.add_post("/mutate", handle)
    ctx = server_context(Path(tls_dir) / "tls.crt", Path(tls_dir) / "tls.key")
    web.run_app(app, host="127.0.0.1", port=port, ssl_context=ctx, access_log=None,
                print=None)


def _webhook_server(tls_dir: str, port: int, core: int) -> None:
    _pin(core)
    from dra_gateway.devkit.sim.memory import MemoryCluster
    from dra_gateway.kube.cluster.connect import offer_memory
    from dra_gateway.webhook.server import ServeOptions, serve
    from dra_gateway.webhook.settings import WebhookSettings

    settings = WebhookSettings(tls_dir=Path(tls_dir), reconcile_webhooks=False)
    options = ServeOptions(host="127.0.0.1", port=port, cluster="memory")
    offer_memory(MemoryCluster)  # `--cluster memory`: a fresh simulator
    # Warnings and errors only: the benchmark measures serving, not log volume.
    from dra_gateway.webhook import logs

    logs.configure(30)
    asyncio.run(serve(settings, options))


# The namespace of the validated pods: it has a GPUQuota and a sharing policy (tier t7, which
# requires compute with every share, and here allows A100s only) when the policies are loaded.
VALIDATE_NAMESPACE = "team-007"
_VALIDATE_POLICY = "tier-07"
# The cards both runs publish: nodes of eight A100s or eight H100s (16 device profiles), which
# the pod's selector (A100 or H100) matches both of.
_NODES = 64
# The GPUs of the openb trace's cluster, which the generated quotas are sized against.
_TOTAL_GPUS = 6212


def translated_pod(namespace: str) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """The HAMi pod as /mutate leaves it, and the ResourceClaimTemplates it points at."""
    import jsonpatch

    from dra_gateway.translator.rules import load_rules
    from dra_gateway.translator.translate import translate

    pod = hami_deployment_pod()
    pod["metadata"] = {**pod["metadata"], "namespace": namespace, "name": "llm-serve-x"}
    plan = translate(pod, load_rules())
    if plan.refusal is not None:
        raise RuntimeError(f"the built-in rules refuse the pod: {plan.refusal.message}")
    translated = jsonpatch.apply_patch(pod, plan.patch)
    templates = [{**t, "metadata": {**t["metadata"], "namespace": namespace}}
                 for t in plan.templates]
    return translated, templates


def _node_slice(n: int) -> dict[str, Any]:
    """The ResourceSlice of node `n`: eight shared A100s (even n) or H100s (odd n)."""
    from dra_gateway.kube import names

    node = f"gpu-{n:03d}"
    product = "NVIDIA H100 80GB HBM3" if n % 2 else "NVIDIA A100-SXM4-80GB"
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
            "metadata": {"name": f"{node}-{names.DRIVER}"},
            "spec": {"driver": names.DRIVER, "nodeName": node,
                     "pool": {"name": node, "generation": 0, "resourceSliceCount": 1},
                     "devices": [{
                         "name": f"gpu-{i}", "allowMultipleAllocations": True,
                         "attributes": {"type": {"string": "gpu"},
                                        "uuid": {"string": f"GPU-{n:03d}-{i}"},
                                        "productName": {"string": product},
                                        "index": {"int": i}},
                         "capacity": {"memory": {"value": "80Gi"}, "cores": {"value": "100"}},
                     } for i in range(8)]}}


def _policy_server(tls_dir: str, port: int, core: int, templates: list[dict[str, Any]],
                   policies: bool, status_writes: int) -> None:
    """The webhook over an in-memory cluster holding the pod's templates, and the generated
    GPU policies when `policies`; `status_writes` GPUQuota status writes every 2 s."""
    _pin(core)
    from dra_gateway.devkit.bench.trace import policy_objects
    from dra_gateway.devkit.sim.memory import MemoryCluster
    from dra_gateway.kube.cluster.connect import offer_memory
    from dra_gateway.kube.resources import (
        DEVICE_CLASSES,
        GPU_QUOTAS,
        GPU_SHARING_POLICIES,
        NAMESPACES,
        RESOURCE_CLAIM_TEMPLATES,
        RESOURCE_SLICES,
    )
    from dra_gateway.node_plugin.deviceclasses import device_classes
    from dra_gateway.webhook import logs
    from dra_gateway.webhook.server import ServeOptions, serve
    from dra_gateway.webhook.settings import WebhookSettings

    logs.configure(30)

    async def main() -> None:
        cluster = MemoryCluster()
        for template in templates:
            await cluster.create(RESOURCE_CLAIM_TEMPLATES, template,
                                 namespace=template["metadata"]["namespace"])
        for obj in device_classes():
            await cluster.create(DEVICE_CLASSES, obj)
        for n in range(_NODES):
            await cluster.create(RESOURCE_SLICES, _node_slice(n))
        quotas: list[dict[str, Any]] = []
        if policies:
            namespaces, quotas, sharing = policy_objects(_TOTAL_GPUS)
            for obj in namespaces:
                await cluster.create(NAMESPACES, obj)
            for obj in quotas:
                await cluster.create(GPU_QUOTAS, obj, namespace=obj["metadata"]["namespace"])
            for obj in sharing:
                if obj["metadata"]["name"] == _VALIDATE_POLICY:
                    # Evaluated on the published cards' profiles at /validate.
                    obj["spec"]["allowedModels"] = ["*A100*"]
                await cluster.create(GPU_SHARING_POLICIES, obj)

        async def write_status() -> None:
            n = 0
            while True:
                await asyncio.sleep(2.0)
                for _ in range(status_writes):
                    quota = quotas[n % len(quotas)]
                    n += 1
                    await cluster.patch(
                        GPU_QUOTAS, quota["metadata"]["name"],
                        {"status": {"hard": {"memory": quota["spec"]["hard"]["memory"]},
                                    "used": {"memory": f"{n % 97}Gi"}}},
                        namespace=quota["metadata"]["namespace"], subresource="status")

        writer = asyncio.create_task(write_status()) if quotas and status_writes else None
        settings = WebhookSettings(tls_dir=Path(tls_dir), reconcile_webhooks=False)
        try:
            offer_memory(MemoryCluster)
            await serve(settings, ServeOptions(host="127.0.0.1", port=port, cluster="memory"),
                        cluster=cluster)
        finally:
            if writer is not None:
                writer.cancel()

    asyncio.run(main())


# ---- client ----------------------------------------------------------------------------------


async def _exchange(reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                    request: bytes) -> bytes:
    writer.write(request)
    head = await reader.readuntil(b"\r\n\r\n")
    length = 0
    for line in head.split(b"\r\n"):
        if line[:15].lower() == b"content-length:":
            length = int(line[15:])
    body = await reader.readexactly(length)
    if not head.startswith(b"HTTP/1.1 200"):
        raise RuntimeError(f"unexpected answer: {head.splitlines()[0]!r} {body[:200]!r}")
    return body


async def _connect(port: int, ctx: ssl.SSLContext
                   ) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    return await asyncio.open_connection("127.0.0.1", port, ssl=ctx, server_hostname="localhost")


async def _wait_ready(port: int, ctx: ssl.SSLContext, request: bytes) -> None:
    deadline = time.monotonic() + 60
    while True:
        try:
            reader, writer = await _connect(port, ctx)
            await _exchange(reader, writer, request)
            writer.close()
            return
        except (OSError, asyncio.IncompleteReadError, ssl.SSLError, RuntimeError):
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.2)


async def _one_connection(port: int, ctx: ssl.SSLContext, requests: list[bytes],
                          check: bytes | None) -> tuple[float, list[float]]:
    reader, writer = await _connect(port, ctx)
    latencies = []
    started = time.perf_counter()
    for request in requests:
        t0 = time.perf_counter()
        body = await _exchange(reader, writer, request)
        latencies.append(time.perf_counter() - t0)
        if check is not None and check not in body:
            raise RuntimeError(f"the webhook's answer lacks {check!r}: {body[:300]!r}")
    elapsed = time.perf_counter() - started
    writer.close()
    return elapsed, latencies


async def _many_connections(port: int, ctx: ssl.SSLContext, requests: list[bytes],
                            connections: int) -> float:
    shares = [requests[i::connections] for i in range(connections)]
    conns = [await _connect(port, ctx) for _ in range(connections)]

    async def drive(conn: tuple[asyncio.StreamReader, asyncio.StreamWriter],
                    share: list[bytes]) -> None:
        for request in share:
            await _exchange(conn[0], conn[1], request)

    started = time.perf_counter()
    await asyncio.gather(*(drive(c, s) for c, s in zip(conns, shares, strict=True)))
    elapsed = time.perf_counter() - started
    for _, writer in conns:
        writer.close()
    return elapsed


def _cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process (Linux /proc), immune to other processes' load."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _percentile(values: list[float], q: float) -> float:
    return statistics.quantiles(values, n=1000, method="inclusive")[int(q * 10) - 1]


def measure(name: str, target: Any, tls_dir: str, args: argparse.Namespace,
            check: bytes | None, *, path: str = "/mutate", pod: dict[str, Any] | None = None,
            namespace: str = "inference", target_args: tuple[Any, ...] = ()) -> dict[str, float]:
    port = _free_port()
    process = multiprocessing.get_context("spawn").Process(
        target=target, args=(tls_dir, port, args.server_core, *target_args), daemon=True)
    process.start()
    try:
        ctx = ssl.create_default_context(cafile=str(Path(tls_dir) / "ca.crt"))
        pod = pod if pod is not None else hami_deployment_pod()

        def bodies(count: int) -> list[bytes]:
            return [http_request(path, review_body(pod, namespace)) for _ in range(count)]

        warm, seq, par = bodies(args.warmup), bodies(args.requests), bodies(args.requests * 2)

        async def run() -> dict[str, float]:
            assert process.pid is not None
            await _wait_ready(port, ctx, warm[0])
            await _one_connection(port, ctx, warm, check)
            elapsed, latencies = await _one_connection(port, ctx, seq, check)
            cpu_before = _cpu_seconds(process.pid)
            many = await _many_connections(port, ctx, par, args.connections)
            cpu = _cpu_seconds(process.pid) - cpu_before
            return {
                "rps_1": len(seq) / elapsed,
                "p50_ms": statistics.median(latencies) * 1000,
                "p99_ms": _percentile(latencies, 99) * 1000,
                "rps_n": len(par) / many,
                "per_cpu_s": len(par) / cpu,
            }

        result = asyncio.run(run())
    finally:
        process.terminate()
        process.join(10)
    print(f"{name:9} 1 conn: {result['rps_1']:8.0f} reviews/s  p50 {result['p50_ms']:.3f} ms  "
          f"p99 {result['p99_ms']:.3f} ms   {args.connections} conns: "
          f"{result['rps_n']:8.0f} reviews/s  ({result['per_cpu_s']:.0f} per server CPU-second)",
          flush=True)
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--requests", type=int, default=3000)
    parser.add_argument("--warmup", type=int, default=300)
    parser.add_argument("--connections", type=int, default=8)
    parser.add_argument("--server-core", type=int, default=1)
    parser.add_argument("--client-core", type=int, default=0)
    parser.add_argument("--rounds", type=int, default=3,
                        help="alternate bare and webhook this many times (default: 3)")
    parser.add_argument("--mode", choices=("mutate", "validate"), default="mutate",
                        help="mutate: /mutate against a bare handler (default); validate: "
                             "/validate without and with 200 GPUQuotas and 50 sharing policies")
    parser.add_argument("--status-writes", type=int, default=0, metavar="N",
                        help="validate mode: GPUQuota status writes every 2 s while the "
                             "policies run is measured (default: 0)")
    args = parser.parse_args()
    cores = os.sched_getaffinity(0)
    if args.server_core not in cores or args.client_core not in cores:
        print(f"cores {args.server_core} and {args.client_core} must be among {sorted(cores)}",
              file=sys.stderr)
        return 2
    _pin(args.client_core)
    from dra_gateway.certs.generate import make_bundle, write_bundle

    with tempfile.TemporaryDirectory() as tls_dir:
        write_bundle(make_bundle(dns_names=["localhost"], ip_addresses=["127.0.0.1"]),
                     Path(tls_dir))
        body = len(review_body(hami_deployment_pod()))
        print(f"review body {body} bytes; server pinned to core {args.server_core}, client to "
              f"core {args.client_core}; {args.requests} sequential and {args.requests * 2} "
              f"spread over {args.connections} connections, after {args.warmup} warm-up")
        if args.mode == "validate":
            return _validate(tls_dir, args)
        bares, hooks = [], []
        for _ in range(args.rounds):
            bares.append(measure("bare", _bare_server, tls_dir, args, check=None))
            hooks.append(measure("webhook", _webhook_server, tls_dir, args, check=b'"patch"'))

    def best(runs: list[dict[str, float]]) -> dict[str, float]:
        # On a shared machine other processes only ever slow a run down: the best round of
        # each is the least disturbed measurement of it.
        return {"rps_1": max(r["rps_1"] for r in runs), "rps_n": max(r["rps_n"] for r in runs),
                "p50_ms": min(r["p50_ms"] for r in runs), "p99_ms": min(r["p99_ms"] for r in runs),
                "per_cpu_s": max(r["per_cpu_s"] for r in runs)}

    def median_ratio(key: str) -> float:
        return statistics.median(h[key] / b[key] for h, b in zip(hooks, bares, strict=True))

    bare, hook = best(bares), best(hooks)
    print(f"best of {args.rounds}: bare 1 conn {bare['rps_1']:.0f}/s p99 {bare['p99_ms']:.2f} ms,"
          f" {args.connections} conns {bare['rps_n']:.0f}/s; webhook 1 conn {hook['rps_1']:.0f}/s "
          f"p50 {hook['p50_ms']:.3f} ms p99 {hook['p99_ms']:.2f} ms, {args.connections} conns "
          f"{hook['rps_n']:.0f}/s")
    print(f"ratio webhook/bare (best rounds): 1 conn {hook['rps_1'] / bare['rps_1']:.2f}, "
          f"{args.connections} conns {hook['rps_n'] / bare['rps_n']:.2f}; median of per-round "
          f"ratios: 1 conn {median_ratio('rps_1'):.2f}, {args.connections} conns "
          f"{median_ratio('rps_n'):.2f} (goal: >= 0.85 and webhook p99 < 1 ms)")
    print(f"reviews per server CPU-second (load-independent): bare {bare['per_cpu_s']:.0f}, "
          f"webhook {hook['per_cpu_s']:.0f}, ratio {hook['per_cpu_s'] / bare['per_cpu_s']:.2f}; "
          f"cost per review: bare {1e6 / bare['per_cpu_s']:.0f} us, webhook "
          f"{1e6 / hook['per_cpu_s']:.0f} us")
    return 0


def _validate(tls_dir: str, args: argparse.Namespace) -> int:
    pod, templates = translated_pod(VALIDATE_NAMESPACE)
    print(f"/validate of pod {VALIDATE_NAMESPACE}/{pod['metadata']['name']} at CREATE, "
          f"{len(templates)} template(s); policies run: 200 GPUQuotas, 50 GPUSharingPolicies, "
          f"200 Namespaces, {args.status_writes} quota status writes every 2 s")
    plain: list[dict[str, float]] = []
    loaded: list[dict[str, float]] = []
    for _ in range(args.rounds):
        for runs, name, policies in ((plain, "none", False), (loaded, "policies", True)):
            runs.append(measure(name, _policy_server, tls_dir, args, check=b'"allowed":true',
                                path="/validate", pod=pod, namespace=VALIDATE_NAMESPACE,
                                target_args=(templates, policies, args.status_writes)))

    def ratio(key: str) -> float:
        return float(statistics.median(b[key] / a[key]
                                       for a, b in zip(plain, loaded, strict=True)))

    best_plain = min(r["p99_ms"] for r in plain)
    best_loaded = min(r["p99_ms"] for r in loaded)
    print(f"p99 with one connection, best of {args.rounds}: none {best_plain:.3f} ms, policies "
          f"{best_loaded:.3f} ms ({best_loaded / best_plain:.2f}x); median of per-round ratios "
          f"policies/none: p99 {ratio('p99_ms'):.2f}, p50 {ratio('p50_ms'):.2f}, reviews per "
          f"server CPU-second {ratio('per_cpu_s'):.2f} (goal: p99 within 1.10x)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
