"""The interleaved 1F1B pipeline schedule as a real JAX program: forward and backward tick by tick.

`validate.lowering` runs this program for interleaved plans (``v > 1``); without interleaving it
runs `validate.split_backward`, which keeps ``S`` micro-batches in flight where this schedule's
``v = 1`` case, described first below, keeps ``2S − 1`` and pays twice 1F1B's bubble.

Schedule. As GPipe in `validate.gpipe`, inside a ``jax.shard_map`` manual over the plan's
pipeline axis (data, tensor and context axes stay automatic), stage ``s`` of ``S`` holds its
slice of the stacked layers and the batch is cut into ``M`` micro-batches per data replica.
One ``lax.scan`` of ``M + 2(S − 1)`` ticks runs, on every stage and every tick, one forward
and one backward of the stage's layers:

- forward of micro-batch ``f = t − s`` (stage 0 reads it from the embedded batch, the others
  from what their predecessor ``ppermute``d the tick before), by ``jax.vjp``;
- on the last stage, the head and the loss of that micro-batch at once, so its cotangent
  exists the tick its forward finishes (every pipeline group computes them on the last
  stage's output, handed round by a ``psum`` over the pipeline axis, so the head's weights
  and gradients need no exchange between stages);
- backward of micro-batch ``b = t − 2(S − 1) + s``, whose output cotangent the next stage
  ``ppermute``d back the tick before (on the last stage, the head's), from the residuals its
  forward kept.

Outside ``0 ≤ f < M`` (warm-up, cool-down) or ``0 ≤ b < M`` the work is done on data nobody
reads and masked out of every sum (SPMD: every device runs the same program), so each device
does ``(M + 2S − 2) / M`` times its useful layer work, forward and backward, and runs the head
that many times.

Interleaved (``interleave = v > 1``, Megatron's virtual stages, stored device-major as
`validate.gpipe.interleaved_layer_order` says): ticks carry one chunk each. The forward runs
GPipe's ring order (`validate.gpipe.work_item`: item ``t − d`` on device ``d``); the
backward runs the same order with the chunks reversed, item ``t − lag − (S − 1 − d)``
(`costmodel.step.lockstep.backward_lag_ticks`: ``(v − 1)·S + S − 1``), its cotangents on the reverse ring (device 0's
first chunk back round to the last device's previous chunk), so the last device's backward
of a micro-batch's last chunk runs the tick its forward and head do. ``M·v + (v + 1)·S − 2``
ticks in all; with ``v = 1`` this is the schedule above.

Memory. A chunk's layers run one at a time (a ``lax.scan``), each by ``jax.vjp`` of that layer
under the plan's ``jax.checkpoint`` policy; the vjp function is a pytree
(``jax.tree_util.Partial``) whose leaves are the residuals the policy saves and the layer's
weights. The weights (the very arrays the forward took) are not copied; every other leaf is
written in place into ring buffers ``[K, layers per chunk, ...]``, slot ``w mod K`` for
forward item ``w``, and the backward, again one layer at a time, rebuilds each layer's vjp
function from its slot (the pytree's structure is static) and adds the layer's gradient into
its sum in place: no whole-stage copy of a micro-batch's residuals or gradients exists beside
the buffers and sums. ``K = 2v·S − 1`` is what device 0 needs (its first chunk of a
micro-batch is backpropagated ``2(v·S − 1)`` ticks after its forward, one tick per hop each way
in lockstep; device ``d``'s chunk ``c`` needs ``2(v − 1 − c)·S + 2(S − 1 − d) + 1``, but every
device holds the same buffers; in a ring of ``2v·S − 1`` the bubble ticks' writes land where
no item in flight is). With fewer items (``M·v < 2v·S − 1``) the ring holds all ``M·v`` and
bubble ticks write into one more slot (`costmodel.step.lockstep.interleaved_in_flight_slots`). Without interleaving a stage so
keeps ``min(2S − 1, M + 1)`` micro-batches of its layers' residuals whatever ``M``, where GPipe
keeps ``M + S − 1`` and Megatron's 1F1B (whose forward and backward steps alternate, half a
tick apart) ``S − s``; interleaved, ``min(2v·S − 1, M·v + 1)`` chunks (about ``2S`` micro-batches
of the stage's layers), where GPipe keeps ``M·v + S − 1``. Besides them the program keeps the embedded batch and stage 0's input
cotangents (``M`` micro-batches' activations each, for the embedding's gradient, computed
after the schedule from their sum over the stages) and one micro-batch's logits and their
gradient. On the CPU backend the residuals are the raw 16-bit integers of
`validate.lowering.residual_storage`.

Gradients. The layer gradients are summed over the ticks in the parameters' dtype (fp32,
masked outside real backward items), the head's likewise (the same on every pipeline group),
the embedding's from stage 0's cotangents. XLA reduces each tick's layer and head gradients
over the data axes inside the tick loop (`validate.predict` counts them per tick).

Plans with schedule "gpipe" run `validate.gpipe`'s GPipe program.
"""

