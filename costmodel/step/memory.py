"""Per-device memory of a layout, itemised, for the most loaded pipeline stage.

Mixed-precision accounting (Megatron-LM's, 18 bytes per parameter without ZeRO):
``params`` is the compute-dtype copy the kernels read (2 B); ``grads`` the gradients as
reduced (fp32, 4 B); ``optimizer`` the fp32 master copy and Adam's two moments (12 B).
ZeRO 1 shards the optimizer state over dp (and the context ranks where the stack does,
`Layout.zero_shards`), ZeRO 2 also the gradients, ZeRO 3 (FSDP) also the parameters.
With ``param_dtype == compute_dtype`` there is no separate master copy.
Where the weights are held in fp32 and cast where used (`SoftwareStack.fp32_weights`, the
JAX program) they are the master copy (4 B, 16 bytes per parameter without ZeRO); their fp32
gradients are split from ZeRO 2 where the step forms them locally, from ZeRO 1 where XLA reduces
them inside the loop (`gradient_split`). A ZeRO-2 stack that reduces only after the last
micro-batch holds them whole until then (`accumulates_whole_gradients`).

Activations are `costmodel.step.activations` per layer times the layers a stage holds times
the micro-batches in flight on the first stage (GPipe all m; 1F1B min(p, m);
interleaved p·(1 + (p−1)/(p·v)), Korthikanti et al. 2022 section 4.2.3). The last stage
also keeps the fp32 logits of each micro-batch in flight there (all m under GPipe, whose
backward starts after every forward) and one logits gradient.

Gradient accumulation over micro-batches (a loop adding each micro-batch's gradient into the
accumulator) holds one micro-batch's gradient besides the accumulator, split as the
accumulator is (with ZeRO ≥ 2 it is reduce-scattered layer by layer): in the compute dtype, or
in fp32 where the weights are (`SoftwareStack.fp32_weights`; the JAX program's, measured on the
CPU backend). Where the weight-gradient GEMMs add into the accumulator themselves
(`SoftwareStack.fused_grad_accumulation`) there is no such buffer.

Fine-tuning's optimizer options (`costmodel.inputs.train_config.OptimizerState`): pure bf16 (torchtune's
default) holds the bf16 weights as their own master, bf16 gradients and bf16 moments (2 + 2 + 4 = 8 B per
parameter); 8-bit AdamW two int8 moments and an fp32 absmax per 2048 elements (2 + 2 + 2.004 B). With the
step in backward (torchtune's optimizer_in_bwd) each gradient is applied and freed as it is formed, so
``grads`` is the largest single weight's gradient (an MLP matrix, or the embedding or head on an end stage)
instead of every gradient.

LoRA fine-tuning (`costmodel.inputs.workload`): the frozen base weights are held as stored (16-bit,
or int8/int4) with no gradient, no optimizer state and no master copy (``frozen_params_bytes``,
part of ``params_bytes``); the adapters are accounted as any trained weight (compute-dtype
copy, fp32 gradient, fp32 master and moments). ZeRO shards what exists: stage 3 the frozen
weights too, stages 1–2 only the adapters' state. Under the fp8 recipe the fp8 copies a stack
keeps of the frozen weights (`costmodel.step.fp8_memory.fp8_weight_copy_bytes`) count as frozen weights. Activations follow
`costmodel.step.activations.lora_activation_terms`.

Offloading (`costmodel.step.offload`, itemised in ``host``): ZeRO-Offload leaves the device one
gradient bucket and no optimizer state; parameter offload (ZeRO 3) leaves it no parameter,
gradient or optimizer state at all, only what ZeRO 3 gathers while a unit runs (temporaries);
activation offload leaves it the saved tensors of the layers in flight (two).

>>> from costmodel.inputs.model_config import ModelConfig
>>> m = ModelConfig(name="m", hidden_size=1024, num_layers=8, num_heads=16, ffn_size=4096, vocab_size=32000)
>>> from costmodel.inputs.stack import stack_with
>>> megatron = memory_breakdown(m, TrainConfig(seq_len=1024, global_batch=8), Layout(stack=stack_with("megatron-core")))
>>> jax = memory_breakdown(m, TrainConfig(seq_len=1024, global_batch=8), Layout(stack=stack_with("jax")))
>>> [(mem.params_bytes + mem.grads_bytes + mem.optimizer_bytes) / m.total_params for mem in (megatron, jax)]
[18.0, 16.0]
>>> pure = [TrainConfig(seq_len=1024, global_batch=8, optimizer_state=s, optimizer_in_backward=b)
...         for s, b in (("bf16", False), ("8bit", True))]
>>> bf16, int8 = (memory_breakdown(m, t, Layout(micro_batch=8)) for t in pure)
>>> (bf16.params_bytes + bf16.grads_bytes + bf16.optimizer_bytes) / m.total_params  # 2 + 2 + 4
8.0
>>> int8.grads_bytes == 1024 * 32000 * 2, int8.optimizer_bytes / m.total_params  # the head's bf16 gradient; 2 + 2·4/2048
(True, 2.00390625)
>>> lora = memory_breakdown(m, TrainConfig(seq_len=1024, global_batch=8, workload="finetune-lora"), Layout())
>>> lora.frozen_params_bytes / m.total_params, lora.optimizer_bytes / lora.grads_bytes  # 2 B frozen; 12 B state per 4 B gradient
(2.0, 3.0)
"""

