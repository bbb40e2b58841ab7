"""`Machine`: what the simulator reads of a hardware profile, for one compute dtype.

>>> m = load_machine("a100-80gb")
>>> m.peak_flops_per_s, m.intra.bytes_per_s == 300e9 * 0.77
(312000000000000.0, True)
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, NonNegativeFloat, PositiveFloat, PositiveInt

from costmodel.errors import InvalidConfigError, UnsupportedError
from costmodel.hardware.catalog import CATALOG
from costmodel.hardware.host import HostSpec
from costmodel.hardware.profile import ClusterSpec, DeviceKind, GradientTranspose, StepAllocator
from costmodel.hardware.registry import load_hardware
from costmodel.hardware.topology import layout_groups, mesh_groups
from costmodel.inputs.layout import Layout
from costmodel.inputs.train_config import Precision, TrainConfig
from costmodel.step.collectives import Group, Tier
from costmodel.step.fp8_memory import check_frozen_dtype
from costmodel.step.roofline import Efficiency


class Machine(BaseModel):
    """What the simulator needs of a cluster: one device's peaks and its link tiers (`costmodel.hardware.fabric` derives them)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str = Field(description="Hardware profile name.")
    peak_flops_per_s: PositiveFloat = Field(description="Dense peak of the compute dtype (MFU is against it).")
    linear_peak_flops_per_s: PositiveFloat | None = Field(
        None, description="Dense peak the linear layers' GEMMs run at where it differs (fp8 recipe); None: peak_flops_per_s.")
    hbm_bytes_per_s: PositiveFloat = Field(description="HBM bandwidth.")
    instructions_per_s: PositiveFloat | None = Field(None, description="CUDA-core thread instructions a second "
                                                     "(DeviceSpec.instructions_per_s); None: not described.")
    hbm_bytes: PositiveFloat = Field(description="Usable device memory, as the driver reports it (DeviceSpec.usable_bytes).")
    memory_reserve_bytes: NonNegativeFloat = Field(0.0, description="What the runtime takes beside a plan's arrays (CUDA "
                                                   "context, NCCL buffers, fragmentation): a plan fits within hbm_bytes less this.")
    efficiency: Efficiency = Field(default_factory=Efficiency, description="Achievable fractions of the peaks.")
    step_allocator: StepAllocator | None = Field(None, description="Per-step cost of allocating temporaries; None for a pooled allocator.")
    gradient_transpose: GradientTranspose | None = Field(
        None, description="Extra cost of weight gradients whose cotangent the compiler copies transposed (XLA:CPU); None elsewhere.")
    devices_per_node: PositiveInt = Field(description="Devices sharing the intra-node link.")
    intra: Tier = Field(description="Intra-node link as one device sees it (NVLink, PCIe, ICI).")
    inter: Tier = Field(description="Inter-node link as one device sees it (its share of the NICs, DCN), rail-aligned.")
    intra_pair: Tier | None = Field(None, description="NVLink bridge between neighbours 2k, 2k+1 where intra is PCIe; None: none.")
    inter_cross_rail: Tier | None = Field(None, description="Inter-node link between different rails (through the spine); "
                                                            "None: as inter.")
    host: HostSpec | None = Field(None, description="The node's host memory, CPU and device-to-host link; None: not described.")
    device_kind: DeviceKind = Field(DeviceKind.GPU, description="The device's kind, which decides what a program does "
                                    "on it: see `launches_kernels` and `TpOverlap.under`.")

    @property
    def launches_kernels(self) -> bool:
        """Whether the device launches each kernel from a stream (GPUs), so a serving stack's side kernels each pay the
        launch floor; False on TPUs, where the side-kernel counts measured on GPUs do not apply
        (`costmodel.step.serving_kernels.side_kernels`)."""
        return self.device_kind is not DeviceKind.TPU

    @property
    def memory_budget_bytes(self) -> float:
        """The fit threshold: usable memory less the runtime reserve (`costmodel.hardware.reserve`)."""
        return self.hbm_bytes - self.memory_reserve_bytes

    @property
    def linear_peak(self) -> float:
        """Peak FLOP/s of the linear layers' GEMMs."""
        return self.linear_peak_flops_per_s or self.peak_flops_per_s

    def stream_s(self, n_bytes: float) -> float:
        """Seconds a memory-bound kernel takes to read and write ``n_bytes`` of HBM in all."""
        return n_bytes / (self.hbm_bytes_per_s * self.efficiency.hbm)

    def groups(self, layout: Layout) -> dict[str, Group]:
        return layout_groups(layout, **self._tiers())

    def mesh_groups(self, axes: list[tuple[str, int]]) -> dict[str, Group]:
        """The group along each (name, size) axis of a device mesh, major axis first."""
        return mesh_groups(axes, **self._tiers())

    def _tiers(self) -> dict[str, object]:
        return {"devices_per_node": self.devices_per_node, "intra": self.intra, "inter": self.inter, "intra_pair": self.intra_pair,
                "inter_cross_rail": self.inter_cross_rail}


