"""The training step's gradients with ZeRO's collectives written out over the data axes.

Left to XLA's partitioner, a jitted step all-reduces every gradient inside the accumulation
loop, once per micro-batch, whatever the ZeRO stage (and on the CPU backend it never emits a
reduce-scatter). Here each collective is the one the ZeRO stage needs, as MaxText and
Megatron-LM's distributed optimizer run them:

- ZeRO 0: gradients accumulate locally in fp32, each layer's added as the backward forms it
  (`planner.programs.accumulate`); one ``psum`` per step after the loop.
- ZeRO 1: the same, then one ``psum_scatter`` per step into the optimizer state's data split.
- ZeRO 2: each micro-batch's gradients are ``psum_scatter``-ed into a split fp32 accumulator.
- ZeRO 3: each weight the data axes split is gathered where it is used, a layer's inside its
  checkpointed body (so again for its backward), weight matrices in the compute dtype; the
  gather's transpose reduce-scatters the gradient in that dtype, every micro-batch.

ZeRO 0–2 (`replica_loss_and_grads`): the micro-batch's forward and backward are ``jax.vmap``-ped over
the data replicas with ``spmd_axis_name`` the data axes, so each device computes its own replica's
gradient (the mapped dimension split over the data axes) while the tensor axes stay with the
partitioner, and each replica sums its own into a row of a ``[replicas, ...]`` accumulator; the
reductions run in a ``jax.shard_map`` manual over every axis. (A region manual over the data axes
alone fails beside tensor axes: there XLA replicates a ``psum_scatter``'s operand over the other
axes first, and nested regions such as the vocab-parallel lookup are refused, jax 0.10.2.)

ZeRO 3 (`data_parallel_loss_and_grads`, data parallelism alone): the micro-batch loop runs in a
``jax.shard_map`` manual over the data axes, the weights gathered by a ``Weights`` hook.

>>> from costmodel.inputs.layout import Layout
>>> from planner.api import layout_plan
>>> p = layout_plan("gpt2", Layout(dp=1, micro_batch=2), hardware="a100-80gb", global_batch=4, seq_len=32)
>>> reduces_over_data(p)
False
"""

from __future__ import annotations

import math
from typing import Any, Callable

import jax
import jax.numpy as jnp
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from costmodel.step.kernels import forms_gradients_locally
from costmodel.step.memory import accumulates_layer_by_layer
from planner.plan_schema import Plan
from planner.programs.accumulate import make_accumulating_value_and_grad
from planner.programs.params import Params
from planner.programs.train_step import Batch, make_value_and_grad, micro_batched
from planner.shardings import entry_axes


def reduces_over_data(plan: Plan) -> bool:
    """Whether ``plan``'s gradients are formed as this module forms them: the jax stack's
    `costmodel.step.kernels.forms_gradients_locally` (unpipelined, no context or expert axes), but
    not with the optimizer step in backward, whose per-layer reductions XLA's partitioner places
    (`validate.lowering.fused_train_step`)."""
    return forms_gradients_locally(plan.model, plan.train, plan.layout) and not plan.train.optimizer_in_backward


def data_dims(spec: PartitionSpec, data: set[str]) -> tuple[tuple[int, tuple[str, ...]], ...]:
    """``(dimension, data axes)`` for each dimension of ``spec`` that names data axes."""
    found = []
    for dim, entry in enumerate(spec):
        axes = tuple(a for a in entry_axes(entry) if a in data)
        if axes:
            found.append((dim, axes))
    return tuple(found)


def _data_part(spec: PartitionSpec, data: set[str]) -> PartitionSpec:
    """``spec`` with only its data axes: the region's in/out spec (the other axes stay automatic)."""
    dims = dict(data_dims(spec, data))
    return PartitionSpec(*(dims[d] if d in dims else None for d in range(len(spec))))


def gathered_over_data(dims: tuple[tuple[int, tuple[str, ...]], ...], reduce_dtype: Any) -> Callable[[jax.Array], jax.Array]:
    """A weight's whole (over the data axes) value from this device's shard, whose transpose
    reduce-scatters the gradient in ``reduce_dtype`` (the gathered dtype, but fp32 on the CPU
    backend: XLA:CPU aborts on 16-bit sums in a manual region, ``Invalid binary instruction
    opcode copy``, jax 0.10.2)."""
    @jax.custom_vjp
    def gather(x: jax.Array) -> jax.Array:
        for dim, axes in dims:
            x = jax.lax.all_gather(x, axes, axis=dim, tiled=True)
        return x

    def forward(x: jax.Array) -> tuple[jax.Array, None]:
        return gather(x), None

    def backward(_: None, g: jax.Array) -> tuple[jax.Array]:
        dtype = g.dtype
        g = g.astype(reduce_dtype or dtype)
        for dim, axes in reversed(dims):
            g = jax.lax.psum_scatter(g, axes, scatter_dimension=dim, tiled=True)
        return (g.astype(dtype),)

    gather.defvjp(forward, backward)
    return gather


