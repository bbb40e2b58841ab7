"""Data-parallel communication of one step: gradient reduction, ZeRO and FSDP traffic.

- ZeRO 0: one all-reduce of the stage's gradients after the last micro-batch.
- ZeRO 1/2: a reduce-scatter of the gradients (after every micro-batch with ZeRO-2 where
  the stack does so: ``SoftwareStack.reduce_every_micro_batch``), then an all-gather of
  the updated (compute-dtype) parameters.
- ZeRO 3 (FSDP): every micro-batch gathers each layer's parameters in forward and again in
  backward, and reduce-scatters its gradients.

Where the step forms its gradients locally (``SoftwareStack.manual_data_parallel``, the JAX
program unpipelined), the fp32 sums are reduced as ZeRO needs, after the micro-batch loop or
after each micro-batch's backward, on the critical path (`_local_gradient_costs`). Where
otherwise the weights are the fp32 master copy, cast per use (``SoftwareStack.fp32_weights``,
the JAX program pipelined or beside context or expert axes), each gradient is reduced where its
partial sums appear, every micro-batch (a layer's in the compute dtype; reduce-scattered into a
ZeRO 1-2 split accumulator, all-reduced otherwise), and the updated fp32 parameters are gathered;
that gather ends the step unless ``SoftwareStack.overlap_param_gather``.

With overlap (``SoftwareStack.dp_overlap``), the reduction hides behind the backward of the last
micro-batch (interleaved, with ``SoftwareStack.per_chunk_grad_reduce``: each chunk's share behind the
other chunks' remaining backward) and FSDP traffic behind the neighbouring layer's compute, leaving what exceeds
it, plus that compute's slowdown while both run (``Efficiency.overlap_slowdown``); without
overlap all of it is on the critical path. PyTorch's FSDP2
(``SoftwareStack.fsdp_copy_out``) also copies each gathered parameter out of the all-gather
buffer on the compute stream: HBM time that no overlap hides.

LoRA fine-tuning reduces only the adapters' gradients (and ZeRO 1/2 gathers only the
adapters back); ZeRO 3 gathers the frozen weights as stored (int8/int4 too) with the
adapters, and reduce-scatters the adapters' gradients alone.

>>> from costmodel.step.collectives import Tier
>>> from costmodel.step.layer_costs import layer_costs
>>> from costmodel.hardware.machine import Machine
>>> from costmodel.inputs.model_config import ModelConfig
>>> from costmodel.inputs.stack import stack_with
>>> m = ModelConfig(name="m", hidden_size=1024, num_layers=4, num_heads=16, ffn_size=4096, vocab_size=1000)
>>> hw = Machine(name="x", peak_flops_per_s=1e14, hbm_bytes_per_s=1e12, hbm_bytes=8e10,
...              devices_per_node=8, intra=Tier(bytes_per_s=1e11, latency_s=0), inter=Tier(bytes_per_s=1e10, latency_s=0))
>>> lay, train = Layout(dp=8, stack=stack_with("jax", dp_overlap=False)), TrainConfig(seq_len=1024, global_batch=8)
>>> c = data_parallel_costs(m, train, lay, hw, layer_costs(m, train, lay, hw))
>>> c.exposed_s == c.total_s > 0
True
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, NonNegativeFloat

from costmodel.hardware.machine import Machine
from costmodel.inputs.layout import Layout
from costmodel.inputs.model_config import ModelConfig, Positions
from costmodel.inputs.train_config import Dtype, TrainConfig
from costmodel.inputs.workload import norm_params_per_layer
from costmodel.step.collectives import all_gather_s, all_reduce_s, exposed_s, reduce_scatter_s
from costmodel.step.fp8_memory import gathered_layer_param_bytes
from costmodel.step.kernels import forms_gradients_locally, holds_master_weights
from costmodel.step.layer_costs import LayerCosts
from costmodel.step.lockstep import gpipe_ticks, one_f_one_b_ticks, runs_lockstep, sums_gradients_locally


class DataParallelCost(BaseModel):
    """Seconds of data-parallel communication in one step on the busiest device."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    total_s: NonNegativeFloat = Field(description="All data-parallel collectives, overlapped or not.")
    exposed_s: NonNegativeFloat = Field(description="The part on the critical path.")
    copy_s: NonNegativeFloat = Field(0.0, description="Copies of gathered parameters out of the all-gather buffer, on the "
                                     "compute stream (SoftwareStack.fsdp_copy_out); HBM-bound, on the critical path.")


