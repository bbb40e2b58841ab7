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
- Data parallel: gradients are reduced once per micro-batch (the reduction happens inside
  the accumulation loop, where the partial sums appear), layer weights in the compute
  dtype, fp32 for what is used in fp32 (norms, the embedding table, the fp32-output head).
  With ZeRO ≥ 1 the updated fp32 parameters are all-gathered over the data axes.
- Matmul FLOPs: forward, twice that in backward, plus what the recompute policy repeats.
- 1F1B pipelines (`validate.one_f_one_b`): every device runs its stage's forward and
  backward and the head on every one of the ``M + 2(S − 1)`` ticks, bubbles included
  (interleaved, ``M·v + (v + 1)·S − 2`` ticks of one chunk's ``slots / v`` layers); the
  per-layer collectives and FLOPs run ``slots × ticks`` times, the head's and its gradient's
  reduction once per tick, the embedding once on the whole batch. Over the pipeline axis,
  every tick: a ``collective-permute`` of an activation forward and one of its gradient
  backward, and the sum that hands the last stage's output to every pipeline group; once,
  the sum of stage 0's input gradients for the embedding.
- GPipe pipelines (schedule "gpipe"; `validate.pipeline`): every device runs its stage's
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
parallelism, MoE experts without expert parallelism, the flash kernel's causal blocks.
Pipelines with ZeRO, tied embeddings or a table not split over the vocabulary follow the
same rules: the lowering runs the embedding and head whole on every pipeline group.

Not predicted yet (reported as such): context and expert parallelism, pipelines with
uneven stages (their layers are gathered per stage), and pipelines with ZeRO-3 and tensor
parallelism (`validate.pipeline.runs_outer_whole`) or with MoE layers and tensor parallelism
(`validate.lowering.tensor_parallel_experts` is not nested in the pipeline's region).

>>> from costmodel.layout import Layout
>>> from planner.api import layout_plan
>>> p = layout_plan("llama3-8b", Layout(dp=8, tp=4, micro_batch=1, recompute="full", zero_stage=1), seq_len=2048, global_batch=16)
>>> by_kind = {}
>>> for c in predicted_collectives(p):
...     by_kind[c.kind] = by_kind.get(c.kind, 0) + c.total_bytes
>>> {k: round(v / 2**20) for k, v in sorted(by_kind.items())}
{'all-gather': 7659, 'all-reduce': 16982}
"""

from __future__ import annotations

import math
from typing import Any

import jax
from pydantic import BaseModel, ConfigDict, Field

from costmodel.activations import activation_table
from costmodel.data_parallel import stage_params_per_device
from costmodel.hardware import load_hardware
from costmodel.layout import Recompute, Schedule
from costmodel.lockstep import in_flight_slots, one_f_one_b_ticks
from costmodel.machine import machine_for
from costmodel.memory import activation_bytes_per_layer
from costmodel.model_config import ModelConfig, Norm
from costmodel.simulator import simulate
from costmodel.stack import Attention
from planner.models.attention import block_pairs, block_size
from planner.models.params import abstract_params
from planner.models.transformer import moe_capacity
from planner.schema import Plan
from validate.one_f_one_b import runs_one_f_one_b
from validate.pipeline import runs_outer_whole

_F32 = 4
# Matmul weights of a dense layer and the dim (of the stacked [L, ...] array) tensor parallelism splits.
_COLUMN = {"attn/wq": 2, "attn/wk": 2, "attn/wv": 2, "mlp/w_in": 2, "mlp/w_gate": 2}
_ROW = {"attn/wo": 1, "mlp/w_out": 1}
# Weights of the matmuls whose output only the layer's output needs (dead in full recompute).
_LAST_MATMULS = ("mlp/w_out", "moe/w_out", "moe/shared_w_out")


class PredictedCollective(BaseModel):
    """One group of collectives the program should issue."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    kind: str = Field(description="all-reduce, all-gather, reduce-scatter, all-to-all or collective-permute.")
    axes: tuple[str, ...] = Field(description="Mesh axes of its groups.")
    bytes_per_call: float = Field(description="Per-device buffer bytes of one execution.")
    calls: int = Field(description="Executions per step.")
    why: str = Field(description="What it is.")

    @property
    def total_bytes(self) -> float:
        return self.bytes_per_call * self.calls


def unpredicted_features(plan: Plan) -> list[str]:
    """Layout features whose collectives `predicted_collectives` does not model."""
    lay = plan.layout
    even = plan.model.num_layers % lay.pp == 0 and len(set(lay.stage_layers or (0,))) == 1
    features = {"uneven pipeline stages": lay.pp > 1 and not even, _SPLIT_BY_XLA: lay.pp > 1 and not runs_outer_whole(plan),
                "MoE layers with tensor parallelism inside pipelines": lay.pp > 1 and lay.tp > 1 and plan.model.is_moe,
                "context parallelism": lay.cp > 1, "expert parallelism": lay.ep > 1}
    return [name for name, on in features.items() if on]


_SPLIT_BY_XLA = "a pipeline with ZeRO-3 and tensor parallelism (XLA splits its embedding's and head's work over the stages)"


def _per_device(plan: Plan) -> dict[str, tuple[float, tuple[Any, ...], tuple[int, ...]]]:
    """Parameter path → (elements per device, spec, global shape)."""
    sizes = {a.name: a.size for a in plan.mesh}
    out = {}
    for path, leaf in jax.tree_util.tree_flatten_with_path(abstract_params(plan.model))[0]:
        name = "/".join(str(p.key) for p in path)
        spec = plan.param_specs[name]
        split = math.prod(sizes[a] for d in spec if d for a in ((d,) if isinstance(d, str) else d))
        out[name] = (math.prod(leaf.shape) / split, spec, leaf.shape)
    return out


# What a layer's experts keep for their backward (`costmodel.activations`).
_EXPERT_ACTIVATIONS = ("expert_inputs", "mlp_up_output", "mlp_gate_output", "mlp_down_input")


def predicted_memory_bytes(plan: Plan, *, platform: str = "gpu") -> float:
    """The simulator's per-device memory for the program as lowered on ``platform``: the plan's
    own estimate, except for pipelines. Those start from the simulator's GPipe estimate (every
    micro-batch's activations in flight, the head one micro-batch at a time on every pipeline
    group); a 1F1B plan (`validate.one_f_one_b`) then keeps ``2S − 1`` micro-batches instead
    (``2v·S − 1`` chunks interleaved, fewer with fewer micro-batches:
    `_one_f_one_b_memory_change`), where the simulator's 1F1B keeps at most ``S − s`` at stage
    ``s``; a "gpipe" plan (`validate.pipeline`) keeps ``S − 1`` bubble ticks' activations more
    (of one chunk each: ``M·v + S − 1`` chunks interleaved) and accumulates its gradients over
    ticks even with one micro-batch. With ZeRO-3 the
    program keeps no compute-dtype copy of its parameter shard (each layer casts what it
    gathers), which the simulator counts (DeepSpeed keeps one).

    On the CPU backend, which has no 16-bit arithmetic, XLA's float normalization would keep
    the layers' saved activations as fp32 (f32 stacks in the layer loop); the lowering keeps
    them as raw 16-bit integers there (`validate.lowering.residual_storage`), so they count
    as on a GPU, except in the experts' tensor-parallel region, which computes in fp32 there.
    The CPU backend's dot also takes its operands in row-major order only, so the head's
    weight gradient (hidden × tokens · tokens × vocabulary) reads a transposed copy of the
    fp32 logits gradient, one more logits-sized buffer beside the logits and their gradient.
    """
    lay = plan.layout
    memory = plan.predicted.memory
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
    if lay.zero_stage >= 3 and not plan.train.is_lora and plan.train.param_dtype != plan.train.compute_dtype:
        # The program keeps no compute-dtype copy of a ZeRO-3 shard: each layer casts what it gathers.
        total -= memory.params_bytes
    logits_bytes = lay.micro_batch * plan.train.seq_len / lay.cp * plan.model.vocab_size / plan.model.vocab_shards(lay.tp) * _F32
    if lay.pp > 1:
        # Every pipeline group runs the head, one micro-batch at a time (`validate.pipeline`):
        # each device holds one micro-batch's fp32 logits and their gradient, where GPipe's
        # last stage keeps the logits of all its micro-batches.
        gpipe_logits = lay.micro_batches(plan.train) + 1 if memory.stage == "last" else 0
        total += (2 - gpipe_logits) * logits_bytes
    if lay.pp > 1 and lay.micro_batches(plan.train) == 1 and not runs_one_f_one_b(plan):
        # The tick loop adds each of its M + S − 1 ticks' gradients into the accumulator, so
        # a single micro-batch holds a tick's gradient beside it as accumulation does.
        total += stage_params_per_device(plan.model, lay) * plan.train.compute_dtype.bytes
    if platform == "cpu":
        total += logits_bytes
        if _tensor_parallel_experts_bytes(plan, platform) and lay.recompute is not Recompute.FULL:
            # The experts' tensor-parallel region computes in fp32 there: what it keeps is fp32.
            kept = sum(t.bytes for t in activation_table(plan.model, plan.train, lay) if t.name in _EXPERT_ACTIVATIONS)
            total += kept * plan.model.num_layers * (_F32 / plan.train.compute_dtype.bytes - 1)
    return total


def _one_f_one_b_memory_change(plan: Plan, chunk_activation_bytes: float, *, accumulating: bool) -> float:
    """What the 1F1B program (`validate.one_f_one_b`) holds beyond the simulator's GPipe
    estimate of ``M`` micro-batches in flight (``M·v`` chunks): ``K = 2v·S − 1`` chunks of its
    layers' residuals (``2S − 1`` micro-batches without interleaving; ``M·v + 1`` where fewer), stage 0's input
    gradients of every micro-batch beside the embedded batch, and no whole-stage gradient of
    a micro-batch beside the sums (added up one layer at a time)."""
    lay, train = plan.layout, plan.train
    micro = lay.micro_batches(train)
    embedded = lay.micro_batch * train.seq_len / lay.cp * plan.model.hidden_size * train.compute_dtype.bytes
    change = (in_flight_slots(lay.pp, lay.interleave, micro) - micro * lay.interleave) * chunk_activation_bytes + micro * embedded
    if micro > 1 and accumulating and not lay.stack.fused_grad_accumulation:
        change -= stage_params_per_device(plan.model, lay) * train.compute_dtype.bytes / (lay.dp if lay.zero_stage >= 2 else 1)
    return change


def parameters_per_device(plan: Plan) -> float:
    """Parameter elements one device holds under the plan's specs (a dimension its axes do
    not divide stays whole, so this can exceed parameters / model-parallel degree)."""
    return sum(el for el, _, _ in _per_device(plan).values())


def _grad_bytes(name: str, elements: float, compute_bytes: int) -> float:
    """Gradient bytes as the program produces them: fp32 for what it uses in fp32."""
    fp32 = name.endswith(("scale", "norm/bias")) or name in ("embed/tokens", "lm_head/w", "final_norm/bias")
    return elements * (_F32 if fp32 else compute_bytes)


class _Schedule(BaseModel):
    """How often the program runs each part, per device per step."""

    layer_runs: int = Field(description="Executions of one layer's forward (and backward) on one micro-batch.")
    layers_held: int = Field(description="Layers whose parameters this device holds.")
    outer_calls: int = Field(description="Executions of the embedding (and, but for 1F1B, of the head).")
    outer_micro_batches: int = Field(description="Micro-batches the embedding takes per execution.")
    head_calls: int = Field(description="Executions of the head (once per tick inside the 1F1B schedule).")
    head_micro_batches: int = Field(description="Micro-batches the head runs on per step, masked ones included.")
    head_gradients: int = Field(description="Gradients of the head's weights formed (and reduced) apart: one per micro-batch.")


def _schedule(plan: Plan) -> _Schedule:
    lay, layers = plan.layout, plan.model.num_layers
    micro = lay.micro_batches(plan.train)
    if lay.pp == 1:
        return _Schedule(layer_runs=layers * micro, layers_held=layers, outer_calls=micro, outer_micro_batches=1, head_calls=micro,
                         head_micro_batches=micro, head_gradients=micro)
    # Each tick runs one chunk's slots; interleaved, M·v items pass each device (`validate.pipeline.work_item`).
    slots = lay.layers_on_stage(layers, 0) // lay.interleave
    if runs_one_f_one_b(plan):
        # Every tick runs the stage's forward and backward and the head on one micro-batch (`validate.one_f_one_b`).
        return _Schedule(layer_runs=slots * _ticks(plan), layers_held=layers // lay.pp, outer_calls=1, outer_micro_batches=micro,
                         head_calls=_ticks(plan), head_micro_batches=_ticks(plan), head_gradients=_ticks(plan))
    # One execution of the embedding and the head on the whole batch, the head one micro-batch
    # after another with its gradients formed at once (`validate.pipeline.micro_batch_mean`).
    return _Schedule(layer_runs=slots * _ticks(plan), layers_held=layers // lay.pp, outer_calls=1, outer_micro_batches=micro,
                     head_calls=1, head_micro_batches=micro, head_gradients=micro)


def _ticks(plan: Plan) -> int:
    """Ticks of the pipeline's loop: ``M·v`` items per device, plus ``S − 1`` to fill it (1F1B:
    plus `costmodel.lockstep.backward_lag_ticks` and ``S − 1`` to bring the last gradient back)."""
    lay = plan.layout
    if runs_one_f_one_b(plan):
        return one_f_one_b_ticks(lay.micro_batches(plan.train), lay.pp, lay.interleave)
    return lay.micro_batches(plan.train) * lay.interleave + lay.pp - 1


def predicted_collectives(plan: Plan, *, platform: str = "gpu") -> list[PredictedCollective]:
    """The collectives of one step of the plan's program as lowered on ``platform`` (see the
    module docstring)."""
    model, lay, train = plan.model, plan.layout, plan.train
    data, tensor, pipeline = plan.axes_of("dp"), plan.axes_of("tp"), plan.axes_of("pp")
    e = train.compute_dtype.bytes
    runs = _schedule(plan)
    act = lay.micro_batch * train.seq_len * model.hidden_size
    outer_tokens = runs.outer_micro_batches * lay.micro_batch * train.seq_len
    params = _per_device(plan)
    out: list[PredictedCollective] = []
    experts_bytes = _tensor_parallel_experts_bytes(plan, platform)
    if tensor:
        def split(key: str, dim: int) -> bool:
            name = f"layers/{key}"
            return name in params and params[name][1][dim] is not None

        if experts_bytes:
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
            out.append(PredictedCollective(kind="all-reduce", axes=tensor, bytes_per_call=outer_act * _F32, calls=runs.outer_calls,
                                           why="vocab-parallel embedding rows (fp32)"))
        head = "embed/tokens" if model.tie_embeddings else "lm_head/w"
        if params[head][1][0 if model.tie_embeddings else 1] is not None:
            out.append(PredictedCollective(kind="all-reduce", axes=tensor, bytes_per_call=head_tokens * model.hidden_size * _F32, calls=1,
                                           why="vocab-parallel head input gradient (fp32)"))
            out.append(PredictedCollective(kind="all-reduce", axes=tensor, bytes_per_call=4 * head_tokens * _F32, calls=1,
                                           why="softmax max and sum, target logit, over the vocabulary split"))
    if data:
        out += _data_parallel(plan, runs, params, experts_bytes)
    if pipeline and runs_one_f_one_b(plan):
        out += [
            PredictedCollective(kind="collective-permute", axes=pipeline, bytes_per_call=act * e, calls=2 * _ticks(plan),
                                why="1F1B: activation to the next stage and gradient to the previous one, every tick"),
            PredictedCollective(kind="all-reduce", axes=pipeline, bytes_per_call=act * e, calls=_ticks(plan),
                                why="1F1B: the last stage's output handed to every stage for the head, every tick"),
            PredictedCollective(kind="all-reduce", axes=pipeline, bytes_per_call=runs.outer_micro_batches * act * e, calls=1,
                                why="1F1B: stage 0's input gradients summed over the stages, for the embedding's gradient"),
        ]
    elif pipeline:
        out += [
            PredictedCollective(kind="collective-permute", axes=pipeline, bytes_per_call=act * e, calls=2 * _ticks(plan),
                                why="activation to the next stage every forward tick, its gradient back every backward tick "
                                    "(interleaved: the last device's also wraps around to the first, in the same permute)"),
            PredictedCollective(kind="all-reduce", axes=pipeline, bytes_per_call=runs.outer_micro_batches * act * e, calls=1,
                                why="last stage's outputs handed to every stage for the head"),
            PredictedCollective(kind="all-reduce", axes=pipeline, bytes_per_call=runs.outer_micro_batches * act * _F32, calls=1,
                                why="embedding output's gradient summed over the stages (fp32)"),
        ]
    return out


def _sequence_parallel(plan: Plan, runs: _Schedule, act_bytes: float, *, experts: bool) -> list[PredictedCollective]:
    """What sequence parallelism adds over the tensor axes (Megatron's, as XLA partitions it).

    The norms' inputs and outputs are split over the sequence. XLA keeps the all-reduces of
    the row-parallel outputs and column-parallel input gradients (then slices), and adds
    all-gathers of the sequence-split activation: before the attention and MLP matmuls in the
    forward, and in the backward the two gathers of the inputs the weight gradients need and
    the two of the output gradients (the transposes of the slices). The head's input is
    gathered likewise (forward, its weight gradient, the output gradient's transpose). Each
    norm's weight gradient is a sum over the split sequence: an fp32 all-reduce.
    """
    model, tensor = plan.model, plan.axes_of("tp")
    # Full recompute gathers again what the weight gradients need; otherwise the backward gathers
    # it once more, but for the experts' region, which keeps its whole input.
    gathers = 6 if plan.layout.recompute is Recompute.FULL or not experts else 5
    norm_bytes = model.hidden_size * _F32 * (2 if model.norm is Norm.LAYERNORM else 1)
    head_act_bytes = act_bytes * runs.head_micro_batches / runs.head_calls
    head = "embed/tokens" if model.tie_embeddings else "lm_head/w"
    unsplit_head = [] if plan.param_specs[head][0 if model.tie_embeddings else 1] is not None else [
        PredictedCollective(kind="all-reduce", axes=tensor, bytes_per_call=model.hidden_size * model.vocab_size * _F32,
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
    ]


def _idle_capacity_params(model: ModelConfig, seq_len: int) -> float:
    """Expert parameters a token's share of the capacity slack runs through: each expert
    computes its full buffer of ``capacity`` slots per sequence (`planner.models.transformer`),
    `planner.models.transformer.MOE_CAPACITY_FACTOR` times the routed tokens' share, filled or not."""
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


def _is_bias(name: str) -> bool:
    """Bias vectors (``bo``, ``b_out``…), whose gradient needs no gathered copy of themselves."""
    return name.rsplit("/", 1)[-1].startswith("b")


def _data_split(spec: tuple[Any, ...], axes: tuple[str, ...], sizes: dict[str, int]) -> int:
    """How many ways ``spec`` splits an array over the mesh axes ``axes``."""
    return math.prod(sizes[a] for d in spec if d for a in ((d,) if isinstance(d, str) else d) if a in axes)


def _tensor_parallel_experts_bytes(plan: Plan, platform: str) -> int:
    """Bytes per element of what the experts' tensor-parallel region (`validate.lowering.tensor_parallel_experts`)
    sums and of its weights' gradients (fp32 on the CPU backend, where the region computes in
    fp32); 0 when the experts do not run in one."""
    spec = plan.param_specs.get("layers/moe/w_in")
    if not plan.axes_of("tp") or spec is None or spec[3] is None or plan.layout.pp > 1:
        return 0
    return _F32 if platform == "cpu" else plan.train.compute_dtype.bytes


def _data_parallel(plan: Plan, runs: _Schedule, params: dict[str, tuple[float, tuple[Any, ...], tuple[int, ...]]],
                   experts_bytes: int) -> list[PredictedCollective]:
    """Collectives over the data axes: gradient reductions, ZeRO's gathers, the embedding's gradient.

    Gradients are all-reduced whole over the data axes once per micro-batch, also where ZeRO
    shards them (XLA reduces, then slices; it did not emit reduce-scatters). With ZeRO-3 each
    weight the data axes split is gathered in the compute dtype where it is used: a layer's
    weights once in its forward and once in its backward on every run, the head's twice per
    step (the gather does not depend on the micro-batch, so XLA hoists it out of the loop).

    Once gradients are sharded (ZeRO ≥ 1), a table not split over the vocabulary gets its
    lookup gradient from the rows of the embedding output's gradient, gathered with the
    micro-batch's tokens, instead of a whole-table reduction: an all-gather of the (compute
    dtype) rows for a separate table; fp32 rows exchanged by an all-to-all, the table's
    reduction shared with the head's, for a tied one or one split over the data axes
    (ZeRO-3, whose lookup also exchanges the looked-up fp32 row slices). Learned positions are
    likewise reduced and gathered only for the rows a sequence uses, in the compute dtype.
    """
    model, lay, train = plan.model, plan.layout, plan.train
    data = plan.axes_of("dp")
    sizes = {a.name: a.size for a in plan.mesh}
    e = train.compute_dtype.bytes
    whole = {n: el * _data_split(spec, data, sizes) for n, (el, spec, _) in params.items()}  # elements before the data split
    split = {n for n, (_, spec, _) in params.items() if _data_split(spec, data, sizes) > 1}
    vocab, _ = params["embed/tokens"][1]
    rows = lay.zero_stage >= 1 and vocab is None  # not the vocab-parallel lookup (`embedding_lookup`)
    # Tokens the embedding takes per execution: a pipeline embeds all its micro-batches at once.
    outer_tokens = runs.outer_micro_batches * lay.micro_batch * train.seq_len // lay.cp
    layer_bytes = sum(_grad_bytes(n, whole[n], experts_bytes if experts_bytes and n.startswith("layers/moe/w_") else e)
                      / runs.layers_held for n in whole if n.startswith("layers/"))
    other_bytes = sum(_grad_bytes(n, whole[n], e) for n in whole if not n.startswith("layers/"))
    positions = "embed/positions" in whole and rows
    if positions:
        other_bytes += train.seq_len * model.hidden_size * e - _grad_bytes("embed/positions", whole["embed/positions"], e)
    if rows and not model.tie_embeddings:
        other_bytes -= whole["embed/tokens"] * _F32
    elif model.tie_embeddings and not rows:  # the lookup's and the head's gradients of the shared table are reduced apart
        other_bytes += whole["embed/tokens"] * _F32
    head_bytes = (sum(_grad_bytes(n, whole[n], e) for n in ("lm_head/w", "final_norm/scale", "final_norm/bias") if n in whole)
                  + (whole["embed/tokens"] * _F32 if model.tie_embeddings else 0))
    out = [
        PredictedCollective(kind="all-reduce", axes=data, bytes_per_call=layer_bytes, calls=runs.layer_runs,
                            why="layer gradients, every micro-batch (every tick when pipelined)"),
        PredictedCollective(kind="all-reduce", axes=data, bytes_per_call=other_bytes - head_bytes, calls=runs.outer_calls,
                            why="embedding gradients, every micro-batch (once when pipelined)"),
        PredictedCollective(kind="all-reduce", axes=data, bytes_per_call=head_bytes, calls=runs.head_gradients,
                            why="head and final-norm gradients, every micro-batch"),
    ]
    if rows:
        exchanged = model.tie_embeddings or "embed/tokens" in split
        out.append(PredictedCollective(kind="all-gather", axes=data, bytes_per_call=outer_tokens * lay.dp * 4, calls=runs.outer_calls,
                                       why="ZeRO: the micro-batch's tokens, to find each table row's gradient"))
        if exchanged:
            out.append(PredictedCollective(
                kind="all-to-all", axes=data, bytes_per_call=outer_tokens * model.hidden_size * _F32,
                calls=(1 + ("embed/tokens" in split)) * runs.outer_calls,
                why="ZeRO: the embedding output's gradient rows (fp32), and with ZeRO-3 the looked-up row slices"))
        else:
            out.append(PredictedCollective(kind="all-gather", axes=data, bytes_per_call=outer_tokens * lay.dp * model.hidden_size * e,
                                           calls=runs.outer_calls, why="ZeRO: the embedding output's gradient rows"))
    if positions:
        split_positions = "embed/positions" in split
        out.append(PredictedCollective(kind="all-gather", axes=data, bytes_per_call=train.seq_len * model.hidden_size * e,
                                       calls=1 if split_positions else runs.outer_calls,
                                       why="ZeRO-3: the used position rows, once" if split_positions else
                                       "ZeRO: the used position rows' gradient"))
    layer_split = [n for n in split if n.startswith("layers/")]
    # With sequence parallelism XLA gathers again for full recompute's forward, but not the
    # weights of the layer's last matmuls, whose recomputation is dead code.
    regathered = lay.sequence_parallel and lay.recompute is Recompute.FULL
    for gathered, calls, why in (
        (sum(whole[n] for n in layer_split if not _is_bias(n)), 2, "ZeRO-3: a layer's weights gathered for its forward and again for "
                                                                   "its backward"),
        (sum(whole[n] for n in layer_split if regathered and not _is_bias(n) and not n.endswith(_LAST_MATMULS)), 1,
         "ZeRO-3: a layer's weights gathered once more for full recompute (sequence parallel)"),
        (sum(whole[n] for n in layer_split if _is_bias(n)), 1, "ZeRO-3: a layer's biases gathered for its forward"),
    ):
        if gathered:
            out.append(PredictedCollective(kind="all-gather", axes=data, bytes_per_call=gathered / runs.layers_held * e,
                                           calls=calls * runs.layer_runs, why=why))
    head = "embed/tokens" if model.tie_embeddings else "lm_head/w"
    if "embed/tokens" in split and not rows and not model.tie_embeddings:
        out.append(PredictedCollective(kind="all-gather", axes=data, bytes_per_call=whole["embed/tokens"] * _F32, calls=1,
                                       why="ZeRO-3: the vocab-parallel table gathered over the data axes (fp32, as stored), once"))
    if head in split:
        # A tied table is gathered whole in fp32: the lookup reads it as stored, the head casts the gathered copy.
        out.append(PredictedCollective(kind="all-gather", axes=data, bytes_per_call=whole[head] * (_F32 if model.tie_embeddings else e),
                                       calls=2, why="ZeRO-3: the head's weight gathered for the forward and for the backward"))
    if lay.zero_stage >= 1:
        gathered = sum(whole[n] for n in whole if n not in split) * _F32
        out.append(PredictedCollective(kind="all-gather", axes=data, bytes_per_call=gathered, calls=1,
                                       why="ZeRO: updated fp32 parameters (those not kept split) gathered from their data shards"))
    return out


def predicted_matmul_flops(plan: Plan) -> float | None:
    """Matmul FLOPs per device per step of the plan's program: forward (weights, attention
    scores and values over the full ``S×S``, or the causal blocks of the flash kernel, the
    head), backward twice that (the flash kernel's two and a half times), and the recompute:
    full repeats the layer's forward but its last matmul, selective the scores' matmul (for
    the softmax's backward). Pipelined, each device runs its stage's layers on every tick
    (`_Schedule`) and the head on the whole batch. None where XLA splits the embedding's work
    over the stages (`validate.pipeline.runs_outer_whole`)."""
    if plan.layout.pp > 1 and not runs_outer_whole(plan):
        return None
    model, lay, train = plan.model, plan.layout, plan.train
    runs = _schedule(plan)
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
    head = 2 * model.hidden_size * model.vocab_size / lay.tp
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
    return micro_tokens * (runs.layer_runs * layer / lay.tp + runs.head_micro_batches * 3 * head)
