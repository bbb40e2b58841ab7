"""The optimizer step fused into the backward pass: each layer's gradient applied as it is formed.

torchtune's single-device full fine-tuning recipe (``optimizer_in_bwd``) registers a hook on
every parameter that steps the optimizer and frees the gradient as soon as autograd forms it,
so a step never holds the whole model's gradients (`costmodel.step.memory`). This is the same
step in JAX, with the stacked layers of `planner.programs.transformer`:

- the forward runs the layers under a scan that keeps each layer's input (full recompute);
- the head's and the loss's gradient is taken, and the head's weights stepped, at once;
- the backward is a reverse scan that recomputes a layer, takes its gradient and applies AdamW
  to its weights and moments there, writing them back into the stacks it carries (in place,
  the stacks being donated);
- the embedding is stepped last (with a tied table, with the head's gradient added).

At most one layer's gradients, or the head's, exist at a time. Only full recompute is lowered:
the forward runs undifferentiated and keeps each layer's input alone; keeping more would mean
stacking each layer's backward residuals by hand (the plain step leaves that to ``lax.scan``'s
own differentiation, which forms the whole model's gradients).

>>> from costmodel.inputs.model_config import ModelConfig
>>> from planner.programs.params import init_params
>>> from planner.programs.train_step import init_opt_state, make_train_step
>>> cfg = ModelConfig(name="t", hidden_size=32, num_layers=2, num_heads=4, ffn_size=64, vocab_size=50)
>>> train = TrainConfig(seq_len=8, global_batch=2, workload="finetune-full", optimizer_in_backward=True)
>>> params = init_params(cfg, jax.random.key(0))
>>> batch = {"tokens": jnp.ones((2, 8), jnp.int32), "targets": jnp.full((2, 8), 3, jnp.int32)}
>>> fused = make_fused_train_step(cfg, train)(params, init_opt_state(params), batch)
>>> plain = make_train_step(cfg, train, remat="full")(params, init_opt_state(params), batch)
>>> all(bool(jnp.allclose(a, b, atol=1e-6)) for a, b in zip(jax.tree.leaves(fused), jax.tree.leaves(plain)))
True
"""

from __future__ import annotations

from typing import Any, Callable

import jax
import jax.numpy as jnp

from costmodel.errors import UnsupportedError
from costmodel.inputs.model_config import ModelConfig
from costmodel.inputs.train_config import TrainConfig
from planner.programs.fp8_linear import fp8_linear
from planner.programs.params import Params
from planner.programs.residuals import from_bits, to_bits
from planner.programs.train_step import MOE_AUX_LOSS_WEIGHT, Batch, adamw_apply, chunked_head_loss
from planner.programs.transformer import embed, layer_body

# Pins the sharding of a tree of one layer's ("layers") or the outer ("outer") weights, or of
# their moments and gradients: the validator keeps weights as the parameters are split and
# moments and gradients as the optimizer state is (ZeRO); identity otherwise.
Shard = Callable[[str, Params], Params]


def _as_computed(kind: str, tree: Params) -> Params:
    return tree


