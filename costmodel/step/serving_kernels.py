"""The kernels one transformer layer launches in a serving step (prefill or decode), per device.

- Linear GEMMs (qkv, attention output, MLP or experts): the weights as stored
  (`costmodel.inputs.workload.InferenceConfig.weight_dtype`), activations in the compute dtype. fp8
  weights run W8A8 as TensorRT-LLM's and vLLM's fp8 recipes do: the GEMM reads the fp8 weight
  and an fp8 activation at the part's fp8 peak and writes the compute dtype. Each GEMM input is
  quantized with one per-tensor scale (static, calibrated; a dynamic scale's amax pass is not
  counted) by a pass fused into the kernel that produces it (TensorRT-LLM's norm-quant and
  activation-quant kernels, vLLM's compiled fusion passes): counted as one HBM read of the
  compute-dtype input and one fp8 write, no launch of its own. int8/int4 weights are cast to the
  compute dtype inside the GEMM (weight-only), unless GPTQ's kernels run them
  (`costmodel.step.weight_kernels`).
- Attention against the KV cache (decode: the new token's query over the whole cache, read once
  in the cache's dtype, or once per query head where the stack's kernel does, `decode_kv_reads`;
  prefill: causal, quadratic) at the compute dtype's peak; the head too.
- An eager stack (`costmodel.inputs.serving_stack.ServingStack.operators_unfused`) runs every
  small operator as a kernel of its own (`unfused_operator_kernel`), and materialized attention
  writes the score matrix and passes over it four times (`materialized_attention_kernels`).
- Side kernels (`side_kernels`): the norms with their residual adds, the rotary embedding, the
  KV-cache write and the MLP activation, as many launches as the serving stack splits them into
  (`costmodel.inputs.serving_stack.ServingStack.side_kernels_per_layer`), each reading and
  writing its share of those activations once and paying a launch floor.
- Mixture of experts: the router (a ``hidden × experts`` GEMM at the compute peak), then each
  token's top-k experts: ``2·k·expert params`` FLOPs a token, and the weights of every expert the
  step's tokens touch. Under uniform, independent routing (the load-balancing loss's aim; real
  routers are skewed, which touches fewer) ``n`` tokens touch on average
  ``E·(1 − (1 − k/E)^n)`` of ``E`` experts (`expected_experts_touched`): ``k`` at batch 1, all of
  them for a prompt. Dispatch and combine (gathers of ``k · tokens × hidden``) are not counted.
  Tensor parallelism splits every expert as a dense MLP; expert parallelism is not modelled.

>>> expected_experts_touched(num_experts=8, experts_per_token=2, tokens=1)
2.0
>>> round(expected_experts_touched(num_experts=8, experts_per_token=2, tokens=64), 4)
8.0
"""

from __future__ import annotations

from costmodel.inputs.layout import Layout
from costmodel.inputs.model_config import ModelConfig, Norm, Positions
from costmodel.inputs.stack import Attention
from costmodel.inputs.train_config import TrainConfig
from costmodel.inputs.workload import WeightKernel
from costmodel.step.fp8_memory import FP8_BYTES
from costmodel.step.kernels import Kernel, KernelKind
from costmodel.step.weight_kernels import gptq_linear_kernels

_F32 = 4


def expected_experts_touched(*, num_experts: int, experts_per_token: int, tokens: float) -> float:
    """Distinct experts ``tokens`` tokens route to on average when each picks ``experts_per_token``
    of ``num_experts`` uniformly: ``E·(1 − (1 − k/E)^n)`` (each expert missed by a token with
    probability ``1 − k/E``, independently)."""
    return num_experts * (1 - (1 - experts_per_token / num_experts) ** tokens)


def kv_element_bytes(train: TrainConfig) -> float:
    """Bytes of one cached key or value element (`costmodel.inputs.workload.KvCacheDtype`)."""
    return train.workload.serving.kv_cache_dtype.bytes(train.compute_dtype.bytes)


