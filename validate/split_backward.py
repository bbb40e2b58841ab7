"""1F1B with ``S`` micro-batches in flight as one SPMD program: each stage's backward split in two.

Lockstep SPMD (every device runs the same loop, a hand-off takes a whole step of it) makes the
plain 1F1B of `validate.one_f_one_b` keep ``2S − 1`` micro-batches in flight and pay twice
async 1F1B's bubble. Cutting a stage's backward in two by its layers gives three operations of
about the same cost (with ``B ≈ 2F``): ``F`` (the forward of all the stage's ``n`` layers),
``B_hi`` (the backward of its upper ``h = ⌈n/2⌉`` layers) and ``B_lo`` (its lower ``n − h``).
Stage ``s`` of ``S`` runs, one operation per slot,

    F(m, s)    at slot 3m + s
    B_hi(m, s) at slot 3m + 3S − 2 − 2s
    B_lo(m, s) at slot 3m + 3S − 1 − 2s

(`costmodel.step.lockstep.split_backward_op`). Modulo 3 these are ``s``, ``s + 1`` and
``s + 2``, so every stage has exactly one operation a slot, and every dependency is met the
slot before: each slot ends with two ``ppermute``s (the output up to ``s + 1`` for its ``F``, and
down to ``s − 1`` for its ``B_hi``) consumed the very next slot. Stage ``s`` holds micro-batch
``m`` from ``F(m)`` to ``B_lo(m)``: ``S − s`` micro-batches, in a ring of ``min(S, M)``
residual slots plus one scratch slot that the other operations write. ``3(M + S − 1)`` slots of
about ``F`` each: ``(M + S − 1)(F + B)``, Megatron's 1F1B bubble.

A slot is a ``lax.scan`` over ``h`` layer steps; step ``j`` is a ``lax.switch`` among the forward of
layers ``2j`` and ``2j + 1`` (about one layer's backward in cost; the forward of layer ``2j`` alone
where ``n`` is odd and ``2j + 1 = n``), the backward of one layer (``n − 1 − j`` in ``B_hi``,
``n − h − 1 − j`` in ``B_lo``) and nothing (bubbles, and ``B_lo``'s last step where ``n`` is odd),
chosen per stage. Each device runs only its branch. The branches return one or two layers'
residuals or one layer's gradient; the writes into the ring, the reads from it and the adds into
the gradient sums happen outside the switch, at one layer's size, because XLA copies a buffer
that a branch updates in place. The layers' residuals and vjp functions are those of
`validate.one_f_one_b.KeptResiduals`.

Three slots make a period of the outer ``lax.scan`` (``M + S − 1`` periods). After slot
``(S − 1) mod 3`` of a period, the one where the last stage runs an ``F``, every pipeline group
runs the head and loss on the last stage's output (handed round by a ``psum`` over the pipeline
axis, as in `validate.one_f_one_b`), so its cotangent is there for the last stage's ``B_hi`` the
next slot (a piece of the sequence at a time under ``--cross-entropy-chunks``). Stage 0's ``B_lo``
leaves each micro-batch's input cotangent for the embedding's gradient, formed after the loop. The
layers' tensor-axis collectives run inside the branches: every device of a stage's groups takes the
same branch.

Gradients over the data axes (`accumulates_over_data_locally`): under ZeRO 0, and ZeRO 1 without
tensor axes, the region is manual over the data axes too and the weights are this device's own
values, so each replica sums its gradients over the whole loop and they are reduced once after it
(all-reduced, or reduce-scattered into the optimizer state's split). Otherwise XLA places the data
axes and reduces each layer's gradient inside the backward branch, once a micro-batch.
"""

from __future__ import annotations

import math
from functools import partial
from typing import Any

import jax
import jax.numpy as jnp
from jax.sharding import Mesh, PartitionSpec

from costmodel.step.lockstep import SplitOp, split_backward_periods, split_backward_start, split_ring_slots, sums_gradients_locally
from planner.plan_schema import Plan
from planner.programs.train_step import MOE_AUX_LOSS_WEIGHT, chunked_head_loss
from planner.programs.transformer import run_layers
from planner.shardings import partition_spec_tree, zero_sharded_specs
from validate.data_parallel_region import data_dims
from validate.gpipe import check_pipeline, stage_slots
from validate.mesh_hooks import activation_constraint, residual_storage
from validate.one_f_one_b import KeptResiduals, around_schedule, head_keys, mark_varying, runs_one_f_one_b

