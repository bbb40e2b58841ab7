"""Hardware profiles: a device, and the fabrics (`costmodel.hardware.fabric`) that make nodes of it a cluster.

Units are SI and converted once, in `costmodel.hardware.catalog`: FLOP/s, bytes, bytes/s,
seconds (NIC speeds in Gb/s, as vendors quote them). A user adds a profile as a JSON
file holding a `ClusterSpec`.

>>> from costmodel.hardware.registry import load_hardware
>>> cluster = load_hardware("a100-80gb")
>>> cluster.device.peak_flops_per_s["bfloat16"], cluster.devices_per_node
(312000000000000.0, 8)
"""

from __future__ import annotations

import math
from enum import StrEnum
from typing import Annotated

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    NonNegativeFloat,
    PositiveFloat,
    PositiveInt,
    ValidationInfo,
    field_validator,
)

from costmodel.errors import InvalidConfigError, UnsupportedError
from costmodel.hardware.fabric import MAX_PER_NODE, ByteRate, InterNodeFabric, IntraNodeFabric
from costmodel.hardware.host import HostSpec
from costmodel.hardware.reserve import GPU_RESERVE, NO_RESERVE, TPU_RESERVE, RuntimeReserve
from costmodel.hardware.storage import ASSUMED_SHARED_STORAGE, StorageSpec
from costmodel.step.collectives import Tier
from costmodel.step.roofline import Efficiency

# A floor no part comes near (a CPU core does GFLOP/s), so that seconds computed from a
# profile stay finite: a fuzzed profile of 1e-300 rates divided by zero.
FlopRate = Annotated[float, Field(ge=1e6)]


class DeviceKind(StrEnum):
    GPU = "gpu"
    TPU = "tpu"
    CPU = "cpu"


DEFAULT_RESERVES: dict[DeviceKind, RuntimeReserve] = {DeviceKind.GPU: GPU_RESERVE, DeviceKind.TPU: TPU_RESERVE,
                                                      DeviceKind.CPU: NO_RESERVE}


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


class GradientTranspose(BaseModel):
    """What a weight gradient costs beyond its GEMM where the compiler transposes the cotangent.

    A weight gradient ``xᵀ·g`` contracts the tokens, the leading dimension of both operands.
    cuBLAS and TPU matrix units take a transposed operand as it lies (no catalog profile sets
    this); XLA's CPU backend first copies the output cotangent ``g`` transposed, and where an
    elementwise backward produces ``g`` (an activation's, a softmax's, a norm's, the loss's) it
    fuses that op into the copy, whose strided reads then run far below a plain copy's
    (`validate.cpu_profile` measures both, per byte of cotangent).
    """

    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)  # a profile is finite numbers

    plain_s_per_byte: NonNegativeFloat = Field(description="Seconds per cotangent byte where the copy only transposes.")
    fused_s_per_byte: NonNegativeFloat = Field(
        description="Seconds per cotangent byte where an elementwise backward is fused into the transposing copy.")


class DeviceSpec(BaseModel):
    """One accelerator: peaks per dtype, memory, and what its kernels reach of them."""

    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)  # a profile is finite numbers

    name: str = Field(description="Part name.")
    kind: DeviceKind = Field(description="GPU, TPU or CPU.")
    peak_flops_per_s: dict[str, FlopRate] = Field(
        description="Dense peak per dtype ('float32', 'tf32', 'bfloat16', 'float16', 'float8_e4m3fn', 'int8', "
                    "'float4_e2m1fn'); only what the part has."
    )
    hbm_bytes: PositiveFloat = Field(description="Device memory capacity, as the datasheet gives it.")
    usable_hbm_bytes: PositiveFloat | None = Field(
        None, description="Device memory as the driver reports it (nvidia-smi's memory.total): what a process can "
                          "address; None: hbm_bytes.")
    memory_reserve_bytes: NonNegativeFloat | None = Field(
        None, description="Memory the runtime takes beside a plan's arrays (CUDA context, NCCL buffers, fragmentation): "
                          "plans fit within usable memory less this; None: the default of the device's kind "
                          "(costmodel.hardware.reserve).")
    hbm_bytes_per_s: ByteRate = Field(description="Device memory bandwidth.")
    power_limit_w: PositiveFloat | None = Field(None, description="Board power limit the peaks and efficiencies assume.")
    instructions_per_s: PositiveFloat | None = Field(
        None, description="Thread instructions the GPU's cores issue a second (SMs × 4 schedulers × 32 lanes × boost clock): "
                          "the bound of a kernel limited by its CUDA-core arithmetic (`costmodel.step.weight_kernels`); None: "
                          "not described.")
    efficiency: Efficiency = Field(default_factory=Efficiency, description="Achievable fractions of the peaks.")
    step_allocator: StepAllocator | None = Field(None, description="Per-step cost of allocating temporaries; None for a pooled allocator.")
    gradient_transpose: GradientTranspose | None = Field(
        None, description="Extra cost of weight gradients whose cotangent the compiler copies transposed; None where GEMMs "
                          "take it as it lies.")
    source: str = Field(description="Where the numbers come from.")

    @property
    def usable_bytes(self) -> float:
        """Device memory a process can address: the driver's figure where known, else the datasheet's."""
        return self.usable_hbm_bytes or self.hbm_bytes

    @property
    def reserve_bytes(self) -> float:
        """The runtime reserve: ``memory_reserve_bytes``, or its kind's default on this part's usable memory.

        >>> from costmodel.hardware.registry import load_hardware
        >>> round(load_hardware("h100-sxm").device.reserve_bytes / 2**30, 2)
        3.99
        """
        if self.memory_reserve_bytes is not None:
            return self.memory_reserve_bytes
        return DEFAULT_RESERVES[self.kind].bytes_for(self.usable_bytes)

    def peak_for(self, dtype: str) -> float:
        """Dense peak FLOP/s for ``dtype``; raises `UnsupportedError` if the part lacks it."""
        if dtype not in self.peak_flops_per_s:
            raise UnsupportedError(
                f"{self.name} has no {dtype} peak (it has {', '.join(sorted(self.peak_flops_per_s))})",
                fix="choose a compute dtype the part supports",
            )
        return self.peak_flops_per_s[dtype]


