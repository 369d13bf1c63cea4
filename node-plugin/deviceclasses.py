"""The DeviceClasses of the gateway's devices: whole or shared GPUs, and MIG instances.

Selectors follow NVIDIA's classes (driver and `type` attribute), so the two look alike to users.
Pure data; installing them is the Helm chart's or the operator's job.
"""

from __future__ import annotations

from typing import Any

from dra_gateway.kube import names
from dra_gateway.kube.resources import DEVICE_CLASSES


def device_class(name: str, *, driver: str, device_type: str) -> dict[str, Any]:
    expression = (f"device.driver == '{driver}' && "
                  f"device.attributes['{driver}'].type == '{device_type}'")
    return {
        "apiVersion": DEVICE_CLASSES.api_version,
        "kind": DEVICE_CLASSES.kind,
        "metadata": {"name": name, "labels": {names.LABEL_MANAGED_BY: names.MANAGED_BY}},
        "spec": {"selectors": [{"cel": {"expression": expression}}]},
    }


def device_classes(driver: str = names.DRIVER) -> list[dict[str, Any]]:
    return [device_class(names.GPU_CLASS, driver=driver, device_type="gpu"),
            device_class(names.MIG_CLASS, driver=driver, device_type="mig")]
