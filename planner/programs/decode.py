"""A decode step of the reference transformer against a KV cache.

``decode_step(params, kv_cache, batch) -> (logits_BxV, kv_cache)``: each of the batch's
sequences adds one token (``batch["tokens"]``, ``[B, 1]``) at ``batch["position"]``; every
layer writes that token's key and value into its cache slot and attends over the whole
allocated cache (``[B, kv_heads, T, head_dim]`` a layer, T the context rounded up to whole
blocks of the paged allocator), positions after the current one masked out. Query heads are
grouped by the KV head they share (GQA), as in training. Weights are served as stored
(`served_dtype_of`: layer matrices in the serving weight dtype, the rest in the compute
dtype) and cast to the compute dtype on use, fp8 ones too (the weights' bytes and the FLOPs are
the W8A8 program's; the activations' fp8 quantization is not lowered); the KV cache is stored in its dtype
(`kv_cache_dtype_of`) and read back to the compute dtype; the score softmax and the logits are fp32.
Mixture-of-experts models are not lowered (refused in one line).

The layers come two ways (`abstract_decode_inputs`'s ``stacked``). Served, each layer's weights
and cache are arrays of their own (``params["layers"]`` a list, ``kv_cache["k"]`` a list of
``[B, K, T, H]``) and the layers run as a Python loop, as MaxText serves with ``scan_layers``
off: on an H200 (2026-11-28, `benchmarks.gpu_truth.decode_layouts`) the ``lax.scan`` over stacked
layers copied every layer's weights out of the stack each token (llama3-8b, batch 1: 11.9 ms a
token, 5.8 ms served per layer), and a cache laid out ``[B, T, K, H]`` was transposed for the
score products (batch 32, context 8192: 82.7 ms, 14.4 ms as ``[B, K, T, H]``). Stacked (leading
dimension the layer, the cache ``[L, B, K, T, H]``), the layers are a ``lax.scan``: a pipeline
stage's slice of them, which one SPMD program can split over the pipeline axis.

>>> from costmodel.inputs.model_config import ModelConfig
>>> from costmodel.inputs.train_config import TrainConfig
>>> cfg = ModelConfig(name="t", hidden_size=32, num_layers=2, num_heads=4, num_kv_heads=2, ffn_size=64, vocab_size=50)
>>> train = TrainConfig(workload="decode", global_batch=3, seq_len=20)
>>> params, cache, batch = abstract_decode_inputs(cfg, train)
>>> len(cache["k"]), cache["k"][0].shape  # 2 layers; 20 tokens in 2 blocks of 16
(2, (3, 2, 32, 8))
>>> logits, new_cache = jax.eval_shape(lambda p, c, b: decode_step(p, c, b, cfg), params, cache, batch)
>>> logits.shape, logits.dtype, new_cache["v"][1].shape  # logits over the vocabulary padded to 128, padding masked
((3, 128), dtype('float32'), (3, 2, 32, 8))
"""

from __future__ import annotations

import math
from typing import Any, Callable

import jax
import jax.numpy as jnp

from costmodel.errors import UnsupportedError
from costmodel.inputs.model_config import ModelConfig, Positions
from costmodel.inputs.train_config import TrainConfig
from costmodel.inputs.workload import KvCacheDtype
from costmodel.step.inference import padded_context
from planner.programs.params import Params, abstract_params
from planner.programs.transformer import Constrain, Lookup, _activation, _keep, _norm, _take, head


def served_dtype_of(path: str, train: TrainConfig) -> Any:
    """The dtype a served weight is stored in: layer matrices (not the norms) in the serving
    weight dtype, embedding, head and norms in the compute dtype."""
    quantized = path.startswith("layers/") and "norm/" not in path
    return jnp.dtype(train.workload.frozen_dtype.jax_name if quantized else train.compute_dtype.value)


def kv_cache_dtype_of(train: TrainConfig) -> Any:
    """The dtype the K and V caches are stored in: the compute dtype, or ``float8_e4m3fn`` for an fp8 cache."""
    return jnp.dtype("float8_e4m3fn" if train.workload.serving.kv_cache_dtype is KvCacheDtype.FP8 else train.compute_dtype.value)


def kv_cache_shape(cfg: ModelConfig, train: TrainConfig, *, replicas: int = 1) -> tuple[int, int, int, int]:
    """``(batch, kv_heads, allocated tokens, head_dim)`` of one layer's K (and V) cache for
    ``replicas`` data-parallel replicas, each serving the workload's batch."""
    return train.global_batch * replicas, cfg.num_kv_heads, padded_context(train), cfg.head_dim


