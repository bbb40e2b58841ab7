"""The training step's gradients with ZeRO's collectives written out, manual over the data axes.

Left to XLA's partitioner, a jitted step all-reduces every gradient inside the accumulation
loop, once per micro-batch, whatever the ZeRO stage (and on the CPU backend it never emits a
reduce-scatter). Here the micro-batch loop runs in a ``jax.shard_map`` manual over the plan's
data axes (the tensor and context axes stay with the partitioner), so each collective is the one
the ZeRO stage needs, as MaxText and Megatron-LM's distributed optimizer run them:

- ZeRO 0: gradients accumulate locally in fp32; one ``psum`` per step after the loop.
- ZeRO 1: the same, then one ``psum_scatter`` per step into the optimizer state's data split.
- ZeRO 2: each micro-batch's gradients are ``psum_scatter``-ed into a split fp32 accumulator.
- ZeRO 3: each weight the data axes split is gathered where it is used, a layer's inside its
  checkpointed body (so again for its backward), weight matrices in the compute dtype; the
  gather's transpose reduce-scatters the gradient in that dtype, every micro-batch.

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
from jax.sharding import Mesh, PartitionSpec

from costmodel.step.kernels import forms_gradients_locally
from planner.plan_schema import Plan
from planner.programs.params import Params
from planner.programs.train_step import Batch, make_value_and_grad, micro_batched
from planner.shardings import entry_axes


def reduces_over_data(plan: Plan) -> bool:
    """Whether ``plan``'s gradients are formed in the data-parallel region: the jax stack's
    `costmodel.step.kernels.forms_gradients_locally` (data parallelism alone, unpipelined), but
    not with the optimizer step in backward, whose per-layer reductions XLA's partitioner places
    (`validate.lowering.fused_train_step`)."""
    return forms_gradients_locally(plan.train, plan.layout) and not plan.train.optimizer_in_backward


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
    """``(params, batch) -> (mean loss, fp32 gradients)`` with ZeRO's collectives (module doc).

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
    # The gradients as the optimizer takes them: under ZeRO 0 as the parameters are split.
    reduced_specs = grad_specs if lay.zero_stage >= 1 else param_specs
    out_specs = jax.tree.map(lambda s: _data_part(s, data), reduced_specs)
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
                                         hooks={**hooks, "weights": weights} if lay.zero_stage == 3 else hooks,
                                         loss_chunks=lay.stack.cross_entropy_chunks)

    sizes = {a.name: a.size for a in plan.mesh}
    gathered = jax.tree.map(lambda s: bool(data_dims(s, data)) and lay.zero_stage == 3, held_specs)

    def scatter(g: jax.Array, spec: PartitionSpec) -> jax.Array:
        for dim, axes in data_dims(spec, data):
            g = jax.lax.psum_scatter(g, axes, scatter_dimension=dim, tiled=True)
        return g

    # Gradients are summed in the parameters' dtype: the fp32 master weights', or bf16 in pure-bf16 training.
    stored = jnp.dtype(train.param_dtype.value)

    def per_micro_batch(g: jax.Array, spec: PartitionSpec) -> jax.Array:
        g = g.astype(stored)
        return scatter(g, spec) if lay.zero_stage == 2 else g

    def after_loop(g: jax.Array, spec: PartitionSpec, done: bool) -> jax.Array:
        # ZeRO-3's gathered weights were reduced by their gathers' transposes, ZeRO-2's split ones each micro-batch.
        if done or (lay.zero_stage == 2 and data_dims(spec, data)):
            return g
        return scatter(g, spec) if data_dims(spec, data) else jax.lax.psum(g, data_axes)

    def accumulated_shape(p: jax.Array, spec: PartitionSpec) -> tuple[int, ...]:
        shape = list(p.shape)
        for dim, axes in data_dims(spec, data) if lay.zero_stage == 2 else ():
            shape[dim] //= math.prod(sizes[a] for a in axes)
        return tuple(shape)

    def local(params: Params, batch: Batch) -> tuple[jax.Array, Params]:
        # Differentiated as this device's own values, so no reduction appears in the backward
        # but ZeRO-3's, the transposes of its gathers.
        params = jax.tree.map(lambda p, done: p if done else jax.lax.pcast(p, data_axes, to="varying"), params, gathered)

        def accumulate(carry: tuple[jax.Array, Params], mb: Batch) -> tuple[tuple[jax.Array, Params], None]:
            loss, grads = value_and_grad(params, mb, None)
            grads = jax.tree.map(per_micro_batch, grads, reduced_specs)
            return (carry[0] + loss, jax.tree.map(jnp.add, carry[1], grads)), None

        sums = jax.tree.map(lambda p, s: jnp.zeros(accumulated_shape(p, s), stored), params, reduced_specs)
        zeros = jax.lax.pcast((jnp.zeros((), jnp.float32), sums), data_axes, to="varying")
        (loss, grads), _ = jax.lax.scan(accumulate, zeros, micro_batched(batch, micro_batches))
        grads = jax.tree.map(after_loop, grads, reduced_specs, gathered)
        scale = 1 / (micro_batches * replicas)
        return jax.lax.psum(loss, data_axes) * scale, jax.tree.map(lambda g: g * scale, grads)

    batch_spec = {"tokens": PartitionSpec(data_axes), "targets": PartitionSpec(data_axes)}
    return jax.shard_map(local, mesh=mesh, in_specs=(held_specs, batch_spec), out_specs=(PartitionSpec(), out_specs),
                         axis_names=data)
