"""The translator's claims as the node plugin's shared cards and prepare read them.

Consumption follows upstream consumable capacity: a requested amount rounded up to the request
policy's range, an amount not requested at the policy's default (the whole card).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from dra_gateway.gpu import mig as gpu_mig
from dra_gateway.kube import names
from dra_gateway.kube.cel import compile_selector
from dra_gateway.kube.cel.devices import device_view
from dra_gateway.kube.quantity import parse_quantity
from dra_gateway.node_plugin import cdi
from dra_gateway.node_plugin.claims import plan_claim
from dra_gateway.node_plugin.devices import DeviceOptions, device_table, devices_of
from dra_gateway.node_plugin.inventory import load_inventory
from dra_gateway.translator.rules import load_rules
from dra_gateway.translator.translate import translate

from .claimdata import NODE, UID

SHARES = [
    {"aliyun.com/gpu-mem": "6"},
    {"nvidia.com/gpumem": "4000"},
    {"nvidia.com/gpumem-percentage": "25"},
    {"nvidia.com/gpu": "1", "nvidia.com/gpucores": "30"},
    {"nvidia.com/gpu.shared": "1"},
    {"k8s.amazonaws.com/vgpu": "2"},
    {"koordinator.sh/gpu-core": "20", "koordinator.sh/gpu-memory-ratio": "20"},
    {"tke.cloud.tencent.com/qgpu-core": "50", "tke.cloud.tencent.com/qgpu-memory": "4"},
]


def _consumed(requested: dict[str, str], capacity: dict[str, Any]) -> dict[str, int]:
    out = {}
    for name, entry in capacity.items():
        policy = entry["requestPolicy"]
        if name not in requested:
            out[name] = parse_quantity(policy["default"]).nanos
            continue
        amount = parse_quantity(requested[name]).nanos
        low = parse_quantity(policy["validRange"]["min"]).nanos
        step = parse_quantity(policy["validRange"].get("step", "0")).nanos or 1
        amount = max(amount, low)
        out[name] = low + -(-(amount - low) // step) * step
    return out


@pytest.mark.parametrize("limits", SHARES, ids=lambda limits: ",".join(limits))
def test_a_translated_share_consumes_only_what_it_asks_and_is_limited_to_its_config(
        limits: dict[str, str], mixed: Path) -> None:
    facts = load_inventory(mixed)
    options = DeviceOptions(consumable_capacity=True)
    (card,) = [d for d in devices_of(facts, options) if d.get("allowMultipleAllocations")]
    pod = {"metadata": {"name": "p", "namespace": "ml"},
           "spec": {"containers": [{"name": "main", "resources": {"limits": limits}}]}}
    plan = translate(pod, load_rules())
    (template,) = plan.templates
    spec = template["spec"]["spec"]
    (request,) = spec["devices"]["requests"]
    params = spec["devices"]["config"][0]["opaque"]["parameters"]
    consumed = _consumed(request["exactly"]["capacity"]["requests"], card["capacity"])
    whole = {n: parse_quantity(c["value"]).nanos for n, c in card["capacity"].items()}
    if "memoryPercent" in params:
        # Relative memory has no absolute request: the allocator resolves it per card.
        consumed["memory"] = whole["memory"] * params["memoryPercent"] // 100
    # Nothing is taken at the default: the card stays open to other shares.
    assert all(consumed[n] < whole[n] for n in whole), consumed

    claim = {"metadata": {"name": "p-main", "namespace": "ml", "uid": UID}, "spec": spec,
             "status": {"allocation": {"devices": {"results": [{
                 "request": "main", "driver": names.DRIVER, "pool": NODE,
                 "device": card["name"], "shareID": "5b0f6b8e-2a4e-4f43-9d1c-6b1f3c2a9e77",
                 "consumedCapacity": {n: str(parse_quantity(f"{v}n")) for n, v in
                                      consumed.items()}}]}}}}
    kind = cdi.cdi_kind(names.DRIVER)
    prepared = plan_claim(claim, uid=UID, node_name=NODE, node_labels={}, driver=names.DRIVER,
                          kind=kind, devices=device_table(facts, options))
    share = prepared.devices[0].card
    assert (share.memory is not None) == ("memory" in params or "memoryPercent" in params)
    assert (share.cores is not None) == ("cores" in params)


MIG_INVENTORY = """
driverVersion: "550.54.15"
cudaDriverVersion: "12.4"
gpus:
  - index: 0
    uuid: GPU-5a1e2b7c-0d3f-4e59-8a61-2c4b9e7f1a03
    productName: NVIDIA H100 80GB HBM3
    memory: 80Gi
    migDevices:
      - {profile: 1g.10gb+me, uuid: MIG-0f8e6a2d-3b1c-5e47-9d20-6a7b8c9d0e11, memory: 9984Mi,
         profileId: 20, placement: {start: 0, size: 1}}
      - {profile: 1g.10gb, uuid: MIG-1a2b3c4d-5e6f-5a7b-8c9d-0e1f2a3b4c5d, memory: 9984Mi,
         profileId: 19, placement: {start: 1, size: 1}}
      - {profile: 3g.40gb, uuid: MIG-2b3c4d5e-6f7a-5b8c-9d0e-1f2a3b4c5d6e, memory: 40448Mi,
         profileId: 9, placement: {start: 4, size: 4}}
