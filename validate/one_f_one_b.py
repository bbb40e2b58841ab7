"""The 1F1B pipeline schedule as a real JAX program: forward and backward interleaved tick by tick.

Schedule. As GPipe in `validate.pipeline`, inside a ``jax.shard_map`` manual over the plan's
pipeline axis (data, tensor and context axes stay automatic), stage ``s`` of ``S`` holds its
slice of the stacked layers and the batch is cut into ``M`` micro-batches per data replica.
One ``lax.scan`` of ``M + 2(S − 1)`` ticks runs, on every stage and every tick, one forward
and one backward of the stage's layers:

- forward of micro-batch ``f = t − s`` (stage 0 reads it from the embedded batch, the others
  from what their predecessor ``ppermute``d the tick before), by ``jax.vjp`` of the stage's
  layers under the plan's ``jax.checkpoint`` policy;
- on the last stage, the head and the loss of that micro-batch at once, so its cotangent
  exists the tick its forward finishes (every pipeline group computes them on the last
  stage's output, handed round by a ``psum`` over the pipeline axis, as `validate.pipeline`
  does for the whole batch: the head's weights and gradients need no exchange between stages);
- backward of micro-batch ``b = t − 2(S − 1) + s``, whose output cotangent the next stage
  ``ppermute``d back the tick before (on the last stage, the head's), from the residuals its
  forward kept.

Outside ``0 ≤ f < M`` (warm-up, cool-down) or ``0 ≤ b < M`` the work is done on data nobody
reads and masked out of every sum (SPMD: every device runs the same program), so each device
does ``(M + 2S − 2) / M`` times its useful layer work, forward and backward, and runs the head
that many times.

Memory. The stage's layers run one at a time (a ``lax.scan``), each by ``jax.vjp`` of that
layer; the vjp function is a pytree (``jax.tree_util.Partial``) whose leaves are the residuals
the checkpoint policy saves and the layer's weights. The weights (the very arrays the forward
took) are not copied; every other leaf is written in place into ring buffers
``[K, layers, ...]`` of ``K = 2S − 1`` in-flight micro-batches (slot ``f mod K``), and the
backward, again one layer at a time, rebuilds each layer's vjp function from its slot (the
pytree's structure is static) and adds the layer's gradient into its sum in place, so no
whole-stage copy of a micro-batch's residuals or gradients exists beside the buffers and sums.
``K`` is what stage 0 needs (its micro-batch ``f``'s backward comes ``2(S − 1)`` ticks after its
forward, one tick per hop each way in lockstep; stage ``s`` needs ``2(S − s) − 1``, but every
device holds the same buffer). So a stage keeps ``2S − 1`` micro-batches of its layers'
residuals whatever ``M``, where GPipe keeps ``M + S − 1`` and Megatron's 1F1B (whose forward
and backward steps alternate, half a tick apart) ``S − s``. Besides them the program keeps the embedded batch and stage 0's input
cotangents (``M`` micro-batches' activations each, for the embedding's gradient, computed after
the schedule from their sum over the stages) and one micro-batch's logits and their gradient.
On the CPU backend the residuals are the raw 16-bit integers of `validate.lowering.residual_storage`.

Gradients. The stage's layer gradients are summed over the ticks in the parameters' dtype
(fp32, masked outside ``0 ≤ b < M``), the head's likewise (the same on every pipeline group), the embedding's from stage 0's
cotangents. XLA reduces each tick's layer and head gradients over the data axes inside the
tick loop (`validate.predict` counts them per tick).

Interleaved plans (``interleave > 1``) and plans with schedule "gpipe" run `validate.pipeline`'s
GPipe program.
"""

from __future__ import annotations

from functools import partial
from typing import Any, Callable

import jax
import jax.numpy as jnp
from jax.sharding import Mesh, PartitionSpec

from costmodel.errors import UnsupportedError
from costmodel.layout import Schedule
from planner.models.train_step import MOE_AUX_LOSS_WEIGHT, cross_entropy
from planner.models.transformer import embed, head, run_layers
from planner.schema import Plan
from validate.lowering import activation_constraint, embedding_lookup, residual_storage
from validate.pipeline import check_pipeline, runs_outer_whole, stage_slots


def runs_one_f_one_b(plan: Plan) -> bool:
    """Whether the plan's pipeline is lowered as 1F1B (this module) rather than GPipe: a
    pipelined plan whose schedule is not "gpipe" and that is not interleaved."""
    lay = plan.layout
    return lay.pp > 1 and lay.schedule is not Schedule.GPIPE and lay.interleave == 1