class ClusterSpec(BaseModel):
    """A cluster: its device, how many share a node, the fabric inside a node and the network between nodes.

    For TPUs a "node" is a slice: ``intra_node`` is its ICI torus and ``inter_node`` the
    data-centre network (DCN) between slices. In a JSON file ``device`` may name a built-in
    device (``"h100-sxm"``) instead of spelling it out; docs/clusters.md "Describing a cluster" has an example.
    """

    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)  # a profile is finite numbers

    name: str = Field(description="Profile name.")
    description: str = Field("", description="What the cluster is, and the documents its facts come from.")
    device: DeviceSpec = Field(description="The accelerator, or the name of a built-in one.")
    devices_per_node: PositiveInt = Field(le=MAX_PER_NODE, description="Devices on one intra-node fabric (GPU node, TPU slice).")
    intra_node: IntraNodeFabric = Field(description="NVSwitch, NVLink pairs, PCIe, a TPU ICI torus, or host memory.")
    inter_node: InterNodeFabric = Field(description="The network between nodes: NICs, their speed, rail-optimised or not.")
    storage: StorageSpec = Field(ASSUMED_SHARED_STORAGE, description="The shared filesystem tokens are read from and "
                                 "checkpoints written to; default an assumption, labelled as one.")
    host: HostSpec | None = Field(None, description="Each node's host memory, CPU and device-to-host link, for offloading "
                                  "(`costmodel.step.offload`); None: not described, offloading refused.")

    @field_validator("device", mode="before")
    @classmethod
    def _device_by_name(cls, value: object, info: ValidationInfo) -> object:
        if not isinstance(value, str):
            return value
        # The built-in devices are built from this module's types, so `registry.load_hardware` hands them in.
        devices = (info.context or {}).get("devices", {})
        if value not in devices:
            raise ValueError(f"unknown device {value!r} (known: {', '.join(sorted(devices))})")
        return devices[value]

    @property
    def wraparound(self) -> bool:
        return self.intra_node.wraparound

    def intra_tier(self, *, pair: bool = False) -> Tier:
        """What the collective model uses inside a node (``pair``: between bridged neighbours)."""
        return self.intra_node.tier(pair=pair)

    def inter_tier(self, *, rail_aligned: bool = True) -> Tier:
        """What the collective model uses across nodes, for one device (``rail_aligned``: same-rank members)."""
        return self.inter_node.tier(self.devices_per_node, rail_aligned=rail_aligned)

    def with_memory_reserve(self, reserve_bytes: float | None) -> ClusterSpec:
        """This cluster with its device's runtime reserve set (``--memory-reserve-gib``); None keeps the default.

        >>> from costmodel.hardware.registry import load_hardware
        >>> load_hardware("h100-sxm").with_memory_reserve(2 * 2**30).device.reserve_bytes / 2**30
        2.0
        """
        if reserve_bytes is None:
            return self
        usable = self.device.usable_bytes
        if not 0 <= reserve_bytes < usable:
            raise InvalidConfigError(f"--memory-reserve-gib={reserve_bytes / 2**30:g} must be at least 0 and below the "
                                     f"{usable / 2**30:.1f} GiB a {self.device.name} has",
                                     fix="give the GiB the CUDA context, NCCL buffers and fragmentation take, e.g. 4")
        return self.model_copy(update={"device": self.device.model_copy(update={"memory_reserve_bytes": reserve_bytes})})

    def with_devices_per_node(self, n: int) -> ClusterSpec:
        """This cluster with nodes of ``n`` devices, each device keeping its share of the NICs.

        >>> from costmodel.hardware.registry import load_hardware
        >>> load_hardware("dgx-h100").with_devices_per_node(4).inter_node.nics_per_node
        4
        """
        nics = self.inter_node.nics_per_node
        if not 1 <= n <= MAX_PER_NODE:
            raise InvalidConfigError(f"--devices-per-node={n} must be between 1 and {MAX_PER_NODE:,}", fix="give a positive count")
        if nics * n % self.devices_per_node:
            raise InvalidConfigError(
                f"--devices-per-node={n} would split {self.name}'s NICs ({nics} per {self.devices_per_node} devices) unevenly",
                fix=f"give a multiple of {self.devices_per_node // math.gcd(nics, self.devices_per_node)}, or describe "
                    "the nodes in a cluster JSON file (docs/clusters.md: Describing a cluster)")
        network = self.inter_node.model_copy(update={"nics_per_node": nics * n // self.devices_per_node})
        return self.model_copy(update={"devices_per_node": n, "inter_node": network})

    def summary(self) -> str:
        """One line: devices per node, the fabric inside a node and the network between nodes.

        >>> from costmodel.hardware.registry import load_hardware
        >>> print(load_hardware("dgx-a100").summary())
        dgx-a100: 8× a100-80gb per node; NVSwitch (nvlink3) at 300 GB/s; 8× 200 Gb/s NICs (ib-hdr200), rail-optimised, 25 GB/s per device
        """
        return (f"{self.name}: {self.devices_per_node}× {self.device.name} per {self.intra_node.unit}; {self.intra_node.summary()}; "
                f"{self.inter_node.summary(self.devices_per_node)}")
