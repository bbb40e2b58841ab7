"""The step simulator: a layout on a machine → `StepEstimate`, every term explained.

1. One layer's kernels and collectives for one micro-batch (`costmodel.step.layer_costs`).
2. Per-stage forward/backward times: layers per stage, plus the embedding on the first
   stage and the head and loss on the last.
3. The pipeline schedule, simulated (`costmodel.step.schedules`), with blocking stage-to-stage
   transfers (`stage_transfer_s`).
4. Data-parallel reduction / ZeRO / FSDP traffic and what of it is exposed, plus FSDP2's
   copies of gathered parameters (`costmodel.step.data_parallel`), the gradient accumulation
   over micro-batches where it is a kernel of its own, then the optimizer update, with
   fp16's gradient unscaling (all HBM-bound).
5. Where the runtime maps a step's temporaries afresh (XLA's CPU runtime), faulting them in.
6. With offloading (`costmodel.step.offload`), instead of the device's optimizer update and gradient
   accumulation: the device↔host copies beyond what the compute hides (ZeRO-Offload's gradients
   behind backward; parameter offload's shards behind forward and backward), and Adam on the CPU;
   offloaded activations' copies beyond the forward and backward they run beside.

>>> from costmodel.step.collectives import Tier
>>> from costmodel.hardware.machine import Machine
>>> from costmodel.inputs.model_config import ModelConfig
>>> m = ModelConfig(name="m", hidden_size=1024, num_layers=8, num_heads=16, ffn_size=4096, vocab_size=1000)
>>> hw = Machine(name="x", peak_flops_per_s=1e14, hbm_bytes_per_s=1e12, hbm_bytes=8e10,
...              devices_per_node=8, intra=Tier(bytes_per_s=1e11, latency_s=0), inter=Tier(bytes_per_s=1e10, latency_s=0))
>>> est = simulate(m, TrainConfig(seq_len=1024, global_batch=16), Layout(dp=2, tp=2, pp=2, micro_batch=2, recompute="full"), hw)
>>> abs(est.breakdown.total_s - est.step_time_s) < 1e-9 and 0 < est.mfu < est.hfu < 1
True
"""

from __future__ import annotations

from dataclasses import dataclass

from costmodel.hardware.machine import Machine
from costmodel.hardware.topology import link_between_stages
from costmodel.inputs.layout import Layout, Offload, Schedule, check_layout
from costmodel.inputs.model_config import ModelConfig
from costmodel.inputs.train_config import OptimizerState, TrainConfig
from costmodel.step.collectives import all_gather_s, exposed_s, p2p_s
from costmodel.step.data_parallel import data_parallel_costs, frozen_stage_bytes, trainable_params_per_device
from costmodel.step.estimate import StepEstimate, TimeBreakdown
from costmodel.step.inference import simulate_inference
from costmodel.step.kernels import KernelKind, embedding_forward_kernels, head_forward_kernels, layer_forward_kernels
from costmodel.step.layer_costs import LayerCosts, layer_costs, phase_time
from costmodel.step.lockstep import runs_lockstep
from costmodel.step.memory import MemoryBreakdown, memory_breakdown
from costmodel.step.offload import (
    OffloadTimes,
    activation_offload_s,
    check_offloadable,
    offload_times,
    param_offload_times,
    require_host,
)
from costmodel.step.recompute import recomputed_kernels
from costmodel.step.schedules import PipelineTimes, lockstep_step_estimate, pipeline_step_estimate, simulate_pipeline
from costmodel.step.stage_split import identical_stage_layers

# Optimizer-step HBM traffic per parameter, Megatron-LM's and torchtitan's alike: Adam reads
# the fp32 param, grad, m and v and writes param, m and v (28 B); the gradient norm for
# clipping reads the grads (4 B); the grads are then scaled or zeroed (4 B); the updated
# param is read again and written in the compute dtype (4 + 2 B).
OPTIMIZER_BYTES_PER_PARAM = 7 * 4 + 4 + 4 + 4 + 2
# fp16 with dynamic loss scaling, per parameter, before the update: the fp16 gradient is
# cast into the fp32 main gradient (read 2 B, write 4 B), then unscaled and checked for
# inf/NaN in one pass (read and write 4 B each). Megatron-LM @ec20274
# megatron/optimizer/optimizer.py: _copy_model_grads_to_main_grads, then
# _unscale_main_grads_and_check_for_nan (torch._amp_foreach_non_finite_check_and_unscale_).
LOSS_SCALING_BYTES_PER_PARAM = 2 + 4 + 4 + 4


