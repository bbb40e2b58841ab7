"""What the plan's program should communicate and compute, per device, before XLA compiles it.

The prediction follows the reference program's structure (`validate.lowering`) and the
partitioning XLA gives it, term by term, each with a one-line reason:

- Tensor parallel, per layer and micro-batch: one all-reduce of the ``[tokens, D]``
  activation per row-parallel matmul (``wo``, ``w_out``) in forward, and one per
  column-parallel matmul (``wq``, ``wk``, ``wv``, ``w_in``, ``w_gate``) in backward: XLA
  reduces each partial input gradient on its own, where Megatron's fused QKV and
  gate/up GEMMs reduce two. Full recompute repeats the forward ones except the last,
  which only feeds the layer's output and is dead code in the recomputation.
- Vocabulary-parallel embedding (fp32 rows summed over the vocabulary axes) and head
  (fp32 input gradient, four ``[tokens]`` softmax/loss reductions).
- Where the gradients are formed per data replica (`validate.data_parallel_region`: ZeRO 0–2,
  beside tensor axes too; ZeRO 3 under data parallelism alone): what each ZeRO stage needs
  (`validate.predict_data_parallel.region_collectives`). Elsewhere: gradients are
  reduced once per micro-batch (the reduction happens inside the accumulation loop, where
  the partial sums appear), layer weights in the compute dtype, fp32 for what is used in
  fp32 (norms, the embedding table, the fp32-output head). With ZeRO ≥ 1 the updated fp32
  parameters are all-gathered over the data axes.
- Matmul FLOPs: forward, twice that in backward, plus what the recompute policy repeats.
- 1F1B pipelines without interleaving (`validate.split_backward`): each layer's forward and
  backward run once a micro-batch (the layer step's other branches do nothing), so its
  collectives and FLOPs run ``slots × M`` times; the head runs once a period of three slots
  (``M + S − 1`` periods), its gradient's reduction with it. Over the pipeline axis, every slot:
  a ``collective-permute`` of the slot's output up and one down; every period, the sum that hands
  the last stage's output to every pipeline group; once, the sum of stage 0's input gradients.
- Interleaved 1F1B (`validate.one_f_one_b`): every device runs a chunk's forward and
  backward and the head on every one of the ``M·v + (v + 1)·S − 2`` ticks, bubbles included:
  the per-layer collectives and FLOPs run ``slots / v × ticks`` times, the head's and its
  gradient's reduction once per tick, the embedding once on the whole batch. Over the pipeline
  axis, every tick: a ``collective-permute`` of an activation forward and one of its gradient
  backward, and the sum that hands the last stage's output to every pipeline group; once, the
  sum of stage 0's input gradients for the embedding.
- GPipe pipelines (schedule "gpipe"; `validate.gpipe`): every device runs its stage's
  layers on every one of the ``M + S − 1`` ticks, bubble ticks included, so the per-layer
  collectives and FLOPs above run ``slots × ticks`` times rather than ``layers × M``
  (interleaved, ``M·v + S − 1`` ticks of one chunk's ``slots / v`` layers each), and
  the data-parallel reduction of layer gradients happens inside the backward tick loop.
  The embedding and head run once on the whole batch (their collectives once, on ``M``
  micro-batches' tokens). Over the pipeline axis: one ``collective-permute`` of a
  micro-batch's activation per tick in forward and one in backward (interleaved, the same
  permute also carries the last device's output round to the first), the sum of the last
  stage's outputs (bf16) and the sum of the embedding's gradient (fp32).

Also predicted: ZeRO 1/2/3 (whole-gradient all-reduces, per-layer weight gathers in forward
and backward, the embedding's row-gradient exchange, updated-parameter gathers), sequence
parallelism, MoE experts, the flash kernel's causal blocks.
Pipelines with ZeRO, tied embeddings or a table not split over the vocabulary follow the
same rules: the lowering runs the embedding and head whole on every pipeline group.

Expert parallelism: the all-to-alls of the experts' region (`_expert_exchanges`); each expert's
gradients are summed over the data axes its expert axes leave.

Not predicted yet (reported as such): context parallelism, the optimizer step in backward
(`planner.programs.fused_step`) with ZeRO 3 or tensor parallelism, pipelines with
uneven stages (their layers are gathered per stage), and pipelines with ZeRO-3 and tensor
parallelism (`validate.gpipe.runs_outer_whole`) or with MoE layers and tensor parallelism
(`validate.mesh_hooks.expert_region` is not nested in the pipeline's region).

>>> from costmodel.inputs.layout import Layout
>>> from planner.api import layout_plan
>>> p = layout_plan("llama3-8b", Layout(dp=8, tp=4, micro_batch=1, recompute="full", zero_stage=1), seq_len=2048, global_batch=16)
>>> by_kind = {}
>>> for c in predicted_collectives(p):
...     by_kind[c.kind] = by_kind.get(c.kind, 0) + c.total_bytes
>>> {k: round(v / 2**20) for k, v in sorted(by_kind.items())}
{'all-gather': 3830, 'all-reduce': 8320, 'reduce-scatter': 7659}
"""