from __future__ import annotations

from pydantic import Field, NonNegativeFloat, computed_field

from costmodel.inputs.layout import Layout, Offload, Recompute, Schedule
from costmodel.inputs.model_config import ModelConfig, Positions
from costmodel.inputs.train_config import TrainConfig
from costmodel.record import Record
from costmodel.step.activations import activation_bytes_per_layer
from costmodel.step.data_parallel import (
    frozen_layer_bytes,
    frozen_stage_bytes,
    layer_params_per_device,
    spread_over_data,
    stage_expert_params,
    stage_trainable_params,
)
from costmodel.step.fp8_memory import fp8_weight_copy_bytes
from costmodel.step.kernels import forms_gradients_locally, holds_master_weights
from costmodel.step.lockstep import in_flight_slots, runs_lockstep
from costmodel.step.offload import ACTIVATION_OFFLOAD_LAYERS_KEPT, HostMemory, device_grad_bytes, host_memory, param_host_memory

# Gradient-reduction buckets in flight (PyTorch DDP's default bucket is 25 MB, two in flight).
_REDUCTION_BUCKETS_BYTES = 2 * 25e6


class MemoryBreakdown(Record):
    """Bytes one device holds at its peak, by kind."""

    stage: str = Field(description="Which pipeline stage this is ('first', 'last' or 'only').")
    params_bytes: NonNegativeFloat = Field(description="Compute-dtype parameters held (frozen base weights included).")
    frozen_params_bytes: NonNegativeFloat = Field(0.0, description="Of params_bytes, the frozen base weights as stored (LoRA); "
                                                  "0 when every weight trains.")
    grads_bytes: NonNegativeFloat = Field(description="Gradients held.")
    optimizer_bytes: NonNegativeFloat = Field(description="Master weights and optimizer moments held.")
    activations_bytes: NonNegativeFloat = Field(description="Activations kept for backward, all in-flight micro-batches.")
    temporary_bytes: NonNegativeFloat = Field(description="Transient buffers: FSDP gathers, recompute working set, logits, buckets.")
    kv_cache_bytes: NonNegativeFloat = Field(0.0, description="Inference: the KV cache one device holds, in whole blocks of the "
                                             "paged allocator (`costmodel.step.inference`); 0 for training.")
    hbm_bytes: NonNegativeFloat | None = Field(None, description="Usable device memory (the driver's figure), when known.")
    reserve_bytes: NonNegativeFloat = Field(0.0, description="The runtime reserve (CUDA context, NCCL buffers, fragmentation: "
                                            "costmodel.hardware.reserve): a fit threshold below hbm_bytes, not part of total_bytes.")
    host: HostMemory | None = Field(None, description="Offloading: the host memory one device's offloaded state takes, "
                                    "itemised (`costmodel.step.offload`), for the pipeline stage that offloads the most; None when "
                                    "nothing is offloaded.")

    @computed_field(description="Sum of all items.")
    @property
    def total_bytes(self) -> float:
        return (self.params_bytes + self.grads_bytes + self.optimizer_bytes + self.activations_bytes + self.temporary_bytes
                + self.kv_cache_bytes)

    @computed_field(description="The same as total_bytes: what one device must hold.")
    @property
    def per_device_bytes(self) -> float:
        return self.total_bytes

    @computed_field(description="hbm_bytes - reserve_bytes - total_bytes; negative when it does not fit.")
    @property
    def margin_bytes(self) -> float | None:
        return None if self.hbm_bytes is None else self.hbm_bytes - self.reserve_bytes - self.total_bytes

    def limit_text(self) -> str:
        """The fit threshold in words: ``75.7 GiB (79.6 usable − 4.0 reserved)``; the usable memory alone without a reserve."""
        if self.hbm_bytes is None:
            return "unknown"
        if not self.reserve_bytes:
            return f"{self.hbm_bytes / 2**30:.1f} GiB"
        return (f"{(self.hbm_bytes - self.reserve_bytes) / 2**30:.1f} GiB ({self.hbm_bytes / 2**30:.1f} usable − "
                f"{self.reserve_bytes / 2**30:.1f} reserved)")

    @computed_field(description="Host memory this device's offloaded state takes (host.total_bytes); 0 without offloading.")
    @property
    def host_bytes(self) -> float:
        return 0.0 if self.host is None else self.host.total_bytes

    @computed_field(description="Whether total_bytes fits in hbm_bytes less reserve_bytes and, when offloading, the host state "
                                "in its share of host memory.")
    @property
    def fits(self) -> bool | None:
        if self.hbm_bytes is None:
            return None
        return self.total_bytes <= self.hbm_bytes - self.reserve_bytes and (self.host is None or self.host.fits is not False)