def make_fused_train_step(cfg: ModelConfig, train: TrainConfig, *, attention: str = "materialized",
                          hooks: dict[str, Any] | None = None, loss_chunks: int = 1, as_bits: bool = False,
                          shard_as_weights: Shard = _as_computed, shard_as_moments: Shard = _as_computed) -> Callable[..., Any]:
    """A function ``(params, opt_state, batch) -> (params, opt_state, {"loss": ...})`` with the
    AdamW step fused into the backward (module doc). ``hooks`` are `forward`'s (``constrain``,
    ``lookup``, ``experts``, ``keep_residuals``). 16-bit weights and moments may arrive as integers
    of their width (`planner.programs.residuals.to_bits`) and are returned as they arrived;
    ``as_bits`` also keeps the layers' saved inputs so. The CPU backend's float normalization
    widens a 16-bit stack that a loop writes to fp32; integers it leaves as they are."""
    if not train.workload.trains_base_weights:
        raise UnsupportedError("the optimizer step in backward is lowered for full training only, not adapters",
                               fix="drop --optimizer-in-backward")
    hooks = dict(hooks or {})
    keep_residuals = hooks.pop("keep_residuals", lambda fn: fn)
    lookup = {"lookup": hooks.pop("lookup")} if "lookup" in hooks else {}
    if train.is_fp8:
        hooks["linear"] = fp8_linear
    constrain = {"constrain": hooks["constrain"]} if "constrain" in hooks else {}
    compute_dtype = jnp.dtype(train.compute_dtype.value)
    body = layer_body(cfg, attention=attention, lora_scale=train.workload.adapter_scale, **hooks)
    layer = keep_residuals(body)
    aux_cotangent = jnp.float32(MOE_AUX_LOSS_WEIGHT / cfg.num_layers)
    opt = train.optimizer
    head_keys = ("final_norm", "embed" if cfg.tie_embeddings else "lm_head")

    def step(params: Params, opt_state: dict[str, Any], batch: Batch) -> tuple[Params, dict[str, Any], dict[str, jax.Array]]:
        count = opt_state["step"] + 1
        m, v = dict(opt_state["m"]), dict(opt_state["v"])
        stepped = dict(params)
        outer = {k: jax.tree.map(from_bits, w) for k, w in params.items() if k != "layers"}

        def apply(kind: str, keys: tuple[str, ...], grads: Params) -> None:
            m_keys, v_keys = ({k: jax.tree.map(from_bits, tree[k]) for k in keys} for tree in (m, v))
            weights, m_keys, v_keys = adamw_apply({k: outer[k] for k in keys}, shard_as_moments(kind, grads), m_keys, v_keys,
                                                  count, opt)
            for tree, part in zip((stepped, m, v), (shard_as_weights(kind, weights), m_keys, v_keys)):
                tree.update({k: jax.tree.map(_stored_as, tree[k], part[k]) for k in keys})

        with jax.named_scope("embed"):
            x_BxSxD, embed_backward = jax.vjp(
                lambda table: embed(table, batch["tokens"], cfg, compute_dtype=compute_dtype, **constrain, **lookup),
                {"embed": outer["embed"]})

        def forward(x_BxSxD: jax.Array, layer_params: Params) -> tuple[jax.Array, tuple[jax.Array, jax.Array]]:
            y_BxSxD, aux = body(x_BxSxD, jax.tree.map(from_bits, layer_params))
            return y_BxSxD, (to_bits(x_BxSxD) if as_bits else x_BxSxD, aux)

        y_BxSxD, (inputs_LxBxSxD, aux_L) = jax.lax.scan(forward, x_BxSxD, params["layers"])
        head = {k: outer[k] for k in head_keys}
        if cfg.tie_embeddings:
            head["embed"] = {"tokens": outer["embed"]["tokens"]}
        loss, head_backward = jax.vjp(
            lambda weights, y: chunked_head_loss(y, weights, batch["targets"], cfg, chunks=loss_chunks, **constrain), head, y_BxSxD)
        head_grads, g_BxSxD = head_backward(jnp.ones((), loss.dtype))
        with jax.named_scope("optimizer"):
            apply("outer", ("final_norm",), {"final_norm": head_grads["final_norm"]})
            if not cfg.tie_embeddings:
                apply("outer", ("lm_head",), {"lm_head": head_grads["lm_head"]})

        def backward(carry: tuple[Any, ...], xs: tuple[jax.Array, jax.Array]) -> tuple[tuple[Any, ...], None]:
            g_BxSxD, *stacks = carry
            i, saved_BxSxD = xs
            weights, m_i, v_i = jax.tree.map(lambda stack: from_bits(stack[i]), stacks)
            weights, m_i, v_i = shard_as_weights("layers", weights), shard_as_moments("layers", m_i), shard_as_moments("layers", v_i)
            _, layer_backward = jax.vjp(layer, from_bits(saved_BxSxD), weights)
            g_BxSxD, grads = layer_backward((g_BxSxD, aux_cotangent))
            with jax.named_scope("optimizer"):
                weights, m_i, v_i = adamw_apply(weights, shard_as_moments("layers", grads), m_i, v_i, count, opt)
            new = (shard_as_weights("layers", weights), m_i, v_i)
            stacks = jax.tree.map(lambda stack, x: stack.at[i].set(_stored_as(stack, x)), tuple(stacks), new)
            return (g_BxSxD, *stacks), None

        carry = (g_BxSxD, params["layers"], m["layers"], v["layers"])
        (g_BxSxD, stepped["layers"], m["layers"], v["layers"]), _ = jax.lax.scan(
            backward, carry, (jnp.arange(cfg.num_layers), inputs_LxBxSxD), reverse=True)
        (embed_grads,) = embed_backward(g_BxSxD)
        if cfg.tie_embeddings:
            tokens = embed_grads["embed"]["tokens"] + head_grads["embed"]["tokens"]
            embed_grads = {"embed": {**embed_grads["embed"], "tokens": tokens}}
        with jax.named_scope("optimizer"):
            apply("outer", ("embed",), embed_grads)
        loss = loss + MOE_AUX_LOSS_WEIGHT * aux_L.mean()
        return stepped, {"m": m, "v": v, "step": count}, {"loss": loss}

    return step


def _stored_as(held: jax.Array, x: jax.Array) -> jax.Array:
    """``x`` stored as ``held`` is: as integers where ``held`` holds 16-bit floats so."""
    return to_bits(x) if held.dtype != x.dtype else x
