"""Inference: prefill and decode with a KV cache, on weights alone.

A decode step produces one token for each of the batch's sequences. Per device it reads
every weight it holds and the whole KV cache once, and computes ``2·params + attention``
FLOPs per sequence, so at small batch it is HBM-bound: each kernel takes ``max(compute,
HBM)`` time (`costmodel.step.roofline.kernel_time_s`, the launch floor included). Prefill runs
the prompts' forward pass at once: compute-bound, the causal attention's quadratic part
included.

- KV cache: ``2 · layers · kv_heads · head_dim · bytes · batch · context`` in all, each
  sequence rounded up to whole blocks of the paged allocator (``kv_block_size`` tokens).
  Tensor parallelism splits the kv heads (each device keeps one when tp > kv_heads, so the
  cache is replicated ``tp / kv_heads`` times), pipeline parallelism the layers, data
  parallelism (independent replicas) nothing: each replica holds its own batch's cache.
- Weights: the layer matrices in ``InferenceConfig.weight_dtype``, norms, embedding and
  head in the compute dtype; split as in training (`costmodel.step.data_parallel.stage_params`).
  fp8 weights run the linear GEMMs in fp8 at the part's fp8 peak (W8A8); a mixture of experts
  holds every expert but a step reads only those its tokens touch (`costmodel.step.serving_kernels`).
- KV cache in ``InferenceConfig.kv_cache_dtype`` (the compute dtype, or fp8: one byte).
- Tensor parallelism: two all-reduces per layer of ``tokens × hidden`` (after the attention
  output and the MLP down projections), on the critical path.
- 2D weight-stationary decode (``Layout.tp_embed`` = X > 1 of tp = X·Y; Pope et al. 2022's
  layout): every layer weight splits its model dimension over X devices and its heads or MLP
  width over Y, the residual stream its model dimension over X, the KV cache its sequences over
  X and its heads over Y. Per layer, over the X axes (`tensor_parallel_s`): each norm's
  statistics (fp32, one per token for RMSNorm, two for LayerNorm), the q, k and v projections'
  partial sums (one all-reduce of ``tokens × (heads + 2·kv_heads)/Y × head_dim``), the attention
  output gathered back from the sequences' split (``tokens × heads/Y × head_dim``) and the MLP
  input projections' partial sums (``tokens × ffn/Y``, twice gated); over the Y axes the two
  row-parallel outputs' (``tokens × hidden/X`` each); before the head the last hidden state is
  gathered over X. The weights a device reads and the FLOPs it runs are the 1D layout's with
  the same tp; the bytes moved shrink with Y and X instead of staying ``tokens × hidden``, for
  more (and smaller) collectives: the latency terms decide at small batches.
- Pipeline parallelism: a replica's sequences are split into as many micro-batches as
  stages (at most one per sequence, a divisor of the replica's batch); a token passes every
  stage in turn, so the time per output token is the sum over stages plus the hand-offs,
  and at least the busiest stage times the micro-batches it serves.
- Data parallelism: independent replicas, each serving the batch (``batch`` is sequences per
  replica); throughput is ``dp`` times a replica's, latency a replica's.
- Time to first token: a replica's prompts prefilled together, stage after stage.
- The serving stack (`costmodel.inputs.serving_stack`, ``InferenceConfig.serving_stack``): a step
  takes at least the host time its stack spends dispatching operators one by one (an eager
  framework); a compiled or graph-replayed step adds none.

>>> from costmodel.step.collectives import Tier
>>> from costmodel.hardware.machine import Machine
>>> from costmodel.inputs.model_config import ModelConfig
>>> m = ModelConfig(name="m", hidden_size=1024, num_layers=8, num_heads=16, num_kv_heads=4, ffn_size=4096, vocab_size=1000)
>>> hw = Machine(name="x", peak_flops_per_s=1e15, hbm_bytes_per_s=1e12, hbm_bytes=8e10,
...              devices_per_node=8, intra=Tier(bytes_per_s=1e11, latency_s=1e-6), inter=Tier(bytes_per_s=1e10, latency_s=1e-5))
>>> train = TrainConfig(workload="decode", global_batch=4, seq_len=1000)
>>> kv_cache_bytes(m, train, Layout()) == 2 * 8 * 4 * 64 * 2 * 4 * 1008  # 1000 tokens in 63 blocks of 16
True
>>> est = simulate_inference(m, train, Layout(tp=2), hw)
>>> est.serving.decode_bound, est.time_per_output_token_s >= est.serving.hbm_lower_bound_s
('hbm', True)
"""