from __future__ import annotations

from functools import partial
from typing import Any, Callable

import jax
import jax.numpy as jnp
from jax.sharding import Mesh, PartitionSpec

from costmodel.errors import UnsupportedError
from costmodel.inputs.layout import Schedule
from costmodel.step.lockstep import backward_lag_ticks, interleaved_in_flight_slots, one_f_one_b_ticks, ring_slots
from planner.plan_schema import Plan
from planner.programs.train_step import MOE_AUX_LOSS_WEIGHT, chunked_head_loss
from planner.programs.transformer import embed, run_layers
from validate.gpipe import check_pipeline, runs_outer_whole, stage_slots, work_item
from validate.mesh_hooks import activation_constraint, embedding_lookup, residual_storage


def runs_one_f_one_b(plan: Plan) -> bool:
    """Whether the plan's pipeline is lowered as 1F1B rather than GPipe: a pipelined plan whose
    schedule is not "gpipe" (interleaved by this module, otherwise by `validate.split_backward`)."""
    return plan.layout.pp > 1 and plan.layout.schedule is not Schedule.GPIPE


class KeptResiduals:
    """A stage's layers run one at a time by ``jax.vjp``, each layer's residuals kept in slot
    ``slot`` of ring buffers ``[K, layers, ...]`` (updated in place), the backward rebuilt
    from them. A vjp function is a pytree whose leaves are its residuals and the weights it
    was given: the weights are not buffered but handed back in the backward, and its
    structure (static) is the one `forward` last traced, so a tick calls `forward` first."""

    def __init__(self, layer_fn: Callable[..., tuple[jax.Array, jax.Array]], layers_VxW: Any, slots: int):
        self.layer_fn, self.layers_VxW, self.slots = layer_fn, layers_VxW, slots
        self.n_layers = jax.tree.leaves(layers_VxW)[0].shape[1]  # per chunk
        self.treedef: Any = None
        self.weight_index: list[int | None] = []  # per vjp leaf: which of the layer's leaves it is, if any

    def _layer(self, chunk: jax.Array, i: jax.Array) -> Any:
        return jax.tree.map(lambda w: jax.lax.dynamic_slice_in_dim(w[chunk], i, 1, 0), self.layers_VxW)

    def split(self, backward: Any, layer: Any) -> list[jax.Array]:
        """The leaves of ``backward`` (a layer's vjp function) that are residuals, not ``layer``'s weights."""
        leaves, self.treedef = jax.tree.flatten(backward)
        index = {id(w): k for k, w in enumerate(jax.tree.leaves(layer))}
        self.weight_index = [index.get(id(leaf)) for leaf in leaves]
        if all(k is None for k in self.weight_index):  # every backward reads its weights: they would be buffered per micro-batch
            raise UnsupportedError("the layer's vjp does not hand back its weights as given, so 1F1B would keep a copy per micro-batch",
                                   fix="validate the plan with schedule gpipe")
        return [leaf for leaf, k in zip(leaves, self.weight_index) if k is None]

    def empty_buffers(self, x_BxSxD: jax.Array) -> list[jax.Array]:
        """Zeroed ring buffers for the residuals of one layer on ``x_BxSxD``."""
        def residuals(x_BxSxD: jax.Array, layer: Any) -> list[jax.Array]:
            return self.split(jax.vjp(self.layer_fn, x_BxSxD, layer)[1], layer)

        shapes = jax.eval_shape(residuals, x_BxSxD, jax.tree.map(lambda w: w[0, :1], self.layers_VxW))
        return [jnp.zeros((self.slots, self.n_layers, *r.shape), r.dtype) for r in shapes]

    def rebuild(self, residuals: list[jax.Array], layer: Any) -> Any:
        """The layer's vjp function from its ``residuals`` (as `split` gave them) and its weights ``layer``."""
        read, weights = iter(residuals), jax.tree.leaves(layer)
        return jax.tree.unflatten(self.treedef, [next(read) if k is None else weights[k] for k in self.weight_index])

    def forward(self, x_BxSxD: jax.Array, buffers: list[jax.Array], chunk: jax.Array, slot: jax.Array
                ) -> tuple[jax.Array, jax.Array, list[jax.Array]]:
        """The chunk's output and MoE losses ``[layers]``, the residuals written into ``slot``."""
        def one(carry: tuple[jax.Array, list[jax.Array]], i: jax.Array) -> tuple[tuple[jax.Array, list[jax.Array]], jax.Array]:
            x_BxSxD, buffers = carry
            layer = self._layer(chunk, i)
            (y_BxSxD, aux_1), backward = jax.vjp(self.layer_fn, x_BxSxD, layer)
            buffers = [jax.lax.dynamic_update_slice(buf, leaf[None, None], (slot, i, *(0,) * leaf.ndim))
                       for buf, leaf in zip(buffers, self.split(backward, layer))]
            return (y_BxSxD, buffers), aux_1[0]

        (y_BxSxD, buffers), aux_W = jax.lax.scan(one, (x_BxSxD, buffers), jnp.arange(self.n_layers))
        return y_BxSxD, aux_W, buffers

    def backward(self, d_y_BxSxD: jax.Array, d_aux_W: jax.Array, buffers: list[jax.Array], chunk: jax.Array, slot: jax.Array, *,
                 d_layers_VxW: Any, useful: jax.Array) -> tuple[jax.Array, Any]:
        """The chunk input's cotangent, and ``d_layers_VxW`` plus (where ``useful``) the chunk's layers' gradients."""
        def one(carry: tuple[jax.Array, Any], i: jax.Array) -> tuple[tuple[jax.Array, Any], None]:
            d_y_BxSxD, d_layers = carry
            backward = self.rebuild([buf[slot, i] for buf in buffers], self._layer(chunk, i))
            d_x_BxSxD, d_layer = backward((d_y_BxSxD, d_aux_W[i][None]))
            d_layers = jax.tree.map(lambda acc, d: acc.at[chunk, i].add(jnp.where(useful, d[0], 0).astype(acc.dtype)), d_layers, d_layer)
            return (d_x_BxSxD, d_layers), None

        (d_x_BxSxD, d_layers), _ = jax.lax.scan(one, (d_y_BxSxD, d_layers_VxW), jnp.arange(self.n_layers), reverse=True)
        return d_x_BxSxD, d_layers