def data_parallel_loss_and_grads(plan: Plan, mesh: Mesh, param_specs: Params, grad_specs: Params, *, remat: str,
                                 hooks: dict[str, Any]) -> Callable[[Params, Batch], tuple[jax.Array, Params]]:
    """ZeRO 3 over data parallelism alone: ``(params, batch) -> (mean loss, gradients in the
    parameters' dtype)``, the micro-batch loop manual over the data axes (module doc).

    ``param_specs`` and ``grad_specs`` are the ``PartitionSpec`` trees of the parameters and of
    the gradients the optimizer takes (its moments' split); ``hooks`` go to the forward.
    """
    lay, train = plan.layout, plan.train
    data_axes = plan.axes_of("dp")
    data = set(data_axes)
    compute_dtype = jnp.dtype(train.compute_dtype.value)
    micro_batches = lay.micro_batches(train)
    replicas = math.prod(a.size for a in plan.mesh if a.name in data)
    held_specs = jax.tree.map(lambda s: _data_part(s, data), param_specs)
    out_specs = jax.tree.map(lambda s: _data_part(s, data), grad_specs)
    layer_specs = jax.tree.map(lambda s: PartitionSpec(*s[1:]), held_specs["layers"])
    outer_specs = {k: v for k, v in held_specs.items() if k != "layers"}
    on_cpu = mesh.devices.flat[0].platform == "cpu"

    def gather(path: tuple[Any, ...], x: jax.Array, spec: PartitionSpec) -> jax.Array:
        dims = data_dims(spec, data)
        if not dims:
            return x
        # A weight matrix the program casts where used is cast first: gathered, and its gradient
        # reduced, in the compute dtype. The embedding tables are read as stored.
        if x.ndim >= 2 and path[0].key != "embed":
            x = x.astype(compute_dtype)
        return gathered_over_data(dims, jnp.float32 if on_cpu else None)(x)

    def weights(kind: str, held: Params) -> Params:
        return jax.tree_util.tree_map_with_path(gather, held, layer_specs if kind == "layers" else outer_specs)

    value_and_grad = make_value_and_grad(plan.model, train, remat=remat, attention=lay.stack.attention.value,
                                         hooks={**hooks, "weights": weights}, loss_chunks=lay.stack.cross_entropy_chunks)
    gathered = jax.tree.map(lambda s: bool(data_dims(s, data)), held_specs)
    # Gradients are summed in the parameters' dtype: the fp32 master weights', or bf16 in pure-bf16 training.
    stored = jnp.dtype(train.param_dtype.value)

    def after_loop(g: jax.Array, spec: PartitionSpec, done: bool) -> jax.Array:
        # The gathered weights' gradients were reduced by their gathers' transposes, every micro-batch.
        if done:
            return g
        dims = data_dims(spec, data)
        for dim, axes in dims:
            g = jax.lax.psum_scatter(g, axes, scatter_dimension=dim, tiled=True)
        return g if dims else jax.lax.psum(g, data_axes)

    def local(params: Params, batch: Batch) -> tuple[jax.Array, Params]:
        # Differentiated as this device's own values, so no reduction appears in the backward
        # but the transposes of the gathers.
        params = jax.tree.map(lambda p, done: p if done else jax.lax.pcast(p, data_axes, to="varying"), params, gathered)

        def accumulate(carry: tuple[jax.Array, Params], mb: Batch) -> tuple[tuple[jax.Array, Params], None]:
            loss, grads = value_and_grad(params, mb, None)
            return (carry[0] + loss, jax.tree.map(lambda s, g: s + g.astype(stored), carry[1], grads)), None

        zeros = jax.lax.pcast((jnp.zeros((), jnp.float32), jax.tree.map(lambda p: jnp.zeros(p.shape, stored), params)),
                              data_axes, to="varying")
        (loss, grads), _ = jax.lax.scan(accumulate, zeros, micro_batched(batch, micro_batches))
        grads = jax.tree.map(after_loop, grads, out_specs, gathered)
        scale = 1 / (micro_batches * replicas)
        return jax.lax.psum(loss, data_axes) * scale, jax.tree.map(lambda g: g * scale, grads)

    batch_spec = {"tokens": PartitionSpec(data_axes), "targets": PartitionSpec(data_axes)}
    return jax.shard_map(local, mesh=mesh, in_specs=(held_specs, batch_spec), out_specs=(PartitionSpec(), out_specs),
                         axis_names=data)


