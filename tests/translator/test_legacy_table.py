"""The built-in rules and the core's table of legacy names (`gpu/legacy_resources.py`) agree.

A protocol's names and units live in one table that the node plugin and the quota conversion
read; its translation lives in a rule of `translator/builtin/`. Each test here says, when they
disagree, what to add or change in which file, so that a new protocol is its rows there plus
its rule here, and a failing test names the missing half.
"""

from __future__ import annotations

from dataclasses import dataclass

import yaml

from dra_gateway.gpu.legacy_resources import (
    LEGACY_RESOURCES,
    UNITS,
    is_legacy_gpu_resource,
    legacy_resource,
)
from dra_gateway.kube import names
from dra_gateway.translator.documents import RuleSpec
from dra_gateway.translator.loading import builtin_sources

_TABLE = "gpu/legacy_resources.py"
_ROW = ('LegacyResource("{name}", "gpu", "<who hands it out>", '
        '"<devices|memory|cores|memory-percent|priority>", "{unit}")')


@dataclass(frozen=True)
class _Read:
    """A resource name a built-in rule reads, in its unit, for its class."""

    name: str
    unit: str
    rule: str
    file: str
    class_name: str

    @property
    def where(self) -> str:
        return f"rule {self.rule} ({self.file})"

    @property
    def gateway(self) -> bool:
        return self.class_name in names.GATEWAY_CLASSES


def _built_in_reads() -> list[_Read]:
    reads = []
    for file, text in builtin_sources():
        for document in yaml.safe_load_all(text):
            for raw in document.get("rules", ()):
                rule = RuleSpec.model_validate(raw)
                reads.extend(_Read(name, spec.unit if spec is not None else "", rule.name,
                                   file.removeprefix("builtin/"), rule.device.class_name)
                             for name, spec in rule.resources.items())
    return reads


READS = _built_in_reads()


def test_the_built_in_rules_are_read() -> None:
    assert len({read.rule for read in READS}) > 20
    assert {read.file for read in READS} >= {"nvidia.yaml", "koordinator.yaml", "volcano.yaml",
                                             "alibaba.yaml", "tencent.yaml", "vendors.yaml"}


def test_every_name_of_the_table_is_read_by_a_built_in_rule() -> None:
    read = {r.name for r in READS}
    unread = [
        f"{_TABLE} lists {row.name}, but no rule of translator/builtin/ reads it: add it to the "
        f"`resources` of its protocol's rule there"
        + (f" ({row.name}: {{unit: {row.unit}}})" if row.unit else "")
        for row in LEGACY_RESOURCES if row.name not in read]
    assert unread == [], "\n".join(unread)


def test_every_gpu_name_a_built_in_rule_reads_is_in_the_table() -> None:
    # A rule of the gateway's classes, or a name of a GPU family: the node plugin must withhold
    # its cards and a GPUQuota must know what it counts, both from the table.
    missing = [
        f"{read.where} reads {read.name}, which {_TABLE} does not list: add a row to "
        f"LEGACY_RESOURCES, {_ROW.format(name=read.name, unit=read.unit)} (reference "
        "\"Legacy and vendor GPU request protocols\"); policy/legacyquotas.py derives its "
        "GPUQuota terms from it"
        for read in READS
        if (read.gateway or is_legacy_gpu_resource(read.name))
        and legacy_resource(read.name) is None]
    assert missing == [], "\n".join(missing)


def test_the_built_in_rules_read_each_name_in_the_unit_of_the_table() -> None:
    differ = []
    for read in READS:
        row = legacy_resource(read.name)
        if row is not None and row.unit != read.unit:
            differ.append(
                f"{read.where} reads {read.name} in unit {read.unit!r}, {_TABLE} says "
                f"{row.unit!r}: make them the reference's (the rule's `unit:`, the row's `unit`)")
    assert differ == [], "\n".join(differ)


def test_a_name_is_the_gateways_exactly_when_its_row_names_no_other_allocator() -> None:
    wrong = []
    for row in LEGACY_RESOURCES:
        gateway_rules = sorted(r.where for r in READS if r.name == row.name and r.gateway)
        if row.allocator and gateway_rules:
            wrong.append(f"{row.name}: {_TABLE} says {row.allocator} allocates it, but "
                         f"{', '.join(gateway_rules)} sends it to a gateway class: clear the "
                         "row's `allocator` (a GPUQuota then counts it)")
        if not row.allocator and not gateway_rules:
            wrong.append(f"{row.name}: no built-in rule sends it to a gateway class, but its row "
                         f"in {_TABLE} names no other allocator: set `allocator` to whose "
                         "driver allocates it (a GPUQuota then leaves it to its ResourceQuota)")
    assert wrong == [], "\n".join(wrong)


def test_every_unit_of_the_table_is_one_rules_know() -> None:
    assert sorted(row.name for row in LEGACY_RESOURCES if row.unit not in UNITS) == []
