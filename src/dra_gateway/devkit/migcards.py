"""The MIG geometry of the cards the NVML stand-in plays: A100-40GB, A100-80GB, H100-80GB and
H200-141GB, as NVML answers for them.

Per model: the card's memory and, per GPU instance profile, NVML's profile index (the
`NVML_GPU_INSTANCE_PROFILE_*` constant), its id (nvidia-smi's "ID"), its compute slices
(`sliceCount`), its memory (`memorySizeMB`) and its possible placements (start, size in memory
slices), as `nvidia-smi mig -lgip` and `-lgipp` print them. The four share one geometry: 8
memory slices and 7 compute slices, one instance with media extensions. The H100-80GB memory
figures are nvidia-smi's; the other models' are the nearest MiB to the same fractions, and the
stand-in is compared with a real card's read-only queries where one is lent (the issue's note
says what was compared). The product never reads this table: the node plugin asks NVML.
"""

from __future__ import annotations

from dataclasses import dataclass

from dra_gateway.gpu.mig import Geometry, Profile

# NVML_GPU_INSTANCE_PROFILE_* (nvml.h)
PROFILE_1_SLICE = 0x0
PROFILE_2_SLICE = 0x1
PROFILE_3_SLICE = 0x2
PROFILE_4_SLICE = 0x3
PROFILE_7_SLICE = 0x4
PROFILE_1_SLICE_REV1 = 0x7  # 1g with media extensions
PROFILE_1_SLICE_REV2 = 0x9  # 1g with twice the memory


@dataclass(frozen=True, slots=True)
class ProfileRow:
    index: int  # NVML_GPU_INSTANCE_PROFILE_*
    name: str
    profile_id: int
    compute_slices: int
    memory_mib: int
    size: int
    starts: tuple[int, ...]

    def profile(self) -> Profile:
        return Profile(name=self.name, profile_id=self.profile_id,
                       compute_slices=self.compute_slices, memory_mib=self.memory_mib,
                       size=self.size, starts=self.starts, nvml_index=self.index)


@dataclass(frozen=True, slots=True)
class CardModel:
    name: str  # the card's NVML name
    memory_mib: int
    rows: tuple[ProfileRow, ...]

    def geometry(self) -> Geometry:
        return Geometry(memory_slices=8, compute_slices=7,
                        profiles=tuple(r.profile() for r in self.rows))


def _rows(one: tuple[str, int], double: tuple[str, int], three: tuple[str, int],
          full: tuple[str, int]) -> tuple[ProfileRow, ...]:
    """The rows of the shared geometry, given each size's name and memory (MiB): one memory
    slice, two, four and eight."""
    (n1, m1), (n2, m2), (n4, m4), (n8, m8) = one, double, three, full
    g2 = n2.split(".", 1)[1]  # "20gb": 1g.20gb and 2g.20gb share it
    g4 = n4.split(".", 1)[1]
    return (
        ProfileRow(PROFILE_1_SLICE, n1, 19, 1, m1, 1, (0, 1, 2, 3, 4, 5, 6)),
        ProfileRow(PROFILE_1_SLICE_REV1, f"{n1}+me", 20, 1, m1, 1, (0, 1, 2, 3, 4, 5, 6)),
        ProfileRow(PROFILE_1_SLICE_REV2, n2, 15, 1, m2, 2, (0, 2, 4, 6)),
        ProfileRow(PROFILE_2_SLICE, f"2g.{g2}", 14, 2, m2, 2, (0, 2, 4)),
        ProfileRow(PROFILE_3_SLICE, n4, 9, 3, m4, 4, (0, 4)),
        ProfileRow(PROFILE_4_SLICE, f"4g.{g4}", 5, 4, m4, 4, (0,)),
        ProfileRow(PROFILE_7_SLICE, n8, 0, 7, m8, 8, (0,)),
    )


MODELS: dict[str, CardModel] = {m.name: m for m in (
    CardModel("NVIDIA A100-SXM4-40GB", 40960, _rows(
        ("1g.5gb", 4864), ("1g.10gb", 9856), ("3g.20gb", 20096), ("7g.40gb", 40192))),
    CardModel("NVIDIA A100-SXM4-80GB", 81920, _rows(
        ("1g.10gb", 9728), ("1g.20gb", 19968), ("3g.40gb", 40192), ("7g.80gb", 81152))),
    CardModel("NVIDIA H100 80GB HBM3", 81559, _rows(
        ("1g.10gb", 9984), ("1g.20gb", 20096), ("3g.40gb", 40448), ("7g.80gb", 81152))),
    CardModel("NVIDIA H200", 143771, _rows(
        ("1g.18gb", 16640), ("1g.35gb", 33280), ("3g.71gb", 68096), ("7g.141gb", 133632))),
)}