def replica_loss_and_grads(plan: Plan, mesh: Mesh, param_specs: Params, grad_specs: Params, *, remat: str,
                           hooks: dict[str, Any]) -> Callable[[Params, Batch], tuple[jax.Array, Params]]:
    """ZeRO 0–2: ``(params, batch) -> (mean loss, gradients)``, each data replica's formed on its
    own devices, summed in the master weights' dtype (fp32 in mixed precision) and reduced as the ZeRO
    stage needs (module doc). The parameters are the fp32 master weights, or under ZeRO 1–2 their
    compute-dtype copy (`costmodel.step.kernels.keeps_compute_copy`).

    ``param_specs`` and ``grad_specs`` are the ``PartitionSpec`` trees of the parameters and of
    the gradients the optimizer takes (its moments' split); ``hooks`` are the forward's, built per
    replica (`validate.mesh_hooks.activation_constraint`).
    """
    lay, train = plan.layout, plan.train
    data_axes = plan.axes_of("dp")
    data = set(data_axes)
    micro_batches = lay.micro_batches(train)
    replicas = math.prod(a.size for a in plan.mesh if a.name in data)
    # The gradients as the optimizer takes them: under ZeRO 0 as the parameters are split.
    reduced_specs = grad_specs if lay.zero_stage >= 1 else param_specs
    value_and_grad = make_value_and_grad(plan.model, train, remat=remat, attention=lay.stack.attention.value, hooks=hooks,
                                         loss_chunks=lay.stack.cross_entropy_chunks)
    per_replica = jax.vmap(value_and_grad, in_axes=(None, 0, None), spmd_axis_name=data_axes)
    # Several micro-batches' sums held whole (ZeRO 0-1) take each layer's gradient as the backward forms it.
    layer_by_layer = accumulates_layer_by_layer(plan.model, train, lay)
    if layer_by_layer:
        accumulating = jax.vmap(make_accumulating_value_and_grad(plan.model, train, remat=remat, attention=lay.stack.attention.value,
                                                                 hooks=hooks, loss_chunks=lay.stack.cross_entropy_chunks),
                                in_axes=(None, 0, 0), spmd_axis_name=data_axes)
    # Gradients are summed in the master weights' dtype (a compute copy's are cast up): fp32, or bf16 in pure-bf16 training.
    stored = jnp.dtype(train.param_dtype.value)

    def reduce(g_R: jax.Array, spec: PartitionSpec, reduced: PartitionSpec) -> jax.Array:
        """The replicas' ``[replicas, ...]`` rows summed into the optimizer's split of them."""
        def local(g_1: jax.Array) -> jax.Array:
            dims = data_dims(reduced, data)
            g = g_1[0]
            for dim, axes in dims:
                g = jax.lax.psum_scatter(g, axes, scatter_dimension=dim, tiled=True)
            return g if dims else jax.lax.psum(g, data_axes)

        return jax.shard_map(local, mesh=mesh, in_specs=PartitionSpec(data_axes, *spec), out_specs=reduced)(g_R)

    def reduce_all(grads_R: Params) -> Params:
        return jax.tree.map(reduce, grads_R, param_specs, reduced_specs)

    def by_replica(x: jax.Array, spec: PartitionSpec) -> jax.Array:
        return jax.lax.with_sharding_constraint(x, NamedSharding(mesh, PartitionSpec(data_axes, *spec)))

    def loss_and_grads(params: Params, batch: Batch) -> tuple[jax.Array, Params]:
        # [micro-batches, replicas, sequences, ...]: a replica's sequences are the ones its devices hold.
        by_replica_MxR = NamedSharding(mesh, PartitionSpec(None, data_axes))
        batch_MxR = jax.tree.map(lambda v: jax.lax.with_sharding_constraint(v.reshape(v.shape[0], replicas, -1, *v.shape[2:]),
                                                                            by_replica_MxR), micro_batched(batch, micro_batches))

        def accumulate(carry: tuple[jax.Array, Params], mb: Batch) -> tuple[tuple[jax.Array, Params], None]:
            if layer_by_layer:
                loss_R, sums_R = accumulating(params, mb, carry[1])
                return (carry[0] + loss_R, jax.tree.map(by_replica, sums_R, param_specs)), None
            loss_R, grads_R = per_replica(params, mb, None)
            grads_R = jax.tree.map(lambda g, s: by_replica(g.astype(stored), s), grads_R, param_specs)
            grads = reduce_all(grads_R) if lay.zero_stage == 2 else grads_R
            return (carry[0] + loss_R, jax.tree.map(jnp.add, carry[1], grads)), None

        def zeros(p: jax.Array, spec: PartitionSpec, reduced: PartitionSpec) -> jax.Array:
            if lay.zero_stage == 2:  # the split accumulator, as the optimizer splits the gradient
                return jax.lax.with_sharding_constraint(jnp.zeros(p.shape, stored), NamedSharding(mesh, reduced))
            return by_replica(jnp.zeros((replicas, *p.shape), stored), spec)

        start = (by_replica(jnp.zeros((replicas,), jnp.float32), PartitionSpec()),
                 jax.tree.map(zeros, params, param_specs, reduced_specs))
        (loss_R, grads), _ = jax.lax.scan(accumulate, start, batch_MxR)
        if lay.zero_stage < 2:
            grads = reduce_all(grads)
        scale = 1 / (micro_batches * replicas)
        return loss_R.sum() * scale, jax.tree.map(lambda g: g * scale, grads)

    return loss_and_grads