def optimizer_bytes_per_param(train: TrainConfig) -> float:
    """HBM bytes the optimizer step moves per trained parameter, by how its state is stored.

    fp32 (`OPTIMIZER_BYTES_PER_PARAM`): 42 B. Pure bf16: Adam reads the bf16 weight, gradient and two moments and
    writes weight and moments (7 × 2 B), the gradient norm reads the gradients and they are zeroed (2 + 2 B);
    no cast, the weights are their own master. 8-bit AdamW: the bf16 weight and gradient read and the weight
    written (3 × 2 B), each int8 moment read and written with its block's fp32 absmax (2 × 2 × (1 + 4/2048) B),
    then the norm and the zeroing (2 + 2 B). In backward (torchtune's optimizer_in_bwd) a gradient is freed,
    not zeroed, and cannot be clipped by the global norm (torchtune refuses clip_grad_norm with it), so
    those two passes go.

    >>> [optimizer_bytes_per_param(TrainConfig(optimizer_state=s)) for s in ("fp32", "bf16", "8bit")]
    [42, 18, 14.0078125]
    >>> optimizer_bytes_per_param(TrainConfig(optimizer_state="8bit", optimizer_in_backward=True))
    10.0078125
    """
    state = train.optimizer_state
    if state is OptimizerState.FP32:
        norm_and_zero = 2 * 4  # the fp32 main gradients'
        return OPTIMIZER_BYTES_PER_PARAM - (norm_and_zero if train.optimizer_in_backward else 0)
    norm_and_zero = 2 * train.grad_dtype.bytes
    weight_and_grad = 3 * train.param_dtype.bytes
    moments = 2 * state.moment_bytes  # each read and written
    return weight_and_grad + moments + (0 if train.optimizer_in_backward else norm_and_zero)


@dataclass(frozen=True)
class _Stage:
    """One pipeline stage's work for one micro-batch, in seconds."""

    compute_s: float
    memory_s: float
    recompute_s: float
    comm_s: float
    forward_s: float
    backward_s: float
    ends_forward_s: float  # of forward_s: the embedding's and the head's
    ends_backward_s: float


def _stages(model: ModelConfig, train: TrainConfig, layout: Layout, hw: Machine, layer: LayerCosts) -> list[_Stage]:
    embed_kernels = embedding_forward_kernels(model, train, layout)
    embed, embed_bwd = phase_time(embed_kernels, hw), phase_time(embed_kernels, hw, backward=True)
    head_kernels = head_forward_kernels(model, train, layout)
    head, head_bwd = phase_time(head_kernels, hw), phase_time(head_kernels, hw, backward=True)
    stages = []
    for s in range(layout.pp):
        first, last = s == 0, s == layout.pp - 1
        n_layers = layout.layers_on_stage(model.num_layers, s)
        fwd_ends = [p for p, on in ((embed, first), (head, last)) if on]
        bwd_ends = [p for p, on in ((embed_bwd, first), (head_bwd, last)) if on]
        stages.append(_Stage(
            compute_s=n_layers * (layer.forward.compute_s + layer.backward.compute_s) + sum(p.compute_s for p in fwd_ends + bwd_ends),
            memory_s=n_layers * (layer.forward.memory_s + layer.backward.memory_s) + sum(p.memory_s for p in fwd_ends + bwd_ends),
            recompute_s=n_layers * layer.recompute.total_s,
            comm_s=n_layers * layer.exposed_comm_s,
            forward_s=n_layers * layer.forward_s + sum(p.total_s for p in fwd_ends),
            backward_s=n_layers * layer.backward_s + sum(p.total_s for p in bwd_ends),
            ends_forward_s=sum(p.total_s for p in fwd_ends), ends_backward_s=sum(p.total_s for p in bwd_ends),
        ))
    return stages


