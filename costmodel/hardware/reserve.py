"""The runtime reserve: device memory a training process takes beside the arrays a plan predicts.

A plan's predicted memory is its arrays' peak (weights, gradients, optimizer state, activations,
temporaries: `costmodel.step.memory`), comparable with a measured peak of the program's own
allocations. The process needs more than that on the device, so a plan is called fitting only at
or below usable memory − reserve (a fit threshold; the reserve is never added to the prediction):

- the CUDA context (driver, loaded kernels): about 300 MB with CUDA's lazy module loading
  (11.7 and later), over 1000 MB before (pytorch/pytorch#107667, a maintainer's answer; 200–700 MB
  across machines in pytorch/pytorch#28113). We take 0.5 GiB.
- communication buffers: NCCL allocates per communicator and channel; one communicator running
  all-reduce took about 1.6 GB, three or more about 6 GB (NVIDIA/nccl#864, with the maintainer's
  answer in NVIDIA/nccl#986: memory grows with channels and communicators); an intra-node
  all-to-all on 8 H100 grew it from 1.06 to 4.34 GB (NVIDIA/nccl#1685). We take 1.5 GiB, one
  communicator's; a plan with several communicating axes may need more (``--memory-reserve-gib``).
- allocator fragmentation: memory the caching allocator holds that no array can use
  (pytorch/pytorch#35901; PyTorch's ``expandable_segments`` exists to shrink it). Its size depends
  on the program; we assume 2.5 % of usable memory (2 GiB of an 80 GB part), an assumption.

TPUs run no CUDA context or NCCL; the XLA runtime's own reservation is assumed to be covered by
the fragmentation share alone (an assumption). The CPU profile stands for this host's emulated
devices, whose predictions are checked against compiled programs as they are: no reserve.

>>> round(GPU_RESERVE.bytes_for(81559 * 2**20) / 2**30, 2)
3.99
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, NonNegativeFloat

_GIB = 2**30


class RuntimeReserve(BaseModel):
    """What one device kind's runtime takes beside a plan's arrays (module docstring has the sources)."""

    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)

    context_bytes: NonNegativeFloat = Field(description="The CUDA context (driver and loaded kernels).")
    communication_bytes: NonNegativeFloat = Field(description="Collective-communication buffers (NCCL).")
    fragmentation_fraction: float = Field(ge=0, lt=1, description="Share of usable memory the allocator holds that no array can use.")

    def bytes_for(self, usable_bytes: float) -> float:
        """The reserve on a device of ``usable_bytes``."""
        return self.context_bytes + self.communication_bytes + self.fragmentation_fraction * usable_bytes

    def measured_beyond_arrays(self, measure: str, usable_bytes: float, *, communicates: bool) -> float:
        """What a memory measurement counts beside a plan's arrays: ``allocated`` (PyTorch's
        max_memory_allocated) nothing; ``reserved`` (max_memory_reserved) the allocator's fragmentation;
        ``device`` (the driver's figure, nvidia-smi) the context, the communication buffers where the
        process communicates, and the fragmentation.

        >>> round(GPU_RESERVE.measured_beyond_arrays("device", 80 * _GIB, communicates=True) / _GIB, 2)
        4.0
        """
        fragmentation = self.fragmentation_fraction * usable_bytes
        parts = {"allocated": 0.0, "reserved": fragmentation,
                 "device": self.context_bytes + (self.communication_bytes if communicates else 0.0) + fragmentation}
        return parts[measure]


GPU_RESERVE = RuntimeReserve(context_bytes=0.5 * _GIB, communication_bytes=1.5 * _GIB, fragmentation_fraction=0.025)
TPU_RESERVE = RuntimeReserve(context_bytes=0.0, communication_bytes=0.0, fragmentation_fraction=0.025)
NO_RESERVE = RuntimeReserve(context_bytes=0.0, communication_bytes=0.0, fragmentation_fraction=0.0)
