"""The plan's device mesh and what the reference programs' hooks do on it.

The training step (`validate.lowering`), its pipeline schedules (`validate.gpipe`,
`validate.one_f_one_b`) and the serving programs (`validate.serving`) all run the reference
programs of `planner.programs` with these: the mesh, the plan's activation specs as sharding
constraints, the vocab-parallel embedding, the experts' region, how residuals are stored,
and the KV cache's split.
"""

from __future__ import annotations

import functools
import math
from typing import Any, Callable

import jax
import jax.numpy as jnp
from jax.sharding import AxisType, Mesh, NamedSharding, PartitionSpec

from costmodel.errors import InvalidPlanError
from costmodel.inputs.layout import Recompute
from planner.plan_schema import Plan
from planner.programs.residuals import residuals_as_bits
from planner.programs.transformer import Experts, KeepResiduals
from planner.shardings import entry_axes
from validate.data_parallel_region import data_dims, gathered_over_data

# The reference model's jax.checkpoint policies; torchtitan's per-op and per-layer variants
# are closest to Megatron's selective policy (keep the weight matmuls).
REMAT_POLICY = {
    Recompute.NONE: "none", Recompute.FULL: "full", Recompute.SELECTIVE: "selective",
    Recompute.SELECTIVE_OP: "selective", Recompute.SELECTIVE_LAYER: "selective",
}


def device_mesh(plan: Plan, devices: Any = None) -> Mesh:
    """The plan's mesh on ``devices`` (default: this process's, or the global ones under
    ``jax.distributed``), axes named as in the plan."""
    devices = jax.devices() if devices is None else devices
    if len(devices) < plan.layout.n_devices:
        raise InvalidPlanError(f"the plan needs {plan.layout.n_devices} devices, this process sees {len(devices)}",
                               fix="run it through validate.compile_check.compile_in_subprocess, which emulates them")
    sizes = tuple(a.size for a in plan.mesh)
    return jax.make_mesh(sizes, tuple(a.name for a in plan.mesh), axis_types=(AxisType.Auto,) * len(sizes),
                         devices=devices[:plan.layout.n_devices])


def token_spec(plan: Plan) -> PartitionSpec:
    """How a batch's ``[batch, sequence]`` tokens are split: by sequence over the data axes, by
    position over the context axes (serving plans have none)."""
    return PartitionSpec(plan.axes_of("dp") or None, plan.axes_of("cp") or None)


def kv_cache_spec(plan: Plan) -> PartitionSpec:
    """How a serving step's stacked K (and V) cache ``[layers, batch, kv_heads, tokens, head_dim]``
    is split: by layer over the pipeline axes, by sequence over the data axes (and a 2D
    weight-stationary plan's model-dimension axes, `costmodel.inputs.layout.Layout.tp_embed`), by
    KV head as the plan's ``wk``. A layer's own cache (served per layer) drops the first entry."""
    kv_split = plan.param_specs["layers/attn/wk"][2]
    return PartitionSpec(plan.axes_of("pp") or None, (*plan.axes_of("dp"), *plan.axes_of("tpe")) or None, kv_split, None, None)


def layer_kv_cache_spec(plan: Plan) -> PartitionSpec:
    """How one layer's K (and V) cache ``[batch, kv_heads, tokens, head_dim]`` is split: `kv_cache_spec` without the layers."""
    return PartitionSpec(*kv_cache_spec(plan)[1:])


def region_mesh(mesh: Mesh) -> Any:
    """``mesh``, or inside a region manual over some of its axes (the pipeline's,
    `validate.gpipe`) that region's abstract mesh, whose axis types say which axes are
    manual: shardings and nested shard_maps there must name it (XLA aborted otherwise)."""
    context = jax.sharding.get_abstract_mesh()
    return context if context.axis_names else mesh


def without_manual(spec: PartitionSpec, mapped: tuple[str, ...] = ()) -> PartitionSpec:
    """``spec`` without the axes the enclosing region is manual over (the data axes of
    `validate.data_parallel_region`), where each device holds its own slice along them, nor the
    ``mapped`` axes, which a ``jax.vmap(..., spmd_axis_name=mapped)`` around the caller puts on its
    mapped dimension."""
    dropped = set(jax.sharding.get_abstract_mesh().manual_axes) | set(mapped)
    if not dropped:
        return spec

    def kept(dim: Any) -> Any:
        axes = tuple(a for a in entry_axes(dim) if a not in dropped)
        return axes[0] if len(axes) == 1 else axes or None

    return PartitionSpec(*(kept(d) for d in spec))


