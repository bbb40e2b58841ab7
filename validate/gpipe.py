"""Pipeline parallelism as a real JAX program: GPipe over the plan's pipeline axis with ``shard_map``.

Plans with schedule "gpipe" run the program below; the other pipelined plans run the 1F1B
schedule, plain or interleaved, of `validate.one_f_one_b` (`validate.lowering.loss_and_grads` picks).

Schedule. Inside a ``jax.shard_map`` that is manual over the pipeline axis only (data, tensor
and context axes stay automatic, so XLA partitions each stage's layers as the plan's specs
say), stage ``s`` holds its contiguous slice of the stacked layers (``param_specs`` put the
pipeline axis on their leading dim). The batch is cut into the plan's ``M`` micro-batches per
data replica; on tick ``t`` of ``M + S − 1`` (a ``lax.scan``, ``S`` stages) stage 0 takes
micro-batch ``t``, every other stage what its predecessor ``ppermute``d on tick ``t − 1``, and
the last stage keeps the output of micro-batch ``t − S + 1``. Every device runs the same
program (SPMD), so stages also compute in the bubble ticks, on data nobody reads: each
device does ``(M + S − 1) / M`` times its useful layer work, and the bubble shows up as
compute rather than idle time.

Embedding, head and loss run outside the stages' region on the whole batch, with the plan's
vocab-parallel embedding and activation constraints as in the non-pipelined step
(`validate.lowering`), each in a region of its own that is manual over the pipeline axis with
everything whole there (`runs_outer_whole` says when). A ``psum`` over the
pipeline axis hands the last stage's outputs to every pipeline group, which all compute the
head: duplicated work, but the head's gradient then needs no all-reduce over the pipeline
axis, which is often the one crossing nodes. Left automatic, XLA split some of that work over
the pipeline axis (the lookup's scatter-add gradient, a tied or ZeRO-sharded head's weight
gradient) with all-reduces and permutes the plan does not have. The head runs one micro-batch
after another with its gradients formed at once (`micro_batch_mean`), as a 1F1B last stage
does, so one micro-batch's logits are alive at a time.

Backward and memory. Gradients come from differentiating the whole schedule, so the backward
ticks mirror the forward ones in reverse (GPipe): each stage keeps what its recompute policy
saves (the plan's ``jax.checkpoint`` policy, as in the reference model) for all ``M + S − 1``
ticks, where 1F1B keeps at most ``S`` micro-batches in flight. The micro-batches'
gradients add up inside the one backward pass; XLA reduces each tick's layer gradients over
the data axes inside the backward tick loop (`validate.predict` counts them per tick).

Interleaved stages (``interleave = v > 1``, Megatron's virtual stages). Each device holds
``v`` model chunks of ``L / (S·v)`` layers; chunk ``c`` of device ``d`` is virtual stage
``c·S + d``. The stacked layers are stored device-major (`interleaved_layer_order`), as
Megatron keeps each chunk on its device, so the pipeline axis's contiguous split of the stack
hands every device its own chunks and no layer moves between devices. Device ``d`` works
through its items one tick after device ``d − 1``: item ``w = t − d``, in rounds of ``S``
micro-batches × ``v`` chunks (`work_item`: chunk 0 for micro-batches ``rS … rS + S − 1``,
then chunk 1 for the same ones, …). The ``ppermute`` is then a ring: the last device's output
of chunk ``c`` reaches device 0 exactly on the tick it runs chunk ``c + 1`` of that
micro-batch. ``M·v + S − 1`` ticks of one chunk each: ``(M·v + S − 1) / (M·v)`` times the
useful layer work, where GPipe's ``S`` stages do ``(M + S − 1) / M``. Memory is GPipe's too:
the backward keeps every tick's saved activations (``M·v + S − 1`` chunks), where Megatron's
interleaved 1F1B keeps about ``S`` micro-batches' worth in flight. With ``v = 1`` this is the
GPipe schedule above. Interleaving needs ``M`` divisible by ``S`` and ``L`` by ``S·v``.

Uneven stages (``stage_layers``, or a layer count the stages do not divide) are padded: every
stage runs ``max(stage layers)`` layer slots, and a slot past its stage's count holds zero
weights, which makes a pre-norm residual layer exactly the identity (``x + 0 + 0``) and,
multiplied by the 0/1 mask, gets no gradient. The padding adds compute but not time (each
tick lasts as long as the longest stage anyway). Laying the stacked layers out per stage is
a gather over their leading dim, so XLA moves layers between stages every step (and their
gradients back), parameter traffic a pipeline storing each stage's layers would not have.

The two sums over the pipeline axis run in float32: XLA's CPU all-reduce promotion aborts
(``Invalid binary instruction opcode copy``, jax 0.10.2) on a bf16 sum over a manual axis,
whose reducer ends in a copy.
"""