from __future__ import annotations

from costmodel.hardware.machine import machine_for
from costmodel.hardware.registry import load_hardware
from costmodel.inputs.layout import Recompute, Schedule
from costmodel.inputs.model_config import ModelConfig, Norm, Positions
from costmodel.inputs.stack import Attention
from costmodel.step.activations import activation_table
from costmodel.step.data_parallel import layer_params_per_device, stage_params, stage_params_per_device
from costmodel.step.kernels import keeps_compute_copy
from costmodel.step.lockstep import in_flight_slots
from costmodel.step.memory import MemoryBreakdown, accumulates_layer_by_layer, activation_bytes_per_layer, micro_batch_gradient_bytes
from costmodel.step.simulator import simulate
from planner.plan_schema import Plan
from planner.programs.attention import block_pairs, block_size
from planner.programs.transformer import moe_capacity
from planner.shardings import zero_sharded_specs
from validate.data_parallel_region import reduces_over_data
from validate.gpipe import runs_outer_whole
from validate.one_f_one_b import runs_one_f_one_b
from validate.predict_data_parallel import data_parallel_collectives, region_collectives
from validate.program_runs import F32_BYTES, PredictedCollective, ProgramRuns, param_shards, pipeline_ticks, program_runs
from validate.split_backward import accumulates_over_data_locally

# Matmul weights of a dense layer and the dim (of the stacked [L, ...] array) tensor parallelism splits.
_COLUMN = {"attn/wq": 2, "attn/wk": 2, "attn/wv": 2, "mlp/w_in": 2, "mlp/w_gate": 2}
_ROW = {"attn/wo": 1, "mlp/w_out": 1}


def unpredicted_features(plan: Plan) -> list[str]:
    """Layout features whose collectives `predicted_collectives` does not model."""
    lay = plan.layout
    even = plan.model.num_layers % lay.pp == 0 and len(set(lay.stage_layers or (0,))) == 1
    features = {"uneven pipeline stages": lay.pp > 1 and not even, _SPLIT_BY_XLA: lay.pp > 1 and not runs_outer_whole(plan),
                "MoE layers with tensor parallelism inside pipelines": lay.pp > 1 and lay.tp > 1 and plan.model.is_moe,
                "context parallelism": lay.cp > 1, _FUSED_GATHERS: plan.train.optimizer_in_backward and (lay.zero_stage == 3 or lay.tp > 1)}
    return [name for name, on in features.items() if on]


# llama3-8b, data=8: 1.34x the predicted all-gather bytes with ZeRO 3, 1.33x over the tensor axis
# beside tp=2 (ZeRO 0 and 1 alone: every collective byte as predicted).
_FUSED_GATHERS = ("the optimizer step in backward with ZeRO 3 or tensor parallelism (XLA gathers weights for a layer's "
                  "recompute and its backward apart)")
_SPLIT_BY_XLA = "a pipeline with ZeRO-3 and tensor parallelism (XLA splits its embedding's and head's work over the stages)"