def min_state_bytes_per_device(model: ModelConfig, train: TrainConfig, n_devices: int) -> float:
    """A lower bound on any layout's per-device memory: weights, gradients and optimizer state of
    every parameter, spread evenly over all devices (ZeRO 3 across everything), nothing else.

    Arithmetic on the config alone, so a model no cluster of ``n_devices`` could hold is refused
    before any layout is costed.

    >>> from costmodel.inputs.model_config import ModelConfig
    >>> m = ModelConfig(name="m", hidden_size=1024, num_layers=8, num_heads=16, ffn_size=4096, vocab_size=32000)
    >>> min_state_bytes_per_device(m, TrainConfig(seq_len=1024, global_batch=8), 2) / m.total_params
    8.0
    """
    # Whatever the stack: the master weights, a gradient and Adam's moments (a compute-dtype copy
    # is not needed where the weights are the master, `SoftwareStack.fp32_weights`).
    per_param = train.param_dtype.bytes + (0 if train.optimizer_in_backward else train.grad_dtype.bytes) + train.moment_bytes_per_param
    if not train.workload.trains_base_weights:  # the frozen weights, at most 2 B each, and the trained ones' state
        return (model.total_params * train.compute_dtype.bytes + train.workload.trainable_params(model) * per_param) / n_devices
    return model.total_params * per_param / n_devices


def in_flight_microbatches(layout: Layout, n_microbatches: int, stage: int = 0) -> float:
    """Micro-batches whose activations pipeline stage ``stage`` holds at once, in units of its layers.

    In 1F1B stage s warms up with p − s forwards before its first backward; in lockstep
    (`SoftwareStack.lockstep_pipeline`) every stage keeps the program's ring,
    `costmodel.step.lockstep.in_flight_slots` (``min(p, m) + 1`` micro-batches, ``2v·p − 1`` chunks interleaved).
    """
    p, m, v = layout.pp, n_microbatches, layout.interleave
    if layout.schedule is Schedule.GPIPE:
        return m
    if runs_lockstep(layout):  # every stage keeps the lockstep ring (`costmodel.step.lockstep`)
        return in_flight_slots(p, v, m) / v
    if layout.schedule is Schedule.INTERLEAVED and v > 1:
        return min(m, p * (1 + (p - 1) / (p * v))) if stage == 0 else 1
    return min(p - stage, m)


