"""Time to translate typical pods, against copy.deepcopy of the same pod in the same run.

Rules are loaded once. "warm" is the admission steady state: the request shape was seen before,
so translation walks the pod, hits the shape cache and builds the patch. "cold" clears the cache
before every call: every CEL expression of the rule runs and the template is hashed again.
The baseline, copy.deepcopy of the pod, is about the least any webhook does with a pod.

    .venv/bin/python -m dra_gateway.devkit.bench.translator [--iterations N] [--json]
"""

from __future__ import annotations

import argparse
import copy
import gc
import json
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

from dra_gateway.translator.rules import RuleSet, load_rules
from dra_gateway.translator.translate import translate


def _container(name: str, limits: dict[str, Any]) -> dict[str, Any]:
    return {
        "name": name,
        "image": "registry.example.com/team/app:1.2.3",
        "command": ["python", "-m", "serve"],
        "env": [{"name": "LOG_LEVEL", "value": "info"}, {"name": "PORT", "value": "8080"}],
        "ports": [{"containerPort": 8080, "protocol": "TCP"}],
        "volumeMounts": [{"name": "cache", "mountPath": "/cache"}],
        "resources": {"limits": {"cpu": "4", "memory": "16Gi", **limits},
                      "requests": {"cpu": "2", "memory": "8Gi", **limits}},
    }


def _pod(name: str, *containers: dict[str, Any],
         annotations: dict[str, str] | None = None) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": "ml", "labels": {"app": name},
                     "annotations": {"team": "vision", **(annotations or {})}},
        "spec": {
            "containers": list(containers),
            "volumes": [{"name": "cache", "emptyDir": {}}],
            "nodeSelector": {"kubernetes.io/os": "linux"},
            "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists",
                             "effect": "NoSchedule"}],
        },
    }


PODS: dict[str, dict[str, Any]] = {
    "one whole GPU": _pod("whole", _container("main", {"nvidia.com/gpu": 1})),
    "HAMi share": _pod("hami", _container("main", {
        "nvidia.com/gpu": 1, "nvidia.com/gpumem": 8000, "nvidia.com/gpucores": 30}),
        annotations={"nvidia.com/use-gputype": "A100,H100"}),
    "three containers": _pod(
        "three",
        _container("trainer", {"nvidia.com/gpu": 2}),
        _container("evaluator", {"nvidia.com/gpumem": 4000}),
        _container("logger", {})),
}


def _measure(function: Callable[[], Any], iterations: int) -> list[int]:
    times = []
    clock = time.perf_counter_ns
    for _ in range(iterations):
        start = clock()
        function()
        times.append(clock() - start)
    return times


def _summary(times: list[int]) -> dict[str, float]:
    ordered = sorted(times)
    p99 = ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))]
    return {"median_us": statistics.median(ordered) / 1000, "p99_us": p99 / 1000}


def run(iterations: int, rules: RuleSet) -> list[dict[str, Any]]:
    results = []
    for label, pod in PODS.items():
        plan = translate(pod, rules)
        if plan.refusal is not None or not plan.patch:
            raise SystemExit(f"{label}: the sample pod did not translate: {plan.refusal}")

        def cold(pod: dict[str, Any] = pod) -> Any:
            rules.cache.clear()
            return translate(pod, rules)

        def warm(pod: dict[str, Any] = pod) -> Any:
            return translate(pod, rules)

        def baseline(pod: dict[str, Any] = pod) -> Any:
            return copy.deepcopy(pod)

        gc.disable()
        try:
            base = _summary(_measure(baseline, iterations))
            hot = _summary(_measure(warm, iterations))
            fresh = _summary(_measure(cold, max(iterations // 10, 100)))
        finally:
            gc.enable()
        results.append({
            "pod": label,
            "warm": hot,
            "cold": fresh,
            "deepcopy": base,
            "warm_vs_deepcopy": hot["median_us"] / base["median_us"],
            "cold_vs_deepcopy": fresh["median_us"] / base["median_us"],
        })
    return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--iterations", type=int, default=20000)
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")
    args = parser.parse_args(argv)
    rules = load_rules()
    results = run(args.iterations, rules)
    if args.json:
        print(json.dumps(results, indent=2))
        return 0
    print(f"{'pod':<18} {'warm median':>12} {'warm p99':>10} {'cold median':>12} "
          f"{'cold p99':>10} {'deepcopy':>10} {'warm/deepcopy':>14} {'cold/deepcopy':>14}")
    for row in results:
        print(f"{row['pod']:<18} {row['warm']['median_us']:>10.1f}us "
              f"{row['warm']['p99_us']:>8.1f}us {row['cold']['median_us']:>10.1f}us "
              f"{row['cold']['p99_us']:>8.1f}us {row['deepcopy']['median_us']:>8.1f}us "
              f"{row['warm_vs_deepcopy']:>13.2f}x {row['cold_vs_deepcopy']:>13.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