def decode_kv_reads(model: ModelConfig, train: TrainConfig) -> float:
    """Times decode attention reads each cached KV head from HBM: once, or once per query head of
    its group where the stack's kernel runs a thread block per query head
    (`costmodel.inputs.serving_stack.ServingStack.kv_read_per_query_head`).

    >>> m = ModelConfig(name="m", hidden_size=1024, num_layers=8, num_heads=16, num_kv_heads=4, ffn_size=4096, vocab_size=1000)
    >>> decode_kv_reads(m, TrainConfig(workload="decode")), decode_kv_reads(m, TrainConfig(workload="decode",
    ...     inference={"serving_stack": "tensorrt-llm-0.6"}))
    (1, 4.0)
    """
    return model.num_heads / model.num_kv_heads if train.workload.serving.stack.kv_read_per_query_head else 1


def linear_kernels(name: str, *, tokens: float, d_in: float, d_out: float, train: TrainConfig, weights: float = 1.0) -> list[Kernel]:
    """``tokens`` rows through a ``d_in × d_out`` weight (``weights`` distinct such matrices read:
    the experts touched), at the linear layers' peak, and the fp8 input quantization (module docstring).

    >>> fp8 = TrainConfig(workload="decode", inference={"weight_dtype": "fp8"})
    >>> [(k.name, k.bytes, k.fused) for k in linear_kernels("w", tokens=1, d_in=10, d_out=20, train=fp8)]
    [('w', 250.0, False), ('w_input_quant', 30.0, True)]
    """
    serving = train.workload.serving
    if serving.weight_kernel is not WeightKernel.FUSED:
        return gptq_linear_kernels(name, rows=tokens, d_in=d_in, d_out=d_out, train=train, weights=weights)
    e = train.compute_dtype.bytes
    flops = 2 * tokens * d_in * d_out
    if not train.serves_fp8:
        return [Kernel(name=name, kind=KernelKind.MATMUL, flops=flops, linear=True,
                       bytes=weights * d_in * d_out * serving.weight_bytes + tokens * (d_in + d_out) * e,
                       stream_efficiency=serving.stack.weight_only_stream.get(serving.weight_dtype.value, 1.0))]
    gemm = Kernel(name=name, kind=KernelKind.MATMUL, flops=flops, linear=True,
                  bytes=weights * d_in * d_out * FP8_BYTES + tokens * d_in * FP8_BYTES + tokens * d_out * e)
    quant = Kernel(name=f"{name}_input_quant", kind=KernelKind.MEMORY, flops=0, bytes=tokens * d_in * (e + FP8_BYTES), fused=True)
    return [gemm, quant]


def _mlp_kernels(model: ModelConfig, train: TrainConfig, layout: Layout, tokens: float) -> list[Kernel]:
    """The dense MLP, or the router and the experts (and a shared expert) of a mixture of experts."""
    gated, d, tp = 2 if model.mlp.gated else 1, model.hidden_size, layout.tp
    if not model.is_moe:
        f = model.ffn_size / tp
        return [*linear_kernels("mlp_up", tokens=tokens, d_in=d, d_out=gated * f, train=train),
                *linear_kernels("mlp_down", tokens=tokens, d_in=f, d_out=d, train=train)]
    n_e, k, e = model.num_experts, model.experts_per_token, train.compute_dtype.bytes
    touched = expected_experts_touched(num_experts=n_e, experts_per_token=k, tokens=tokens)
    f = model.moe_ffn_size / tp
    router = Kernel(name="router", kind=KernelKind.MATMUL, flops=2 * tokens * d * n_e,
                    bytes=d * n_e * train.workload.serving.weight_bytes + tokens * (d + n_e) * e)
    kernels = [router, *linear_kernels("expert_up", tokens=tokens * k, d_in=d, d_out=gated * f, train=train, weights=touched),
               *linear_kernels("expert_down", tokens=tokens * k, d_in=f, d_out=d, train=train, weights=touched)]
    if model.shared_expert_ffn_size:
        fs = model.shared_expert_ffn_size / tp
        kernels += [*linear_kernels("shared_up", tokens=tokens, d_in=d, d_out=gated * fs, train=train),
                    *linear_kernels("shared_down", tokens=tokens, d_in=fs, d_out=d, train=train)]
    return kernels