def machine_for(cluster: ClusterSpec, *, compute_dtype: str = "bfloat16", linear_dtype: str | None = None) -> Machine:
    """The simulator's view of ``cluster`` computing in ``compute_dtype`` (its linear layers'
    GEMMs in ``linear_dtype`` where given); a dtype the part has no peak for is refused
    (`check_peak`)."""
    check_peak(cluster, compute_dtype)
    if linear_dtype is not None:
        check_peak(cluster, linear_dtype)
    return Machine(
        name=cluster.name,
        peak_flops_per_s=cluster.device.peak_for(compute_dtype),
        linear_peak_flops_per_s=cluster.device.peak_for(linear_dtype) if linear_dtype and linear_dtype != compute_dtype else None,
        hbm_bytes_per_s=cluster.device.hbm_bytes_per_s,
        instructions_per_s=cluster.device.instructions_per_s,
        hbm_bytes=cluster.device.usable_bytes,
        memory_reserve_bytes=cluster.device.reserve_bytes,
        efficiency=cluster.device.efficiency,
        step_allocator=cluster.device.step_allocator,
        gradient_transpose=cluster.device.gradient_transpose,
        devices_per_node=cluster.devices_per_node,
        intra=cluster.intra_tier(),
        inter=cluster.inter_tier(),
        intra_pair=cluster.intra_tier(pair=True) if cluster.intra_node.pair_link else None,
        inter_cross_rail=cluster.inter_tier(rail_aligned=False),
        host=cluster.host,
        device_kind=cluster.device.kind,
    )


def train_machine(cluster: ClusterSpec, train: TrainConfig) -> Machine:
    """``cluster`` as ``train``'s precision runs on it: its GEMMs at ``train.matmul_peak_dtype``,
    the linear layers' at ``train.linear_peak_dtype``; a weight storage the precision cannot run
    is refused (`costmodel.step.fp8_memory.check_frozen_dtype`).

    >>> from costmodel.inputs.train_config import Precision
    >>> m = train_machine(load_hardware("h100-sxm"), TrainConfig().with_precision(Precision.FP8))
    >>> round(m.linear_peak / m.peak_flops_per_s, 3)
    2.0
    """
    check_serving_peak(cluster, train)
    machine = machine_for(cluster, compute_dtype=train.matmul_peak_dtype, linear_dtype=train.linear_peak_dtype)
    check_frozen_dtype(train)  # after the peaks: a part without fp8 is named first
    return machine


# Users name dtypes by recipe; the catalog keys peaks by numpy-style names.
_DTYPE_LABELS = {"float8_e4m3fn": "float8", "float32": "float32", "tf32": "tf32", "bfloat16": "bfloat16", "float16": "float16",
                 "int8": "int8"}


def check_peak(cluster: ClusterSpec, dtype: str) -> None:
    """Refuse (exit 2) a dtype ``cluster``'s part has no peak for, naming the built-in parts that have one.

    >>> try:
    ...     check_peak(load_hardware("a100-80gb"), "float8_e4m3fn")
    ... except InvalidConfigError as err:
    ...     print(str(err).split(";")[0])
    a100-80gb has no float8 peak
    """
    if dtype in cluster.device.peak_flops_per_s:
        return
    label = _DTYPE_LABELS.get(dtype, dtype)
    having = sorted({c.device.name for c in CATALOG.values() if dtype in c.device.peak_flops_per_s})
    raise InvalidConfigError(
        f"{cluster.device.name} has no {label} peak; parts with one: {', '.join(having) or 'none'}",
        fix=f"choose one of those with --hardware, or a precision {cluster.device.name} accelerates (`plan hardware` lists them)")


def check_serving_peak(cluster: ClusterSpec, train: TrainConfig) -> None:
    """Refuse (exit 5) serving fp8 weights on a part without an fp8 peak: its GEMMs cannot take
    fp8 inputs (TensorRT-LLM and vLLM run fp8 W8A8 on Hopper and later; vLLM's weight-only
    fp8 Marlin path on Ampere is not modelled).

    >>> try:
    ...     check_serving_peak(load_hardware("a100-80gb"), TrainConfig(workload="decode", inference={"weight_dtype": "fp8"}))
    ... except UnsupportedError as err:
    ...     print(str(err).split(";")[0])
    serving fp8 weights runs the GEMMs in fp8, and a100-80gb has no fp8 peak
    """
    if not train.serves_fp8 or "float8_e4m3fn" in cluster.device.peak_flops_per_s:
        return
    having = sorted({c.name for c in CATALOG.values() if "float8_e4m3fn" in c.device.peak_flops_per_s})
    raise UnsupportedError(f"serving fp8 weights runs the GEMMs in fp8, and {cluster.device.name} has no fp8 peak",
                           fix=f"use --frozen-dtype int8 (weight-only, 1 byte too) or --hardware {' / '.join(having)}")


def supported_precisions(cluster: ClusterSpec) -> list[Precision]:
    """The ``--precision`` recipes ``cluster``'s part has every peak for.

    >>> [p.value for p in supported_precisions(load_hardware("v100"))]
    ['fp32', 'fp16']
    """
    peaks = cluster.device.peak_flops_per_s
    base = TrainConfig()
    return [p for p in Precision if {base.with_precision(p).matmul_peak_dtype, base.with_precision(p).linear_peak_dtype} <= peaks.keys()]


def load_machine(name_or_path: str, *, devices_per_node: int | None = None, compute_dtype: str = "bfloat16") -> Machine:
    """`load_hardware` then `machine_for`: a profile name or JSON path to a Machine."""
    return machine_for(load_hardware(name_or_path, devices_per_node=devices_per_node), compute_dtype=compute_dtype)