def _largest_param(model: ModelConfig, layout: Layout, *, ends: bool) -> float:
    """The largest single weight a device of a stage holds: an MLP matrix, or the embedding or head on an end stage."""
    mlp = model.hidden_size * model.ffn_size / layout.tp
    return max(mlp, model.hidden_size * model.vocab_per_shard(layout.tp)) if ends else mlp


def _stage_memory(model: ModelConfig, train: TrainConfig, layout: Layout, stage: int, per_layer: float,
                  recompute_temporary: float, host_capacity_bytes: float | None = None) -> dict[str, object]:
    shards, zero = layout.zero_shards, layout.zero_stage  # the ways ZeRO shards
    first, last = stage == 0, stage == layout.pp - 1
    n = stage_trainable_params(model, train, layout, stage)
    mixed = train.param_dtype != train.compute_dtype
    master_weights = holds_master_weights(model, train, layout)
    separate_master = mixed and not master_weights
    optimizer_per_param = (train.param_dtype.bytes if separate_master else 0) + train.moment_bytes_per_param
    experts = stage_expert_params(model, train, layout, stage)

    def sharded(shards: int) -> float:  # the stage's trained parameters split ``shards`` ways over data
        return spread_over_data(n, experts, shards, layout.ep)

    params = sharded(shards if zero >= 3 else 1) * (train.compute_dtype.bytes if separate_master else train.param_dtype.bytes)
    fp8_copies = fp8_weight_copy_bytes(model, train, layout, stage, layer_params=layer_params_per_device(model, layout))
    if train.workload.trains_base_weights:
        frozen = 0.0
        params += fp8_copies
    else:  # the fp8 copies are of the frozen weights, not of the adapters
        frozen = frozen_stage_bytes(model, train, layout, stage) / (shards if zero >= 3 else 1) + fp8_copies
    n_micro = max(1, layout.micro_batches(train))
    grad_split = gradient_split(model, train, layout)
    # FSDP1's no_sync holds whole gradients until the step's last micro-batch reduce-scatters them.
    whole_sums = accumulates_whole_gradients(model, train, layout)
    unsplit = n_micro > 1 and layout.stack.unsharded_grad_accumulation or whole_sums
    grad_shards = 1 if unsplit else grad_split
    grad_bytes = train.param_dtype.bytes if master_weights else train.grad_dtype.bytes
    grads = sharded(grad_shards) * grad_bytes + frozen_grad_bytes(model, train, layout, stage) / grad_shards
    if train.optimizer_in_backward:  # each gradient applied and freed as it is formed: the largest weight's at most
        grads = min(grads, _largest_param(model, layout, ends=first or last) * grad_bytes / grad_split)
    optimizer = sharded(shards if zero >= 1 else 1) * optimizer_per_param
    offloaded = layout.offload is not Offload.NONE
    host = None
    if layout.offload is Offload.OPTIMIZER:  # ZeRO-Offload: state and fp32 gradients on the host, a bucket on the device
        grads, optimizer = device_grad_bytes(n, _largest_param(model, layout, ends=first or last), train), 0.0
        host = host_memory(sharded(shards), train, micro_batches=n_micro, capacity_bytes=host_capacity_bytes)
    elif layout.offload is Offload.PARAMS:  # every shard and the optimizer on the host; units on the device while gathered
        host = param_host_memory(sharded(shards), frozen, train, capacity_bytes=host_capacity_bytes)
        params, frozen, grads, optimizer = 0.0, 0.0, 0.0, 0.0

    layers = layout.layers_on_stage(model.num_layers, stage)
    sb = layout.micro_batch * train.seq_len / layout.cp
    in_flight = in_flight_microbatches(layout, n_micro, stage)
    embedding_out = sb * model.hidden_size * train.compute_dtype.bytes / (layout.tp if layout.sequence_parallel else 1)
    activations = in_flight * (layers * per_layer + (embedding_out if first else 0))
    if layout.offload_activations:  # every layer's saved tensors on the host, the layers in flight on the device
        kept = min(layers, ACTIVATION_OFFLOAD_LAYERS_KEPT) * per_layer + (embedding_out if first else 0)
        host = (host or HostMemory(master_weights_bytes=0.0, moments_bytes=0.0, grads_bytes=0.0, param_copy_bytes=0.0,
                                   accumulated_grads_bytes=0.0, capacity_bytes=host_capacity_bytes)
                ).model_copy(update={"activations_bytes": activations - kept})
        activations = kept

    temporary = 0.0
    if n_micro > 1 and not layout.stack.fused_grad_accumulation and not offloaded:  # offloaded: summed on the host
        temporary += micro_batch_gradient_bytes(n, model, train, layout, expert_params=experts)
    if layout.dp * layout.cp > 1:  # gradients summed over data and context ranks
        layer_params = layer_params_per_device(model, layout)
        trained_layer = layer_params if train.workload.trains_base_weights else train.workload.adapter_params_per_layer(model, tp=layout.tp)
        if grad_split > 1 and not whole_sums:
            # One layer's full gradient exists until it is reduce-scattered (or reduced and sliced).
            temporary += trained_layer * train.grad_dtype.bytes + frozen_grad_bytes(model, train, layout, stage) / max(1, layers)
        elif layout.stack.dp_overlap:  # buckets let the reduction start before the backward ends
            temporary += _REDUCTION_BUCKETS_BYTES if train.workload.trains_base_weights else \
                min(_REDUCTION_BUCKETS_BYTES, n * train.grad_dtype.bytes)
        if zero >= 3:
            # FSDP gathers the layer being computed and prefetches the next.
            gathered = layer_params * train.compute_dtype.bytes if train.workload.trains_base_weights else \
                frozen_layer_bytes(model, train, layout) + trained_layer * train.compute_dtype.bytes
            temporary += min(2, layers) * gathered
            if forms_gradients_locally(model, train, layout):
                temporary += _held_outer_weights_bytes(model, train, layout)
    temporary += recompute_temporary
    if last:
        logits = sb * model.vocab_per_shard(layout.tp) * 4  # fp32
        chunks = layout.stack.cross_entropy_chunks
        if chunks > 1:
            # One piece's logits and their gradient, none kept from forward to backward; the loop
            # over the pieces sums the head weight's gradient in an fp32 buffer of its own.
            temporary += 2 * logits / chunks + model.vocab_per_shard(layout.tp) * model.hidden_size * 4
        else:  # the loss's buffers (`SoftwareStack.loss_buffers`) and the logits of the other micro-batches in flight;
            # in lockstep the head runs one micro-batch per tick
            temporary += (layout.stack.loss_buffers + (0 if runs_lockstep(layout) else in_flight - 1)) * logits
    return {"params_bytes": params + frozen, "frozen_params_bytes": frozen, "grads_bytes": grads, "optimizer_bytes": optimizer,
            "activations_bytes": activations, "temporary_bytes": temporary, "host": host}


