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

**Parameter offload** (``Offload.PARAMS``, with ZeRO 3), as PyTorch FSDP1 runs
``CPUOffload(offload_params=True)`` (pytorch/pytorch ``torch/distributed/fsdp/_runtime_utils.py``,
read through the project's code search, version not pinned): each rank's shard of every wrapped
unit lives on the host as stored, and is copied up before the unit's all-gather, in forward and
again in backward (the unit is resharded after forward; a checkpointed unit's recompute runs
while it is gathered for backward); each reduced gradient shard is cast to the parameter dtype
and copied down (``_cast_grad_to_param_dtype``, ``_offload_grad``: ``flat_param._cpu_grad``),
and the optimizer steps the host copy. The copies run on FSDP's side streams behind the compute
of the units before (prefetch), so a micro-batch waits only for what they take beyond its
forward and backward; the CPU optimizer step follows the backward, exposed. Its rate is taken as
DeepSpeed's CPU Adam's (`costmodel.hardware.host`): torch's CPU AdamW is slower, so for full
fine-tuning this is optimistic; under LoRA the step is tiny either way.

**Activation offload** (``Layout.offload_activations``), as torchtune's ``OffloadActivations``
runs it (pytorch/torchtune @bd2a0fc ``torchtune/training/_activation_offloading.py``: a
``saved_tensors_hooks`` that copies each saved tensor of at least 1 KiB to pinned host memory
on a side stream during the forward, and back before the backward reads it): the device keeps
the layers in flight (`ACTIVATION_OFFLOAD_LAYERS_KEPT`), the host every layer's saved tensors.
Each micro-batch copies them down behind its forward and up behind its backward; only what a
copy takes beyond the compute it runs beside is exposed.

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

# Activation offload keeps the layer being computed and the next one (torchtune prefetches the next
# layer's saved tensors in backward and holds up to 5 tensors, about one layer, in its forward stash).
ACTIVATION_OFFLOAD_LAYERS_KEPT = 2
# DeepSpeed's default reduce_bucket_size, in elements (deepspeed/runtime/zero/config.py).
REDUCE_BUCKET_ELEMENTS = 5e8
_FP32_BYTES = 4


class HostMemory(Record):
    """Host memory one device's offloaded partition takes, by kind, and its share of the node's."""

    master_weights_bytes: NonNegativeFloat = Field(description="The partition's trained weights the optimizer updates: fp32 "
                                                   "master weights (ZeRO-Offload), or the shard as stored (parameter offload).")
    moments_bytes: NonNegativeFloat = Field(description="Adam's first and second moments, fp32.")
    grads_bytes: NonNegativeFloat = Field(description="Gradients the optimizer reads: fp32 (ZeRO-Offload), in the parameters' "
                                          "dtype (parameter offload).")
    param_copy_bytes: NonNegativeFloat = Field(description="The 16-bit copy of the updated partition sent to the device.")
    accumulated_grads_bytes: NonNegativeFloat = Field(description="16-bit running gradient sums with gradient accumulation; else 0.")
    frozen_weights_bytes: NonNegativeFloat = Field(0.0, description="Parameter offload: the shard of the frozen weights "
                                                   "(fine-tuning), as stored.")
    activations_bytes: NonNegativeFloat = Field(0.0, description="Activation offload: the saved tensors of every layer of "
                                                "the micro-batches in flight.")
    capacity_bytes: NonNegativeFloat | None = Field(None, description="This device's share of its node's host memory, when known.")

    @computed_field(description="Sum of the items.")
    @property
    def total_bytes(self) -> float:
        return (self.master_weights_bytes + self.moments_bytes + self.grads_bytes + self.param_copy_bytes + self.accumulated_grads_bytes
                + self.frozen_weights_bytes + self.activations_bytes)

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
    params_to_device_bytes: NonNegativeFloat = Field(description="Parameter bytes copied host → device per step: the updated "
                                                     "16-bit partition (ZeRO-Offload), or every shard before each gather "
                                                     "(parameter offload).")
    link_bytes_per_s: NonNegativeFloat = Field(description="Device↔host bandwidth per direction used (peak × efficiency).")
    exposed_grads_s: NonNegativeFloat = Field(description="Seconds the copies during the micro-batches outlast the compute they "
                                              "run behind (ZeRO-Offload: the gradients' behind backward; parameter offload: "
                                              "both directions behind forward and backward).")
    params_to_device_s: NonNegativeFloat = Field(description="Seconds of the parameter copy up after the optimizer (ZeRO-Offload, "
                                                 "exposed); 0 under parameter offload, whose copies up run with the gathers.")
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
    """Raise `UnsupportedError` unless ``train`` is full training, the only workload whose optimizer
    state is offloaded here (ZeRO-Offload).

    >>> check_offloadable(TrainConfig(workload="finetune-lora"))
    Traceback (most recent call last):
    costmodel.errors.UnsupportedError: offloading is modelled for full training, not finetune-lora; fix: use --offload none
    """
    if not train.workload.trains_base_weights:
        raise UnsupportedError(f"offloading is modelled for full training, not {train.workload.kind}", fix="use --offload none")


def param_host_memory(trained_params: float, frozen_bytes: float, train: TrainConfig, *, capacity_bytes: float | None) -> HostMemory:
    """Host bytes of one device's shards under parameter offload: the trained shard as stored, its
    gradient in the same dtype, the optimizer's moments, and the frozen shard.

    >>> m = param_host_memory(1e9, 0.0, TrainConfig(), capacity_bytes=None)
    >>> m.master_weights_bytes / 1e9, m.grads_bytes / 1e9, m.moments_bytes / 1e9  # fp32 weights and gradient, two fp32 moments
    (4.0, 4.0, 8.0)
    """
    stored = trained_params * train.param_dtype.bytes
    return HostMemory(master_weights_bytes=stored, moments_bytes=trained_params * train.moment_bytes_per_param, grads_bytes=stored,
                      param_copy_bytes=0.0, accumulated_grads_bytes=0.0, frozen_weights_bytes=frozen_bytes,
                      capacity_bytes=capacity_bytes)


def param_offload_times(trained_params: float, shard_bytes: float, train: TrainConfig, *, micro_batches: int,
                        micro_batch_s: float, host: HostSpec, devices_sharing: int) -> OffloadTimes:
    """Parameter offload's traffic and CPU optimizer step for one device (see the module docstring).

    Args:
      trained_params: parameters of this device's trained shard (their gradients go down).
      shard_bytes: bytes of this device's whole shard as stored (trained and frozen: it goes up twice
        per micro-batch, before the forward and the backward gathers).
      micro_batch_s: one micro-batch's forward and backward on this device, which the copies run behind.

    >>> from costmodel.hardware.catalog import DGX_A100_320GB_HOST
    >>> t = param_offload_times(0.0, 12.8e9, TrainConfig(), micro_batches=2, micro_batch_s=0.5, host=DGX_A100_320GB_HOST,
    ...                         devices_sharing=1)
    >>> t.params_to_device_bytes / 1e9, t.exposed_grads_s  # 2 × 12.8 GB per micro-batch at 25.6 GB/s: 1 s, 0.5 s of it hidden
    (51.2, 1.0)
    """
    up = 2 * shard_bytes
    down = trained_params * train.param_dtype.bytes
    rate = host.link_bytes_per_s
    adam_rate = host.adam_params_per_s(devices_sharing=devices_sharing)
    return OffloadTimes(
        offloaded_params=trained_params, grads_to_host_bytes=micro_batches * down, grads_from_host_bytes=0.0,
        params_to_device_bytes=micro_batches * up, link_bytes_per_s=rate,
        exposed_grads_s=micro_batches * max(0.0, max(up, down) / rate - micro_batch_s), params_to_device_s=0.0,
        cpu_adam_params_per_s=adam_rate, cpu_adam_s=trained_params / adam_rate)


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


def activation_offload_s(activation_bytes: float, *, micro_batches: int, forward_s: float, backward_s: float, host: HostSpec) -> float:
    """Seconds activation offload adds to a step: each micro-batch's saved tensors go down behind its
    forward and come up behind its backward; what a copy takes beyond that compute is exposed.

    >>> from costmodel.hardware.catalog import DGX_A100_320GB_HOST
    >>> activation_offload_s(25.6e9, micro_batches=2, forward_s=0.5, backward_s=1.0, host=DGX_A100_320GB_HOST)  # 1 s each way
    1.0
    """
    copy_s = activation_bytes / host.link_bytes_per_s
    return micro_batches * (max(0.0, copy_s - forward_s) + max(0.0, copy_s - backward_s))