def activation_constraint(plan: Plan, mesh: Mesh, *, per_replica: bool = False) -> Callable[[str, jax.Array], jax.Array]:
    """``constrain(name, x)`` for the reference model: pins the activations the plan names to
    its specs (``with_sharding_constraint``), so XLA partitions them the plan's way rather
    than by its own propagation. K/V heads follow the plan's ``wk``: split over the tensor axes
    that divide them (all, or on a serving plan's split tensor axis the major one), whole otherwise.
    ``per_replica``: the forward runs vmapped over the data replicas (`validate.data_parallel_region`),
    whose data axes the vmap places."""
    specs = {name: PartitionSpec(*spec) for name, spec in plan.activation_specs.items()}
    heads = plan.activation_specs.get("attention_heads_BxSxNxH")
    if heads is not None:
        kv_entry = plan.param_specs["layers/attn/wk"][2]
        groups = tuple(a for a in entry_axes(heads[2]) if a not in entry_axes(kv_entry))
        specs["kv_heads_BxSxKxH"] = PartitionSpec(heads[0], None, kv_entry, None)
        # A materialized score matrix is split like the heads (over KV heads, and their query groups over the rest),
        # whole over both sequences: left free, XLA split the backward's over the sequence and moved it with all-to-alls.
        specs["scores_BxKxGxSxS"] = PartitionSpec(heads[0], kv_entry, groups or None, None, None)

    residual = plan.activation_specs.get("residual_BxSxD")
    if residual is not None and residual[1] is not None:  # sequence parallel: a row-parallel output's gradient gathered once
        specs["row_output_grad_BxSxD"] = PartitionSpec(residual[0], None, residual[2])
        specs["positions_SxD"] = PartitionSpec(None, None)  # the learned positions a step uses, whole (`embed`)
    sizes = dict(zip(mesh.axis_names, mesh.devices.shape))
    mapped = plan.axes_of("dp") if per_replica else ()

    def divides(dim: Any, n: int) -> bool:
        return n % math.prod(sizes[a] for a in entry_axes(dim)) == 0

    def constrain(name: str, x: jax.Array) -> jax.Array:
        spec = specs.get(name)
        if spec is None:
            return x
        # A dimension its axes do not divide (an unpadded vocabulary, vocab_multiple=1) stays whole, as its weight does.
        spec = without_manual(PartitionSpec(*(d if divides(d, n) else None for d, n in zip(spec, x.shape))), mapped)
        return jax.lax.with_sharding_constraint(x, NamedSharding(region_mesh(mesh), spec))

    return constrain


def embedding_lookup(plan: Plan, mesh: Mesh, *, per_replica: bool = False) -> Callable[[jax.Array, jax.Array], jax.Array]:
    """Megatron's vocab-parallel embedding when the plan splits the table's vocabulary: each
    device looks up the tokens its vocabulary slice holds (zeros elsewhere) and a sum over the
    vocabulary axes completes the rows; a table ZeRO-3 also splits over the data axes is
    gathered whole over them first, as FSDP gathers any weight. Left to XLA, the gather of a
    vocabulary-sharded table became all-gathers of tokens, an all-reduce over every axis and
    an all-to-all of the gradient, and under ZeRO-3 exchanges of row slices over both axes.
    ``per_replica``: as `activation_constraint`'s."""
    vocab, _ = plan.param_specs["embed/tokens"]
    if vocab is None:
        return lambda table_VxD, tokens_BxS: jnp.take(table_VxD, tokens_BxS, axis=0)
    vocab_axes = (vocab,) if isinstance(vocab, str) else tuple(vocab)
    tokens = without_manual(token_spec(plan), plan.axes_of("dp") if per_replica else ())

    def local(table_vxD: jax.Array, tokens_BxS: jax.Array) -> jax.Array:
        start = jax.lax.axis_index(vocab_axes) * table_vxD.shape[0]
        local_BxS = tokens_BxS - start
        inside_BxS = (local_BxS >= 0) & (local_BxS < table_vxD.shape[0])
        rows_BxSxD = jnp.take(table_vxD, jnp.where(inside_BxS, local_BxS, 0), axis=0)
        return jax.lax.psum(jnp.where(inside_BxS[..., None], rows_BxSxD, 0), vocab_axes)

    def lookup(table_VxD: jax.Array, tokens_BxS: jax.Array) -> jax.Array:
        return jax.shard_map(local, mesh=region_mesh(mesh), in_specs=(PartitionSpec(vocab_axes, None), tokens),
                             out_specs=PartitionSpec(*tokens, None))(table_VxD, tokens_BxS)

    return lookup