def abstract_decode_inputs(cfg: ModelConfig, train: TrainConfig, *, replicas: int = 1,
                           stacked: bool = False) -> tuple[Params, dict[str, Any], dict[str, Any]]:
    """``(params, kv_cache, batch)`` of a decode step as ``jax.ShapeDtypeStruct``s, the batch of
    ``replicas`` replicas; the layers served one array a layer, or ``stacked`` (module docstring)."""
    params = jax.tree_util.tree_map_with_path(
        lambda path, x: jax.ShapeDtypeStruct(x.shape, served_dtype_of("/".join(str(k.key) for k in path), train)), abstract_params(cfg))
    layer_cache = jax.ShapeDtypeStruct(kv_cache_shape(cfg, train, replicas=replicas), kv_cache_dtype_of(train))
    cache = jax.ShapeDtypeStruct((cfg.num_layers, *layer_cache.shape), layer_cache.dtype)
    batch = {"tokens": jax.ShapeDtypeStruct((train.global_batch * replicas, 1), jnp.int32), "position": jax.ShapeDtypeStruct((), jnp.int32)}
    if stacked:
        return params, {"k": cache, "v": cache}, batch
    return jax.eval_shape(per_layer, params), {"k": [layer_cache] * cfg.num_layers, "v": [layer_cache] * cfg.num_layers}, batch


def per_layer(params: Params) -> Params:
    """``params`` with the stacked layers cut into a list of one layer's weights each (served).

    >>> cfg = ModelConfig(name="t", hidden_size=32, num_layers=2, num_heads=4, num_kv_heads=2, ffn_size=64, vocab_size=50)
    >>> layers = jax.eval_shape(per_layer, abstract_params(cfg))["layers"]
    >>> len(layers), layers[0]["attn"]["wq"].shape
    (2, (32, 4, 8))
    """
    stack = params["layers"]
    count = jax.tree.leaves(stack)[0].shape[0]
    return {**params, "layers": [jax.tree.map(lambda x, i=i: x[i], stack) for i in range(count)]}


def is_served_per_layer(layers: Params) -> bool:
    """Whether ``layers`` are a list of one layer's weights each, not stacked."""
    return isinstance(layers, (list, tuple))


def loop_served_layers(layer: Callable[..., tuple[jax.Array, jax.Array, jax.Array]], x: jax.Array, layers: list[Params],
                       kv_cache: dict[str, list[jax.Array]]) -> tuple[jax.Array, dict[str, list[jax.Array]]]:
    """``layer(x, weights, k, v) -> (x, k, v)`` through the served ``layers`` in order, each
    against its own cache: the output and the caches it wrote."""
    written: dict[str, list[jax.Array]] = {"k": [], "v": []}
    for p, k, v in zip(layers, kv_cache["k"], kv_cache["v"]):
        x, k, v = layer(x, p, k, v)
        written["k"].append(k)
        written["v"].append(v)
    return x, written


def _rope_at(x_BxNxH: jax.Array, position: jax.Array, theta: float) -> jax.Array:
    h = x_BxNxH.shape[-1]
    angle_H2 = position.astype(jnp.float32) * theta ** (-jnp.arange(0, h, 2, dtype=jnp.float32) / h)
    cos, sin = jnp.cos(angle_H2), jnp.sin(angle_H2)
    x1, x2 = jnp.split(x_BxNxH.astype(jnp.float32), 2, axis=-1)
    return jnp.concatenate([x1 * cos - x2 * sin, x1 * sin + x2 * cos], axis=-1).astype(x_BxNxH.dtype)