def balanced_layout(model: ModelConfig, train: TrainConfig, layout: Layout, hw: Machine) -> Layout:
    """``layout`` with its layers cut into stages by `balanced_stage_layers` (the inter-op DP):
    the end stages, which also run the embedding and the head, get fewer layers when that
    shortens the slowest stage. Unchanged without pipelining, with interleaving, in lockstep (the
    head and embedding run outside the stages' slots there, on every device, `split_backward_estimate`),
    or when the even split is already best.

    >>> from costmodel.hardware.machine import load_machine
    >>> from costmodel.inputs.stack import STACKS
    >>> m = ModelConfig(name="m", hidden_size=1024, num_layers=8, num_heads=16, ffn_size=4096, vocab_size=128000)
    >>> megatron = Layout(pp=4, stack=STACKS["megatron-core"])
    >>> balanced_layout(m, TrainConfig(seq_len=1024, global_batch=16), megatron, load_machine("a100-80gb")).stage_layers
    (2, 2, 3, 1)
    """
    if layout.pp == 1 or layout.interleave > 1 or runs_lockstep(layout):
        return layout
    even = layout.model_copy(update={"stage_layers": None})
    layer = layer_costs(model, train, even, hw)
    ends = _stages(model.model_copy(update={"num_layers": layout.pp}), train, even, hw, layer)
    first_extra = ends[0].forward_s + ends[0].backward_s - (layer.forward_s + layer.backward_s)
    last_extra = ends[-1].forward_s + ends[-1].backward_s - (layer.forward_s + layer.backward_s)
    split = identical_stage_layers(model.num_layers, pp=layout.pp, layer_s=layer.forward_s + layer.backward_s,
                                   first_extra_s=first_extra, last_extra_s=last_extra)
    uneven = len(set(split)) > 1 or model.num_layers % layout.pp
    return layout.model_copy(update={"stage_layers": split if uneven else None})


def model_flops_per_step(model: ModelConfig, train: TrainConfig) -> float:
    """Model FLOPs of one step, as the workload counts them by MFU's convention
    (`costmodel.workloads.flops`: ``6·N + 6·L·H·Q·s`` a training token, causal attention, no
    recompute). Under LoRA the frozen weights' backward has no weight gradient: 2 × their forward
    FLOPs (4·N per token), the attention 3 ×, the adapters 3 × their own.

    >>> m = ModelConfig(name="m", hidden_size=1024, num_layers=8, num_heads=16, ffn_size=4096, vocab_size=1000)
    >>> lora, full = TrainConfig(seq_len=128, workload="finetune-lora"), TrainConfig(seq_len=128)
    >>> 0.66 < model_flops_per_step(m, lora) / model_flops_per_step(m, full) < 0.7
    True
    """
    return train.workload.model_flops(model, tokens=train.tokens_per_step, seq_len=train.seq_len)


def _recompute_flops(model: ModelConfig, train: TrainConfig, layout: Layout) -> float:
    kernels = recomputed_kernels(layer_forward_kernels(model, train, layout), model, layout)
    per_device_mb = sum(k.total_flops for k in kernels if k.kind is not KernelKind.MEMORY) * model.num_layers
    return per_device_mb * layout.micro_batches(train) * layout.dp * layout.tp * layout.cp


def grad_accumulation_s(model: ModelConfig, train: TrainConfig, layout: Layout, hw: Machine) -> float:
    """Adding each micro-batch's gradient into the accumulator, after the first, where a
    separate kernel does it (not `SoftwareStack.fused_grad_accumulation`): it reads the gradient
    in the compute dtype and reads and writes the accumulator (in the gradient dtype, the
    data-parallel shard of it from ZeRO 2 on).

    >>> from costmodel.hardware.machine import load_machine
    >>> m = ModelConfig(name="m", hidden_size=1024, num_layers=8, num_heads=16, ffn_size=4096, vocab_size=1000)
    >>> hw, train = load_machine("a100-80gb"), TrainConfig(seq_len=1024, global_batch=16)
    >>> grad_accumulation_s(m, train, Layout(micro_batch=4), hw) > 0 == grad_accumulation_s(m, train, Layout(micro_batch=16), hw)
    True
    """
    n_micro = layout.micro_batches(train)
    if layout.stack.fused_grad_accumulation or n_micro <= 1:
        return 0.0
    params = trainable_params_per_device(model, train, layout) / (layout.zero_shards if layout.zero_stage >= 2 else 1)
    bytes_per_param = train.compute_dtype.bytes + 2 * train.grad_dtype.bytes
    return hw.stream_s((n_micro - 1) * params * bytes_per_param)


