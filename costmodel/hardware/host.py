"""The host a node's devices hang off: its memory, its CPU cores and the link to each device.

What offloading (`costmodel.step.offload`) needs of a cluster: how much host memory a node has,
how fast a device reaches it (PCIe, or NVLink-C2C on a Grace superchip), and how fast the
CPU runs Adam. Units are SI (bytes, bytes/s per direction).

>>> host = HostSpec(memory_bytes_per_node=1e12, cpu_cores_per_node=128, dram_bytes_per_s_per_node=409.6e9,
...                 link=LinkSpec(name="pcie4-x16", bytes_per_s=32e9, latency_s=5e-6, source="PCIe 4.0 x16"), source="test")
>>> host.link_bytes_per_s / 1e9, round(host.adam_params_per_s(devices_sharing=1) / 1e9, 2)  # DRAM-bound: 409.6 GB/s × 0.7 / 34 B
(25.6, 8.43)
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, PositiveFloat, PositiveInt

from costmodel.hardware.fabric import ByteRate, LinkSpec

# DeepSpeed's CPU Adam (csrc/includes/cpu_adam.h, Step_AVX, DeepSpeed v0.19.6) streams, per
# parameter, the fp32 parameter, gradient and both moments in and the parameter and moments
# out (28 B); ZeRO-Offload then casts the fp32 partition into the 16-bit host buffer it
# copies to the device (read 4 B, write 2 B; deepspeed/runtime/zero/stage_1_and_2.py, step()).
ADAM_HOST_BYTES_PER_PARAM = 7 * 4 + 4 + 2
# Assumed, not measured: one core keeps ~10 GB/s of that stream going (a single core's
# sustained DRAM bandwidth on server parts), 10e9 / 34 B ≈ 3e8 parameters/s. DeepSpeed states
# only a relative figure (CPU-Adam 5.1–6.5× torch's CPU Adam for 1–10 B parameters,
# docs/_pages/training.md); a full node is bound by its DRAM bandwidth long before this.
ASSUMED_ADAM_PARAMS_PER_S_PER_CORE = 3e8
# Assumed: the fraction of peak DRAM bandwidth a streaming kernel sustains (STREAM triad on
# two-socket servers typically reaches 65–80 %).
ASSUMED_DRAM_EFFICIENCY = 0.7


class HostSpec(BaseModel):
    """A node's host: memory, CPU cores, DRAM bandwidth and each device's link to it."""

    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)  # a profile is finite numbers

    memory_bytes_per_node: PositiveFloat = Field(description="Host (CPU) memory of one node.")
    cpu_cores_per_node: PositiveInt = Field(description="CPU cores of one node, all sockets.")
    dram_bytes_per_s_per_node: ByteRate = Field(description="Peak host memory bandwidth of one node, all sockets.")
    dram_efficiency: float = Field(ASSUMED_DRAM_EFFICIENCY, gt=0, le=1,
                                   description="Fraction of the DRAM peak a streaming kernel (CPU Adam) sustains; default assumed.")
    link: LinkSpec = Field(description="One device's link to host memory, per direction (PCIe x16, NVLink-C2C).")
    adam_params_per_s_per_core: PositiveFloat = Field(
        ASSUMED_ADAM_PARAMS_PER_S_PER_CORE, description="Parameters per second one core updates with DeepSpeed's CPU Adam "
        "when DRAM does not bind; default assumed (costmodel.hardware.host).")
    source: str = Field(description="Where the numbers come from.")

    @property
    def link_bytes_per_s(self) -> float:
        """What large device↔host copies reach, per direction: the link's peak times its efficiency."""
        return self.link.bytes_per_s * self.link.efficiency

    def adam_params_per_s(self, *, devices_sharing: int) -> float:
        """Parameters per second CPU Adam updates for one device when ``devices_sharing`` devices of
        the node each run their own: its share of the cores, or of the DRAM bandwidth, whichever binds."""
        cores = self.cpu_cores_per_node / devices_sharing * self.adam_params_per_s_per_core
        dram = self.dram_bytes_per_s_per_node * self.dram_efficiency / devices_sharing / ADAM_HOST_BYTES_PER_PARAM
        return min(cores, dram)

    def summary(self) -> str:
        """One line, e.g. ``host 1 TB, 128 cores, 410 GB/s DRAM; pcie4-x16 at 25.6 GB/s per device``."""
        return (f"host {self.memory_bytes_per_node / 1e12:g} TB, {self.cpu_cores_per_node} cores, "
                f"{self.dram_bytes_per_s_per_node / 1e9:.0f} GB/s DRAM; {self.link.name} at {self.link_bytes_per_s / 1e9:.1f} "
                "GB/s per device")