def _held_outer_weights_bytes(model: ModelConfig, train: TrainConfig, layout: Layout) -> float:
    """ZeRO-3 where the step forms its gradients locally: the embedding tables (as stored) and the
    head (in the compute dtype) gathered once and held through the step, as XLA hoists their
    gathers out of the micro-batch loop (`validate.data_parallel_region`)."""
    h, v = model.hidden_size, model.vocab_per_shard(layout.tp)
    tables = v * h + (model.max_position_embeddings * h if model.positions is Positions.LEARNED else 0)
    head = 0 if model.tie_embeddings else h * v * train.compute_dtype.bytes
    return tables * train.param_dtype.bytes + head


def gradient_split(model: ModelConfig, train: TrainConfig, layout: Layout) -> int:
    """How many ways the accumulated gradients are split over dp: from ZeRO 2 (also where the
    gradients are formed locally, `forms_gradients_locally`: ZeRO 1 holds them whole until its one
    reduce-scatter); where XLA reduces fp32 master weights' gradients inside the loop, from ZeRO 1
    with the optimizer state, but a pipeline's tick loop sums a stage's gradients whole
    (`validate.split_backward`, `validate.one_f_one_b`), so there only ZeRO 3 splits them."""
    if holds_master_weights(model, train, layout) and not forms_gradients_locally(model, train, layout):
        split_from = 1 if layout.pp == 1 else 3
    else:
        split_from = 2
    return layout.zero_shards if layout.zero_stage >= split_from else 1