def layer_params_per_device(model: ModelConfig, layout: Layout) -> float:
    """Parameters of one layer held by one device (tp splits all; ep splits experts too)."""
    experts = model.routed_expert_params_per_layer
    return (model.params_per_layer - experts) / layout.tp + experts / (layout.tp * layout.ep)


def stage_params(model: ModelConfig, layout: Layout, stage: int) -> float:
    """Parameters one device of pipeline stage ``stage`` holds, before ZeRO sharding (the first
    stage has the embedding, the last the head)."""
    first, last = stage == 0, stage == layout.pp - 1
    params = layout.layers_on_stage(model.num_layers, stage) * layer_params_per_device(model, layout)
    h, v = model.hidden_size, model.vocab_per_shard(layout.tp)
    if first:
        params += v * h + (model.max_position_embeddings * h if model.positions is Positions.LEARNED else 0)
    if last:
        # A tied head shares the embedding only when both ends are on one stage.
        params += h + (0 if model.tie_embeddings and first else h * v)
    return params


def stage_params_per_device(model: ModelConfig, layout: Layout) -> float:
    """Parameters on the most loaded pipeline stage, per device, before ZeRO sharding."""
    return max(stage_params(model, layout, s) for s in range(layout.pp))


def stage_trainable_params(model: ModelConfig, train: TrainConfig, layout: Layout, stage: int) -> float:
    """Parameters one device of pipeline stage ``stage`` trains, before ZeRO sharding: all it
    holds, or under LoRA its layers' adapters.

    >>> m = ModelConfig(name="m", hidden_size=1024, num_layers=4, num_heads=16, ffn_size=4096, vocab_size=1000)
    >>> stage_trainable_params(m, TrainConfig(workload="finetune-lora"), Layout(), 0)  # 4 layers · 16 · 4 · 2048
    524288.0
    """
    if train.workload.trains_base_weights:
        return stage_params(model, layout, stage)
    return layout.layers_on_stage(model.num_layers, stage) * train.workload.adapter_params_per_layer(model, tp=layout.tp)


def stage_expert_params(model: ModelConfig, train: TrainConfig, layout: Layout, stage: int) -> float:
    """Routed-expert parameters one device of ``stage`` trains (its ``1 / (tp · ep)`` share)."""
    if not train.workload.trains_base_weights:
        return 0.0
    return layout.layers_on_stage(model.num_layers, stage) * model.routed_expert_params_per_layer / (layout.tp * layout.ep)