def in_flight_slots(stages: int) -> int:
    """Micro-batches of residuals every stage keeps (`K`): stage 0's backward of a micro-batch
    comes ``2(S − 1)`` ticks after its forward.

    >>> in_flight_slots(4)
    7
    """
    return 2 * stages - 1


def one_f_one_b_ticks(micro_batches: int, stages: int) -> int:
    """Ticks of the 1F1B loop: the last backward (stage 0, micro-batch ``M − 1``) runs on tick
    ``M − 1 + 2(S − 1)``.

    >>> one_f_one_b_ticks(8, 4)
    14
    """
    return micro_batches + 2 * (stages - 1)


class _KeptResiduals:
    """A stage's layers run one at a time by ``jax.vjp``, each layer's residuals kept in slot
    ``slot`` of ring buffers ``[K, layers, ...]`` (updated in place), the backward rebuilt
    from them. A vjp function is a pytree whose leaves are its residuals and the weights it
    was given: the weights are not buffered but handed back in the backward, and its
    structure (static) is the one `forward` last traced, so a tick calls `forward` first."""

    def __init__(self, layer_fn: Callable[..., tuple[jax.Array, jax.Array]], layers: Any, slots: int):
        self.layer_fn, self.layers, self.slots = layer_fn, layers, slots
        self.n_layers = jax.tree.leaves(layers)[0].shape[0]
        self.treedef: Any = None
        self.is_weight: list[bool] = []

    def _layer(self, i: jax.Array) -> Any:
        return jax.tree.map(lambda w: jax.lax.dynamic_index_in_dim(w, i, 0, keepdims=True), self.layers)

    def _split(self, backward: Any, layer: Any) -> list[jax.Array]:
        leaves, self.treedef = jax.tree.flatten(backward)
        ids = {id(w) for w in jax.tree.leaves(layer)}
        self.is_weight = [id(leaf) in ids for leaf in leaves]
        if not any(self.is_weight):  # every backward reads its weights: they would be buffered per micro-batch
            raise UnsupportedError("the layer's vjp does not hand back its weights as given, so 1F1B would keep a copy per micro-batch",
                                   fix="validate the plan with schedule gpipe")
        return [leaf for leaf, weight in zip(leaves, self.is_weight) if not weight]

    def empty_buffers(self, x_BxSxD: jax.Array) -> list[jax.Array]:
        """Zeroed ring buffers for the residuals of one layer on ``x_BxSxD``."""
        def residuals(x_BxSxD: jax.Array, layer: Any) -> list[jax.Array]:
            return self._split(jax.vjp(self.layer_fn, x_BxSxD, layer)[1], layer)

        shapes = jax.eval_shape(residuals, x_BxSxD, jax.tree.map(lambda w: w[:1], self.layers))
        return [jnp.zeros((self.slots, self.n_layers, *r.shape), r.dtype) for r in shapes]

    def forward(self, x_BxSxD: jax.Array, buffers: list[jax.Array], slot: jax.Array) -> tuple[jax.Array, jax.Array, list[jax.Array]]:
        """The stage's output and MoE losses ``[layers]``, the residuals written into ``slot``."""
        def one(carry: tuple[jax.Array, list[jax.Array]], i: jax.Array) -> tuple[tuple[jax.Array, list[jax.Array]], jax.Array]:
            x_BxSxD, buffers = carry
            layer = self._layer(i)
            (y_BxSxD, aux_1), backward = jax.vjp(self.layer_fn, x_BxSxD, layer)
            buffers = [jax.lax.dynamic_update_slice(buf, leaf[None, None], (slot, i, *(0,) * leaf.ndim))
                       for buf, leaf in zip(buffers, self._split(backward, layer))]
            return (y_BxSxD, buffers), aux_1[0]

        (y_BxSxD, buffers), aux_W = jax.lax.scan(one, (x_BxSxD, buffers), jnp.arange(self.n_layers))
        return y_BxSxD, aux_W, buffers

    def backward(self, d_y_BxSxD: jax.Array, d_aux_W: jax.Array, buffers: list[jax.Array], slot: jax.Array, d_layers: Any,
                 useful: jax.Array) -> tuple[jax.Array, Any]:
        """The stage input's cotangent, and ``d_layers`` plus (where ``useful``) the layers' gradients."""
        def one(carry: tuple[jax.Array, Any], i: jax.Array) -> tuple[tuple[jax.Array, Any], None]:
            d_y_BxSxD, d_layers = carry
            read = iter(buf[slot, i] for buf in buffers)
            weights = iter(jax.tree.leaves(self._layer(i)))
            backward = jax.tree.unflatten(self.treedef, [next(weights) if w else next(read) for w in self.is_weight])
            d_x_BxSxD, d_layer = backward((d_y_BxSxD, d_aux_W[i][None]))
            d_layers = jax.tree.map(lambda acc, d: jax.lax.dynamic_update_index_in_dim(
                acc, acc[i] + jnp.where(useful, d[0], 0).astype(acc.dtype), i, 0), d_layers, d_layer)
            return (d_x_BxSxD, d_layers), None

        (d_x_BxSxD, d_layers), _ = jax.lax.scan(one, (d_y_BxSxD, d_layers), jnp.arange(self.n_layers), reverse=True)
        return d_x_BxSxD, d_layers