# What a layer's experts keep for their backward (`costmodel.step.activations`).
_EXPERT_ACTIVATIONS = ("expert_inputs", "mlp_up_output", "mlp_gate_output", "mlp_down_input")


def predicted_memory_bytes(plan: Plan, *, platform: str = "gpu") -> float:
    """The simulator's per-device memory for the program as lowered on ``platform``: the plan's
    own estimate, except for pipelines. Those start from the simulator's GPipe estimate (every
    micro-batch's activations in flight, the head one micro-batch at a time on every pipeline
    group); a 1F1B plan then keeps ``min(S, M) + 1`` micro-batches instead (`validate.split_backward`;
    interleaved, ``2v·S − 1`` chunks, `validate.one_f_one_b`, fewer with fewer micro-batches:
    `_one_f_one_b_memory_change`), where the simulator's 1F1B keeps at most ``S − s`` at stage
    ``s``; a "gpipe" plan (`validate.gpipe`) keeps ``S − 1`` bubble ticks' activations more
    (of one chunk each: ``M·v + S − 1`` chunks interleaved) and accumulates its gradients over
    ticks even with one micro-batch.

    On the CPU backend, which has no 16-bit arithmetic, XLA's float normalization would keep
    the layers' saved activations as fp32 (f32 stacks in the layer loop); the lowering keeps
    them as raw 16-bit integers there (`validate.lowering.residual_storage`), so they count
    as on a GPU, except in the experts' tensor-parallel region, which computes in fp32 there.
    A plan with its saved activations offloaded is lowered without that offload, so it is predicted
    without it too.
    The CPU backend's dot also takes its operands in row-major order only, so the head's
    weight gradient (hidden × tokens · tokens × vocabulary) reads a transposed copy of the
    fp32 logits gradient, one more logits-sized buffer beside the logits and their gradient.
    And where the step keeps a compute-dtype copy of the weights (ZeRO 1–2,
    `costmodel.step.kernels.keeps_compute_copy`), a micro-batch's gradient of it, written by the
    layer loop in 16 bits on a GPU, is fp32 there; where the step adds the gradients in layer by
    layer (`costmodel.step.memory.accumulates_layer_by_layer`) its peak is in the backward, beside
    an fp32 copy of the stacked layer weights that XLA:CPU makes for their dots (the buffer
    assignment of llama3-8b's dp8 ZeRO-1 step: ``f32[32,4096,14336]`` converts of the weights).
    """
    lay = plan.layout
    memory = plan.predicted.memory
    if lay.offload_activations:  # lowered with the saved activations on the device
        lay = lay.model_copy(update={"offload_activations": False})
        memory = simulate(plan.model, plan.train, lay, machine_for(load_hardware(plan.hardware))).memory
    bubble_activations = 0.0
    if lay.pp > 1:
        gpipe = lay.model_copy(update={"schedule": Schedule.GPIPE, "interleave": 1})
        memory = simulate(plan.model, plan.train, gpipe, machine_for(load_hardware(plan.hardware))).memory
        # The tick loop saves what every one of its M·v + S − 1 ticks computes, the S − 1 bubble ticks
        # (of one chunk each) too.
        layers = max(gpipe.layers_on_stage(plan.model.num_layers, s) for s in range(lay.pp)) // lay.interleave
        per_layer = activation_bytes_per_layer(plan.model, plan.train, gpipe)
        bubble_activations = (lay.pp - 1) * layers * per_layer
        if runs_one_f_one_b(plan):
            bubble_activations = _one_f_one_b_memory_change(plan, layers * per_layer, accumulating=memory.temporary_bytes > 0)
    total = memory.total_bytes + bubble_activations
    if lay.pp > 1:
        total += ends_elsewhere_bytes(plan, memory)
    logits_bytes = lay.micro_batch * plan.train.seq_len / lay.cp * plan.model.vocab_per_shard(lay.tp) * F32_BYTES
    pieces = lay.stack.cross_entropy_chunks
    if lay.pp > 1 and pieces > 1:
        # The loss in pieces on every pipeline group: a piece's logits and their gradient and the head
        # weight's fp32 gradient sum, which the simulator gives its last stage alone.
        if memory.stage != "last":
            total += 2 * logits_bytes / pieces + plan.model.vocab_per_shard(lay.tp) * plan.model.hidden_size * F32_BYTES
    elif lay.pp > 1:
        # Every pipeline group runs the head, one micro-batch at a time (`validate.gpipe`):
        # each device holds one micro-batch's fp32 logits and their gradient, where GPipe's
        # last stage keeps the logits of all its micro-batches.
        gpipe_logits = lay.micro_batches(plan.train) + 1 if memory.stage == "last" else 0
        total += (2 - gpipe_logits) * logits_bytes
    if lay.pp > 1 and lay.micro_batches(plan.train) == 1 and not runs_one_f_one_b(plan):
        # The tick loop adds each of its M + S − 1 ticks' gradients into the accumulator, so
        # a single micro-batch holds a tick's gradient beside it as accumulation does.
        total += micro_batch_gradient_bytes(stage_params_per_device(plan.model, lay), plan.model, plan.train, lay)
    if platform == "cpu":
        total += logits_bytes / (pieces if lay.pp > 1 else 1)
        if keeps_compute_copy(plan.model, plan.train, lay) and lay.micro_batches(plan.train) > 1:
            # The copy's gradient of a micro-batch, a loop's 16-bit output, is written as fp32 there.
            held = micro_batch_gradient_bytes(stage_params_per_device(plan.model, lay), plan.model, plan.train, lay)
            total += held * (F32_BYTES / plan.train.compute_dtype.bytes - 1)
            if accumulates_layer_by_layer(plan.model, plan.train, lay):
                # The copy's stacked layer weights widened to fp32 once, outside the layer loops, and
                # held through the backward, where such a step peaks (beside the accumulator).
                total += plan.model.num_layers * layer_params_per_device(plan.model, lay) * F32_BYTES
        if _expert_region_bytes(plan, platform) and lay.recompute is not Recompute.FULL:
            # The experts' tensor-parallel region computes in fp32 there: what it keeps is fp32.
            kept = sum(t.bytes for t in activation_table(plan.model, plan.train, lay) if t.name in _EXPERT_ACTIVATIONS)
            total += kept * plan.model.num_layers * (F32_BYTES / plan.train.compute_dtype.bytes - 1)
    return total