from __future__ import annotations

from functools import partial
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, PartitionSpec

from costmodel.errors import UnsupportedError
from costmodel.inputs.layout import Layout
from planner.plan_schema import Plan
from planner.programs.train_step import MOE_AUX_LOSS_WEIGHT, chunked_head_loss
from planner.programs.transformer import SAVED, embed, run_layers
from validate.mesh_hooks import activation_constraint, embedding_lookup, residual_storage


def check_pipeline(plan: Plan) -> tuple[str, ...]:
    """The pipeline's mesh axes; raises `UnsupportedError` for what is not lowered."""
    lay, layers = plan.layout, plan.model.num_layers
    if lay.pp == 1:
        raise UnsupportedError("the plan has no pipeline (pp=1)", fix="use validate.lowering.train_step")
    if lay.interleave > 1 and layers % (lay.pp * lay.interleave):
        raise UnsupportedError(f"interleave={lay.interleave}: {layers} layers do not cut into pp·interleave = "
                               f"{lay.pp * lay.interleave} equal chunks", fix="pick an interleave with pp·interleave dividing num_layers")
    if lay.interleave > 1 and lay.micro_batches(plan.train) % lay.pp:
        raise UnsupportedError(f"interleave={lay.interleave}: {lay.micro_batches(plan.train)} micro-batches are not a multiple of "
                               f"pp={lay.pp}", fix="pick micro_batch and global_batch so that micro-batches divide by pp")
    return plan.axes_of("pp")


