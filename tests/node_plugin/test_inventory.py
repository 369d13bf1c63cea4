from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from dra_gateway.node_plugin.inventory import InventoryError, load_inventory, parse_inventory

GPU = {"index": 0, "uuid": "GPU-aaaa-0001", "productName": "NVIDIA L4", "memory": "24Gi",
       "cudaComputeCapability": "8.9", "driverVersion": "535.104.05",
       "pciBusID": "0000:41:00.0", "numaNode": 0}


def test_the_eight_gpu_example_loads_every_card(h100x8: Path) -> None:
    facts = load_inventory(h100x8)
    assert [g.index for g in facts.gpus] == list(range(8))
    assert {g.memory for g in facts.gpus} == {80 * 2**30}
    assert len({g.uuid for g in facts.gpus}) == 8
    assert {g.driver_version for g in facts.gpus} == {"550.54.15"}


def test_mig_devices_put_the_card_in_mig_mode(mixed: Path) -> None:
    facts = load_inventory(mixed)
    assert [g.mig_enabled for g in facts.gpus] == [True, False, False]
    assert [m.profile for m in facts.gpus[0].mig_devices] == ["3g.40gb", "2g.20gb", "1g.10gb"]
    assert facts.gpus[1].sharing == "shared"


def test_every_fault_is_reported_with_its_path() -> None:
    data = {"gpus": [GPU, {**GPU, "index": 1, "uuid": "GPU-aaaa-0002"},
                     {**GPU, "index": 2, "uuid": "GPU-aaaa-0003", "memory": "80GB"},
                     {**GPU, "index": 3, "uuid": "GPU-aaaa-0004", "colour": "green"}]}
    with pytest.raises(InventoryError) as caught:
        parse_inventory(data, source="node.yaml")
    assert caught.value.errors == [
        'gpus[2].memory: invalid quantity "80GB": unknown suffix "GB"; use a binary suffix '
        '(Ki, Mi, Gi, Ti, Pi, Ei), a decimal one (n, u, m, k, M, G, T, P, E) or an exponent '
        'such as "e3"',
        "gpus[3].colour: unknown field",
    ]
    assert str(caught.value).startswith("node.yaml: 2 errors: gpus[2].memory: invalid quantity")


def test_invalid_values_name_field_and_expected_form() -> None:
    data = {"gpus": [{**GPU, "uuid": "abc", "cudaComputeCapability": "nine",
                      "pciBusID": "18:00", "sharing": "sometimes"}]}
    with pytest.raises(InventoryError) as caught:
        parse_inventory(data)
    assert caught.value.errors == [
        'gpus[0].uuid: invalid GPU UUID "abc": expected "GPU-" and hex digits',
        'gpus[0].cudaComputeCapability: invalid version "nine": expected numbers such as "9.0" '
        'or "535.104.05"',
        'gpus[0].pciBusID: invalid PCI bus ID "18:00": expected a form like "0000:18:00.0"',
        "gpus[0].sharing: Input should be 'exclusive' or 'shared'",
    ]


def test_duplicate_indexes_and_uuids_are_refused() -> None:
    data = {"gpus": [GPU, {**GPU, "pciBusID": "0000:42:00.0"}]}
    with pytest.raises(InventoryError) as caught:
        parse_inventory(data)
    assert caught.value.errors == [
        "gpus[1].index: duplicate index 0 (also gpus[0])",
        "gpus[1].uuid: duplicate uuid 'GPU-aaaa-0001' (also gpus[0])",
    ]


def test_missing_fields_and_mig_overcommit_are_refused() -> None:
    gpu = {k: v for k, v in GPU.items() if k != "productName"}
    mig = {"profile": "1g.10gb", "uuid": "MIG-aaaa", "memory": "30Gi"}
    data = {"gpus": [gpu, {**GPU, "index": 1, "uuid": "GPU-aaaa-0002",
                           "migDevices": [mig]}]}
    with pytest.raises(InventoryError) as caught:
        parse_inventory(data)
    assert caught.value.errors == [
        "gpus[0].productName: required field is missing",
        "gpus[1]: migDevices: their memory (32212254720 bytes) exceeds the card's "
        "(25769803776 bytes)",
    ]


def test_unreadable_and_malformed_files_name_the_file(tmp_path: Path) -> None:
    with pytest.raises(InventoryError, match=r"missing\.yaml: 1 error: cannot read the file"):
        load_inventory(tmp_path / "missing.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("gpus: [\n")
    with pytest.raises(InventoryError, match=r"bad.yaml: 1 error: line 2, column 1: not valid "):
        load_inventory(bad)
    empty = tmp_path / "empty.yaml"
    empty.write_text(yaml.safe_dump([1, 2]))
    with pytest.raises(InventoryError, match="expected a mapping with a `gpus` list"):
        load_inventory(empty)


def test_a_bare_number_too_small_for_bytes_of_a_card_is_refused_with_its_unit() -> None:
    with pytest.raises(InventoryError) as caught:
        parse_inventory({"gpus": [{**GPU, "memory": 81920}]})
    assert caught.value.errors == [
        "gpus[0].memory: 81920 has no unit and, read as bytes, is 80Ki: less than any GPU "
        "holds; write the unit, e.g. 81920Mi (nvidia-smi counts MiB)"]
    # Bytes, and quantities with their unit, are read as written.
    for memory in (85899345920, "85899345920", "80Gi", "81920Mi"):
        assert parse_inventory({"gpus": [{**GPU, "memory": memory}]}).gpus[0].memory == 80 << 30


def test_mig_instances_whose_placements_overlap_are_refused() -> None:
    migs = [{"profile": "3g.40gb", "uuid": "MIG-aaaa", "memory": "4Gi",
             "placement": {"start": 0, "size": 4}},
            {"profile": "1g.10gb", "uuid": "MIG-bbbb", "memory": "4Gi",
             "placement": {"start": 4, "size": 1}},
            {"profile": "2g.20gb", "uuid": "MIG-cccc", "memory": "4Gi",
             "placement": {"start": 2, "size": 2}}]
    with pytest.raises(InventoryError) as caught:
        parse_inventory({"gpus": [{**GPU, "migDevices": migs}]})
    assert caught.value.errors == [
        "gpus[0]: migDevices[0] and migDevices[2] overlap: their placements share slices of the "
        "card (one from 0 to 3, the other from 2); MIG instances of one card never share a "
        "slice"]
    # Side by side, they are fine.
    migs[2]["placement"] = {"start": 5, "size": 2}
    assert len(parse_inventory({"gpus": [{**GPU, "migDevices": migs}]}).gpus[0].mig_devices) == 3


def test_nvlink_islands_and_cliques_are_read_from_the_file_and_checked() -> None:
    data = {"gpus": [{**GPU, "nvlinkIsland": 0, "nvlinkClique": "c0ffee.3"},
                     {**GPU, "index": 1, "uuid": "GPU-aaaa-0002", "nvlinkIsland": 0}]}
    facts = parse_inventory(data)
    assert [(g.nvlink_island, g.nvlink_clique) for g in facts.gpus] == [
        (0, "c0ffee.3"), (0, None)]
    with pytest.raises(InventoryError) as caught:
        parse_inventory({"gpus": [{**GPU, "nvlinkIsland": -1, "nvlinkClique": ""}]})
    assert [e.split(":")[0] for e in caught.value.errors] == [
        "gpus[0].nvlinkIsland", "gpus[0].nvlinkClique"]