def ends_elsewhere_bytes(plan: Plan, memory: MemoryBreakdown) -> float:
    """What a pipelined program holds beyond the simulator's ``memory`` of its busiest stage: every
    pipeline group runs the embedding and the head whole (`validate.gpipe`), so every device
    keeps both, with their gradients and optimizer state, where the simulator gives each to its
    own end stage."""
    model, lay = plan.model, plan.layout
    names = {"first": 0, "last": lay.pp - 1}
    busiest = names[memory.stage] if memory.stage in names else int(memory.stage.removeprefix("stage "))
    ends = [stage_params(model, lay, s) - lay.layers_on_stage(model.num_layers, s) * layer_params_per_device(model, lay)
            for s in range(lay.pp)]
    program = ends[0] + ends[-1] - (model.hidden_size * model.vocab_per_shard(lay.tp) if model.tie_embeddings else 0)
    state_per_param = (memory.params_bytes + memory.grads_bytes + memory.optimizer_bytes) / stage_params(model, lay, busiest)
    return (program - ends[busiest]) * state_per_param


def _one_f_one_b_memory_change(plan: Plan, chunk_activation_bytes: float, *, accumulating: bool) -> float:
    """What the 1F1B program (`validate.one_f_one_b`) holds beyond the simulator's GPipe
    estimate of ``M`` micro-batches in flight (``M·v`` chunks): the ring of its layers' residuals
    (`costmodel.step.lockstep.in_flight_slots`: ``min(S, M) + 1`` micro-batches without interleaving,
    ``2v·S − 1`` chunks interleaved, ``M·v + 1`` where fewer), stage 0's input
    gradients of every micro-batch beside the embedded batch and their fp32 sum over the stages,
    and no whole-stage gradient of a micro-batch beside the sums (added up one layer at a time)."""
    lay, train = plan.layout, plan.train
    micro = lay.micro_batches(train)
    embedded = lay.micro_batch * train.seq_len / lay.cp * plan.model.hidden_size * train.compute_dtype.bytes
    cotangents = micro * embedded * (1 + F32_BYTES / train.compute_dtype.bytes)
    change = (in_flight_slots(lay.pp, lay.interleave, micro) - micro * lay.interleave) * chunk_activation_bytes + cotangents
    if accumulates_over_data_locally(plan) and lay.zero_stage == 0:
        # The sums' all-reduce writes its whole result beside them (ZeRO 1's reduce-scatter a data shard of it):
        # llama2-7b and a 512-wide model on pipeline=2,data=4 compile within 4 % of this.
        change += stage_params_per_device(plan.model, lay) * train.param_dtype.bytes
    if micro > 1 and accumulating and not lay.stack.fused_grad_accumulation:
        change -= micro_batch_gradient_bytes(stage_params_per_device(plan.model, lay), plan.model, train, lay)
    return change


