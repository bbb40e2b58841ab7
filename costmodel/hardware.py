"""Hardware profiles: devices, links and how they form a cluster.

Units are SI and converted once, in `costmodel.catalog`: FLOP/s, bytes, bytes/s,
seconds. A user adds a profile as a JSON file holding a `ClusterSpec`.

>>> cluster = load_hardware("a100-80gb")
>>> cluster.device.peak_flops_per_s["bfloat16"], cluster.devices_per_node
(312000000000000.0, 8)
"""

from __future__ import annotations

from enum import StrEnum
from pathlib import Path
from typing import Annotated

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    NonNegativeFloat,
    PositiveFloat,
    PositiveInt,
    ValidationError,
)

from costmodel.collectives import Tier
from costmodel.errors import InvalidConfigError, UnsupportedError, first_problem, read_user_file
from costmodel.roofline import MIN_EFFICIENCY, Efficiency

# Floors no part comes near (a CPU core does GFLOP/s and GB/s), so that seconds computed from a
# profile stay finite: a fuzzed profile of 1e-300 rates divided by zero.
FlopRate = Annotated[float, Field(ge=1e6)]
ByteRate = Annotated[float, Field(ge=1e3)]


class DeviceKind(StrEnum):
    GPU = "gpu"
    TPU = "tpu"
    CPU = "cpu"


class StepAllocator(BaseModel):
    """How the runtime allocates a step's temporaries, where that costs time.

    XLA's GPU and TPU runtimes draw a step's temporaries from a pool kept across steps
    (no catalog profile sets this). Its CPU runtime allocates a device's temporaries anew
    every step, and on Linux an allocation above ~32 MiB (glibc's largest mmap threshold)
    comes back as freshly mapped memory whose every page the kernel faults in and zeroes
    again (`validate.cpu_profile` measures both numbers).
    """

    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)  # a profile is finite numbers

    fresh_above_bytes: NonNegativeFloat = Field(description="Temporaries per device above this are mapped afresh every step.")
    first_touch_s_per_byte: NonNegativeFloat = Field(description="Seconds to fault in and zero one byte of freshly mapped memory.")


class DeviceSpec(BaseModel):
    """One accelerator: peaks per dtype, memory, and what its kernels reach of them."""

    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)  # a profile is finite numbers

    name: str = Field(description="Part name.")
    kind: DeviceKind = Field(description="GPU, TPU or CPU.")
    peak_flops_per_s: dict[str, FlopRate] = Field(
        description="Dense peak per dtype ('float32', 'tf32', 'bfloat16', 'float16', 'float8_e4m3fn', 'int8'); only what the part has."
    )
    hbm_bytes: PositiveFloat = Field(description="Device memory capacity.")
    hbm_bytes_per_s: ByteRate = Field(description="Device memory bandwidth.")
    power_limit_w: PositiveFloat | None = Field(None, description="Board power limit the peaks and efficiencies assume.")
    efficiency: Efficiency = Field(default_factory=Efficiency, description="Achievable fractions of the peaks.")
    step_allocator: StepAllocator | None = Field(None, description="Per-step cost of allocating temporaries; None for a pooled allocator.")
    source: str = Field(description="Where the numbers come from.")

    def peak_for(self, dtype: str) -> float:
        """Dense peak FLOP/s for ``dtype``; raises `UnsupportedError` if the part lacks it."""
        if dtype not in self.peak_flops_per_s:
            raise UnsupportedError(
                f"{self.name} has no {dtype} peak (it has {', '.join(sorted(self.peak_flops_per_s))})",
                fix="choose a compute dtype the part supports",
            )
        return self.peak_flops_per_s[dtype]


class LinkSpec(BaseModel):
    """A link tier as one device sees it: bandwidth per direction, latency, NCCL/XLA efficiency."""

    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)  # a profile is finite numbers

    name: str = Field(description="e.g. 'nvlink3', 'ib-hdr200', 'ici-v5p', 'dcn'.")
    bytes_per_s: ByteRate = Field(description="Peak bandwidth per device, per direction.")
    latency_s: NonNegativeFloat = Field(description="Per-hop latency of a collective step (alpha).")
    efficiency: float = Field(0.8, ge=MIN_EFFICIENCY, le=1, description="Fraction of bytes_per_s collectives reach on large messages.")
    source: str = Field(description="Where the numbers come from.")

    def tier(self, *, wraparound: bool = False) -> Tier:
        """The collective model's view of this link."""
        return Tier(bytes_per_s=self.bytes_per_s * self.efficiency, latency_s=self.latency_s, bidirectional_ring=wraparound)


class ClusterSpec(BaseModel):
    """A hardware profile: the device, how many share a node, and the links within and between nodes.

    For TPUs a "node" is a slice: ``intra_node`` is its ICI torus (``torus_dims``, rings
    with wrap-around) and ``inter_node`` the data-centre network between slices.
    """

    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)  # a profile is finite numbers

    name: str = Field(description="Profile name.")
    device: DeviceSpec = Field(description="The accelerator.")
    devices_per_node: PositiveInt = Field(description="Devices on one intra-node fabric (GPU node, TPU slice).")
    intra_node: LinkSpec = Field(description="NVLink/NVSwitch, PCIe, or TPU ICI.")
    inter_node: LinkSpec = Field(description="InfiniBand/RoCE NIC per device, or DCN.")
    torus_dims: tuple[PositiveInt, ...] = Field((), description="TPU slice torus shape; empty for switched fabrics.")

    @property
    def wraparound(self) -> bool:
        return bool(self.torus_dims)


def list_hardware() -> list[str]:
    """Names of the built-in profiles."""
    from costmodel.catalog import CATALOG

    return sorted(CATALOG)


def load_hardware(name_or_path: str, *, devices_per_node: int | None = None) -> ClusterSpec:
    """A built-in profile by name, or a `ClusterSpec` JSON file; ``devices_per_node`` overrides.

    Raises:
      InvalidConfigError: unknown name (the known ones are listed), missing file, or a
        file that is not a valid profile.
    """
    from costmodel.catalog import CATALOG

    if name_or_path in CATALOG:
        cluster = CATALOG[name_or_path]
    else:
        path = Path(name_or_path)
        if not path.is_file():
            raise InvalidConfigError(
                f"unknown hardware {name_or_path!r}", fix=f"use a profile JSON path or one of: {', '.join(list_hardware())}"
            )
        try:
            cluster = ClusterSpec.model_validate_json(read_user_file(path, "hardware profile"))
        except ValidationError as err:
            where, msg, _ = first_problem(err)
            raise InvalidConfigError(f"{name_or_path}: {where or 'profile'}: {msg}", fix="see costmodel.hardware.ClusterSpec") from None
    if devices_per_node is not None:
        if devices_per_node < 1:
            raise InvalidConfigError(f"--devices-per-node={devices_per_node} must be positive", fix="give a positive count")
        cluster = cluster.model_copy(update={"devices_per_node": devices_per_node})
    return cluster