# The layer step's branches (`lax.switch` order).
_FORWARD_TWO, _FORWARD_ONE, _BACKWARD, _IDLE = range(4)


def accumulates_over_data_locally(plan: Plan) -> bool:
    """Whether the program sums each data replica's gradients on its own devices and reduces them
    once after the loop, the region manual over the data axes too
    (`costmodel.step.lockstep.sums_gradients_locally`: ZeRO 0–1 on the jax stack, dense models);
    otherwise XLA places the data axes and reduces each layer's gradient as its backward forms it."""
    return runs_split_backward(plan) and sums_gradients_locally(plan.model, plan.layout)


def runs_split_backward(plan: Plan) -> bool:
    """Whether the plan's pipeline runs this module's schedule: 1F1B without interleaving
    (interleaved plans keep `validate.one_f_one_b`'s)."""
    return runs_one_f_one_b(plan) and plan.layout.interleave == 1


def branch_shares(plan: Plan) -> tuple[float, ...] | None:
    """How often each branch of the layer step's switch runs, as a share of the switch's executions
    (``3(M + S − 1)·h`` a device: every stage runs each branch as often), for reading the compiled
    program's collectives and FLOPs (`validate.hlo`); None for plans that do not run this schedule.

    >>> from costmodel.inputs.layout import Layout
    >>> from planner.api import layout_plan
    >>> shares = branch_shares(layout_plan("llama3-8b", Layout(pp=4, micro_batch=1), seq_len=1024, global_batch=8))
    >>> [round(s, 3) for s in shares]  # 8 micro-batches, 8 layers a stage: 11 periods of 3 slots of 4 steps
    [0.242, 0.0, 0.485, 0.273]
    """
    if not runs_split_backward(plan):
        return None
    micro, n = plan.layout.micro_batches(plan.train), _layer_slots(plan)
    runs = 3 * split_backward_periods(micro, plan.layout.pp) * ((n + 1) // 2)
    shares = (micro * (n // 2) / runs, micro * (n % 2) / runs, micro * n / runs)
    return (*shares, 1.0 - sum(shares))


def split_backward_loss_and_grads(plan: Plan, mesh: Mesh, *, remat: str) -> Any:
    """``(params, batch) -> (mean loss, gradients)`` of the plan's 1F1B schedule with its backward
    split in two (see the module docstring); ``remat`` is the reference model's recompute policy."""
    axes = check_pipeline(plan)
    model, train, stages = plan.model, plan.train, plan.layout.pp
    micro = plan.layout.micro_batches(train)
    data = plan.axes_of("dp") if accumulates_over_data_locally(plan) else ()
    manual = (*axes, *data)
    replicas = math.prod(a.size for a in plan.mesh if a.name in data)
    ring = split_ring_slots(stages, micro)
    forward_sends = [(i, i + 1) for i in range(stages - 1)]
    backward_sends = [(j, i) for i, j in forward_sends]
    dt = jnp.dtype(train.compute_dtype.value)
    n = _layer_slots(plan)
    half = (n + 1) // 2
    keep_residuals = residual_storage(mesh)
    constrain = activation_constraint(plan, mesh, per_replica=bool(data))  # no data axes where they are manual
    aux_weight = MOE_AUX_LOSS_WEIGHT / (micro * model.num_layers)
    head_slot, head_lag = (stages - 1) % 3, (stages - 1) // 3

    def layer_forward(x_BxSxD: jax.Array, layer: Any) -> tuple[jax.Array, jax.Array]:
        y_BxSxD, aux_1 = run_layers(x_BxSxD, layer, model, remat=remat, attention=plan.layout.stack.attention.value,
                                    constrain=constrain, keep_residuals=keep_residuals)
        return y_BxSxD, mark_varying(aux_1, manual)

    def head_loss(head_params: Any, y_BxSxD: jax.Array, targets_BxS: jax.Array) -> jax.Array:
        return chunked_head_loss(y_BxSxD, head_params, targets_BxS, model, chunks=plan.layout.stack.cross_entropy_chunks,
                                 constrain=constrain)

    def schedule(layers_W: Any, live_W: jax.Array, head_params: Any, x_MxBxSxD: jax.Array, targets_MxBxS: jax.Array) -> tuple[Any, ...]:
        stage = jax.lax.axis_index(axes)
        first, last = stage == 0, stage == stages - 1
        varying = partial(mark_varying, axes=manual)
        x_MxBxSxD = varying(x_MxBxSxD)
        # Differentiated as this device's own values, so no reduction over the data axes appears in the backward.
        layers_W, head_params = jax.tree.map(lambda w: mark_varying(w, data), (layers_W, head_params))
        kept = KeptResiduals(layer_forward, jax.tree.map(lambda w: w[None], layers_W), ring + 1)
        buffers = [varying(b) for b in kept.empty_buffers(x_MxBxSxD[0].astype(dt))]  # traces the vjp's structure

        def one_layer(i: jax.Array) -> Any:
            return jax.tree.map(lambda w: jax.lax.dynamic_slice_in_dim(w, i, 1, 0), layers_W)

        def no_gradient(layer: Any) -> Any:
            return jax.tree.map(jnp.zeros_like, layer)

        def no_residuals(residuals: list[jax.Array]) -> list[jax.Array]:
            return [jnp.zeros_like(r) for r in residuals]

        # Branches: (x, first layer, second layer, first layer's residuals, live of both, MoE cotangent)
        # -> (output, two layers' residuals, the first layer's gradient, MoE loss).
        def forward_two(x_BxSxD, layer_a, layer_b, residuals, live_2, d_aux):
            (h_BxSxD, aux_a), backward_a = jax.vjp(layer_forward, x_BxSxD, layer_a)
            (y_BxSxD, aux_b), backward_b = jax.vjp(layer_forward, h_BxSxD, layer_b)
            aux = aux_a[0] * live_2[0] + aux_b[0] * live_2[1]
            return y_BxSxD, kept.split(backward_a, layer_a), kept.split(backward_b, layer_b), no_gradient(layer_a), aux

        def forward_one(x_BxSxD, layer_a, layer_b, residuals, live_2, d_aux):
            (y_BxSxD, aux_a), backward_a = jax.vjp(layer_forward, x_BxSxD, layer_a)
            saved = kept.split(backward_a, layer_a)
            return y_BxSxD, saved, no_residuals(saved), no_gradient(layer_a), aux_a[0] * live_2[0]

        def backward(d_y_BxSxD, layer_a, layer_b, residuals, live_2, d_aux):
            d_x_BxSxD, d_layer = kept.rebuild(residuals, layer_a)((d_y_BxSxD, d_aux))
            return d_x_BxSxD, no_residuals(residuals), no_residuals(residuals), d_layer, jnp.zeros(())

        def idle(x_BxSxD, layer_a, layer_b, residuals, live_2, d_aux):
            return x_BxSxD, no_residuals(residuals), no_residuals(residuals), no_gradient(layer_a), jnp.zeros(())

        def slot_step(carry: tuple[Any, ...], slot: jax.Array) -> tuple[tuple[Any, ...], jax.Array]:
            """One operation of this stage (`costmodel.step.lockstep.split_backward_op`), layer by layer."""
            recv_up_BxSxD, recv_down_BxSxD, previous_BxSxD, buffers, d_layers_W, aux, d_x_MxBxSxD = carry
            op, mb = _op_of(slot, stage, stages, micro)
            x_BxSxD = jnp.select([op == SplitOp.FORWARD, op == SplitOp.BACKWARD_HIGH],
                                 [jnp.where(first, x_MxBxSxD[mb], recv_up_BxSxD), jnp.where(last, previous_BxSxD, recv_down_BxSxD)],
                                 previous_BxSxD)
            write_slot = jnp.where(op == SplitOp.FORWARD, mb % ring, ring)

            def layer_step(inner: tuple[Any, ...], j: jax.Array) -> tuple[tuple[Any, ...], None]:
                x_BxSxD, buffers, d_layers_W, aux = inner
                first_layer = jnp.stack([2 * j, n - 1 - j, n - half - 1 - j, j])[jnp.minimum(op, SplitOp.IDLE)]
                first_layer = jnp.clip(first_layer, 0, n - 1)
                second_layer = jnp.minimum(2 * j + 1, n - 1)
                backward_step = (op == SplitOp.BACKWARD_HIGH) | ((op == SplitOp.BACKWARD_LOW) & (j < n - half))
                forward_step = jnp.where(2 * j + 1 < n, _FORWARD_TWO, _FORWARD_ONE)
                branch = jnp.select([op == SplitOp.FORWARD, backward_step], [forward_step, _BACKWARD], _IDLE)
                residuals = [jax.lax.dynamic_slice(buf, (mb % ring, first_layer, *(0,) * (buf.ndim - 2)), (1, 1, *buf.shape[2:]))[0, 0]
                             for buf in buffers]
                live_2 = jnp.stack([live_W[first_layer], live_W[second_layer]])
                d_aux = varying((live_W[first_layer] * aux_weight)[None])
                branches = [_all_varying(f, varying) for f in (forward_two, forward_one, backward, idle)]
                x_BxSxD, saved_a, saved_b, d_layer, aux_step = jax.lax.switch(
                    branch, branches, x_BxSxD, one_layer(first_layer), one_layer(second_layer), residuals, live_2, d_aux)
                # The second layer first: where it is the first (n odd), the first's residuals win.
                for layer_index, saved in ((second_layer, saved_b), (first_layer, saved_a)):
                    buffers = [jax.lax.dynamic_update_slice(buf, leaf[None, None], (write_slot, layer_index, *(0,) * leaf.ndim))
                               for buf, leaf in zip(buffers, saved)]
                d_layers_W = jax.tree.map(lambda acc, d: acc.at[first_layer].add(d[0].astype(acc.dtype)), d_layers_W, d_layer)
                return (x_BxSxD, buffers, d_layers_W, aux + aux_step), None

            (y_BxSxD, buffers, d_layers_W, aux), _ = jax.lax.scan(layer_step, (x_BxSxD, buffers, d_layers_W, aux), jnp.arange(half))
            embedded = first & (op == SplitOp.BACKWARD_LOW)
            d_x_MxBxSxD = d_x_MxBxSxD.at[mb].set(jnp.where(embedded, y_BxSxD, d_x_MxBxSxD[mb]))
            sent_up_BxSxD = jax.lax.ppermute(y_BxSxD, axes, forward_sends)
            sent_down_BxSxD = jax.lax.ppermute(y_BxSxD, axes, backward_sends)
            return (sent_up_BxSxD, sent_down_BxSxD, y_BxSxD, buffers, d_layers_W, aux, d_x_MxBxSxD), y_BxSxD

        def period(carry: tuple[Any, ...], p: jax.Array) -> tuple[tuple[Any, ...], None]:
            slots, d_head, loss = carry
            for k in range(3):
                slots, y_BxSxD = slot_step(slots, 3 * p + k)
                if k == head_slot:  # the last stage ran micro-batch p − head_lag's F: its head and loss, on every group
                    head_mb = p - head_lag
                    useful = (0 <= head_mb) & (head_mb < micro)
                    y_last_BxSxD = jax.lax.psum(jnp.where(last, y_BxSxD, 0).astype(jnp.float32), axes).astype(dt)
                    loss_mb, head_backward = jax.vjp(lambda hp, y: head_loss(hp, y, targets_MxBxS[jnp.clip(head_mb, 0, micro - 1)]),
                                                     head_params, y_last_BxSxD)
                    # A replica's mean loss seeds 1 / replicas of it: the sums over the data axes are then the mean's gradients.
                    d_head_mb, d_y_BxSxD = head_backward(mark_varying(jnp.asarray(1.0 / (micro * replicas), loss_mb.dtype), data))
                    loss = loss + jnp.where(useful, loss_mb / micro, 0.0)
                    d_head = jax.tree.map(lambda acc, d: acc + jnp.where(useful, d, 0).astype(acc.dtype), d_head, d_head_mb)
                    slots = (*slots[:2], jnp.where(last, d_y_BxSxD.astype(dt), slots[2]), *slots[3:])
            return (slots, d_head, loss), None

        zero_act = varying(jnp.zeros(x_MxBxSxD.shape[1:], dt))
        slots = (zero_act, zero_act, zero_act, buffers, jax.tree.map(lambda w: varying(jnp.zeros(w.shape, w.dtype)), layers_W),
                 varying(jnp.zeros((), jnp.float32)), varying(jnp.zeros(x_MxBxSxD.shape, dt)))
        init = (slots, jax.tree.map(lambda p: mark_varying(jnp.zeros_like(p), data), head_params),
                mark_varying(jnp.zeros((), jnp.float32), data))
        (slots, d_head, loss), _ = jax.lax.scan(period, init, jnp.arange(split_backward_periods(micro, stages)))
        d_layers_W, aux, d_x_MxBxSxD = slots[4], slots[5], slots[6]
        d_x_MxBxSxD = jax.lax.psum(jnp.where(first, d_x_MxBxSxD, 0).astype(jnp.float32), axes)
        loss = loss + aux_weight * jax.lax.psum(aux, axes)
        if data:  # each replica's sums, reduced once (the loss is each replica's mean: their mean)
            d_layers_W, d_head = jax.tree.map(_reduce_over(data), (d_layers_W, d_head), (layer_out, head_out))
            loss = jax.lax.pmean(loss, data)
        return loss, d_layers_W, d_head, d_x_MxBxSxD

    whole, split, by_data = PartitionSpec(), PartitionSpec(axes), PartitionSpec(None, data or None)
    layer_out, head_out = _reduced_specs(plan, data, axes)
    piped = jax.shard_map(schedule, mesh=mesh, in_specs=(split, split, whole, by_data, by_data),
                          out_specs=(whole, layer_out, head_out, by_data), axis_names=set(manual))

    return around_schedule(plan, mesh, piped)


def _layer_slots(plan: Plan) -> int:
    """Layer slots a stage runs: its layers, or the longest stage's where they are uneven (`validate.gpipe.stage_slots`)."""
    return len(stage_slots(plan.model.num_layers, plan.layout)[0]) // plan.layout.pp


def _reduced_specs(plan: Plan, data: tuple[str, ...], axes: tuple[str, ...]) -> tuple[Any, Any]:
    """Out specs of the layers' and the head's gradients: split over the pipeline axes (the layers) and,
    where the program sums them locally under ZeRO 1, over the data axes as the optimizer state is
    (`planner.shardings.zero_sharded_specs`), whole over them otherwise."""
    specs = partition_spec_tree(plan.model, plan.param_specs)
    layers = jax.tree.map(lambda _: PartitionSpec(axes), specs["layers"])
    head = {k: jax.tree.map(lambda _: PartitionSpec(), specs[k]) for k in head_keys(plan.model)}
    if not data or plan.layout.zero_stage == 0:
        return layers, head
    sizes = {a.name: a.size for a in plan.mesh}
    split = partition_spec_tree(plan.model, zero_sharded_specs(plan.model, plan.param_specs, data, sizes))

    def data_only(spec: PartitionSpec, first: tuple[str, ...] | None = None) -> PartitionSpec:
        dims = dict(data_dims(spec, set(data)))
        return PartitionSpec(*(dims.get(d) for d in range(len(spec)))) if first is None else \
            PartitionSpec(first, *(dims.get(d) for d in range(1, len(spec))))

    return (jax.tree.map(lambda s: data_only(s, axes), split["layers"]),
            {k: jax.tree.map(data_only, split[k]) for k in head_keys(plan.model)})


def _reduce_over(data: tuple[str, ...]) -> Any:
    """``(sum, out spec) -> reduced``: reduce-scattered over the data axes its out spec names, else all-reduced."""
    def reduce(g: jax.Array, spec: PartitionSpec) -> jax.Array:
        dims = data_dims(spec, set(data))
        for dim, over in dims:
            g = jax.lax.psum_scatter(g, over, scatter_dimension=dim, tiled=True)
        return g if dims else jax.lax.psum(g, data)

    return reduce


def _all_varying(branch: Any, varying: Any) -> Any:
    """``branch`` with every output marked varying over the region's manual axes: a switch's branches must agree."""
    return lambda *args: jax.tree.map(varying, branch(*args))


def _op_of(slot: jax.Array, stage: jax.Array, stages: int, micro: int) -> tuple[jax.Array, jax.Array]:
    """`costmodel.step.lockstep.split_backward_op` on traced integers: the operation (`SplitOp`) and micro-batch."""
    kind = (slot - stage) % 3
    mb = (slot - split_backward_start(kind, stage, stages)) // 3
    useful = (0 <= mb) & (mb < micro)
    return jnp.where(useful, kind, SplitOp.IDLE), jnp.clip(mb, 0, micro - 1)