"""


@pytest.mark.parametrize(("resource", "profile"), [
    ("nvidia.com/mig-1g.10gb.me", "1g.10gb+me"),
    ("nvidia.com/mig-1g.10gb", "1g.10gb"),
    ("nvidia.com/mig-3g.40gb", "3g.40gb"),
])
def test_a_translated_mig_request_selects_the_instances_of_its_profile(
        resource: str, profile: str, tmp_path: Path) -> None:
    """The device plugin's names, `+` written as `.`, select the devices NVML's profile names
    (a `.me` request that matched nothing waited for ever)."""
    inventory = tmp_path / "mig.yaml"
    inventory.write_text(MIG_INVENTORY)
    devices = devices_of(load_inventory(inventory), DeviceOptions())
    pod = {"metadata": {"name": "p", "namespace": "ml"},
           "spec": {"containers": [{"name": "main", "resources": {"limits": {resource: "1"}}}]}}
    (template,) = translate(pod, load_rules()).templates
    (request,) = template["spec"]["spec"]["devices"]["requests"]
    selectors = [compile_selector(s["cel"]["expression"])
                 for s in request["exactly"]["selectors"]]
    chosen = [d for d in devices
              if all(s.matches(device_view(names.DRIVER, d)) for s in selectors)]
    assert [d["attributes"]["profile"]["string"] for d in chosen] == [profile]
    assert gpu_mig.profile_of_resource(resource) == profile  # one reading of the names


def _chosen(request: dict[str, Any], devices: list[dict[str, Any]]) -> tuple[str, list[str]]:
    """The alternative the allocator would take (the first with a device) and the profiles
    of the devices it matches."""
    alternatives = request.get("firstAvailable") or [{"name": "", **request["exactly"]}]
    for alternative in alternatives:
        selectors = [compile_selector(s["cel"]["expression"])
                     for s in alternative.get("selectors", [])]
        chosen = [d["attributes"]["profile"]["string"] for d in devices
                  if all(s.matches(device_view(names.DRIVER, d)) for s in selectors)]
        if chosen:
            return alternative["name"], chosen
    return "", []


@pytest.mark.parametrize(("limits", "annotations", "node_selector", "wanted"), [
    ({"nvidia.com/gpu": "1"}, {}, {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3-MIG-3g.40gb"},
     ("", ["3g.40gb"])),
    ({"nvidia.com/gpu": "1"}, {}, {"cloud.google.com/gke-gpu-partition-size": "1g.10gb"},
     ("", ["1g.10gb"])),
    # 8000 MiB: the smallest profile that holds it (1g.10gb, not its +me twin nor the 3g).
    ({"nvidia.com/gpumem": "8000"}, {"nvidia.com/vgpu-mode": "mig"}, {},
     ("1g-10gb", ["1g.10gb"])),
    ({"volcano.sh/vgpu-memory": "30000"}, {"volcano.sh/vgpu-mode": "mig"}, {},
     ("3g-40gb", ["3g.40gb"])),
])
def test_the_other_mig_forms_select_the_instances_an_administrator_made(
        limits: dict[str, str], annotations: dict[str, str], node_selector: dict[str, str],
        wanted: tuple[str, list[str]], tmp_path: Path) -> None:
    inventory = tmp_path / "mig.yaml"
    inventory.write_text(MIG_INVENTORY)
    devices = devices_of(load_inventory(inventory), DeviceOptions())
    pod = {"metadata": {"name": "p", "namespace": "ml", "annotations": annotations},
           "spec": {"nodeSelector": node_selector,
                    "containers": [{"name": "main", "resources": {"limits": limits}}]}}
    (template,) = translate(pod, load_rules()).templates
    (request,) = template["spec"]["spec"]["devices"]["requests"]
    assert _chosen(request, devices) == wanted