def interleaved_layer_order(num_layers: int, layout: Layout) -> np.ndarray:
    """Which layer each row of the stacked layers holds in a plan with ``interleave > 1``:
    device-major, so the pipeline axis's contiguous split of the stack gives device ``d`` its
    chunks ``c = 0 … v − 1``, chunk ``c`` holding virtual stage ``c·pp + d``. Reference
    parameters ``p`` become the program's as ``p[order]``, its gradients ``g`` the reference's
    as ``g[np.argsort(order)]``.

    >>> interleaved_layer_order(8, Layout(pp=2, interleave=2))
    array([0, 1, 4, 5, 2, 3, 6, 7])
    """
    s, v = layout.pp, layout.interleave
    layer_VxSxC = np.arange(num_layers).reshape(v, s, num_layers // (s * v))  # C = layers per chunk
    return layer_VxSxC.transpose(1, 0, 2).reshape(-1)


def work_item(work: jax.Array, *, stages: int, chunks: int) -> tuple[jax.Array, jax.Array]:
    """(chunk, micro-batch) of a device's ``work``-th item: rounds of ``stages`` micro-batches,
    each through chunk 0, then chunk 1, … (Megatron's interleaved order); with one chunk the
    micro-batch is ``work`` itself.

    >>> [tuple(int(i) for i in work_item(jnp.asarray(w), stages=2, chunks=2)) for w in range(6)]
    [(0, 0), (0, 1), (1, 0), (1, 1), (0, 2), (0, 3)]
    """
    round_, within = jnp.divmod(work, stages * chunks)
    return within // stages, round_ * stages + within % stages


def runs_outer_whole(plan: Plan) -> bool:
    """Whether every pipeline group runs the embedding and the head whole (each in a region
    manual over the pipeline axes). Not with ZeRO-3 and tensor parallelism, where XLA's
    partitioner aborts on those regions (a replica-group check in ``spmd_partitioner_util``,
    jax 0.10.2); left automatic there, XLA splits some of their work over the stages."""
    return not (plan.layout.zero_stage >= 3 and plan.axes_of("tp"))


def stage_slots(num_layers: int, layout: Layout) -> tuple[np.ndarray, np.ndarray]:
    """Which layer each stage's layer slot runs and whether it is live, stages major:
    ``pp · max(stage layers)`` slots, a padded slot pointing at its stage's own last layer.

    >>> stage_slots(6, Layout(pp=2, stage_layers=(2, 4)))
    (array([0, 1, 1, 1, 2, 3, 4, 5]), array([ True,  True, False, False,  True,  True,  True,  True]))
    >>> stage_slots(5, Layout(pp=2))[1]
    array([ True,  True,  True,  True,  True, False])
    """
    s = layout.pp
    counts = layout.stage_layers or tuple(num_layers // s + (i < num_layers % s) for i in range(s))
    starts, width = np.cumsum((0, *counts[:-1])), max(counts)
    slot_SxW = np.arange(width)[None, :]
    layer_SxW = starts[:, None] + np.minimum(slot_SxW, np.array(counts)[:, None] - 1)
    return layer_SxW.reshape(-1), (slot_SxW < np.array(counts)[:, None]).reshape(-1)


def micro_batch_mean(loss_fn: Callable[..., jax.Array]) -> Callable[..., jax.Array]:
    """``loss_fn(outer, y_BxSxD, targets_BxS)`` averaged over micro-batches ``y_MxBxSxD`` as the
    last stage of a 1F1B pipeline computes it: each micro-batch's loss and its gradients at
    once, so that one micro-batch's logits are alive at a time (the whole batch's, in fp32,
    would outgrow the stages' activations). The backward scales what the forward kept.

    >>> f = micro_batch_mean(lambda w, y, t: (w * y).sum())
    >>> float(f(2.0, jnp.ones((3, 4)), jnp.zeros((3,), jnp.int32))), float(jax.grad(f)(2.0, jnp.ones((3, 4)), jnp.zeros((3,), jnp.int32)))
    (8.0, 4.0)
    """
    def forward(outer: Any, y_MxBxSxD: jax.Array, targets_MxBxS: jax.Array) -> tuple[jax.Array, Any]:
        def one(grad_sum: Any, micro_batch: tuple[jax.Array, jax.Array]) -> tuple[Any, tuple[jax.Array, jax.Array]]:
            loss, (d_outer, d_y_BxSxD) = jax.value_and_grad(loss_fn, argnums=(0, 1))(outer, *micro_batch)
            return jax.tree.map(jnp.add, grad_sum, d_outer), (loss, d_y_BxSxD)

        d_outer, (losses_M, d_y_MxBxSxD) = jax.lax.scan(one, jax.tree.map(jnp.zeros_like, outer), (y_MxBxSxD, targets_MxBxS))
        m = y_MxBxSxD.shape[0]
        return losses_M.mean(), (jax.tree.map(lambda d: d / m, d_outer), d_y_MxBxSxD / m)

    def backward(kept: Any, g: jax.Array) -> tuple[Any, jax.Array, None]:
        d_outer, d_y_MxBxSxD = kept
        return jax.tree.map(lambda d: g * d, d_outer), (g * d_y_MxBxSxD).astype(d_y_MxBxSxD.dtype), None

    mean_loss = jax.custom_vjp(lambda outer, y, targets: forward(outer, y, targets)[0])
    mean_loss.defvjp(forward, backward)
    return mean_loss


def gpipe_loss_and_grads(plan: Plan, mesh: Mesh, *, remat: str) -> Callable[..., Any]:
    """``(params, batch) -> (mean loss, gradients)`` of the plan's GPipe schedule, or its
    interleaved form, whose stacked layers are stored as `interleaved_layer_order` says (1F1B
    plans run `validate.one_f_one_b` instead: `validate.lowering.loss_and_grads` picks);
    ``remat`` is the reference model's recompute policy ("none", "selective", "full")."""
    axes = check_pipeline(plan)
    model, train, stages, chunks = plan.model, plan.train, plan.layout.pp, plan.layout.interleave
    micro = plan.layout.micro_batches(train)
    # Stage to stage; interleaved, the last device's output also wraps around to device 0 for the next chunk.
    sends = [(i, (i + 1) % stages) for i in range(stages if chunks > 1 else stages - 1)]
    dt = jnp.dtype(train.compute_dtype.value)
    layer_P, live_P = stage_slots(model.num_layers, plan.layout)  # P = stages · slots per stage
    padded = len(layer_P) != model.num_layers or not live_P.all()
    constrain, lookup, keep_residuals = activation_constraint(plan, mesh), embedding_lookup(plan, mesh), residual_storage(mesh)
    # Saves what the layers' own policy saves (their named activations) and no sliced weights.
    chunk_policy = (jax.checkpoint_policies.nothing_saveable if remat == "full" else
                    jax.checkpoint_policies.save_only_these_names(*SAVED))

    def schedule(layers: Any, live_W: jax.Array, x_MxBxSxD: jax.Array) -> tuple[jax.Array, jax.Array]:
        stage = jax.lax.axis_index(axes)
        first, last = stage == 0, stage == stages - 1
        # This device's slots as [chunk, slot]: its chunks are contiguous in the stack.
        layers_VxW = jax.tree.map(lambda w: w.reshape(chunks, -1, *w.shape[1:]), layers)
        live_VxW = live_W.reshape(chunks, -1)
        # Made varying once, so the backward sums the embedding's gradient over the stages once,
        # not on every tick; in float32, as is the output's sum below: XLA's CPU all-reduce
        # promotion aborts on a bf16 sum over a manual axis (jax 0.10.2).
        x_MxBxSxD = jax.lax.pcast(x_MxBxSxD.astype(jnp.float32), axes, to="varying")

        @keep_residuals
        @partial(jax.checkpoint, policy=chunk_policy)
        def run_chunk(x_BxSxD: jax.Array, layers_VxW: Any, chunk: jax.Array) -> tuple[jax.Array, jax.Array]:
            # The chunk's weights are sliced again for the backward, not saved per tick: a copy of
            # each tick's chunk would hold M·v chunks of weights.
            chunk_layers = jax.tree.map(lambda w: w[chunk], layers_VxW)
            return run_layers(x_BxSxD, chunk_layers, model, remat=remat, attention=plan.layout.stack.attention.value)

        def tick(carry: tuple[jax.Array, ...], t: jax.Array) -> tuple[tuple[jax.Array, ...], None]:
            received_BxSxD, out_MxBxSxD, aux = carry
            work = t - stage  # this device's item; outside 0 … M·v − 1 it is a bubble tick
            useful = (work >= 0) & (work < micro * chunks)
            chunk, mb = work_item(jnp.clip(work, 0, micro * chunks - 1), stages=stages, chunks=chunks)
            x_BxSxD = jnp.where(first & (chunk == 0), x_MxBxSxD[mb].astype(dt), received_BxSxD)
            y_BxSxD, aux_W = run_chunk(x_BxSxD, layers_VxW, chunk) if chunks > 1 else run_layers(
                x_BxSxD, layers, model, remat=remat, attention=plan.layout.stack.attention.value, keep_residuals=keep_residuals)
            done = last & (chunk == chunks - 1) & useful  # micro-batch ``mb`` leaves the last virtual stage
            out_MxBxSxD = out_MxBxSxD.at[mb].set(jnp.where(done, y_BxSxD, out_MxBxSxD[mb]))
            aux = aux + jnp.where(useful, (aux_W * live_VxW[chunk]).sum(), 0.0)
            sent_BxSxD = jax.lax.ppermute(y_BxSxD, axes, sends)
            return (sent_BxSxD, out_MxBxSxD, aux), None

        # The carry differs between stages: mark it varying over the pipeline axes for scan.
        init = (jnp.zeros_like(x_MxBxSxD[0], dtype=dt), jnp.zeros_like(x_MxBxSxD, dtype=dt),
                jax.lax.pcast(jnp.zeros((), jnp.float32), axes, to="varying"))
        (_, out_MxBxSxD, aux), _ = jax.lax.scan(tick, init, jnp.arange(micro * chunks + stages - 1))
        return jax.lax.psum(jnp.where(last, out_MxBxSxD, 0).astype(jnp.float32), axes).astype(dt), jax.lax.psum(aux, axes)

    piped = jax.shard_map(schedule, mesh=mesh, in_specs=(PartitionSpec(axes), PartitionSpec(axes), PartitionSpec()),
                          out_specs=(PartitionSpec(), PartitionSpec()), axis_names=set(axes))

    def outer_region(fn: Callable[..., Any]) -> Callable[..., Any]:
        # Manual over the pipeline axes with every input and output whole there: each pipeline
        # group runs all of ``fn``, as planned.
        if not runs_outer_whole(plan):
            return fn
        return jax.shard_map(fn, mesh=mesh, in_specs=PartitionSpec(), out_specs=PartitionSpec(), axis_names=set(axes))

    def embedding(outer: Any, tokens_GxS: jax.Array) -> jax.Array:
        return embed(outer, tokens_GxS, model, compute_dtype=dt, constrain=constrain, lookup=lookup)

    def head_loss(outer: Any, y_GxSxD: jax.Array, targets_GxS: jax.Array) -> jax.Array:
        return chunked_head_loss(y_GxSxD, outer, targets_GxS, model, chunks=plan.layout.stack.cross_entropy_chunks, constrain=constrain)

    def loss(params: Any, batch: dict[str, jax.Array]) -> jax.Array:
        layers = params["layers"]
        if padded:
            layers = jax.tree.map(lambda w: jnp.take(w, layer_P, axis=0) * live_P.reshape(-1, *(1,) * (w.ndim - 1)), layers)
        outer = {k: v for k, v in params.items() if k != "layers"}
        x_GxSxD = outer_region(embedding)(outer, batch["tokens"])
        g, s, d = x_GxSxD.shape
        # Micro-batch index minor within each data shard, as in gradient accumulation: no data moves.
        x_MxBxSxD = jnp.moveaxis(x_GxSxD.reshape(g // micro, micro, s, d), 1, 0)
        y_MxBxSxD, aux = piped(layers, jnp.asarray(live_P, jnp.float32), x_MxBxSxD)
        targets_MxBxS = jnp.moveaxis(batch["targets"].reshape(g // micro, micro, s), 1, 0)
        ce = outer_region(micro_batch_mean(head_loss))(outer, y_MxBxSxD, targets_MxBxS)
        return ce + MOE_AUX_LOSS_WEIGHT * aux / (micro * model.num_layers)

    return jax.value_and_grad(loss)