def _varying(x: jax.Array, axes: tuple[str, ...]) -> jax.Array:
    """``x`` marked as differing between the devices of ``axes`` (unless it is already)."""
    missing = tuple(a for a in axes if a not in jax.typeof(x).manual_axis_type.varying)
    return jax.lax.pcast(x, missing, to="varying") if missing else x


def one_f_one_b_loss_and_grads(plan: Plan, mesh: Mesh, *, remat: str) -> Callable[..., Any]:
    """``(params, batch) -> (mean loss, gradients)`` of the plan's 1F1B schedule (see the module
    docstring); ``remat`` is the reference model's recompute policy."""
    axes = check_pipeline(plan)
    model, train, stages = plan.model, plan.train, plan.layout.pp
    micro = plan.layout.micro_batches(train)
    slots, ticks = in_flight_slots(stages), one_f_one_b_ticks(micro, stages)
    forward_sends = [(i, i + 1) for i in range(stages - 1)]
    backward_sends = [(i + 1, i) for i in range(stages - 1)]
    dt = jnp.dtype(train.compute_dtype.value)
    layer_P, live_P = stage_slots(model.num_layers, plan.layout)
    padded = len(layer_P) != model.num_layers or not live_P.all()
    constrain, lookup, keep_residuals = activation_constraint(plan, mesh), embedding_lookup(plan, mesh), residual_storage(mesh)
    aux_weight = MOE_AUX_LOSS_WEIGHT / (micro * model.num_layers)
    head_keys = ("final_norm", "embed" if model.tie_embeddings else "lm_head")

    def layer_forward(x_BxSxD: jax.Array, layer: Any) -> tuple[jax.Array, jax.Array]:
        # One layer (a stack of one, so the plan's checkpoint policy and residual storage apply as in run_layers).
        y_BxSxD, aux_1 = run_layers(x_BxSxD, layer, model, remat=remat, attention=plan.layout.stack.attention.value,
                                    keep_residuals=keep_residuals)
        return y_BxSxD, _varying(aux_1, axes)  # a dense model's constant zeros too, as their cotangent is

    def head_loss(head_params: Any, y_BxSxD: jax.Array, targets_BxS: jax.Array) -> jax.Array:
        return cross_entropy(head(y_BxSxD, head_params, model, constrain=constrain), targets_BxS)

    def schedule(layers: Any, live_W: jax.Array, head_params: Any, x_MxBxSxD: jax.Array, targets_MxBxS: jax.Array) -> tuple[Any, ...]:
        stage = jax.lax.axis_index(axes)
        first, last = stage == 0, stage == stages - 1
        # A carry that differs between stages is marked varying over the pipeline axes, as scan needs.
        varying = partial(_varying, axes=axes)
        x_MxBxSxD = varying(x_MxBxSxD)
        kept = _KeptResiduals(layer_forward, layers, slots)
        buffers = [varying(b) for b in kept.empty_buffers(x_MxBxSxD[0].astype(dt))]

        def tick(carry: tuple[Any, ...], t: jax.Array) -> tuple[tuple[Any, ...], None]:
            received_BxSxD, cotangent_BxSxD, buffers, d_layers, d_head, d_x_MxBxSxD, loss, aux = carry
            f, b, h = t - stage, t - 2 * (stages - 1) + stage, t - (stages - 1)  # forward, backward, head micro-batches
            forward_useful, backward_useful, head_useful = ((0 <= i) & (i < micro) for i in (f, b, h))
            x_BxSxD = jnp.where(first, x_MxBxSxD[jnp.clip(f, 0, micro - 1)], received_BxSxD)
            y_BxSxD, aux_W, buffers = kept.forward(x_BxSxD, buffers, jnp.mod(f, slots))
            aux = aux + jnp.where(forward_useful, (aux_W * live_W).sum(), 0.0)

            # Head and loss on the last stage's output, on every pipeline group (fp32 sum: see `validate.pipeline`).
            y_last_BxSxD = jax.lax.psum(jnp.where(last, y_BxSxD, 0).astype(jnp.float32), axes).astype(dt)
            targets_BxS = targets_MxBxS[jnp.clip(h, 0, micro - 1)]
            loss_mb, head_backward = jax.vjp(lambda p, y: head_loss(p, y, targets_BxS), head_params, y_last_BxSxD)
            d_head_mb, d_y_BxSxD = head_backward(jnp.asarray(1.0 / micro, loss_mb.dtype))
            loss = loss + jnp.where(head_useful, loss_mb / micro, 0.0)
            d_head = jax.tree.map(lambda acc, d: acc + jnp.where(head_useful, d, 0).astype(acc.dtype), d_head, d_head_mb)

            d_out_BxSxD = jnp.where(last, d_y_BxSxD, cotangent_BxSxD)
            d_x_BxSxD, d_layers = kept.backward(d_out_BxSxD, live_W * aux_weight, buffers, jnp.mod(b, slots), d_layers, backward_useful)
            b_index = jnp.clip(b, 0, micro - 1)
            d_x_MxBxSxD = d_x_MxBxSxD.at[b_index].set(jnp.where(first & backward_useful, d_x_BxSxD, d_x_MxBxSxD[b_index]))
            sent_BxSxD = jax.lax.ppermute(y_BxSxD, axes, forward_sends)
            sent_back_BxSxD = jax.lax.ppermute(d_x_BxSxD, axes, backward_sends)
            return (sent_BxSxD, sent_back_BxSxD, buffers, d_layers, d_head, d_x_MxBxSxD, loss, aux), None

        zero_act = varying(jnp.zeros(x_MxBxSxD.shape[1:], dt))
        d_layers = jax.tree.map(lambda w: varying(jnp.zeros(w.shape, w.dtype)), layers)
        init = (zero_act, zero_act, buffers, d_layers, jax.tree.map(jnp.zeros_like, head_params),
                varying(jnp.zeros(x_MxBxSxD.shape, dt)), jnp.zeros((), jnp.float32), varying(jnp.zeros((), jnp.float32)))
        (_, _, _, d_layers, d_head, d_x_MxBxSxD, loss, aux), _ = jax.lax.scan(tick, init, jnp.arange(ticks))
        d_x_MxBxSxD = jax.lax.psum(jnp.where(first, d_x_MxBxSxD, 0).astype(jnp.float32), axes)
        return loss + aux_weight * jax.lax.psum(aux, axes), d_layers, d_head, d_x_MxBxSxD

    whole, split = PartitionSpec(), PartitionSpec(axes)
    piped = jax.shard_map(schedule, mesh=mesh, in_specs=(split, split, whole, whole, whole), out_specs=(whole, split, whole, whole),
                          axis_names=set(axes))

    def embedding(outer: Any, tokens_GxS: jax.Array) -> jax.Array:
        return embed(outer, tokens_GxS, model, compute_dtype=dt, constrain=constrain, lookup=lookup)

    if runs_outer_whole(plan):
        embedding = jax.shard_map(embedding, mesh=mesh, in_specs=whole, out_specs=whole, axis_names=set(axes))

    def pad(layers: Any) -> Any:
        return jax.tree.map(lambda w: jnp.take(w, layer_P, axis=0) * live_P.reshape(-1, *(1,) * (w.ndim - 1)), layers)

    def loss_and_grads(params: Any, batch: dict[str, jax.Array]) -> tuple[jax.Array, Any]:
        outer = {k: v for k, v in params.items() if k != "layers"}
        layers, pad_backward = jax.vjp(pad if padded else lambda w: w, params["layers"])
        x_GxSxD, embed_backward = jax.vjp(lambda o: embedding(o, batch["tokens"]), outer)
        g, s, d = x_GxSxD.shape
        # Micro-batch index minor within each data shard, as in gradient accumulation: no data moves.
        x_MxBxSxD = jnp.moveaxis(x_GxSxD.reshape(g // micro, micro, s, d), 1, 0)
        targets_MxBxS = jnp.moveaxis(batch["targets"].reshape(g // micro, micro, s), 1, 0)
        # Only the head's weights enter the schedule: its gradient sum is carried through every tick.
        head_params = {k: outer[k] for k in head_keys}
        loss, d_layers, d_head, d_x_MxBxSxD = piped(layers, jnp.asarray(live_P, jnp.float32), head_params, x_MxBxSxD, targets_MxBxS)
        d_x_GxSxD = jnp.moveaxis(d_x_MxBxSxD, 0, 1).reshape(g, s, d).astype(x_GxSxD.dtype)
        (d_outer,) = embed_backward(d_x_GxSxD)
        (d_layers,) = pad_backward(d_layers)
        d_outer = {k: jax.tree.map(jnp.add, d, d_head[k]) if k in d_head else d for k, d in d_outer.items()}
        return loss, {**d_outer, "layers": d_layers}

    return loss_and_grads