def layer_kernels(model: ModelConfig, train: TrainConfig, layout: Layout, *, sequences: int, new_tokens: int,
                  kv_heads: float, cache_tokens: int, side: bool = True) -> list[Kernel]:
    """One layer's kernels on one device for ``sequences`` sequences each adding ``new_tokens``
    (1: a decode step against ``cache_tokens`` allocated tokens; the prompt: prefill, causal);
    ``kv_heads`` the KV heads' worth of every sequence's cache the device holds (a fraction where
    a 2D split also divides the sequences, `costmodel.step.inference.device_kv_heads`); with
    ``side``, the serving stack's side kernels (a device that launches kernels, `Machine.launches_kernels`)."""
    e, tp = train.compute_dtype.bytes, layout.tp
    d, hd = model.hidden_size, model.head_dim
    q, kv = model.num_heads // tp * hd, kv_heads * hd
    tokens = sequences * new_tokens
    if train.workload.serving.stack.attention is Attention.MATERIALIZED:
        # Every query scores the whole cache (decode) or the whole prompt, the causal mask applied to the scores.
        keys = cache_tokens if new_tokens == 1 else new_tokens
        attention = materialized_attention_kernels(model, train, layout, queries=tokens, keys_per_query=keys,
                                                   keys=sequences * keys, kv=kv)
    elif new_tokens == 1:  # decode: each new query attends the whole cache (or its window), read once as stored
        attention = [Kernel(name="attention", kind=KernelKind.FLASH_ATTENTION,
                            flops=4 * sequences * min(train.seq_len, model.sliding_window or train.seq_len) * q,
                            bytes=sequences * (2 * kv * cache_tokens * kv_element_bytes(train) * decode_kv_reads(model, train)
                                               + 2 * q * e))]
    else:  # prefill: causal, half the score matrix; q, k, v and the output pass HBM once
        attn_flops = 2 * sequences * new_tokens ** 2 * q
        if model.sliding_window is not None and new_tokens > model.sliding_window:
            attn_flops = 4 * sequences * model.causal_pairs(new_tokens) * q
        attention = [Kernel(name="attention", kind=KernelKind.FLASH_ATTENTION, flops=attn_flops, bytes=tokens * (2 * q + 2 * kv) * e)]
    concat = cache_concat_kernels(train, cached_tokens=sequences * cache_tokens, kv=kv) if new_tokens == 1 else []
    return [*linear_kernels("qkv", tokens=tokens, d_in=d, d_out=q + 2 * kv, train=train), *attention, *concat,
            *linear_kernels("attn_out", tokens=tokens, d_in=q, d_out=d, train=train),
            *_mlp_kernels(model, train, layout, tokens),
            *(side_kernels(model, train, layout, tokens=tokens, kv_heads=kv_heads) if side else [])]


def cache_concat_kernels(train: TrainConfig, *, cached_tokens: float, kv: float) -> list[Kernel]:
    """A decode step's copy of one layer's cache where the serving stack grows it by concatenation
    (`costmodel.inputs.serving_stack.ServingStack.cache_grown_by_concatenation`): the keys' and the
    values' ``torch.cat`` each read ``cached_tokens × kv`` elements and write as many again (the new
    token's share is negligible), in the cache's dtype; none where the cache is written in place.

    >>> eager = TrainConfig(workload="decode", inference={"serving_stack": "hf-eager"})
    >>> # each of two launches reads and writes 1000 · 128 bf16 elements
    >>> [(k.count, k.bytes) for k in cache_concat_kernels(eager, cached_tokens=1000, kv=128)]
    [(2.0, 512000.0)]
    >>> cache_concat_kernels(TrainConfig(workload="decode"), cached_tokens=1000, kv=128)
    []
    """
    if not train.workload.serving.stack.cache_grown_by_concatenation:
        return []
    return [Kernel(name="kv_cache_concat", kind=KernelKind.MEMORY, flops=0, count=2,
                   bytes=2 * cached_tokens * kv * kv_element_bytes(train))]