def _first_touch_s(memory: MemoryBreakdown, hw: Machine) -> float:
    """Faulting in the step's temporaries (gradients, activations, buffers) where the
    runtime maps them afresh every step (`costmodel.hardware.profile.StepAllocator`)."""
    fresh_bytes = memory.grads_bytes + memory.activations_bytes + memory.temporary_bytes
    alloc = hw.step_allocator
    return fresh_bytes * alloc.first_touch_s_per_byte if alloc and fresh_bytes > alloc.fresh_above_bytes else 0.0


def stage_transfer_s(model: ModelConfig, train: TrainConfig, layout: Layout, hw: Machine) -> float:
    """Seconds to pass one micro-batch's activation to the next pipeline stage (0 without pipelining).

    Each tensor-parallel rank sends its 1/tp of it (Megatron-LM's scatter-gather
    optimisation); where the next stage needs it whole (no sequence parallelism) the tp
    ranks there all-gather it over their own link.
    """
    if layout.pp == 1:
        return 0.0
    act_bytes = layout.micro_batch * train.seq_len / layout.cp * model.hidden_size * train.compute_dtype.bytes
    stage_tier = link_between_stages(layout, devices_per_node=hw.devices_per_node, intra=hw.intra, inter=hw.inter,
                                     inter_cross_rail=hw.inter_cross_rail)
    regather_s = 0.0 if layout.sequence_parallel else all_gather_s(act_bytes, hw.groups(layout)["tp"])
    return p2p_s(act_bytes / layout.tp, stage_tier) + regather_s


def exposed_stage_transfer_s(send_s: float, stages: list[_Stage], layout: Layout, hw: Machine) -> float:
    """What one stage-to-stage transfer of ``send_s`` adds to a micro-step: all of it where
    sends block, only what outlasts the shortest chunk micro-step (and that step's slowdown)
    where the stack overlaps them (`SoftwareStack.overlap_p2p`, interleaved schedule only)."""
    if not (layout.stack.overlap_p2p and layout.schedule is Schedule.INTERLEAVED):
        return send_s
    chunk_step_s = min(s.forward_s for s in stages) / layout.interleave
    return exposed_s(send_s, chunk_step_s, hw.efficiency.overlap_slowdown)


def _devices_sharing_host(layout: Layout, hw: Machine) -> int:
    """Devices of a node that offload at once: each gets that share of its host's memory, cores and DRAM."""
    return min(layout.n_devices, hw.devices_per_node)


def _offload(model: ModelConfig, train: TrainConfig, layout: Layout, hw: Machine, stage: _Stage) -> OffloadTimes:
    """The step's offload costs."""
    host = require_host(hw.host, hw.name)
    sharing = _devices_sharing_host(layout, hw)
    partition = trainable_params_per_device(model, train, layout) / layout.zero_shards
    if layout.offload is Offload.PARAMS:
        shard_bytes = partition * train.param_dtype.bytes + frozen_stage_bytes(model, train, layout, 0) / layout.zero_shards
        return param_offload_times(partition, shard_bytes, train, micro_batches=layout.micro_batches(train),
                                   micro_batch_s=stage.forward_s + stage.backward_s, host=host, devices_sharing=sharing)
    check_offloadable(train)
    return offload_times(partition, train, micro_batches=layout.micro_batches(train), backward_s=stage.backward_s,
                         overlap=layout.stack.dp_overlap, host=host, devices_sharing=sharing)