def parameters_per_device(plan: Plan) -> float:
    """Parameter elements one device holds under the plan's specs (a dimension its axes do
    not divide stays whole, so this can exceed parameters / model-parallel degree)."""
    return sum(el for el, _, _ in param_shards(plan).values())


def predicted_collectives(plan: Plan, *, platform: str = "gpu") -> list[PredictedCollective]:
    """The collectives of one step of the plan's program as lowered on ``platform`` (see the
    module docstring)."""
    model, lay, train = plan.model, plan.layout, plan.train
    data, tensor, pipeline = plan.axes_of("dp"), plan.axes_of("tp"), plan.axes_of("pp")
    e = train.compute_dtype.bytes
    runs = program_runs(plan)
    act = lay.micro_batch * train.seq_len * model.hidden_size
    outer_tokens = runs.outer_micro_batches * lay.micro_batch * train.seq_len
    params = param_shards(plan)
    out: list[PredictedCollective] = []
    experts_bytes = _expert_region_bytes(plan, platform)
    if plan.axes_of("ep"):
        out += _expert_exchanges(plan, runs, experts_bytes)
    if tensor:
        def split(key: str, dim: int) -> bool:
            name = f"layers/{key}"
            return name in params and params[name][1][dim] is not None

        if experts_bytes and split("moe/w_in", 3):
            dispatched = lay.micro_batch * model.num_experts * moe_capacity(model, train.seq_len)
            out += [PredictedCollective(kind="all-reduce", axes=tensor, bytes_per_call=act * experts_bytes, calls=runs.layer_runs,
                                        why="MoE: the experts' output summed over the tensor axes, forward"),
                    PredictedCollective(kind="all-reduce", axes=tensor, bytes_per_call=(act + dispatched) * experts_bytes,
                                        calls=runs.layer_runs, why="MoE: the gradients of the experts' input and routing weights "
                                        "summed over the tensor axes, backward")]
        rows = sum(split(k, d) for k, d in _ROW.items())
        cols = sum(split(k, d) for k, d in _COLUMN.items())
        # Full recompute re-runs the forward's row-parallel all-reduces but the dense MLP's, whose
        # output only the layer's output needs; an MoE layer's sum (its own region) is that last one.
        recompute_rows = (rows if model.is_moe else max(rows - 1, 0)) if lay.recompute is Recompute.FULL else 0
        for count, why in ((rows, "row-parallel matmul outputs, forward"), (cols, "column-parallel input gradients, backward"),
                           (recompute_rows, "row-parallel outputs re-run by full recompute")):
            if count:
                out.append(PredictedCollective(kind="all-reduce", axes=tensor, bytes_per_call=act * e, calls=count * runs.layer_runs,
                                               why=why))
        if lay.sequence_parallel:
            out += _sequence_parallel(plan, runs, act * e, experts=bool(experts_bytes))
        outer_act = outer_tokens * model.hidden_size
        head_tokens = runs.head_micro_batches * lay.micro_batch * train.seq_len
        if params["embed/tokens"][1][0] is not None:
            out.append(PredictedCollective(kind="all-reduce", axes=tensor, bytes_per_call=outer_act * F32_BYTES, calls=runs.outer_calls,
                                           why="vocab-parallel embedding rows (fp32)"))
        head = "embed/tokens" if model.tie_embeddings else "lm_head/w"
        if params[head][1][0 if model.tie_embeddings else 1] is not None:
            out.append(PredictedCollective(kind="all-reduce", axes=tensor, bytes_per_call=head_tokens * model.hidden_size * F32_BYTES,
                                           calls=1, why="vocab-parallel head input gradient (fp32)"))
            out.append(PredictedCollective(kind="all-reduce", axes=tensor, bytes_per_call=4 * head_tokens * F32_BYTES, calls=1,
                                           why="softmax max and sum, target logit, over the vocabulary split"))
    if data and reduces_over_data(plan):
        grad_specs = zero_sharded_specs(model, plan.param_specs, data, {a.name: a.size for a in plan.mesh})
        out += region_collectives(plan, runs, params, grad_specs, platform=platform)
    elif data:
        out += data_parallel_collectives(plan, runs, params, experts_bytes)
    if pipeline and runs_one_f_one_b(plan):
        out += [
            PredictedCollective(kind="collective-permute", axes=pipeline, bytes_per_call=act * e, calls=2 * pipeline_ticks(plan),
                                why="1F1B: activation to the next stage and gradient to the previous one, every tick (slot)"),
            PredictedCollective(kind="all-reduce", axes=pipeline, bytes_per_call=act * e, calls=runs.head_calls,
                                why="1F1B: the last stage's output handed to every stage for the head, every tick (period)"),
            PredictedCollective(kind="all-reduce", axes=pipeline, bytes_per_call=runs.outer_micro_batches * act * e, calls=1,
                                why="1F1B: stage 0's input gradients summed over the stages, for the embedding's gradient"),
        ]
    elif pipeline:
        out += [
            PredictedCollective(kind="collective-permute", axes=pipeline, bytes_per_call=act * e, calls=2 * pipeline_ticks(plan),
                                why="activation to the next stage every forward tick, its gradient back every backward tick "
                                    "(interleaved: the last device's also wraps around to the first, in the same permute)"),
            PredictedCollective(kind="all-reduce", axes=pipeline, bytes_per_call=runs.outer_micro_batches * act * e, calls=1,
                                why="last stage's outputs handed to every stage for the head"),
            PredictedCollective(kind="all-reduce", axes=pipeline, bytes_per_call=runs.outer_micro_batches * act * F32_BYTES, calls=1,
                                why="embedding output's gradient summed over the stages (fp32)"),
        ]
    return out