def _widths(model: ModelConfig, layout: Layout, kv_heads: float) -> tuple[int, int, float, float]:
    """Per token on one device: the residual width, the queries', the keys' (or values'), and the MLP's
    (a mixture of experts' over each token's experts)."""
    q = model.num_heads // layout.tp * model.head_dim
    ffn = (model.moe_ffn_size * model.experts_per_token if model.is_moe else model.ffn_size) / layout.tp
    return model.hidden_size, q, kv_heads * model.head_dim, ffn


def side_kernels(model: ModelConfig, train: TrainConfig, layout: Layout, *, tokens: float, kv_heads: float) -> list[Kernel]:
    """A layer's side kernels over ``tokens`` tokens on one device (module docstring): per token
    two norms reading and writing the residual stream and its normed copy (``8·hidden``), the
    rotary embedding of the queries and keys (``2·(q + kv)``), the cache write of the keys and
    values (``4·kv``) and the activation (``3·ffn`` gated, else ``2·ffn``; a mixture of experts'
    over each token's experts), in the compute dtype; none where the stack's count is unknown; an
    eager stack's operators one by one (`unfused_operator_kernel`).

    >>> m = ModelConfig(name="m", hidden_size=1024, num_layers=8, num_heads=16, num_kv_heads=4, ffn_size=4096, vocab_size=1000)
    >>> # bf16: (8·1024 + 2·(1024 + 256) + 4·256 + 3·4096) · 2 bytes over the jax stack's 14 launches
    >>> [(k.count, k.count * k.bytes) for k in side_kernels(m, TrainConfig(workload="decode"), Layout(), tokens=1, kv_heads=4)]
    [(14.0, 48128.0)]
    >>> side_kernels(m, TrainConfig(workload="decode", inference={"serving_stack": "torch-compile"}), Layout(), tokens=1, kv_heads=4)
    []
    """
    if train.workload.serving.stack.operators_unfused:
        return [unfused_operator_kernel(model, train, layout, tokens=tokens, kv_heads=kv_heads)]
    count = train.workload.serving.stack.side_kernel_count(grouped_query=model.num_kv_heads < model.num_heads)
    if not count:
        return []
    d, q, kv, ffn = _widths(model, layout, kv_heads)
    rotary = 2 * (q + kv) if model.positions is Positions.ROPE else 0
    elements = 8 * d + rotary + 4 * kv + (3 if model.mlp.gated else 2) * ffn
    return [Kernel(name="side_kernels", kind=KernelKind.MEMORY, flops=0, bytes=tokens * elements * train.compute_dtype.bytes / count,
                   count=count)]