def spread_over_data(params: float, expert_params: float, shards: int, ep: int) -> float:
    """``params`` split ``shards`` ways over the data axes (ZeRO), the routed ``expert_params`` among
    them only over their expert-data-parallel group, the ``shards / ep`` devices holding each expert
    (Megatron's distributed optimizer and MaxText shard expert state there): per device the same
    share of every parameter whatever ``ep`` is.

    >>> spread_over_data(100.0, 80.0, 8, 4)
    42.5
    """
    return (params - expert_params) / shards + expert_params / max(1, shards // ep)


def trainable_params_per_device(model: ModelConfig, train: TrainConfig, layout: Layout) -> float:
    """Trained parameters on the most loaded pipeline stage, per device, before ZeRO sharding."""
    if train.workload.trains_base_weights:
        return stage_params_per_device(model, layout)
    return max(stage_trainable_params(model, train, layout, s) for s in range(layout.pp))


def frozen_layer_bytes(model: ModelConfig, train: TrainConfig, layout: Layout) -> float:
    """Bytes of one layer's frozen base weights on one device under LoRA: the weight matrices
    as `costmodel.inputs.workload.FrozenDtype` stores them, the norms in the compute dtype."""
    norms = norm_params_per_layer(model) / layout.tp
    return (layer_params_per_device(model, layout) - norms) * train.workload.frozen_dtype.bytes + norms * train.compute_dtype.bytes


def frozen_stage_bytes(model: ModelConfig, train: TrainConfig, layout: Layout, stage: int) -> float:
    """Bytes of the frozen base weights one device of stage ``stage`` holds under LoRA, before
    ZeRO sharding: its layers (`frozen_layer_bytes`), the embedding and head in the compute dtype;
    none where every weight trains."""
    if train.workload.trains_base_weights:
        return 0.0
    layers = layout.layers_on_stage(model.num_layers, stage)
    outer = stage_params(model, layout, stage) - layers * layer_params_per_device(model, layout)
    return layers * frozen_layer_bytes(model, train, layout) + outer * train.compute_dtype.bytes


def data_parallel_costs(
    model: ModelConfig, train: TrainConfig, layout: Layout, hw: Machine, layer: LayerCosts
) -> DataParallelCost:
    """Data-parallel seconds of one step for ``layout`` (0 without data or context parallelism): the
    gradients summed over the data and context ranks (``dp_cp``), ZeRO's gathers over those it shards over."""
    if layout.dp * layout.cp == 1:
        return DataParallelCost(total_s=0.0, exposed_s=0.0)
    if layout.zero_stage == 3:
        return _fsdp_costs(model, train, layout, hw, layer)
    groups = hw.groups(layout)
    group, gather_group = groups["dp_cp"], groups["zero"]
    grad_bytes, param_bytes = train.grad_dtype.bytes, train.compute_dtype.bytes
    layers = max(layout.layers_on_stage(model.num_layers, s) for s in range(layout.pp))
    params = trainable_params_per_device(model, train, layout)
    layer_params = layers * layer_params_per_device(model, layout)
    # DeepSpeed's ZeRO-2 reduce-scatters after every micro-batch, not only the last.
    n_reductions = layout.micro_batches(train) if layout.zero_stage == 2 and layout.stack.reduce_every_micro_batch else 1
    if forms_gradients_locally(model, train, layout):
        return _local_gradient_costs(model, train, layout, hw, params)
    if sums_gradients_locally(model, layout):
        # A lockstep pipeline's sums, in the parameters' dtype, all-reduced once after its loop, or under
        # ZeRO 1 reduce-scattered and the updated fp32 parameters gathered. Nothing overlaps: the loop is over first.
        summed_bytes = params * train.param_dtype.bytes
        total_s = all_reduce_s(summed_bytes, group) if layout.zero_stage == 0 else \
            reduce_scatter_s(summed_bytes, group) + all_gather_s(params * Dtype.FP32.bytes, gather_group)
        return DataParallelCost(total_s=total_s, exposed_s=total_s)
    if holds_master_weights(model, train, layout):
        # The JAX program reduces each gradient where its partial sums appear, inside the
        # accumulation loop (every micro-batch) and before its cast back to fp32 (the layers' in
        # the compute dtype); the updated fp32 parameters are gathered whole (`validate.predict`,
        # checked against the compiled HLO). Where ZeRO splits the accumulator (unpipelined; a
        # pipeline's tick loop sums a stage's gradients whole) the partitioner's all-reduce is
        # sliced to the device's shard, which XLA's GPU compiler rewrites into a reduce-scatter
        # (openxla/xla, xla/service/gpu/transforms/reduce_scatter_creator.cc); the CPU backend the
        # validator compiles on keeps the all-reduce, and `validate.predict` counts it so.
        reduce = reduce_scatter_s if layout.zero_stage >= 1 and layout.pp == 1 else all_reduce_s
        reduce_s = reduce(layer_params * param_bytes + (params - layer_params) * Dtype.FP32.bytes, group)
        regather_s = all_gather_s(params * Dtype.FP32.bytes, gather_group) if layout.zero_stage >= 1 else 0.0
        n_reductions = _reductions_in_loop(train, layout)
    elif layout.zero_stage == 0:
        reduce_s, regather_s = all_reduce_s(params * grad_bytes, group), 0.0
    else:  # fp8 parameters gather as fp8 (`costmodel.step.fp8_memory`)
        gathered_bytes = layer_params * gathered_layer_param_bytes(train, layout) + (params - layer_params) * param_bytes
        reduce_s, regather_s = reduce_scatter_s(params * grad_bytes, group), all_gather_s(gathered_bytes, gather_group)
    total_s = n_reductions * reduce_s + regather_s
    if not layout.stack.dp_overlap:
        return DataParallelCost(total_s=total_s, exposed_s=total_s)
    # Bucketed reduction runs while a micro-batch's backward is still going; the parameter
    # all-gather overlaps the next step's first forward.
    slowdown = hw.efficiency.overlap_slowdown
    backward_s = layers * layer.backward_s
    if layout.interleave > 1 and layout.stack.per_chunk_grad_reduce:
        # Chunks finish pp micro-batches apart in the cool-down: all but the last chunk's share of the
        # reduction runs behind the (v - 1)·pp chunk-backwards still to come; the last one's waits.
        v = layout.interleave
        reduce_exposed_s = reduce_s / v + exposed_s(reduce_s * (v - 1) / v, (v - 1) * layout.pp * backward_s / v, slowdown)
    else:
        reduce_exposed_s = exposed_s(reduce_s, backward_s, slowdown)
    gather_window_s = layers * layer.forward_s if layout.stack.overlap_param_gather else 0.0
    exposed = n_reductions * reduce_exposed_s + exposed_s(regather_s, gather_window_s, slowdown)
    return DataParallelCost(total_s=total_s, exposed_s=exposed)


def _local_gradient_costs(model: ModelConfig, train: TrainConfig, layout: Layout, hw: Machine, params: float) -> DataParallelCost:
    """ZeRO 0-2 where the step forms its gradients locally (`SoftwareStack.manual_data_parallel`):
    the sums, in the master weights' dtype, all-reduced (ZeRO 0) or reduce-scattered (1) once
    after the micro-batch loop, or each micro-batch's reduce-scattered after its backward (2);
    then the updated parameters gathered from their data shards in the compute dtype
    (`keeps_compute_copy`). None of it overlaps: the loop's compute is over before the reduction
    starts, and a micro-batch's reduction waits for its whole backward."""
    group = hw.groups(layout)["dp"]
    summed_bytes = params * train.param_dtype.bytes  # summed as the master weights are held
    if layout.zero_stage == 0:
        total_s = all_reduce_s(summed_bytes, group)
    else:
        reductions = layout.micro_batches(train) if layout.zero_stage == 2 else 1
        total_s = reductions * reduce_scatter_s(summed_bytes, group) + all_gather_s(params * train.compute_dtype.bytes, group)
    return DataParallelCost(total_s=total_s, exposed_s=total_s)


def _reductions_in_loop(train: TrainConfig, layout: Layout) -> float:
    """Whole-stage gradient reductions of a program that reduces inside its loop: one per micro-batch
    (also the split-backward 1F1B of lockstep pipelines, whose idle slots reduce nothing); other
    pipelines, one chunk's per tick of the tick loop, bubble ticks included (`validate.predict`
    counts them per tick in the compiled HLO): `costmodel.step.lockstep.gpipe_ticks`, more in
    interleaved lockstep 1F1B.

    >>> train = TrainConfig(seq_len=1024, global_batch=8)
    >>> _reductions_in_loop(train, Layout(dp=2, micro_batch=1)), _reductions_in_loop(train, Layout(dp=2, pp=2, micro_batch=1))
    (4, 4)
    >>> _reductions_in_loop(train, Layout(dp=2, pp=2, micro_batch=1, schedule="gpipe"))
    5.0
    """
    micro = layout.micro_batches(train)
    v = layout.interleave
    if layout.pp == 1 or (runs_lockstep(layout) and v == 1):
        return micro
    ticks = (one_f_one_b_ticks if runs_lockstep(layout) else gpipe_ticks)(micro, layout.pp, v)
    return ticks / v


def _fsdp_costs(model: ModelConfig, train: TrainConfig, layout: Layout, hw: Machine, layer: LayerCosts) -> DataParallelCost:
    """ZeRO 3: each micro-batch gathers every layer's parameters in forward and again in
    backward, and reduce-scatters its gradients; the embedding and head are gathered twice per
    micro-batch, or where the gradients are formed locally once per step; over the ranks ZeRO shards
    over (where those are the data ranks alone, beside context ranks, the reduce-scatter stands for
    the reduction over both)."""
    group = hw.groups(layout)["zero"]
    grad_bytes, param_bytes = train.grad_dtype.bytes, train.compute_dtype.bytes
    layers = max(layout.layers_on_stage(model.num_layers, s) for s in range(layout.pp))
    n_micro = layout.micro_batches(train)
    per_layer = layer_params_per_device(model, layout)
    local = forms_gradients_locally(model, train, layout)
    if not train.workload.trains_base_weights:
        gather, other_gather = _lora_fsdp_bytes(model, train, layout)
        gather_s = all_gather_s(gather, group)
        scatter_s = reduce_scatter_s(train.workload.adapter_params_per_layer(model, tp=layout.tp) * grad_bytes, group)
        ends_s = 2 * all_gather_s(other_gather, group)
        once_s = 0.0
        gathered_bytes = n_micro * 2 * (layers * gather + other_gather)
    else:
        gather_s = all_gather_s(per_layer * gathered_layer_param_bytes(train, layout), group)
        # Formed locally, a layer's gradient is reduce-scattered by its gather's transpose, in the gathered dtype.
        scatter_s = reduce_scatter_s(per_layer * (param_bytes if local else grad_bytes), group)
        other = stage_params_per_device(model, layout) - layers * per_layer
        # There the embedding and head are gathered once per step (hoisted out of the loop), not twice per micro-batch.
        ends_gather_s = all_gather_s(other * param_bytes, group)
        once_s = ends_gather_s if local else 0.0
        ends_s = (0.0 if local else 2 * ends_gather_s) + reduce_scatter_s(other * grad_bytes, group)
        # Two gathers of the stage per micro-batch; a copy-out reads and writes each gathered byte once.
        gathered_bytes = n_micro * 2 * stage_params_per_device(model, layout) * param_bytes
    total_s = n_micro * (layers * (2 * gather_s + scatter_s) + ends_s) + once_s
    copy_s = hw.stream_s(2 * gathered_bytes) if layout.stack.fsdp_copy_out else 0.0
    if not layout.stack.dp_overlap:
        return DataParallelCost(total_s=total_s, exposed_s=total_s, copy_s=copy_s)
    # Prefetching hides a layer's gather behind its neighbour; the first gather and the
    # embedding/head traffic stay exposed.
    slowdown = hw.efficiency.overlap_slowdown
    per_layer_s = exposed_s(gather_s, layer.forward_s, slowdown) + exposed_s(gather_s + scatter_s, layer.backward_s, slowdown)
    exposed = n_micro * (layers * per_layer_s + gather_s + ends_s) + once_s
    return DataParallelCost(total_s=total_s, exposed_s=min(total_s, exposed), copy_s=copy_s)


def _lora_fsdp_bytes(model: ModelConfig, train: TrainConfig, layout: Layout) -> tuple[float, float]:
    """ZeRO 3 under LoRA: bytes one layer's gather moves (frozen weights as stored, adapters in
    the compute dtype) and the embedding's and head's (frozen, so they have no gradient to scatter)."""
    adapters = train.workload.adapter_params_per_layer(model, tp=layout.tp) * train.compute_dtype.bytes
    stage = max(range(layout.pp), key=lambda s: frozen_stage_bytes(model, train, layout, s))
    frozen_layer = frozen_layer_bytes(model, train, layout)
    other = frozen_stage_bytes(model, train, layout, stage) - layout.layers_on_stage(model.num_layers, stage) * frozen_layer
    return frozen_layer + adapters, other