def _expert_exchanges(plan: Plan, runs: ProgramRuns, element_bytes: int) -> list[PredictedCollective]:
    """Expert parallelism's all-to-alls over the expert axes (`validate.mesh_hooks.expert_region`), per
    layer and micro-batch: the dispatched inputs ``[b, E, C, D]`` to their experts and the outputs
    back in the forward, the transposes of both in the backward, and full recompute's inputs once
    more (the outputs' return is dead there); the routing weights ``[b, E, C]`` to the experts in
    the forward, their gradient back, and once more in the backward, which recomputes them from the
    router's kept probabilities rather than keeping the exchanged copy."""
    model, lay, train = plan.model, plan.layout, plan.train
    slots = lay.micro_batch * model.num_experts * moe_capacity(model, train.seq_len)
    tokens = 4 + (lay.recompute is Recompute.FULL)
    return [
        PredictedCollective(kind="all-to-all", axes=plan.axes_of("ep"), bytes_per_call=slots * model.hidden_size * element_bytes,
                            calls=tokens * runs.layer_runs, why="MoE: dispatched tokens to their experts' devices and the "
                            "outputs back, forward and backward" + (", inputs again for full recompute" if tokens > 4 else "")),
        PredictedCollective(kind="all-to-all", axes=plan.axes_of("ep"), bytes_per_call=slots * element_bytes, calls=3 * runs.layer_runs,
                            why="MoE: routing weights to the experts' devices (forward, recomputed in backward) and their gradient back"),
    ]