def _attend(x_BxD: jax.Array, p: Params, k_cache: jax.Array, v_cache: jax.Array, position: jax.Array, cfg: ModelConfig, dt: Any,
            constrain: Constrain, layer: jax.Array | None = None) -> tuple[jax.Array, jax.Array, jax.Array]:
    """One token's attention over a layer's cache ``[B, K, T, H]`` after writing its key and value
    there in place; with ``layer``, the caches are the stacks ``[L, B, K, T, H]`` and one row of
    that layer's is written (not its whole slice rewritten)."""
    b, k_heads, group = x_BxD.shape[0], cfg.num_kv_heads, cfg.num_heads // cfg.num_kv_heads
    q_BxNxH = jnp.einsum("bd,dnh->bnh", x_BxD, p["wq"].astype(dt))
    k_BxKxH = jnp.einsum("bd,dkh->bkh", x_BxD, p["wk"].astype(dt))
    v_BxKxH = jnp.einsum("bd,dkh->bkh", x_BxD, p["wv"].astype(dt))
    if "bq" in p:
        q_BxNxH, k_BxKxH, v_BxKxH = q_BxNxH + p["bq"].astype(dt), k_BxKxH + p["bk"].astype(dt), v_BxKxH + p["bv"].astype(dt)
    if cfg.positions is Positions.ROPE:
        q_BxNxH, k_BxKxH = _rope_at(q_BxNxH, position, cfg.rope_theta), _rope_at(k_BxKxH, position, cfg.rope_theta)
    zero = jnp.zeros((), jnp.int32)
    at, rows = ((zero, zero, position, zero), (slice(None), slice(None), None)) if layer is None else \
        ((layer, zero, zero, position, zero), (None, slice(None), slice(None), None))
    k_cache = jax.lax.dynamic_update_slice(k_cache, k_BxKxH[rows].astype(k_cache.dtype), at)
    v_cache = jax.lax.dynamic_update_slice(v_cache, v_BxKxH[rows].astype(v_cache.dtype), at)
    if layer is None:
        k_BxKxTxH, v_BxKxTxH = constrain("kv_cache_BxKxTxH", k_cache), constrain("kv_cache_BxKxTxH", v_cache)
    else:
        k_BxKxTxH = constrain("kv_cache_BxKxTxH", jax.lax.dynamic_index_in_dim(k_cache, layer, keepdims=False))
        v_BxKxTxH = constrain("kv_cache_BxKxTxH", jax.lax.dynamic_index_in_dim(v_cache, layer, keepdims=False))
    q_BxKxGxH = q_BxNxH.reshape(b, k_heads, group, cfg.head_dim)
    # An fp8 cache is read back to the compute dtype (a no-op for a compute-dtype cache).
    scores_BxKxGxT = jnp.einsum("bkgh,bkth->bkgt", q_BxKxGxH, k_BxKxTxH.astype(dt)).astype(jnp.float32) / math.sqrt(cfg.head_dim)
    visible_T = jnp.arange(k_BxKxTxH.shape[2]) <= position
    probs_BxKxGxT = jax.nn.softmax(jnp.where(visible_T, scores_BxKxGxT, -jnp.inf), axis=-1).astype(dt)
    out_BxNxH = jnp.einsum("bkgt,bkth->bkgh", probs_BxKxGxT, v_BxKxTxH.astype(dt)).reshape(b, cfg.num_heads, cfg.head_dim)
    y_BxD = jnp.einsum("bnh,nhd->bd", out_BxNxH, p["wo"].astype(dt))
    return (y_BxD + p["bo"].astype(dt) if "bo" in p else y_BxD), k_cache, v_cache


def _mlp(x_BxD: jax.Array, p: Params, cfg: ModelConfig, dt: Any) -> jax.Array:
    h_BxF = jnp.einsum("bd,df->bf", x_BxD, p["w_in"].astype(dt)) + (p["b_in"].astype(dt) if "b_in" in p else 0)
    gate_BxF = jnp.einsum("bd,df->bf", x_BxD, p["w_gate"].astype(dt)) if "w_gate" in p else None
    y_BxD = jnp.einsum("bf,fd->bd", _activation(h_BxF, gate_BxF, cfg.mlp), p["w_out"].astype(dt))
    return y_BxD + p["b_out"].astype(dt) if "b_out" in p else y_BxD


def check_serving_lowered(cfg: ModelConfig) -> None:
    """Refuse in one line a model whose serving steps are not lowered: a mixture of experts (the
    serving cost model predicts it; the training MoE layer's capacity dispatch would run every
    expert on each sequence's one token, not the top-k the model costs)."""
    if cfg.is_moe:
        raise UnsupportedError(f"the serving steps of {cfg.name}, a mixture-of-experts model, are not lowered yet (dense models' are)",
                               fix="validate a dense model's serving plan; plan and plan simulate predict this one")


