"""Cost of `Selector.matches` against the same check written in plain Python, side by side.

Run: `python -m dra_gateway.devkit.bench.cel [--devices N] [--rounds R]`. Prints microseconds
per match for:

- cold:   a fresh DeviceView (builds the engine context, evaluates, caches the verdict);
- engine: the engine context already built, verdict cache emptied (pure evaluation);
- cached: the verdict already cached on the view (the allocator's steady state);
- python: a hand-written Python check on the raw device dict (parses the memory quantity);
- python-prepared: the same check on values parsed once per device beforehand;

and each as a ratio to the prepared Python check (the cheapest way to answer the question).
Timings are measured in one run on one machine; only the ratios are meant to be compared
across machines.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from functools import partial
from typing import Any

from dra_gateway.kube.cel import DeviceView, Selector, compile_selector, device_view
from dra_gateway.kube.quantity import Quantity, bytes_of

DRIVER = "gpu.nvidia.com"
SELECTOR = (
    'device.capacity["gpu.nvidia.com"].memory.compareTo(quantity("40Gi")) >= 0 && '
    'device.attributes["gpu.nvidia.com"].productName == "NVIDIA H100 80GB HBM3"'
)
PRODUCTS = (
    ("NVIDIA H100 80GB HBM3", "80Gi"),
    ("NVIDIA A100-SXM4-40GB", "40Gi"),
    ("Tesla T4", "16Gi"),
)


def make_device(i: int) -> dict[str, Any]:
    product, memory = PRODUCTS[i % len(PRODUCTS)]
    return {
        "name": f"gpu-{i}",
        "attributes": {
            "type": {"string": "gpu"},
            "uuid": {"string": f"GPU-{i:08d}"},
            "productName": {"string": product},
            "brand": {"string": "Nvidia"},
            "cudaComputeCapability": {"version": "9.0.0"},
            "driverVersion": {"version": "550.54.15"},
            "index": {"int": i % 8},
            "resource.kubernetes.io/pcieRoot": {"string": f"pci0000:{i % 4:02x}"},
        },
        "capacity": {"memory": {"value": memory}},
    }


def python_check(device: dict[str, Any], minimum: int) -> bool:
    memory = device["capacity"]["memory"]["value"]
    product = device["attributes"]["productName"]["string"]
    return bytes_of(memory) >= minimum and product == "NVIDIA H100 80GB HBM3"


def prepare(device: dict[str, Any]) -> tuple[int, str]:
    return bytes_of(device["capacity"]["memory"]["value"]), device["attributes"]["productName"][
        "string"
    ]


def prepared_check(device: tuple[int, str], minimum: int) -> bool:
    return device[0] >= minimum and device[1] == "NVIDIA H100 80GB HBM3"


def match_all(selector: Selector, views: list[DeviceView]) -> list[bool]:
    return [selector.matches(v) for v in views]


def per_call_us(calls: int, run: Callable[[], object]) -> float:
    start = time.perf_counter()
    run()
    return (time.perf_counter() - start) / calls * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--devices", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()

    devices = [make_device(i) for i in range(args.devices)]
    selector = compile_selector(SELECTOR)
    minimum = bytes_of(Quantity.parse("40Gi"))
    expected = [python_check(d, minimum) for d in devices]

    prepared = [prepare(d) for d in devices]
    results: dict[str, list[float]] = {
        "cold": [],
        "engine": [],
        "cached": [],
        "python": [],
        "python-prepared": [],
    }
    for _ in range(args.rounds):
        views: list[DeviceView] = [device_view(DRIVER, d) for d in devices]
        n = len(views)
        results["cold"].append(per_call_us(n, partial(match_all, selector, views)))
        for v in views:
            v._verdicts.clear()
        results["engine"].append(per_call_us(n, partial(match_all, selector, views)))
        results["cached"].append(per_call_us(n, partial(match_all, selector, views)))
        results["python"].append(
            per_call_us(n, lambda: [python_check(d, minimum) for d in devices])
        )
        results["python-prepared"].append(
            per_call_us(n, lambda: [prepared_check(p, minimum) for p in prepared])
        )
        assert [selector.matches(v) for v in views] == expected

    python = min(results["python-prepared"])
    print(f"selector: {SELECTOR}")
    print(f"{args.devices} devices, best of {args.rounds} rounds")
    print(f"{'mode':<16} {'us/match':>10} {'x prepared python':>18}")
    for mode, times in results.items():
        best = min(times)
        print(f"{mode:<16} {best:>10.2f} {best / python:>18.1f}")


if __name__ == "__main__":
    main()
