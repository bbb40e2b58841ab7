"""Gradients added into an accumulator layer by layer, inside the backward.

`planner.programs.train_step.make_loss_and_grads` sums micro-batches' gradients after each
micro-batch's whole backward: autodiff of the layer scan stacks every layer's gradient, in the
compute dtype, beside the fp32 accumulator they are then added to (16.4 GiB at llama3-70b tp8).
Here the backward is a reverse scan of its own that carries the accumulator and adds each
layer's gradient into its row as it is formed (in place: the accumulator is the loop's carry), so
one layer's gradient exists at a time, as under Megatron-LM's gradient-accumulation fusion
(whose weight-gradient GEMMs add into ``main_grad`` themselves; here the add is still a kernel
of its own).

The forward scan keeps what each layer's backward needs as ``jax.vjp`` leaves it, under the
layer's checkpoint policy (what `planner.programs.transformer.run_layers` keeps), stacked by the
scan; a residual that is the layer's weight itself is not stacked again but read from the
weights in the backward.

>>> from costmodel.inputs.model_config import ModelConfig
>>> from costmodel.inputs.train_config import TrainConfig
>>> from planner.programs.params import init_params
>>> from planner.programs.train_step import make_value_and_grad
>>> cfg = ModelConfig(name="t", hidden_size=32, num_layers=2, num_heads=4, ffn_size=64, vocab_size=50)
>>> train = TrainConfig(seq_len=8, global_batch=2)
>>> params = init_params(cfg, jax.random.key(0))
>>> batch = {"tokens": jnp.ones((2, 8), jnp.int32), "targets": jnp.full((2, 8), 3, jnp.int32)}
>>> acc = jax.tree.map(lambda p: jnp.ones(p.shape, jnp.float32), params)
>>> loss, summed = make_accumulating_value_and_grad(cfg, train)(params, batch, acc)
>>> want_loss, grads = make_value_and_grad(cfg, train)(params, batch, None)
>>> bool(loss == want_loss), all(bool(jnp.allclose(s, 1 + g, atol=1e-6)) for s, g in zip(jax.tree.leaves(summed), jax.tree.leaves(grads)))
(True, True)
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
from planner.programs.train_step import MOE_AUX_LOSS_WEIGHT, Batch, chunked_head_loss
from planner.programs.transformer import REMAT_POLICIES, embed, layer_body


def make_accumulating_value_and_grad(cfg: ModelConfig, train: TrainConfig, *, remat: str = "none", attention: str = "materialized",
                                     hooks: dict[str, Any] | None = None,
                                     loss_chunks: int = 1) -> Callable[[Params, Batch, Params], tuple[jax.Array, Params]]:
    """``(params, batch, acc) -> (mean loss, acc + gradients)`` of one (micro-)batch, each layer's
    gradient added into ``acc`` (the accumulator, in its own dtype) inside the backward (module doc).
    ``hooks`` are `planner.programs.transformer.forward`'s; full training only (not adapters)."""
    if not train.workload.trains_base_weights:
        raise UnsupportedError("gradients accumulated layer by layer are lowered for full training, not adapters",
                               fix="plan the adapters with one micro-batch, or without data parallelism")
    hooks = dict(hooks or {})
    keep_residuals = hooks.pop("keep_residuals", lambda fn: fn)
    front_hooks = {k: hooks[k] for k in ("constrain", "lookup") if k in hooks}
    if train.is_fp8:
        hooks["linear"] = fp8_linear
    body = layer_body(cfg, attention=attention, lora_scale=train.workload.adapter_scale,
                      **{k: v for k, v in hooks.items() if k != "lookup"})
    layer = keep_residuals(jax.checkpoint(body, policy=REMAT_POLICIES[remat]))
    compute_dtype = jnp.dtype(train.compute_dtype.value)
    aux_cotangent = jnp.float32(MOE_AUX_LOSS_WEIGHT / cfg.num_layers)
    weights = hooks.get("weights", lambda kind, held: held)

    def value_and_grad(params: Params, batch: Batch, acc: Params) -> tuple[jax.Array, Params]:
        held = {k: v for k, v in params.items() if k != "layers"}

        def front(held: Params) -> tuple[jax.Array, Params]:
            outer = weights("outer", held)
            return embed(outer, batch["tokens"], cfg, compute_dtype=compute_dtype, **front_hooks), outer

        (x_BxSxD, outer), front_backward = jax.vjp(front, held)
        saved_form: dict[str, Any] = {}  # the vjp closure's tree, and which of its leaves are the layer's weights

        def forward(x_BxSxD: jax.Array, layer_params: Params) -> tuple[jax.Array, tuple[jax.Array, list[jax.Array]]]:
            (y_BxSxD, aux), backward = jax.vjp(layer, x_BxSxD, layer_params)
            leaves, saved_form["tree"] = jax.tree.flatten(backward)
            weight_ids = {id(w): i for i, w in enumerate(jax.tree.leaves(layer_params))}
            saved_form["weight_at"] = [weight_ids.get(id(r)) for r in leaves]
            return y_BxSxD, (aux, [r for r, w in zip(leaves, saved_form["weight_at"]) if w is None])

        y_BxSxD, (aux_L, kept) = jax.lax.scan(forward, x_BxSxD, params["layers"])
        loss, head_backward = jax.vjp(
            lambda outer, y: chunked_head_loss(y, outer, batch["targets"], cfg, chunks=loss_chunks, constrain=hooks.get("constrain")),
            outer, y_BxSxD)
        d_outer, g_BxSxD = head_backward(jnp.ones((), loss.dtype))

        def backward(carry: tuple[jax.Array, Params], xs: tuple[jax.Array, list[jax.Array]]) -> tuple[tuple[jax.Array, Params], None]:
            g_BxSxD, acc_layers = carry
            i, residuals = xs
            stored = jax.tree.leaves(jax.tree.map(lambda w: w[i], params["layers"]))
            saved = iter(residuals)
            leaves = [next(saved) if w is None else stored[w] for w in saved_form["weight_at"]]
            g_BxSxD, grads = jax.tree.unflatten(saved_form["tree"], leaves)((g_BxSxD, aux_cotangent))
            acc_layers = jax.tree.map(lambda a, d: a.at[i].add(d.astype(a.dtype)), acc_layers, grads)
            return (g_BxSxD, acc_layers), None

        (g_BxSxD, acc_layers), _ = jax.lax.scan(backward, (g_BxSxD, acc["layers"]), (jnp.arange(cfg.num_layers), kept), reverse=True)
        (d_held,) = front_backward((g_BxSxD, d_outer))
        summed = {k: jax.tree.map(lambda a, d: a + d.astype(a.dtype), acc[k], d_held[k]) for k in held}
        return loss + MOE_AUX_LOSS_WEIGHT * aux_L.mean(), {**summed, "layers": acc_layers}

    return value_and_grad