def unfused_operator_kernel(model: ModelConfig, train: TrainConfig, layout: Layout, *, tokens: float, kv_heads: float) -> Kernel:
    """The HBM traffic of a layer's small operators over ``tokens`` tokens on one device where each is
    a kernel of its own (`costmodel.inputs.serving_stack.ServingStack.operators_unfused`; the
    operators of transformers' eager Llama layer, `costmodel.inputs.serving_stack.HF_EAGER_OPS_PER_LAYER`),
    with ``e`` the compute dtype's bytes and ``f`` fp32's, per token:

    - each RMSNorm: to fp32 (reads ``e·d``, writes ``f·d``), pow, mean, mul by the statistic, back
      to the dtype, mul by the weight: ``(4e + 7f)·d``; a LayerNorm is one kernel: ``2e·d``;
    - the rotary embedding of q and k (mul, neg of a half, cat, mul, add): ``10e·(q + kv)``;
    - the attention output's ``transpose().contiguous()``: ``2e·q``; two residual adds: ``6e·d``;
    - the activation: SiLU then the gate's mul, ``5e·ffn`` (ungated: ``2e·ffn``).

    Its launches are the stack's host dispatch (`ServingStack.host_ops`), so the kernel pays no floor.

    >>> m = ModelConfig(name="m", hidden_size=1024, num_layers=8, num_heads=16, num_kv_heads=4, ffn_size=4096, vocab_size=1000)
    >>> eager = TrainConfig(workload="decode", inference={"serving_stack": "hf-eager"})
    >>> # bf16: 2·36·1024 (norms) + 20·(1024 + 256) (rotary) + 4·1024 (transpose) + 12·1024 (adds) + 10·4096 (activation)
    >>> unfused_operator_kernel(m, eager, Layout(), tokens=1, kv_heads=4).bytes
    156672.0
    """
    e, f = train.compute_dtype.bytes, _F32
    d, q, kv, ffn = _widths(model, layout, kv_heads)
    norm = (4 * e + 7 * f) * d if model.norm is Norm.RMSNORM else 2 * e * d
    rotary = 10 * e * (q + kv) if model.positions is Positions.ROPE else 0
    per_token = 2 * norm + rotary + 2 * e * q + 6 * e * d + (5 if model.mlp.gated else 2) * e * ffn
    return Kernel(name="unfused_operators", kind=KernelKind.MEMORY, flops=0, bytes=tokens * per_token, fused=True)


def materialized_attention_kernels(model: ModelConfig, train: TrainConfig, layout: Layout, *, queries: float, keys_per_query: float,
                                   keys: float, kv: float) -> list[Kernel]:
    """Eager attention on one device (transformers' eager Llama attention): ``queries`` queries each
    scored against ``keys_per_query`` keys (``keys`` distinct keys and values read, ``kv`` wide, in
    the cache's dtype). ``q·kᵀ`` is a batched GEMM writing every score (a causal mask shrinks no work);
    the scale, the mask's add, the fp32 softmax and its cast back pass over the scores (``6e + 2f``
    bytes a score); ``softmax·v`` a batched GEMM reading them. With grouped-query heads,
    ``repeat_kv`` first copies the keys and values out to every query head.

    >>> m = ModelConfig(name="m", hidden_size=1024, num_layers=8, num_heads=16, num_kv_heads=16, ffn_size=4096, vocab_size=1000)
    >>> eager = TrainConfig(workload="prefill", inference={"serving_stack": "hf-eager"})
    >>> [(k.name, k.flops, k.bytes) for k in materialized_attention_kernels(m, eager, Layout(), queries=8, keys_per_query=8,
    ...                                                                     keys=8, kv=1024)]
    [('attention_scores', 131072.0, 34816.0), ('attention_softmax', 0.0, 20480.0), ('attention_values', 131072.0, 34816.0)]
    """
    e, kv_e = train.compute_dtype.bytes, kv_element_bytes(train)
    heads = model.num_heads // layout.tp
    q, scores = heads * model.head_dim, queries * keys_per_query * heads
    repeated = []
    if q > kv:
        repeated = [Kernel(name="repeat_kv", kind=KernelKind.MEMORY, flops=0, fused=True, bytes=2 * keys * (kv * kv_e + q * e))]
        kv, kv_e = q, e
    gemm_flops, operands = 2 * queries * keys_per_query * q, queries * q * e + keys * kv * kv_e + scores * e
    return [*repeated,
            Kernel(name="attention_scores", kind=KernelKind.MATMUL, flops=gemm_flops, bytes=operands),
            Kernel(name="attention_softmax", kind=KernelKind.MEMORY, flops=0, fused=True, bytes=scores * (6 * e + 2 * _F32)),
            Kernel(name="attention_values", kind=KernelKind.MATMUL, flops=gemm_flops, bytes=operands)]