def decode_embed(params: Params, batch: dict[str, jax.Array], cfg: ModelConfig, *, compute_dtype: Any = jnp.bfloat16,
                 constrain: Constrain = _keep, lookup: Lookup = _take) -> jax.Array:
    """The new tokens' embeddings ``[B, D]`` in the compute dtype (learned positions added at ``batch["position"]``)."""
    tokens_Bx1, position = batch["tokens"], batch["position"]
    x_Bx1xD = constrain("residual_BxSxD", lookup(params["embed"]["tokens"], tokens_Bx1).astype(compute_dtype))
    if cfg.positions is Positions.LEARNED:
        x_Bx1xD = x_Bx1xD + jax.lax.dynamic_slice_in_dim(params["embed"]["positions"], position, 1).astype(compute_dtype)[None]
    return x_Bx1xD[:, 0]


def decode_layer(x_BxD: jax.Array, p: Params, k_cache: jax.Array, v_cache: jax.Array, position: jax.Array, cfg: ModelConfig, *,
                 compute_dtype: Any = jnp.bfloat16, constrain: Constrain = _keep,
                 layer: jax.Array | int | None = None) -> tuple[jax.Array, jax.Array, jax.Array]:
    """One layer on one token per sequence against its cache (``layer``: the index into stacked
    caches, `_attend`): the residual stream after it and the caches with the token written."""
    attended_BxD, k_cache, v_cache = _attend(_norm(x_BxD, p["attn_norm"], cfg), p["attn"], k_cache, v_cache, position, cfg,
                                             compute_dtype, constrain, layer)
    x_BxD = x_BxD + attended_BxD
    return x_BxD + _mlp(_norm(x_BxD, p["mlp_norm"], cfg), p["mlp"], cfg, compute_dtype), k_cache, v_cache


def decode_layers(x_BxD: jax.Array, layers: Params, kv_cache: dict[str, Any], position: jax.Array, cfg: ModelConfig, *,
                  compute_dtype: Any = jnp.bfloat16, constrain: Constrain = _keep) -> tuple[jax.Array, dict[str, Any]]:
    """The ``layers`` (a pipeline stage's, or all; served per layer or stacked, module docstring)
    on one token per sequence, against their caches: the residual stream after them and the
    caches with the token's keys and values written at ``position``."""
    def layer(x_BxD: jax.Array, p: Params, k: jax.Array, v: jax.Array, index: jax.Array | None = None) -> tuple[jax.Array, ...]:
        return decode_layer(x_BxD, p, k, v, position, cfg, compute_dtype=compute_dtype, constrain=constrain, layer=index)

    if is_served_per_layer(layers):
        return loop_served_layers(layer, x_BxD, layers, kv_cache)

    # The stacked cache rides in the loop's carry, so each layer writes its one new row in place;
    # as the loop's per-layer inputs and outputs it would be read and written whole on every step.
    def body(carry: tuple[jax.Array, jax.Array, jax.Array], xs: tuple[Params, jax.Array]) -> tuple[tuple[jax.Array, ...], None]:
        p, index = xs
        return layer(*carry[:1], p, *carry[1:], index), None

    indices_L = jnp.arange(kv_cache["k"].shape[0], dtype=jnp.int32)
    (x_BxD, k_LxBxKxTxH, v_LxBxKxTxH), _ = jax.lax.scan(body, (x_BxD, kv_cache["k"], kv_cache["v"]), (layers, indices_L))
    return x_BxD, {"k": k_LxBxKxTxH, "v": v_LxBxKxTxH}


def decode_step(params: Params, kv_cache: dict[str, Any], batch: dict[str, jax.Array], cfg: ModelConfig, *,
                compute_dtype: Any = jnp.bfloat16, constrain: Constrain = _keep,
                lookup: Lookup = _take) -> tuple[jax.Array, dict[str, Any]]:
    """fp32 logits ``[B, V]`` of the next token and the cache with this token's keys and values
    written (module docstring). ``constrain`` pins named activations (``residual_BxSxD``,
    ``kv_cache_BxKxTxH``, ``logits_BxSxV``), ``lookup`` gathers embedding rows, as in training."""
    check_serving_lowered(cfg)
    x_BxD = decode_embed(params, batch, cfg, compute_dtype=compute_dtype, constrain=constrain, lookup=lookup)
    x_BxD, kv_cache = decode_layers(x_BxD, params["layers"], kv_cache, batch["position"], cfg, compute_dtype=compute_dtype,
                                    constrain=constrain)
    return head(x_BxD[:, None], params, cfg, constrain=constrain)[:, 0], kv_cache