def _sequence_parallel(plan: Plan, runs: ProgramRuns, act_bytes: float, *, experts: bool) -> list[PredictedCollective]:
    """What sequence parallelism adds over the tensor axes (Megatron's, as XLA partitions it).

    The norms' inputs and outputs are split over the sequence. XLA keeps the all-reduces of
    the row-parallel outputs and column-parallel input gradients (then slices), and adds
    all-gathers of the sequence-split activation: before the attention and MLP matmuls in the
    forward, and in the backward the two gathers of the inputs the weight gradients need and
    the two of the output gradients (the transposes of the slices). The head's input is
    gathered likewise (forward, its weight gradient, the output gradient's transpose). Each
    norm's weight gradient is a sum over the split sequence: an fp32 all-reduce. Learned
    positions are added whole (`planner.programs.transformer.embed`): their rows' gradient is
    gathered from the split sequence, once per micro-batch.
    """
    model, tensor = plan.model, plan.axes_of("tp")
    # Full recompute gathers again what the weight gradients need; otherwise the backward gathers
    # it once more, but for the experts' region, which keeps its whole input.
    gathers = 6 if plan.layout.recompute is Recompute.FULL or not experts else 5
    norm_bytes = model.hidden_size * F32_BYTES * (2 if model.norm is Norm.LAYERNORM else 1)
    head_act_bytes = act_bytes * runs.head_micro_batches / runs.head_calls
    head = "embed/tokens" if model.tie_embeddings else "lm_head/w"
    unsplit_head = [] if plan.param_specs[head][0 if model.tie_embeddings else 1] is not None else [
        PredictedCollective(kind="all-reduce", axes=tensor, bytes_per_call=model.hidden_size * model.padded_vocab_size * F32_BYTES,
                            calls=runs.head_gradients, why="sequence parallel: a head not split over the vocabulary runs split over "
                            "the sequence; its weight gradient is summed over the tensor axes (fp32)")]
    return unsplit_head + [
        PredictedCollective(kind="all-gather", axes=tensor, bytes_per_call=act_bytes, calls=gathers * runs.layer_runs,
                            why="sequence parallel: the split activation gathered before the attention and MLP, forward and backward"),
        PredictedCollective(kind="all-reduce", axes=tensor, bytes_per_call=2 * norm_bytes, calls=runs.layer_runs,
                            why="sequence parallel: the layer norms' weight gradients summed over the split sequence (fp32)"),
        PredictedCollective(kind="all-gather", axes=tensor, bytes_per_call=head_act_bytes, calls=3 * runs.head_calls,
                            why="sequence parallel: the head's input gathered (forward, weight gradient, output gradient)"),
        PredictedCollective(kind="all-reduce", axes=tensor, bytes_per_call=norm_bytes, calls=runs.head_calls,
                            why="sequence parallel: the final norm's weight gradient (fp32)"),
        *([PredictedCollective(kind="all-gather", axes=tensor, calls=runs.outer_calls,
                               bytes_per_call=plan.train.seq_len / plan.layout.cp * model.hidden_size * plan.train.compute_dtype.bytes,
                               why="sequence parallel: the learned positions' rows, used whole, get their gradient gathered from "
                               "the split sequence")] if model.positions is Positions.LEARNED else []),
    ]


def _idle_capacity_params(model: ModelConfig, seq_len: int) -> float:
    """Expert parameters a token's share of the capacity slack runs through: each expert
    computes its full buffer of ``capacity`` slots per sequence (`planner.programs.transformer`),
    `planner.programs.transformer.MOE_CAPACITY_FACTOR` times the routed tokens' share, filled or not."""
    if not model.is_moe:
        return 0.0
    e, k = model.num_experts, model.experts_per_token
    slots = e * moe_capacity(model, seq_len)
    return (slots / (seq_len * k) - 1) * model.routed_expert_params_per_layer * k / e