def accumulates_whole_gradients(model: ModelConfig, train: TrainConfig, layout: Layout) -> bool:
    """Whether ZeRO 2 sums several micro-batches' gradients whole, as ZeRO 1 does, because the stack
    reduce-scatters them after the last micro-batch only (no `SoftwareStack.reduce_every_micro_batch`;
    Megatron's distributed optimizer, whose gradient buffer is whole): a sum split before it is
    reduced would drop the other ranks' shares. The JAX program's own reductions (`gradient_split`)
    run every micro-batch; FSDP1's no_sync is `SoftwareStack.unsharded_grad_accumulation`.

    >>> from costmodel.inputs.stack import stack_with
    >>> m = ModelConfig(name="m", hidden_size=1024, num_layers=2, num_heads=16, ffn_size=4096, vocab_size=1000)
    >>> t = TrainConfig(seq_len=1024, global_batch=8)  # two micro-batches of one sequence per replica
    >>> stacks = [stack_with(s) for s in ("megatron-core", "deepspeed", "jax")]
    >>> [accumulates_whole_gradients(m, t, Layout(dp=4, zero_stage=2, micro_batch=1, stack=s)) for s in stacks]
    [True, False, False]
    """
    if layout.zero_stage != 2 or layout.stack.reduce_every_micro_batch or layout.micro_batches(train) <= 1:
        return False
    return not (holds_master_weights(model, train, layout) or forms_gradients_locally(model, train, layout))


def accumulates_layer_by_layer(model: ModelConfig, train: TrainConfig, layout: Layout) -> bool:
    """Whether the step adds each layer's gradient into the micro-batches' whole sum inside the
    backward, as it is formed: the JAX program where it forms its gradients locally
    (`forms_gradients_locally`) under ZeRO 0-1 with several micro-batches, full training
    (`planner.programs.accumulate`, `validate.data_parallel_region`). One layer's gradient then
    exists at a time beside the sum (and the embedding's and head's, formed last).

    >>> m = ModelConfig(name="m", hidden_size=1024, num_layers=2, num_heads=16, ffn_size=4096, vocab_size=1000)
    >>> t = TrainConfig(seq_len=1024, global_batch=8)
    >>> [accumulates_layer_by_layer(m, t, Layout(dp=4, zero_stage=z, micro_batch=1)) for z in (0, 1, 2, 3)]
    [True, True, False, False]
    """
    return (forms_gradients_locally(model, train, layout) and layout.zero_stage < 2 and layout.micro_batches(train) > 1
            and train.workload.trains_base_weights and not train.optimizer_in_backward)


def micro_batch_gradient_bytes(params: float, model: ModelConfig, train: TrainConfig, layout: Layout, *,
                               expert_params: float = 0.0) -> float:
    """One micro-batch's gradient of ``params`` parameters, held beside the accumulator while it is
    added, split as the accumulator is (`gradient_split`; ZeRO 2 reduce-scatters it layer by layer,
    but where the gradients are formed locally (`forms_gradients_locally`) only after the whole
    backward; whole beside a whole accumulator, `accumulates_whole_gradients`): fp32 where the
    weights are the master copy, else in the compute dtype. Where the step adds it in layer by
    layer (`accumulates_layer_by_layer`), one layer's and the embedding's and head's. The
    ``expert_params`` among them split only over their expert-data-parallel group.

    >>> from costmodel.inputs.stack import stack_with
    >>> model = ModelConfig(name="m", hidden_size=1024, num_layers=2, num_heads=16, ffn_size=4096, vocab_size=1000)
    >>> train = TrainConfig(seq_len=1024, global_batch=8)
    >>> [micro_batch_gradient_bytes(1e9, model, train, Layout(dp=4, stack=stack_with(s))) for s in ("maxtext", "megatron-core")]
    [4000000000.0, 2000000000.0]
    >>> layer = layer_params_per_device(model, Layout())  # the jax program: one of the two layers' fp32 gradient less
    >>> micro_batch_gradient_bytes(1e9, model, train, Layout(dp=4)) == (1e9 - layer) * 4
    True
    """
    dtype = train.param_dtype if holds_master_weights(model, train, layout) else train.compute_dtype
    if accumulates_layer_by_layer(model, train, layout):
        layer = layer_params_per_device(model, layout)
        return (params - (layout.layers_on_stage(model.num_layers, 0) - 1) * layer) * dtype.bytes
    whole = (forms_gradients_locally(model, train, layout) and layout.zero_stage == 2) or accumulates_whole_gradients(model, train, layout)
    return spread_over_data(params, expert_params, 1 if whole else gradient_split(model, train, layout), layout.ep) * dtype.bytes


