"""`Machine`: what the simulator reads of a hardware profile, for one compute dtype.

>>> m = load_machine("a100-80gb")
>>> m.peak_flops_per_s, m.intra.bytes_per_s == 300e9 * 0.77
(312000000000000.0, True)
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, PositiveFloat, PositiveInt

from costmodel.collectives import Group, Tier
from costmodel.hardware import ClusterSpec, StepAllocator, load_hardware
from costmodel.host import HostSpec
from costmodel.layout import Layout
from costmodel.roofline import Efficiency
from costmodel.topology import layout_groups, mesh_groups


class Machine(BaseModel):
    """What the simulator needs of a cluster: one device's peaks and its link tiers (`costmodel.fabric` derives them)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str = Field(description="Hardware profile name.")
    peak_flops_per_s: PositiveFloat = Field(description="Dense peak of the compute dtype.")
    hbm_bytes_per_s: PositiveFloat = Field(description="HBM bandwidth.")
    hbm_bytes: PositiveFloat = Field(description="HBM capacity.")
    efficiency: Efficiency = Field(default_factory=Efficiency, description="Achievable fractions of the peaks.")
    step_allocator: StepAllocator | None = Field(None, description="Per-step cost of allocating temporaries; None for a pooled allocator.")
    devices_per_node: PositiveInt = Field(description="Devices sharing the intra-node link.")
    intra: Tier = Field(description="Intra-node link as one device sees it (NVLink, PCIe, ICI).")
    inter: Tier = Field(description="Inter-node link as one device sees it (its share of the NICs, DCN), rail-aligned.")
    intra_pair: Tier | None = Field(None, description="NVLink bridge between neighbours 2k, 2k+1 where intra is PCIe; None: none.")
    inter_cross_rail: Tier | None = Field(None, description="Inter-node link between different rails (through the spine); "
                                                            "None: as inter.")
    host: HostSpec | None = Field(None, description="The node's host memory, CPU and device-to-host link; None: not described.")

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


def machine_for(cluster: ClusterSpec, *, compute_dtype: str = "bfloat16") -> Machine:
    """The simulator's view of ``cluster`` computing in ``compute_dtype``."""
    return Machine(
        name=cluster.name,
        peak_flops_per_s=cluster.device.peak_for(compute_dtype),
        hbm_bytes_per_s=cluster.device.hbm_bytes_per_s,
        hbm_bytes=cluster.device.hbm_bytes,
        efficiency=cluster.device.efficiency,
        step_allocator=cluster.device.step_allocator,
        devices_per_node=cluster.devices_per_node,
        intra=cluster.intra_tier(),
        inter=cluster.inter_tier(),
        intra_pair=cluster.intra_tier(pair=True) if cluster.intra_node.pair_link else None,
        inter_cross_rail=cluster.inter_tier(rail_aligned=False),
        host=cluster.host,
    )


def load_machine(name_or_path: str, *, devices_per_node: int | None = None, compute_dtype: str = "bfloat16") -> Machine:
    """`load_hardware` then `machine_for`: a profile name or JSON path to a Machine."""
    return machine_for(load_hardware(name_or_path, devices_per_node=devices_per_node), compute_dtype=compute_dtype)