def _down_projection_params(model: ModelConfig, seq_len: int) -> float:
    """Weights per token of the layer's last matmul(s), whose output only the layer's output
    needs, so full recompute does not re-run them: the MLP's down projection, or the routed
    experts' (capacity slack included) and the shared expert's."""
    if not model.is_moe:
        return model.ffn_size * model.hidden_size
    routed = model.routed_expert_params_per_layer * model.experts_per_token / model.num_experts + _idle_capacity_params(model, seq_len)
    return routed / (3 if model.mlp.gated else 2) + model.shared_expert_ffn_size * model.hidden_size


def _expert_region_bytes(plan: Plan, platform: str) -> int:
    """Bytes per element of what the experts' region (`validate.mesh_hooks.expert_region`) sums or
    exchanges and of its weights' gradients (fp32 on the CPU backend, where the region computes in
    fp32); 0 when the experts do not run in one (neither tensor nor expert axes split them)."""
    spec = plan.param_specs.get("layers/moe/w_in")
    if spec is None or plan.layout.pp > 1 or not ((plan.axes_of("tp") and spec[3]) or (plan.axes_of("ep") and spec[1])):
        return 0
    return F32_BYTES if platform == "cpu" else plan.train.compute_dtype.bytes


def predicted_matmul_flops(plan: Plan) -> float | None:
    """Matmul FLOPs per device per step of the plan's program: forward (weights, attention
    scores and values over the full ``S×S``, or the causal blocks of the flash kernel, the
    head), backward twice that (the flash kernel's two and a half times), and the recompute:
    full repeats the layer's forward but its last matmul, selective the scores' matmul (for
    the softmax's backward), and the head once more when the loss runs in pieces. Pipelined, each
    device runs its stage's layers on every tick
    (`ProgramRuns`) and the head on the whole batch. None where XLA splits the embedding's work
    over the stages (`validate.gpipe.runs_outer_whole`)."""
    if plan.layout.pp > 1 and not runs_outer_whole(plan):
        return None
    model, lay, train = plan.model, plan.layout, plan.train
    runs = program_runs(plan)
    micro_tokens = lay.micro_batch * train.seq_len / lay.cp
    attention = 4 * train.seq_len * model.num_heads * model.head_dim  # scores and values, per token, forward
    attention_backward = 2 * attention
    if lay.stack.attention is Attention.FLASH:
        # Only the causal triangle's blocks run; the backward recomputes the scores (five matmuls to the forward's two).
        block = block_size(train.seq_len)
        attention *= len(block_pairs(train.seq_len, block)[0]) * block**2 / train.seq_len**2
        attention_backward = 2.5 * attention
    layer_weights = 2 * (model.active_params_per_layer + _idle_capacity_params(model, train.seq_len))
    # A vocabulary the tensor axes do not divide is not split: every tensor device computes the whole head.
    # With sequence parallelism its weight gradient is computed on the sequence split (and then summed).
    head_w = plan.param_specs["embed/tokens"][0] if model.tie_embeddings else plan.param_specs["lm_head/w"][1]
    head = 2 * model.hidden_size * model.padded_vocab_size / lay.tp
    if head_w is None:
        head *= lay.tp if not lay.sequence_parallel else (2 * lay.tp + 1) / 3
    recompute = 0.0
    if lay.recompute is Recompute.FULL:
        last = 2 * _down_projection_params(model, train.seq_len)
        recompute = layer_weights + attention - last
    elif lay.recompute is not Recompute.NONE:
        # Selective: the scores once more (half the attention's forward) for the softmax's backward,
        # which keeps neither the probabilities nor the flash kernel's log-sum-exp; the attention
        # output is kept, so the second matmul is not re-run.
        recompute = attention / 2
    layer = 3 * layer_weights + attention + attention_backward + recompute
    head_passes = 3 + (lay.stack.cross_entropy_chunks > 1)  # the loss in pieces forms each piece's logits again
    return micro_tokens * (runs.layer_runs * layer / lay.tp + runs.head_micro_batches * head_passes * head)