def iteration_layer_kernels(model: ModelConfig, train: TrainConfig, layout: Layout, *, decode_sequences: int, tokens_per_sequence: int,
                            cached_tokens: int, kv_heads: int, prompt_tokens: int, side: bool = True) -> list[Kernel]:
    """One layer's kernels in one continuous-batching iteration on one device: ``decode_sequences``
    sequences each adding ``tokens_per_sequence`` (1; a speculative step verifies several) against
    ``cached_tokens`` cached tokens in all (read once, in the cache's dtype), beside one prompt
    chunk of ``prompt_tokens`` (causal among themselves). The linear layers run over every token
    of the iteration at once, reading their weights once (vLLM's and TensorRT-LLM's mixed batches); ``side`` as in `layer_kernels`."""
    e, d, hd = train.compute_dtype.bytes, model.hidden_size, model.head_dim
    q, kv = model.num_heads // layout.tp * hd, kv_heads * hd
    new = decode_sequences * tokens_per_sequence
    tokens = new + prompt_tokens
    attention = []
    materialized = train.workload.serving.stack.attention is Attention.MATERIALIZED
    if decode_sequences and materialized:  # each new token scores its own sequence's cache
        attention += materialized_attention_kernels(model, train, layout, queries=new, keys_per_query=cached_tokens / decode_sequences,
                                                    keys=cached_tokens, kv=kv)
    elif decode_sequences:
        attention.append(Kernel(name="decode_attention", kind=KernelKind.FLASH_ATTENTION, flops=4 * tokens_per_sequence * cached_tokens * q,
                                bytes=2 * kv * cached_tokens * kv_element_bytes(train) * decode_kv_reads(model, train)
                                + new * 2 * q * e))
    if decode_sequences:
        attention += cache_concat_kernels(train, cached_tokens=cached_tokens, kv=kv)
    if prompt_tokens and materialized:
        attention += materialized_attention_kernels(model, train, layout, queries=prompt_tokens, keys_per_query=prompt_tokens,
                                                    keys=prompt_tokens, kv=kv)
    elif prompt_tokens:
        attention.append(Kernel(name="prefill_attention", kind=KernelKind.FLASH_ATTENTION, flops=2 * prompt_tokens**2 * q,
                                bytes=prompt_tokens * (2 * q + 2 * kv) * e))
    return [*linear_kernels("qkv", tokens=tokens, d_in=d, d_out=q + 2 * kv, train=train), *attention,
            *linear_kernels("attn_out", tokens=tokens, d_in=q, d_out=d, train=train), *_mlp_kernels(model, train, layout, tokens),
            *(side_kernels(model, train, layout, tokens=tokens, kv_heads=kv_heads) if side else [])]


def head_kernel(model: ModelConfig, train: TrainConfig, layout: Layout, sequences: int) -> Kernel:
    """The vocabulary projection of each sequence's last token (vocab-parallel over tp, compute dtype)."""
    v = model.vocab_per_shard(layout.tp)
    d, e = model.hidden_size, train.compute_dtype.bytes
    return Kernel(name="head", kind=KernelKind.MATMUL, flops=2 * sequences * d * v, bytes=d * v * e + sequences * v * _F32)


def untouched_expert_bytes(model: ModelConfig, train: TrainConfig, layout: Layout, tokens: float) -> float:
    """Bytes of one layer's expert weights on one device that ``tokens`` tokens leave unread (0 for a dense model)."""
    if not model.is_moe:
        return 0.0
    touched = expected_experts_touched(num_experts=model.num_experts, experts_per_token=model.experts_per_token, tokens=tokens)
    per_expert = model.routed_expert_params_per_layer / model.num_experts / layout.tp
    return (model.num_experts - touched) * per_expert * train.workload.serving.weight_bytes