def expert_region(plan: Plan, mesh: Mesh) -> Experts:
    """The MoE layer's experts in a region manual over the tensor axes, and under expert
    parallelism over the data axes too, as Megatron runs them.

    Tensor parallelism: every device of the tensor axes dispatches all its tokens and runs its
    experts on its slice of their hidden dimension (``w_in``/``w_gate`` split by columns, ``w_out``
    by rows), and a sum over the tensor axes completes the layer's output — one all-reduce of
    ``[tokens, D]`` in the forward and, as the transpose of taking the whole input, one of its
    gradient in the backward, as a dense MLP has. Left to XLA, the dispatch buffers (``k · 1.25``
    times the tokens) were all-reduced instead.

    Expert parallelism: each device enters with its own sequences (the region is manual over every
    data axis: over only the expert axes, XLA replicated the dispatch gather's operand over the
    others, jax 0.10.2), fills every expert's buffer for them, and an all-to-all over the expert
    axes hands each expert's buffers (inputs and routing weights) to the device holding that expert;
    another hands the outputs back — three in the forward, their transposes in the backward. Weights
    ZeRO-3 splits over the remaining data axes are gathered in the region's dtype (their gradients
    reduce-scattered back); the others' gradients are summed over those axes as the region ends.

    On the CPU backend, which has no 16-bit arithmetic, the region computes in float32: XLA aborts
    on its 16-bit sums there, over the manual axes and over the others alike (``Invalid binary
    instruction opcode copy``, jax 0.10.2)."""
    spec = plan.param_specs.get("layers/moe/w_in")
    if spec is None:
        return lambda fn: fn

    def named(entry: Any, carried: tuple[str, ...]) -> tuple[str, ...]:
        return tuple(a for a in entry_axes(entry) if a in carried)

    f_axes, e_axes = named(spec[3], plan.axes_of("tp")), named(spec[1], plan.axes_of("ep"))
    if not f_axes and not e_axes:
        return lambda fn: fn
    on_cpu = mesh.devices.flat[0].platform == "cpu"
    region_dtype = jnp.float32 if on_cpu else jnp.dtype(plan.train.compute_dtype.value)
    data = plan.axes_of("dp") if e_axes else ()
    manual = set(f_axes + data)
    batch = PartitionSpec(data or None)

    def local_spec(name: str) -> PartitionSpec:  # a stacked weight's spec in the layer loop, its manual axes only
        return PartitionSpec(*(named(d, tuple(manual)) or None for d in plan.param_specs[f"layers/moe/{name}"][1:]))

    def exchange(split_axis: int, concat_axis: int) -> Callable[[jax.Array], jax.Array]:
        if not e_axes:
            return lambda x: x
        return lambda x: jax.lax.all_to_all(x, e_axes, split_axis, concat_axis, tiled=True)

    def whole(w: jax.Array | None, spec: PartitionSpec) -> jax.Array | None:  # over the data axes ZeRO-3 splits it on
        dims = data_dims(spec, set(data) - set(e_axes))
        if w is None or not dims:
            return w
        return gathered_over_data(dims, jnp.float32 if on_cpu else None)(w.astype(region_dtype))

    def wrap(fn: Callable[..., jax.Array]) -> Callable[..., jax.Array]:
        def region(x_BxSxD: jax.Array, token_BxExC: jax.Array, weight_BxExC: jax.Array, w_in: jax.Array, w_gate: jax.Array | None,
                   w_out: jax.Array) -> jax.Array:
            specs = (local_spec("w_in"), local_spec("w_gate") if w_gate is not None else None, local_spec("w_out"))

            def local(x_BxSxD: jax.Array, token_BxExC: jax.Array, weight_BxExC: jax.Array, *weights: Any) -> jax.Array:
                weights = tuple(whole(w, s) for w, s in zip(weights, specs))
                if f_axes:
                    # Varying from the start, so the backward sums the gradient of the layer's input
                    # ([tokens, D]) over the tensor axes, not that of the dispatched copies.
                    x_BxSxD, weight_BxExC = jax.lax.pcast((x_BxSxD, weight_BxExC), f_axes, to="varying")
                y_BxSxD = fn(x_BxSxD, token_BxExC, weight_BxExC, *weights, to_experts=exchange(1, 0), from_experts=exchange(0, 1))
                return jax.lax.psum(y_BxSxD, f_axes) if f_axes else y_BxSxD

            y_BxSxD = jax.shard_map(local, mesh=mesh, in_specs=(batch, batch, batch, *specs), out_specs=batch, axis_names=manual)(
                x_BxSxD.astype(region_dtype), token_BxExC, weight_BxExC.astype(region_dtype), w_in, w_gate, w_out)
            return y_BxSxD.astype(x_BxSxD.dtype)

        return region

    return wrap


def residual_storage(mesh: Mesh, *, scanned_weights: bool = False) -> KeepResiduals:
    """How the layers keep their backward's residuals on ``mesh``'s backend: as raw 16-bit
    integers on the CPU, whose float normalization would widen them to fp32
    (`planner.programs.residuals`); as computed elsewhere. ``scanned_weights``: the layers are a
    scan's body over their stacked weights as stored, so a weight saved as itself stays itself (the
    scan reads it from the stack; a bitcast copy would be stacked again)."""
    if mesh.devices.flat[0].platform != "cpu":
        return lambda fn: fn
    return functools.partial(residuals_as_bits, scan_body=scanned_weights)
