"""Shared storage: what a cluster's parallel filesystem reads and writes, per device.

A training run reads its tokens from, and writes its checkpoints to, a shared parallel
filesystem. Vendors size that filesystem with the cluster (NVIDIA's DGX SuperPOD guidance
states aggregate rates per scalable unit of 32 nodes), so a profile states the rates as each
device's share of the aggregate and a job on ``n`` devices gets ``n`` shares. Every preset's
rates are an assumption for now (``assumed``), and every time-to-train line that uses them
says so: the SuperPOD figure below was recalled, not checked against NVIDIA's document.

>>> SUPERPOD_H100_STANDARD.write_bytes_per_s(n_devices=256) / 1e9  # one scalable unit
20.0
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from costmodel.hardware.fabric import ByteRate

_GB = 1e9
_SUPERPOD_UNIT_GPUS = 32 * 8  # a DGX SuperPOD scalable unit: 32 DGX nodes of 8 GPUs


class StorageSpec(BaseModel):
    """The shared filesystem's sustained read and write rates, as each device's share of the aggregate."""

    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)  # a profile is finite numbers

    read_bytes_per_s_per_device: ByteRate = Field(description="Aggregate sustained read rate / devices it serves.")
    write_bytes_per_s_per_device: ByteRate = Field(description="Aggregate sustained write rate / devices it serves.")
    assumed: bool = Field(description="True when no vendor figure backs the rates: an assumption, said so wherever used.")
    source: str = Field(description="Where the rates come from, or what was assumed.")

    def read_bytes_per_s(self, *, n_devices: int) -> float:
        """Aggregate read rate a job on ``n_devices`` gets (its devices' shares)."""
        return self.read_bytes_per_s_per_device * n_devices

    def write_bytes_per_s(self, *, n_devices: int) -> float:
        """Aggregate write rate a job on ``n_devices`` gets (its devices' shares)."""
        return self.write_bytes_per_s_per_device * n_devices

    def label(self) -> str:
        """How a report names the rates' origin: the source, marked when it is an assumption."""
        return f"assumed: {self.source}" if self.assumed else self.source


SUPERPOD_H100_STANDARD = StorageSpec(
    read_bytes_per_s_per_device=40 * _GB / _SUPERPOD_UNIT_GPUS,
    write_bytes_per_s_per_device=20 * _GB / _SUPERPOD_UNIT_GPUS,
    assumed=True,
    source="40 GB/s read, 20 GB/s write per scalable unit of 32 DGX H100 nodes, recalled as the 'standard' tier of "
           "NVIDIA's DGX SuperPOD storage guidelines (not checked against the document)",
)

# No vendor guidance for these parts: the SuperPOD H100 standard tier's per-GPU share, labelled an assumption.
ASSUMED_SHARED_STORAGE = SUPERPOD_H100_STANDARD.model_copy(update={
    "assumed": True,
    "source": "no vendor figure for this cluster; the DGX SuperPOD H100 'standard' tier's share, 156 MB/s read and "
              "78 MB/s write per device (40 and 20 GB/s per 256 GPUs)",
})

# The emulated-device host: one local disk shared by every device.
ASSUMED_LOCAL_DISK = StorageSpec(
    read_bytes_per_s_per_device=1 * _GB, write_bytes_per_s_per_device=0.5 * _GB, assumed=True,
    source="a local NVMe disk's 1 GB/s read and 0.5 GB/s write for each emulated device (no measurement of this host)",
)