def simulate(model: ModelConfig, train: TrainConfig, layout: Layout, hw: Machine, *, keep_timeline: bool = False) -> StepEstimate:
    """Predict one training step of ``model`` under ``layout`` on ``hw`` (a prefill or decode
    workload: `costmodel.step.inference.simulate_inference`)."""
    if not train.workload.runs_backward:  # a serving forward: its own model
        return simulate_inference(model, train, layout, hw)
    check_layout(layout, model, train, n_devices=layout.n_devices)
    layer = layer_costs(model, train, layout, hw)
    stages = _stages(model, train, layout, hw, layer)
    full_send_s = stage_transfer_s(model, train, layout, hw)
    send_s = exposed_stage_transfer_s(full_send_s, stages, layout, hw)
    n_micro = layout.micro_batches(train)
    times = PipelineTimes(forward_s=tuple(s.forward_s for s in stages), backward_s=tuple(s.backward_s for s in stages),
                          p2p_s=send_s, interleave=layout.interleave, ends_forward_s=tuple(s.ends_forward_s for s in stages),
                          ends_backward_s=tuple(s.ends_backward_s for s in stages),
                          layers=tuple(max(1, layout.layers_on_stage(model.num_layers, s)) for s in range(layout.pp)))
    if runs_lockstep(layout):
        pipe = lockstep_step_estimate(times, n_microbatches=n_micro, keep_events=keep_timeline)
    elif keep_timeline:
        pipe = simulate_pipeline(times, n_microbatches=n_micro, schedule=layout.schedule, keep_events=True)
    else:
        pipe = pipeline_step_estimate(times, n_microbatches=n_micro, schedule=layout.schedule)
    dp = data_parallel_costs(model, train, layout, hw, layer)
    optimizer_params = trainable_params_per_device(model, train, layout) / (layout.zero_shards if layout.zero_stage >= 1 else 1)
    optimizer_bytes = optimizer_bytes_per_param(train) + (LOSS_SCALING_BYTES_PER_PARAM if train.loss_scaled else 0)
    optimizer_s = hw.stream_s(optimizer_params * optimizer_bytes)
    accumulate_s = grad_accumulation_s(model, train, layout, hw)
    busiest_stage = max(range(layout.pp), key=lambda s: stages[s].forward_s + stages[s].backward_s)
    busiest = stages[busiest_stage]
    offload, host_capacity = None, None
    if layout.offload is not Offload.NONE or layout.offload_activations:  # this device's share of its node's host memory
        host_capacity = require_host(hw.host, hw.name).memory_bytes_per_node / _devices_sharing_host(layout, hw)
    if layout.offload is not Offload.NONE:  # the optimizer and the accumulation run on the host instead
        offload = _offload(model, train, layout, hw, busiest)
        optimizer_s = accumulate_s = 0.0
    memory = memory_breakdown(model, train, layout, hbm_bytes=int(hw.hbm_bytes), reserve_bytes=hw.memory_reserve_bytes,
                              host_capacity_bytes=host_capacity)
    # Without pipeline stages one micro-batch is in flight: each moves what the host holds.
    activations_s = (activation_offload_s(memory.host.activations_bytes, micro_batches=n_micro, forward_s=busiest.forward_s,
                                          backward_s=busiest.backward_s, host=hw.host) if layout.offload_activations else 0.0)
    first_touch_s = _first_touch_s(memory, hw)
    offload_s = offload.exposed_transfer_s + offload.cpu_adam_s if offload else 0.0
    step_s = pipe.step_time_s + dp.exposed_s + dp.copy_s + accumulate_s + optimizer_s + first_touch_s + offload_s + activations_s

    n_layers = layout.layers_on_stage(model.num_layers, busiest_stage)
    transfers_s = n_micro * times.transfers_per_microbatch_s
    breakdown = TimeBreakdown(
        compute_s=n_micro * busiest.compute_s,
        memory_bound_s=n_micro * busiest.memory_s + dp.copy_s + accumulate_s,
        recompute_s=n_micro * busiest.recompute_s,
        bubble_s=max(0.0, pipe.step_time_s - n_micro * (busiest.forward_s + busiest.backward_s) - transfers_s),
        exposed_comm_s=n_micro * busiest.comm_s + transfers_s + dp.exposed_s,
        optimizer_s=optimizer_s,
        first_touch_s=first_touch_s,
        offload_transfer_s=offload.exposed_transfer_s if offload else 0.0,
        activation_offload_s=activations_s,
        cpu_optimizer_s=offload.cpu_adam_s if offload else 0.0,
        offload=offload,
        comm_s_by_axis={
            "tp": n_micro * n_layers * (layer.tp_forward_s + layer.tp_backward_s),
            "cp": n_micro * n_layers * layer.cp_total_s,
            "ep": n_micro * n_layers * (layer.ep_forward_s + layer.ep_backward_s),
            "pp": n_micro * times.model_copy(update={"p2p_s": full_send_s}).transfers_per_microbatch_s,
            "dp": dp.total_s,
        },
    )
    flops = model_flops_per_step(model, train)
    peak = step_s * layout.n_devices * hw.peak_flops_per_s
    return StepEstimate(
        layout=layout, hardware=hw.name, n_devices=layout.n_devices, step_time_s=step_s,
        tokens_per_s=train.tokens_per_step / step_s, mfu=flops / peak,
        hfu=(flops + _recompute_flops(model, train, layout)) / peak, model_flops=flops,
        breakdown=breakdown, memory=memory, fits=memory.fits, timeline=pipe.events,
    )