def frozen_grad_bytes(model: ModelConfig, train: TrainConfig, layout: Layout, stage: int = 0) -> float:
    """Gradient bytes of a stage's frozen layer weights before any sharding: none, unless a
    stack's ZeRO-3 gives them one (`SoftwareStack.fsdp_frozen_grads`), in the dtype they are held in.

    >>> from costmodel.inputs.model_config import ModelConfig
    >>> from costmodel.inputs.stack import stack_with
    >>> m = ModelConfig(name="m", hidden_size=1024, num_layers=4, num_heads=16, ffn_size=4096, vocab_size=1000)
    >>> lora = TrainConfig(seq_len=512, global_batch=8, workload="finetune-lora")
    >>> frozen_grad_bytes(m, lora, Layout(dp=2, zero_stage=3, stack=stack_with("lit-gpt"))) == 4 * frozen_layer_bytes(m, lora, Layout())
    True
    >>> frozen_grad_bytes(m, lora, Layout(dp=2, zero_stage=3, stack=stack_with("pytorch-fsdp1")))
    0.0
    """
    if train.workload.trains_base_weights or not (layout.zero_stage >= 3 and layout.stack.fsdp_frozen_grads):
        return 0.0
    return layout.layers_on_stage(model.num_layers, stage) * frozen_layer_bytes(model, train, layout)


def memory_breakdown(model: ModelConfig, train: TrainConfig, layout: Layout, *, hbm_bytes: float | None = None,
                     reserve_bytes: float = 0.0, host_capacity_bytes: float | None = None) -> MemoryBreakdown:
    """Memory of the most loaded device: the first, a middle or the last pipeline stage
    (``host_capacity_bytes``: with offloading, the device's share of its node's host memory;
    ``reserve_bytes``: the runtime reserve, which ``fits`` leaves free).

    With an even split a middle stage never holds more than the first (fewer layers in
    flight, no embedding), so only the ends are costed; uneven stages are all costed.
    """
    per_layer = activation_bytes_per_layer(model, train, layout)
    # Recomputing a layer materialises its full activations once more.
    recompute_temporary = (0.0 if layout.recompute is Recompute.NONE else
                           activation_bytes_per_layer(model, train, layout.model_copy(update={"recompute": Recompute.NONE})))
    if layout.pp == 1:
        return MemoryBreakdown(stage="only", hbm_bytes=hbm_bytes, reserve_bytes=reserve_bytes,
                               **_stage_memory(model, train, layout, 0, per_layer, recompute_temporary, host_capacity_bytes))
    names = {0: "first", layout.pp - 1: "last"}
    costed = range(layout.pp) if layout.stage_layers else (0, layout.pp - 1)
    totals = {s: _stage_memory(model, train, layout, s, per_layer, recompute_temporary, host_capacity_bytes) for s in costed}
    busiest = max(totals, key=lambda s: (sum(v for k, v in totals[s].items() if k not in ("frozen_params_bytes", "host")), -s))
    # Offloaded, the host state is the stage with the most parameters' (the embedding or head may outweigh the busiest's).
    host = max((t["host"] for t in totals.values() if t["host"]), key=lambda h: h.total_bytes, default=None)
    return MemoryBreakdown(stage=names.get(busiest, f"stage {busiest}"), hbm_bytes=hbm_bytes, reserve_bytes=reserve_bytes,
                           **(totals[busiest] | {"host": host}))