def mark_varying(x: jax.Array, axes: tuple[str, ...]) -> jax.Array:
    """``x`` marked as differing between the devices of ``axes`` (unless it is already)."""
    missing = tuple(a for a in axes if a not in jax.typeof(x).manual_axis_type.varying)
    return jax.lax.pcast(x, missing, to="varying") if missing else x


def one_f_one_b_loss_and_grads(plan: Plan, mesh: Mesh, *, remat: str) -> Callable[..., Any]:
    """``(params, batch) -> (mean loss, gradients)`` of the plan's 1F1B schedule (see the module
    docstring); ``remat`` is the reference model's recompute policy."""
    axes = check_pipeline(plan)
    model, train, stages, chunks = plan.model, plan.train, plan.layout.pp, plan.layout.interleave
    micro = plan.layout.micro_batches(train)
    items, lag = micro * chunks, backward_lag_ticks(stages, chunks)
    ring, slots = ring_slots(stages, chunks, micro), interleaved_in_flight_slots(stages, chunks, micro)
    ticks = one_f_one_b_ticks(micro, stages, chunks)
    # Stage to stage; interleaved, a ring: the last device's output wraps round to device 0 for the next chunk.
    forward_sends = [(i, (i + 1) % stages) for i in range(stages if chunks > 1 else stages - 1)]
    backward_sends = [(j, i) for i, j in forward_sends]
    dt = jnp.dtype(train.compute_dtype.value)
    constrain, keep_residuals = activation_constraint(plan, mesh), residual_storage(mesh)
    aux_weight = MOE_AUX_LOSS_WEIGHT / (micro * model.num_layers)

    def layer_forward(x_BxSxD: jax.Array, layer: Any) -> tuple[jax.Array, jax.Array]:
        # One layer (a stack of one, so the plan's checkpoint policy and residual storage apply as in run_layers).
        y_BxSxD, aux_1 = run_layers(x_BxSxD, layer, model, remat=remat, attention=plan.layout.stack.attention.value,
                                    keep_residuals=keep_residuals)
        return y_BxSxD, mark_varying(aux_1, axes)  # a dense model's constant zeros too, as their cotangent is

    def head_loss(head_params: Any, y_BxSxD: jax.Array, targets_BxS: jax.Array) -> jax.Array:
        return chunked_head_loss(y_BxSxD, head_params, targets_BxS, model, chunks=plan.layout.stack.cross_entropy_chunks,
                                 constrain=constrain)

    def item(w: jax.Array) -> tuple[jax.Array, jax.Array, jax.Array]:
        """Whether work item ``w`` is real, its chunk and its micro-batch."""
        return (0 <= w) & (w < items), *work_item(jnp.clip(w, 0, items - 1), stages=stages, chunks=chunks)

    def schedule(layers: Any, live_W: jax.Array, head_params: Any, x_MxBxSxD: jax.Array, targets_MxBxS: jax.Array) -> tuple[Any, ...]:
        stage = jax.lax.axis_index(axes)
        first, last = stage == 0, stage == stages - 1
        # A carry that differs between stages is marked varying over the pipeline axes, as scan needs.
        varying = partial(mark_varying, axes=axes)
        x_MxBxSxD = varying(x_MxBxSxD)
        # This device's slots as [chunk, slot]: its chunks are contiguous in the stack.
        kept = KeptResiduals(layer_forward, jax.tree.map(lambda w: w.reshape(chunks, -1, *w.shape[1:]), layers), slots)
        live_VxW = live_W.reshape(chunks, -1)
        buffers = [varying(b) for b in kept.empty_buffers(x_MxBxSxD[0].astype(dt))]

        def tick(carry: tuple[Any, ...], t: jax.Array) -> tuple[tuple[Any, ...], None]:
            received_BxSxD, cotangent_BxSxD, buffers, d_layers_VxW, d_head, d_x_MxBxSxD, loss, aux = carry
            forward_useful, chunk, mb = item(t - stage)
            x_BxSxD = jnp.where(first & (chunk == 0), x_MxBxSxD[mb], received_BxSxD)
            write_slot = jnp.where(forward_useful | (slots == ring), jnp.mod(t - stage, ring), slots - 1)
            y_BxSxD, aux_W, buffers = kept.forward(x_BxSxD, buffers, chunk, write_slot)
            aux = aux + jnp.where(forward_useful, (aux_W * live_VxW[chunk]).sum(), 0.0)

            # Head and loss where the last device finishes a micro-batch's last chunk, on every pipeline
            # group (fp32 sum: see `validate.gpipe`).
            head_useful, head_chunk, head_mb = item(t - (stages - 1))
            head_useful = head_useful & (head_chunk == chunks - 1)
            y_last_BxSxD = jax.lax.psum(jnp.where(last, y_BxSxD, 0).astype(jnp.float32), axes).astype(dt)
            loss_mb, head_backward = jax.vjp(lambda p, y: head_loss(p, y, targets_MxBxS[head_mb]), head_params, y_last_BxSxD)
            d_head_mb, d_y_BxSxD = head_backward(jnp.asarray(1.0 / micro, loss_mb.dtype))
            loss = loss + jnp.where(head_useful, loss_mb / micro, 0.0)
            d_head = jax.tree.map(lambda acc, d: acc + jnp.where(head_useful, d, 0).astype(acc.dtype), d_head, d_head_mb)

            # Backward items run the work order with the chunks reversed, from the last device down.
            backward_useful, reversed_chunk, b_mb = item(t - lag - (stages - 1 - stage))
            b_chunk = chunks - 1 - reversed_chunk
            b_slot = jnp.mod((b_mb // stages) * stages * chunks + b_chunk * stages + b_mb % stages, ring)  # its forward item
            d_out_BxSxD = jnp.where(last & (b_chunk == chunks - 1), d_y_BxSxD, cotangent_BxSxD)
            d_x_BxSxD, d_layers_VxW = kept.backward(d_out_BxSxD, live_VxW[b_chunk] * aux_weight, buffers, b_chunk, b_slot,
                                                    d_layers_VxW=d_layers_VxW, useful=backward_useful)
            embedded = first & (b_chunk == 0) & backward_useful
            d_x_MxBxSxD = d_x_MxBxSxD.at[b_mb].set(jnp.where(embedded, d_x_BxSxD, d_x_MxBxSxD[b_mb]))
            sent_BxSxD = jax.lax.ppermute(y_BxSxD, axes, forward_sends)
            sent_back_BxSxD = jax.lax.ppermute(d_x_BxSxD, axes, backward_sends)
            return (sent_BxSxD, sent_back_BxSxD, buffers, d_layers_VxW, d_head, d_x_MxBxSxD, loss, aux), None

        zero_act = varying(jnp.zeros(x_MxBxSxD.shape[1:], dt))
        d_layers_VxW = jax.tree.map(lambda w: varying(jnp.zeros(w.shape, w.dtype)), kept.layers_VxW)
        init = (zero_act, zero_act, buffers, d_layers_VxW, jax.tree.map(jnp.zeros_like, head_params),
                varying(jnp.zeros(x_MxBxSxD.shape, dt)), jnp.zeros((), jnp.float32), varying(jnp.zeros((), jnp.float32)))
        (_, _, _, d_layers_VxW, d_head, d_x_MxBxSxD, loss, aux), _ = jax.lax.scan(tick, init, jnp.arange(ticks))
        d_layers = jax.tree.map(lambda d, w: d.reshape(w.shape), d_layers_VxW, layers)
        d_x_MxBxSxD = jax.lax.psum(jnp.where(first, d_x_MxBxSxD, 0).astype(jnp.float32), axes)
        return loss + aux_weight * jax.lax.psum(aux, axes), d_layers, d_head, d_x_MxBxSxD

    whole, split = PartitionSpec(), PartitionSpec(axes)
    piped = jax.shard_map(schedule, mesh=mesh, in_specs=(split, split, whole, whole, whole), out_specs=(whole, split, whole, whole),
                          axis_names=set(axes))
    return around_schedule(plan, mesh, piped)


def head_keys(model: Any) -> tuple[str, ...]:
    """The parameters a pipeline schedule runs the head with: the final norm and the output projection
    (the embedding table where it is tied)."""
    return ("final_norm", "embed" if model.tie_embeddings else "lm_head")


def around_schedule(plan: Plan, mesh: Mesh, piped: Callable[..., tuple[Any, ...]]) -> Callable[..., Any]:
    """``(params, batch) -> (mean loss, gradients)`` around a 1F1B schedule ``piped``, ``(stage layers,
    live slots, head params, x_MxBxSxD, targets_MxBxS) -> (loss, layers' gradients, head's gradients,
    input cotangents)``: the embedding before it (whole on every pipeline group where
    `validate.gpipe.runs_outer_whole`), uneven stages padded, the batch cut into micro-batches, and the
    embedding's gradient from the input cotangents after it, the head's added where the table is tied."""
    axes, model, micro = plan.axes_of("pp"), plan.model, plan.layout.micro_batches(plan.train)
    dt = jnp.dtype(plan.train.compute_dtype.value)
    layer_P, live_P = stage_slots(model.num_layers, plan.layout)
    padded = len(layer_P) != model.num_layers or not live_P.all()
    constrain, lookup = activation_constraint(plan, mesh), embedding_lookup(plan, mesh)

    def embedding(outer: Any, tokens_GxS: jax.Array) -> jax.Array:
        return embed(outer, tokens_GxS, model, compute_dtype=dt, constrain=constrain, lookup=lookup)

    if runs_outer_whole(plan):
        whole = PartitionSpec()
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
        # Only the head's weights enter the schedule: its gradient sum is carried through the loop.
        head_params = {k: outer[k] for k in head_keys(model)}
        loss, d_layers, d_head, d_x_MxBxSxD = piped(layers, jnp.asarray(live_P, jnp.float32), head_params, x_MxBxSxD, targets_MxBxS)
        d_x_GxSxD = jnp.moveaxis(d_x_MxBxSxD, 0, 1).reshape(g, s, d).astype(x_GxSxD.dtype)
        (d_outer,) = embed_backward(d_x_GxSxD)
        (d_layers,) = pad_backward(d_layers)
        d_outer = {k: jax.tree.map(jnp.add, d, d_head[k]) if k in d_head else d for k, d in d_outer.items()}
        return loss, {**d_outer, "layers": d_layers}

    return loss_and_grads
