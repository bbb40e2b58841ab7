"""ZeRO-Offload as DeepSpeed runs it: what an offloaded step keeps on the host and what it costs.

Read from DeepSpeed v0.19.6 (commit edaa722), ``deepspeed/runtime/zero/stage_1_and_2.py`` with
``offload_optimizer: {device: cpu}`` (``self.cpu_offload``), and Ren et al. 2021 (ZeRO-Offload,
USENIX ATC '21, section 4). Each data-parallel rank offloads its 1/dp partition (the offload
lives in DeepSpeed's ZeRO optimizer, which partitions whatever the layout's ZeRO stage):

- **Host** (pinned): the fp32 master weights (``single_partition_of_fp32_groups``), their fp32
  gradient (``initialize_optimizer_states``), Adam's two fp32 moments (DeepSpeedCPUAdam's state),
  the 16-bit copy of the partition sent back to the device
  (``param_buffer_of_bit16_for_cpu_offload_groups``) and, with gradient accumulation, a 16-bit
  running sum per parameter (``accumulated_grads_in_cpu``).
- **Device**: the 16-bit parameters; of the gradients only one reduction bucket
  (``reduce_bucket_size``, 5e8 elements by default, ``deepspeed/runtime/zero/config.py``) and a
  buffer the size of the largest parameter (``temp_grad_buffer_for_gpu_offload``); no
  optimizer state.
- **Device → host**, from the reduction hooks while backward runs (``copy_grads_in_partition``):
  on the last micro-batch each gradient is cast to fp32 on the device and copied, 4 B per
  parameter (``async_inplace_copy_grad_to_fp32_buffer_from_gpu``); with accumulation each
  micro-batch also copies its 16-bit sum down (2 B) and each after the first first fetches the
  running sum up (2 B, ``async_accumulate_grad_in_cpu_via_gpu``).
- **CPU**: Adam over the partition, then the cast into the 16-bit buffer (`costmodel.hardware.host`).
- **Host → device**: the updated 16-bit partition, 2 B per parameter (``step()``).

This is ZeRO-Offload as DeepSpeed's tutorial configures it (``docs/_tutorials/zero-offload.md``:
stage 2, ``overlap_comm: true``): gradients are reduced and copied every micro-batch. (With
stage 1 DeepSpeed accumulates on the device and copies once; not modelled apart.)

Overlap, as DeepSpeed schedules it: with ``overlap_comm`` (`SoftwareStack.dp_overlap`) the
gradient copies run on the reduction stream while backward runs and hide behind it (what a
micro-batch's copies take beyond its backward is exposed); without it they run on the compute
stream and are exposed in full (``reduce_ipg_grads``). The CPU Adam step and the copy up follow
backward in series and are exposed in full (the paper's one-step delayed parameter update is
not modelled).

>>> from costmodel.hardware.catalog import DGX_A100_320GB_HOST
>>> t = offload_times(8e9, TrainConfig(global_batch=1), micro_batches=1, backward_s=10.0, overlap=True, host=DGX_A100_320GB_HOST,
...                   devices_sharing=1)
>>> t.grads_to_host_bytes / 8e9, t.params_to_device_bytes / 8e9, round(t.transfer_s, 3)  # (32 + 16) GB at 25.6 GB/s
(4.0, 2.0, 1.875)
"""

from __future__ import annotations

from pydantic import Field, NonNegativeFloat, computed_field

from costmodel.errors import UnsupportedError
from costmodel.hardware.host import HostSpec
from costmodel.inputs.train_config import TrainConfig
from costmodel.record import Record

# DeepSpeed's default reduce_bucket_size, in elements (deepspeed/runtime/zero/config.py).
REDUCE_BUCKET_ELEMENTS = 5e8
_FP32_BYTES = 4


class HostMemory(Record):
    """Host memory one device's offloaded partition takes, by kind, and its share of the node's."""

    master_weights_bytes: NonNegativeFloat = Field(description="fp32 master weights of the partition.")
    moments_bytes: NonNegativeFloat = Field(description="Adam's first and second moments, fp32.")
    grads_bytes: NonNegativeFloat = Field(description="fp32 gradients Adam reads.")
    param_copy_bytes: NonNegativeFloat = Field(description="The 16-bit copy of the updated partition sent to the device.")
    accumulated_grads_bytes: NonNegativeFloat = Field(description="16-bit running gradient sums with gradient accumulation; else 0.")
    capacity_bytes: NonNegativeFloat | None = Field(None, description="This device's share of its node's host memory, when known.")

    @computed_field(description="Sum of the items.")
    @property
    def total_bytes(self) -> float:
        return self.master_weights_bytes + self.moments_bytes + self.grads_bytes + self.param_copy_bytes + self.accumulated_grads_bytes

    @computed_field(description="Whether total_bytes fits in capacity_bytes (None when the capacity is unknown).")
    @property
    def fits(self) -> bool | None:
        return None if self.capacity_bytes is None else self.total_bytes <= self.capacity_bytes


