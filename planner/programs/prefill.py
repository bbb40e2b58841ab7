"""A prefill step of the reference transformer: the prompts' forward pass, writing the KV cache.

``prefill_step(params, kv_cache, batch) -> (logits_BxV, kv_cache)``: each of the batch's
sequences brings its prompt (``batch["tokens"]``, ``[B, P]``, all of one length); every
layer runs causal attention over the prompt (the flash kernel of `planner.programs.attention`
by default, so no ``P×P`` matrix exists; or the materialized one) and writes all ``P``
tokens' keys and values into cache slots ``0 … P − 1`` (weights and cache as in
`planner.programs.decode`: served per layer, a layer's cache ``[B, kv_heads, T, head_dim]``, T the
context rounded up to whole blocks; or stacked). Only each sequence's last prompt token goes through the head: its logits
choose the first generated token. Weights are served as stored (`served_dtype_of`) and cast
to the compute dtype on use.

>>> from costmodel.inputs.model_config import ModelConfig
>>> from costmodel.inputs.train_config import TrainConfig
>>> cfg = ModelConfig(name="t", hidden_size=32, num_layers=2, num_heads=4, num_kv_heads=2, ffn_size=64, vocab_size=50)
>>> train = TrainConfig(workload="prefill", global_batch=3, seq_len=40, inference={"prompt_len": 20})
>>> params, cache, batch = abstract_prefill_inputs(cfg, train)
>>> batch["tokens"].shape, cache["k"][0].shape  # a 40-token context in 3 blocks of 16
((3, 20), (3, 2, 48, 8))
>>> logits, new_cache = jax.eval_shape(lambda p, c, b: prefill_step(p, c, b, cfg), params, cache, batch)
>>> logits.shape, logits.dtype  # over the vocabulary padded to 128, the padding masked
((3, 128), dtype('float32'))
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

from costmodel.inputs.model_config import ModelConfig
from costmodel.inputs.train_config import TrainConfig
from planner.programs.decode import abstract_decode_inputs, check_serving_lowered, is_served_per_layer, loop_served_layers
from planner.programs.params import Params
from planner.programs.transformer import Constrain, Lookup, _attend_and_project, _dense_mlp, _keep, _norm, _qkv, _take, embed, head


def abstract_prefill_inputs(cfg: ModelConfig, train: TrainConfig, *, replicas: int = 1,
                            stacked: bool = False) -> tuple[Params, dict[str, Any], dict[str, Any]]:
    """``(params, kv_cache, batch)`` of a prefill step as ``jax.ShapeDtypeStruct``s: weights and
    cache as a decode step takes them, the prompts ``[batch · replicas, prompt_len]``."""
    params, cache, _ = abstract_decode_inputs(cfg, train, replicas=replicas, stacked=stacked)
    return params, cache, {"tokens": jax.ShapeDtypeStruct((train.global_batch * replicas, train.prompt_len), jnp.int32)}


def prefill_layers(x_BxPxD: jax.Array, layers: Params, kv_cache: dict[str, Any], cfg: ModelConfig, *,
                   compute_dtype: Any = jnp.bfloat16, constrain: Constrain = _keep,
                   attention: str = "flash") -> tuple[jax.Array, dict[str, Any]]:
    """The ``layers`` (a pipeline stage's, or all; served per layer or stacked) on the prompts,
    against their caches: the residual stream after them and the caches with every prompt
    token's keys and values written."""
    def write(cache_BxKxTxH: jax.Array, new_BxPxKxH: jax.Array) -> jax.Array:
        new_BxKxPxH = jnp.swapaxes(new_BxPxKxH, 1, 2).astype(cache_BxKxTxH.dtype)
        return constrain("kv_cache_BxKxTxH", cache_BxKxTxH.at[:, :, :new_BxKxPxH.shape[2]].set(new_BxKxPxH))

    def layer(x_BxPxD: jax.Array, p: Params, k_BxKxTxH: jax.Array, v_BxKxTxH: jax.Array) -> tuple[jax.Array, jax.Array, jax.Array]:
        dt = compute_dtype
        q_BxPxKxGxH, k_BxPxKxH, v_BxPxKxH = _qkv(_norm(x_BxPxD, p["attn_norm"], cfg), p["attn"], cfg, dt, constrain)
        attended_BxPxD = _attend_and_project(q_BxPxKxGxH, k_BxPxKxH, v_BxPxKxH, p["attn"], cfg, dt, constrain, attention)
        x_BxPxD = constrain("residual_BxSxD", x_BxPxD + attended_BxPxD)
        x_BxPxD = constrain("residual_BxSxD", x_BxPxD + _dense_mlp(_norm(x_BxPxD, p["mlp_norm"], cfg), p["mlp"], cfg, dt,
                                                                  constrain=constrain))
        return x_BxPxD, write(k_BxKxTxH, k_BxPxKxH), write(v_BxKxTxH, v_BxPxKxH)

    if is_served_per_layer(layers):
        return loop_served_layers(layer, x_BxPxD, layers, kv_cache)

    def body(x_BxPxD: jax.Array, xs: tuple[Params, jax.Array, jax.Array]) -> tuple[jax.Array, tuple[jax.Array, jax.Array]]:
        x_BxPxD, k, v = layer(x_BxPxD, *xs)
        return x_BxPxD, (k, v)

    x_BxPxD, (k_LxBxKxTxH, v_LxBxKxTxH) = jax.lax.scan(body, x_BxPxD, (layers, kv_cache["k"], kv_cache["v"]))
    return x_BxPxD, {"k": k_LxBxKxTxH, "v": v_LxBxKxTxH}


def prefill_step(params: Params, kv_cache: dict[str, Any], batch: dict[str, jax.Array], cfg: ModelConfig, *,
                 compute_dtype: Any = jnp.bfloat16, constrain: Constrain = _keep, lookup: Lookup = _take,
                 attention: str = "flash") -> tuple[jax.Array, dict[str, Any]]:
    """fp32 logits ``[B, V]`` of each prompt's last token and the cache holding every prompt
    token's keys and values (module docstring). ``constrain`` and ``lookup`` as in training;
    ``attention`` is the kernel, "flash" or "materialized"."""
    check_serving_lowered(cfg)
    x_BxPxD = embed(params, batch["tokens"], cfg, compute_dtype=compute_dtype, constrain=constrain, lookup=lookup)
    x_BxPxD, kv_cache = prefill_layers(x_BxPxD, params["layers"], kv_cache, cfg, compute_dtype=compute_dtype, constrain=constrain,
                                       attention=attention)
    return head(x_BxPxD[:, -1:], params, cfg, constrain=constrain)[:, 0], kv_cache