from __future__ import annotations

import math
from typing import NamedTuple

from costmodel.errors import UnsupportedError
from costmodel.hardware.machine import Machine
from costmodel.hardware.topology import link_between_stages
from costmodel.inputs.layout import Layout, check_layout
from costmodel.inputs.model_config import ModelConfig, Norm
from costmodel.inputs.train_config import TrainConfig
from costmodel.inputs.workload import norm_params_per_layer
from costmodel.step.collectives import Collective, all_reduce_s, collective_s, p2p_s
from costmodel.step.data_parallel import layer_params_per_device, stage_params
from costmodel.step.estimate import ServingTimes, StepEstimate, TimeBreakdown
from costmodel.step.kernels import Kernel
from costmodel.step.memory import MemoryBreakdown
from costmodel.step.roofline import kernel_bounds_s, kernel_time_s
from costmodel.step.serving_kernels import (
    head_kernel,
    iteration_layer_kernels,
    kv_element_bytes,
    layer_kernels,
    side_kernels,
    untouched_expert_bytes,
)

_F32 = 4


def kv_heads_per_device(model: ModelConfig, tp: int) -> int:
    """KV heads one tensor-parallel device holds: ``kv_heads / tp``, or one (replicated) when tp > kv_heads."""
    return max(1, model.num_kv_heads // tp)


def padded_context(train: TrainConfig) -> int:
    """Tokens of cache allocated per sequence: the context rounded up to whole blocks."""
    block = train.workload.serving.kv_block_size
    return math.ceil(train.seq_len / block) * block


def cached_tokens(model: ModelConfig, train: TrainConfig) -> int:
    """Tokens of cache allocated per sequence: `padded_context`, or under a sliding window shorter
    than the context only the window's (the rolling buffer of Mistral's reference code and vLLM's
    sliding-window block reuse), in whole blocks."""
    window = model.sliding_window
    if window is None or window >= train.seq_len:
        return padded_context(train)
    block = train.workload.serving.kv_block_size
    return math.ceil(window / block) * block


def replica_batch(train: TrainConfig, layout: Layout) -> int:
    """Sequences one data-parallel replica serves: the workload's batch (``TrainConfig.global_batch``)."""
    return train.global_batch


def micro_batches(train: TrainConfig, layout: Layout) -> int:
    """Micro-batches in flight per replica: the largest divisor of its batch not above the stages."""
    b = replica_batch(train, layout)
    return max(d for d in range(1, min(layout.pp, b) + 1) if b % d == 0)


def device_kv_heads(model: ModelConfig, layout: Layout) -> float:
    """KV heads' worth of every sequence's cache one device holds: `kv_heads_per_device` over the
    tensor devices, and under a 2D split (`Layout.tp_embed`) over the heads axis, a 1/tp_embed
    share of the sequences."""
    return kv_heads_per_device(model, layout.tp // layout.tp_embed) / layout.tp_embed


def kv_cache_bytes(model: ModelConfig, train: TrainConfig, layout: Layout, *, stage: int = 0) -> float:
    """KV-cache bytes one device of pipeline stage ``stage`` holds (module docstring)."""
    per_token_layer = 2 * device_kv_heads(model, layout) * model.head_dim * kv_element_bytes(train)
    layers = layout.layers_on_stage(model.num_layers, stage)
    return per_token_layer * layers * replica_batch(train, layout) * cached_tokens(model, train)


class TensorCollective(NamedTuple):
    """One collective of a 2D weight-stationary decode step (`two_d_collectives`)."""

    kind: Collective
    over: str  # "heads": the axes splitting heads and MLP width; "embed": those splitting the model dimension
    size_bytes: float
    calls: int
    why: str


def two_d_collectives(model: ModelConfig, train: TrainConfig, layout: Layout, *, tokens: int, layers: int,
                      last_stage: bool) -> list[TensorCollective]:
    """The tensor-parallel collectives of ``layers`` layers of a 2D weight-stationary split
    (`Layout.tp_embed` > 1) over ``tokens`` new tokens, on ``last_stage`` with the gather before the
    head (module docstring). XLA combines the q, k and v partial sums into one all-reduce, and the
    MLP input and gate's: `validate.predict_serving` checks the list against the compiled module.

    >>> from costmodel.inputs.model_config import ModelConfig
    >>> m = ModelConfig(name="m", hidden_size=4096, num_layers=8, num_heads=32, num_kv_heads=8, ffn_size=14336, vocab_size=1000)
    >>> train = TrainConfig(workload="decode", global_batch=8, seq_len=1024)
    >>> [(c.over, c.calls) for c in two_d_collectives(m, train, Layout(tp=32, tp_embed=4), tokens=8, layers=8, last_stage=False)]
    [('embed', 16), ('embed', 8), ('embed', 8), ('embed', 8), ('heads', 16)]
    """
    e, d, x = train.compute_dtype.bytes, model.hidden_size, layout.tp_embed
    y, hd = layout.tp // x, model.head_dim
    q, kv = model.num_heads // y * hd, model.num_kv_heads // y * hd
    mlp = (2 if model.mlp.gated else 1) * model.ffn_size // y
    stats = 2 if model.norm is Norm.LAYERNORM else 1  # fp32 statistics per token and norm
    out = [
        TensorCollective(Collective.ALL_REDUCE, "embed", tokens * _F32, 2 * layers * stats,
                         "each layer norm's fp32 statistics over the model dimension's split"),
        TensorCollective(Collective.ALL_REDUCE, "embed", tokens * (q + 2 * kv) * e, layers,
                         "the q, k and v projections' partial sums over the model dimension"),
        TensorCollective(Collective.ALL_GATHER, "embed", tokens * q * e, layers,
                         "the attention output gathered from the cache's sequence split"),
        TensorCollective(Collective.ALL_REDUCE, "embed", tokens * mlp * e, layers,
                         "the MLP input projections' partial sums over the model dimension"),
    ]
    if last_stage:
        out.append(TensorCollective(Collective.ALL_GATHER, "embed", tokens * d * e, 1,
                                    "the last hidden state gathered whole for the final norm and the vocabulary-split head"))
    if y > 1:
        out.append(TensorCollective(Collective.ALL_REDUCE, "heads", tokens * d / x * e, 2 * layers,
                                    "row-parallel attention output and MLP down projection, summed over the heads' split"))
    return out


def tensor_parallel_s(model: ModelConfig, train: TrainConfig, layout: Layout, hw: Machine, *, tokens: int, layers: int,
                      last_stage: bool) -> tuple[float, float]:
    """(seconds over the tensor axes that split heads and MLP width, seconds over those that split
    the model dimension) of ``layers`` layers' tensor-parallel collectives over ``tokens`` new
    tokens, on ``last_stage`` the gather before the head too (module docstring; 1D: the second is 0).
    2D moves fewer bytes in more collectives: cheaper at 512 tokens a step, dearer at one.

    >>> from costmodel.hardware.machine import load_machine
    >>> from costmodel.inputs.model_config import ModelConfig
    >>> m = ModelConfig(name="m", hidden_size=4096, num_layers=8, num_heads=32, num_kv_heads=8, ffn_size=14336, vocab_size=1000)
    >>> train, hw = TrainConfig(workload="decode", global_batch=512, seq_len=1024), load_machine("tpu-v5p")
    >>> def comm_s(x, tokens):
    ...     return tensor_parallel_s(m, train, Layout(tp=32, tp_embed=x), hw, tokens=tokens, layers=8, last_stage=True)
    >>> comm_s(1, 512)[1], sum(comm_s(4, 512)) < sum(comm_s(1, 512)), sum(comm_s(4, 1)) > sum(comm_s(1, 1))
    (0.0, True, True)
    """
    if layout.tp == 1:
        return 0.0, 0.0
    groups = hw.groups(layout)
    if layout.tp_embed == 1:
        return 2 * layers * all_reduce_s(tokens * model.hidden_size * train.compute_dtype.bytes, groups["tp"]), 0.0
    seconds = {"heads": 0.0, "embed": 0.0}
    for c in two_d_collectives(model, train, layout, tokens=tokens, layers=layers, last_stage=last_stage):
        seconds[c.over] += c.calls * collective_s(c.kind, c.size_bytes, groups[f"tp_{c.over}"])
    return seconds["heads"], seconds["embed"]


def layer_weight_bytes(model: ModelConfig, train: TrainConfig, layout: Layout) -> float:
    """Bytes of one layer's weights on one device: matrices as stored, norms whole in the compute dtype.
    Where the heads axis has more devices than KV heads, each device holds the K and V projections
    of the one KV head its query heads read (replicated over them, as vLLM does and the serving
    program's split tensor axis lowers), not a 1/tp share of them."""
    norms = norm_params_per_layer(model)  # whole on every device
    heads_tp = layout.tp // layout.tp_embed
    replicated_kv = kv_heads_per_device(model, heads_tp) - model.num_kv_heads / heads_tp
    matrices = (layer_params_per_device(model, layout) - norms / layout.tp
                + 2 * model.hidden_size * model.head_dim * replicated_kv / layout.tp_embed)
    return matrices * train.workload.serving.weight_bytes + norms * train.compute_dtype.bytes


def stage_weight_bytes(model: ModelConfig, train: TrainConfig, layout: Layout, stage: int) -> float:
    """Weight bytes one device of stage ``stage`` holds (the first has the embedding, the last the head)."""
    layers = layout.layers_on_stage(model.num_layers, stage)
    outer = stage_params(model, layout, stage) - layers * layer_params_per_device(model, layout)
    return layers * layer_weight_bytes(model, train, layout) + outer * train.compute_dtype.bytes


def _split_s(kernels: list[Kernel], hw: Machine) -> tuple[float, float, float]:
    """(total, compute-limited part, HBM-limited part) seconds of ``kernels`` on ``hw``, launch floors included."""
    compute = memory = 0.0
    for k in kernels:
        peak_flops_per_s = hw.linear_peak if k.linear else hw.peak_flops_per_s
        rates = {"peak_flops_per_s": peak_flops_per_s, "hbm_bytes_per_s": hw.hbm_bytes_per_s, "efficiency": hw.efficiency,
                 "instructions_per_s": hw.instructions_per_s}
        t = kernel_time_s(k, **rates)
        compute_s, memory_s = kernel_bounds_s(k, **rates)
        if memory_s >= compute_s:
            memory += t
        else:
            compute += t
    return compute + memory, compute, memory


def _stage_s(model: ModelConfig, train: TrainConfig, layout: Layout, hw: Machine, stage: int, *, sequences: int,
             new_tokens: int) -> tuple[float, float, float, float, float]:
    """(total, compute-limited, HBM-limited, tensor-parallel comm, of it over the model-dimension axes) seconds of
    one stage's pass over ``sequences``."""
    layers, last = layout.layers_on_stage(model.num_layers, stage), stage == layout.pp - 1
    per_layer = layer_kernels(model, train, layout, sequences=sequences, new_tokens=new_tokens,
                              kv_heads=device_kv_heads(model, layout), cache_tokens=cached_tokens(model, train), side=hw.launches_kernels)
    kernels = [k.scaled(layers) for k in per_layer]
    if last:
        kernels.append(head_kernel(model, train, layout, sequences))
    total, compute, memory = _split_s(kernels, hw)
    heads_s, embed_s = tensor_parallel_s(model, train, layout, hw, tokens=sequences * new_tokens, layers=layers, last_stage=last)
    return total + heads_s + embed_s, compute, memory, heads_s + embed_s, embed_s


def _handoff_s(model: ModelConfig, train: TrainConfig, layout: Layout, hw: Machine, tokens: int) -> float:
    if layout.pp == 1:
        return 0.0
    tier = link_between_stages(layout, devices_per_node=hw.devices_per_node, intra=hw.intra, inter=hw.inter,
                               inter_cross_rail=hw.inter_cross_rail)
    return p2p_s(tokens * model.hidden_size * train.compute_dtype.bytes, tier)


def iteration_s(model: ModelConfig, train: TrainConfig, layout: Layout, hw: Machine, *, decode_sequences: int,
                cached_tokens: int = 0, tokens_per_sequence: int = 1, prompt_tokens: int = 0) -> float:
    """Seconds of one continuous-batching iteration on one replica without pipeline stages: every
    layer's `serving_kernels.iteration_layer_kernels`, the head over each new token that is a
    sequence's last (all of a speculative step's, a completed prompt chunk's one), and tensor
    parallelism's two all-reduces a layer over the iteration's tokens, at least the serving stack's
    host time to dispatch the step. With one decoding
    sequence per cached context and nothing else it is `simulate_inference`'s time per output token.

    >>> from costmodel.hardware.machine import load_machine
    >>> from costmodel.inputs.model_config import ModelConfig
    >>> m = ModelConfig(name="m", hidden_size=1024, num_layers=8, num_heads=16, num_kv_heads=4, ffn_size=4096, vocab_size=1000)
    >>> hw, train = load_machine("h100-sxm"), TrainConfig(workload="decode", global_batch=4, seq_len=1024)
    >>> t = iteration_s(m, train, Layout(), hw, decode_sequences=4, cached_tokens=4 * 1024)
    >>> abs(t - simulate_inference(m, train, Layout(), hw).time_per_output_token_s) < 1e-12
    True
    """
    if layout.pp > 1 or layout.tp_embed > 1:
        raise UnsupportedError("continuous batching over pipeline stages or a 2D weight-stationary split is not modelled",
                               fix="serve with 1D tensor parallelism and replicas (--pp 1)")
    kernels = [k.scaled(model.num_layers) for k in iteration_layer_kernels(
        model, train, layout, decode_sequences=decode_sequences, tokens_per_sequence=tokens_per_sequence,
        cached_tokens=cached_tokens, kv_heads=kv_heads_per_device(model, layout.tp), prompt_tokens=prompt_tokens,
        side=hw.launches_kernels)]
    kernels.append(head_kernel(model, train, layout, decode_sequences * tokens_per_sequence + (1 if prompt_tokens else 0)))
    tokens = decode_sequences * tokens_per_sequence + prompt_tokens
    comm_s = (2 * model.num_layers * all_reduce_s(tokens * model.hidden_size * train.compute_dtype.bytes, hw.groups(layout)["tp"])
              if layout.tp > 1 else 0.0)
    host_s = train.workload.serving.stack.host_step_s(num_layers=model.num_layers)
    return max(_split_s(kernels, hw)[0] + comm_s, host_s)


def check_inference_layout(model: ModelConfig, train: TrainConfig, layout: Layout) -> Layout:
    """``layout`` with its micro-batch set for serving (`micro_batches`); refuses what is not modelled."""
    if layout.cp > 1 or layout.ep > 1 or layout.zero_stage > 0 or layout.interleave > 1:
        raise UnsupportedError("serving layouts use tensor, pipeline and data (replica) parallelism only (experts split by tp)",
                               fix="drop --cp, --ep, --zero-stage and --interleave")
    lay = layout.model_copy(update={"micro_batch": replica_batch(train, layout) // micro_batches(train, layout)})
    check_layout(lay, model, train.model_copy(update={"global_batch": train.global_batch * lay.dp}), n_devices=lay.n_devices)
    return lay


def inference_memory(model: ModelConfig, train: TrainConfig, layout: Layout, *, hbm_bytes: float | None = None,
                     reserve_bytes: float = 0.0) -> MemoryBreakdown:
    """Per-device memory of the busiest stage: weights, KV cache, the residual stream and
    one layer's widest intermediate (decode: of a micro-batch; prefill: of the prompts), the last
    tokens' fp32 logits."""
    e = train.compute_dtype.bytes
    b = train.workload.step_sequences(micro_batch=layout.micro_batch, replica_batch=replica_batch(train, layout))
    tokens = b * train.workload.new_tokens(prompt_len=train.prompt_len)
    stage = max(range(layout.pp), key=lambda s: stage_weight_bytes(model, train, layout, s) + kv_cache_bytes(model, train, layout, stage=s))
    mlp_per_token = model.experts_per_token * model.moe_ffn_size + model.shared_expert_ffn_size if model.is_moe else model.ffn_size
    widest = max((2 if model.mlp.gated else 1) * mlp_per_token, (model.num_heads + 2 * model.num_kv_heads) * model.head_dim) / layout.tp
    logits = b * model.vocab_per_shard(layout.tp) * _F32 if stage == layout.pp - 1 else 0.0
    return MemoryBreakdown(
        stage="only" if layout.pp == 1 else ("last" if stage == layout.pp - 1 else "first"),
        params_bytes=stage_weight_bytes(model, train, layout, stage), grads_bytes=0.0, optimizer_bytes=0.0,
        activations_bytes=2 * tokens * model.hidden_size * e, temporary_bytes=tokens * widest * e + logits,
        kv_cache_bytes=kv_cache_bytes(model, train, layout, stage=stage), hbm_bytes=hbm_bytes, reserve_bytes=reserve_bytes,
    )


class _Phase(NamedTuple):
    """One serving phase as `simulate_inference` costs it; the workload's step is one of the two (`ServingWorkload.of_step`)."""

    stages: list[tuple[float, float, float, float, float]]
    repeats: int
    step_s: float
    pp_s: float
    new_tokens: int


def simulate_inference(model: ModelConfig, train: TrainConfig, layout: Layout, hw: Machine) -> StepEstimate:
    """Predict serving ``model`` under ``layout`` on ``hw``: time per output token, time to first
    token, tokens/s (decode: output tokens; prefill: prompt tokens) and memory (module docstring)."""
    lay = check_inference_layout(model, train, layout)
    pp, m, b = lay.pp, micro_batches(train, lay), lay.micro_batch
    stack = train.workload.serving.stack
    host_s = stack.host_step_s(num_layers=model.num_layers)
    decode = [_stage_s(model, train, lay, hw, s, sequences=b, new_tokens=1) for s in range(pp)]
    chain_s = sum(t[0] for t in decode) + (pp - 1) * _handoff_s(model, train, lay, hw, b)
    tpot_s = max(chain_s, m * max(t[0] for t in decode), host_s)
    rb, prompt = replica_batch(train, lay), train.prompt_len
    prefill = [_stage_s(model, train, lay, hw, s, sequences=rb, new_tokens=prompt) for s in range(pp)]
    hops_s = (pp - 1) * _handoff_s(model, train, lay, hw, rb * prompt)
    ttft_s = max(sum(t[0] for t in prefill) + hops_s, host_s)
    side = side_kernels(model, train, lay, tokens=b, kv_heads=device_kv_heads(model, lay)) if hw.launches_kernels else []
    # An eager stack's side kernels are its operators one by one, launched by the host dispatch: traffic, no floors.
    launched, unfused = ([], side) if stack.operators_unfused else (side, [])
    untouched = untouched_expert_bytes(model, train, lay, b)
    read_bytes = [stage_weight_bytes(model, train, lay, s) - lay.layers_on_stage(model.num_layers, s) * untouched
                  + kv_cache_bytes(model, train, lay, stage=s) * b / rb for s in range(pp)]
    serving = ServingTimes(
        decode_compute_s=sum(t[1] for t in decode), decode_hbm_s=sum(t[2] for t in decode),
        decode_tp_comm_s=sum(t[3] for t in decode), decode_tp_embed_comm_s=sum(t[4] for t in decode),
        decode_pp_handoff_s=chain_s - sum(t[0] for t in decode),
        decode_bound="hbm" if sum(t[2] for t in decode) >= sum(t[1] for t in decode) else "compute",
        hbm_lower_bound_s=max(sum(read_bytes), m * max(read_bytes)) / hw.hbm_bytes_per_s,
        prefill_compute_s=sum(t[0] - t[3] for t in prefill), prefill_comm_s=sum(t[3] for t in prefill) + hops_s, micro_batches=m,
        host_ops=stack.host_ops(num_layers=model.num_layers), host_s_per_op=stack.host_s_per_op, host_step_s=host_s,
        side_kernels_per_layer=round(sum(k.count for k in launched)), side_kernel_floor_s=hw.efficiency.kernel_floor_s,
        decode_side_kernels_s=_split_s([k.scaled(model.num_layers) for k in launched], hw)[0],
        decode_unfused_operators_s=_split_s([k.scaled(model.num_layers) for k in unfused], hw)[0],
    )
    step = train.workload.of_step(
        decode=_Phase(stages=decode, repeats=m, step_s=tpot_s, pp_s=serving.decode_pp_handoff_s, new_tokens=1),
        prefill=_Phase(stages=prefill, repeats=1, step_s=ttft_s, pp_s=hops_s, new_tokens=prompt))
    busiest = max(step.stages, key=lambda t: t[0])
    compute_s, memory_s, tp_s, tp_embed_s = (step.repeats * x for x in busiest[1:])
    step_s = step.step_s
    model_flops = train.workload.model_flops(model, tokens=lay.dp * train.global_batch * step.new_tokens, seq_len=train.seq_len)
    utilisation = model_flops / (step_s * lay.n_devices * hw.peak_flops_per_s)
    memory = inference_memory(model, train, lay, hbm_bytes=hw.hbm_bytes, reserve_bytes=hw.memory_reserve_bytes)
    return StepEstimate(
        layout=lay, hardware=hw.name, n_devices=lay.n_devices, step_time_s=step_s,
        tokens_per_s=lay.dp * train.global_batch * step.new_tokens / step_s, mfu=utilisation, hfu=utilisation,
        model_flops=model_flops, memory=memory, fits=memory.fits,
        breakdown=TimeBreakdown(compute_s=compute_s, memory_bound_s=memory_s, recompute_s=0.0, exposed_comm_s=tp_s,
                                bubble_s=max(0.0, step_s - compute_s - memory_s - tp_s), optimizer_s=0.0,
                                comm_s_by_axis={"tp": tp_s - tp_embed_s, "tp_embed": tp_embed_s, "pp": step.pp_s}),
        time_per_output_token_s=tpot_s, time_to_first_token_s=ttft_s, serving=serving,
    )