class OffloadTimes(Record):
    """One device's offload traffic and CPU work per step; ``exposed_s`` is what the step waits for."""

    offloaded_params: NonNegativeFloat = Field(description="Parameters of this device's partition (on the host).")
    grads_to_host_bytes: NonNegativeFloat = Field(description="Gradient bytes copied device → host per step (during backward).")
    grads_from_host_bytes: NonNegativeFloat = Field(description="Running gradient sums fetched host → device per step "
                                                    "(gradient accumulation, during backward).")
    params_to_device_bytes: NonNegativeFloat = Field(description="Updated 16-bit parameter bytes copied host → device per step.")
    link_bytes_per_s: NonNegativeFloat = Field(description="Device↔host bandwidth per direction used (peak × efficiency).")
    exposed_grads_s: NonNegativeFloat = Field(description="Seconds the gradient copies outlast the backward they run behind.")
    params_to_device_s: NonNegativeFloat = Field(description="Seconds of the parameter copy up (after Adam, exposed).")
    cpu_adam_params_per_s: NonNegativeFloat = Field(description="Parameters per second CPU Adam updates for this device.")
    cpu_adam_s: NonNegativeFloat = Field(description="Seconds of the CPU Adam step over the partition (exposed).")

    @computed_field(description="Seconds all of the step's device↔host bytes take at link_bytes_per_s, overlapped or not: "
                                "the napkin, bytes moved / bandwidth.")
    @property
    def transfer_s(self) -> float:
        return (self.grads_to_host_bytes + self.grads_from_host_bytes + self.params_to_device_bytes) / self.link_bytes_per_s

    @computed_field(description="Seconds of device↔host copies on the step's critical path.")
    @property
    def exposed_transfer_s(self) -> float:
        return self.exposed_grads_s + self.params_to_device_s


def require_host(host: HostSpec | None, cluster: str) -> HostSpec:
    """``host``, or an `UnsupportedError` naming the fix when the cluster description has none.

    >>> require_host(None, "t4")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    costmodel.errors.UnsupportedError: t4 describes no host memory or device-to-host link to offload to; fix: ...
    """
    if host is None:
        raise UnsupportedError(f"{cluster} describes no host memory or device-to-host link to offload to",
                               fix="use --offload none, or give a cluster file with 'host' (docs/workloads.md: Offloading)")
    return host


def check_offloadable(train: TrainConfig) -> None:
    """Raise `UnsupportedError` unless ``train`` is full training, the only workload offloaded here.

    >>> check_offloadable(TrainConfig(workload="finetune-lora"))
    Traceback (most recent call last):
    costmodel.errors.UnsupportedError: offloading is modelled for full training, not finetune-lora; fix: use --offload none
    """
    if not train.workload.trains_base_weights:
        raise UnsupportedError(f"offloading is modelled for full training, not {train.workload.kind}", fix="use --offload none")


def device_grad_bytes(partition_params: float, largest_param: float, train: TrainConfig) -> float:
    """Gradient bytes a device holds under ZeRO-Offload: one reduction bucket (at most the
    gradients that exist) and the largest parameter's staging buffer, in the compute dtype.

    >>> device_grad_bytes(8e9, 5.25e8, TrainConfig()) / 1e9
    2.05
    """
    return (min(partition_params, REDUCE_BUCKET_ELEMENTS) + largest_param) * train.compute_dtype.bytes


def host_memory(partition_params: float, train: TrainConfig, *, micro_batches: int, capacity_bytes: float | None) -> HostMemory:
    """Host bytes of one device's offloaded partition of ``partition_params`` parameters.

    >>> host_memory(1e9, TrainConfig(), micro_batches=1, capacity_bytes=None).total_bytes / 1e9  # 4 + 8 + 4 + 2 B
    18.0
    """
    return HostMemory(
        master_weights_bytes=partition_params * _FP32_BYTES, moments_bytes=2 * partition_params * _FP32_BYTES,
        grads_bytes=partition_params * _FP32_BYTES, param_copy_bytes=partition_params * train.compute_dtype.bytes,
        accumulated_grads_bytes=partition_params * train.compute_dtype.bytes if micro_batches > 1 else 0.0,
        capacity_bytes=capacity_bytes)


def offload_times(partition_params: float, train: TrainConfig, *, micro_batches: int, backward_s: float, overlap: bool,
                  host: HostSpec, devices_sharing: int) -> OffloadTimes:
    """The step's offload traffic and CPU Adam for one device's partition.

    Args:
      partition_params: parameters of this device's partition.
      micro_batches: micro-batches per step (gradient accumulation steps).
      backward_s: one micro-batch's backward on this device, which the gradient copies run behind.
      overlap: whether they do (DeepSpeed's ``overlap_comm``); else every copy is exposed.
      devices_sharing: devices of the node that offload at once (each gets that share of the cores and DRAM).
    """
    half = partition_params * train.compute_dtype.bytes
    last_down = partition_params * _FP32_BYTES + (half if micro_batches > 1 else 0.0)
    downs = [half] * (micro_batches - 1) + [last_down]
    ups = [0.0] + [half] * (micro_batches - 1)
    rate = host.link_bytes_per_s
    # Overlapped, the busier direction outlasts the backward or not; on the compute stream both directions queue up.
    exposed = sum(max(0.0, max(down, up) / rate - backward_s) if overlap else (down + up) / rate for down, up in zip(downs, ups))
    adam_rate = host.adam_params_per_s(devices_sharing=devices_sharing)
    return OffloadTimes(
        offloaded_params=partition_params, grads_to_host_bytes=sum(downs), grads_from_host_bytes=sum(ups),
        params_to_device_bytes=half, link_bytes_per_s=rate, exposed_grads_s=exposed, params_to_device_s=half / rate,
        cpu_adam_params_per_s=adam_rate, cpu_adam_s=partition_params / adam_rate)
