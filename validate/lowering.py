"""A `Plan` as a JAX program: its device mesh, its sharded abstract inputs, its train step.

Every check of the validator (compile-only, timed, multi-host) builds the program here, so
they all test the same thing: the reference training step (`planner.programs.train_step`)
with the plan's recompute policy and micro-batches (gradient accumulation), its inputs
carrying ``NamedSharding``s of the plan's ``PartitionSpec``s, the plan's activation specs
as sharding constraints and a vocab-parallel embedding. ZeRO: with stage ≥ 1 the Adam
moments are split over the data axes and the accumulated gradients constrained to that
split; stage 3 also splits the parameters (the plan's ``param_specs`` say how). XLA still
all-reduces each micro-batch's gradients inside the accumulation loop, where the partial
sums appear; `validate.predict` counts them there. Pipeline plans run the 1F1B schedule of
`validate.one_f_one_b` (plain or interleaved), or for schedule "gpipe" the GPipe one of `validate.gpipe`.

A LoRA plan (``train.workload == "finetune-lora"``) takes ``(frozen, adapters, opt_state,
batch)`` and returns ``(adapters, opt_state, metrics)``: the frozen base weights carry the
plan's ``param_specs`` and are neither donated nor updated; each adapter is sharded like
the matrix it adapts (`planner.programs.lora.adapter_specs`), its moments over the data axes
too with ZeRO ≥ 1. Pipelined LoRA plans are not lowered.

A serving plan (``train.workload`` prefill or decode) takes ``(params, kv_cache, batch)`` and
returns ``(logits, kv_cache)``: `validate.serving`.
"""

from __future__ import annotations

import json
import math
from typing import Any, Callable

import jax
import jax.numpy as jnp
from jax.sharding import AxisType, Mesh, NamedSharding, PartitionSpec

from costmodel.errors import InvalidPlanError, UnsupportedError
from costmodel.inputs.layout import Recompute
from planner.programs.lora import adapter_shapes, adapter_specs, adapter_tree
from planner.programs.params import abstract_params
from planner.programs.residuals import residuals_as_bits
from planner.programs.train_step import abstract_train_inputs, adamw_update, make_loss_and_grads
from planner.programs.transformer import Experts, KeepResiduals
from planner.intraop.pinned import to_partition_spec
from planner.plan_schema import Plan
from planner.shardings import partition_spec_tree, split_over_data, zero_sharded_specs
from validate.intraop_program import constrained, intra_op_program

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


def check_param_specs(plan: Plan) -> None:
    """Raise `InvalidPlanError` naming the first parameter whose spec XLA would reject:
    missing, the wrong length, an axis the mesh lacks, an axis used twice, or a split the
    dimension's size does not divide.

    >>> from costmodel.inputs.layout import Layout
    >>> from planner.api import layout_plan
    >>> p = layout_plan("gpt2", Layout(dp=2, tp=4, micro_batch=8), hardware="a100-80gb", global_batch=64, seq_len=1024)
    >>> check_param_specs(p.model_copy(update={"param_specs": {**p.param_specs, "layers/mlp/w_in": (None, "tensr", None)}}))
    Traceback (most recent call last):
    costmodel.errors.InvalidPlanError: param_specs["layers/mlp/w_in"] = (None, 'tensr', None): the mesh has no axis 'tensr'; fix: use \
mesh axes data, tensor (or null), one per dimension of shape (12, 768, 3072)
    """
    sizes = {a.name: a.size for a in plan.mesh}
    shapes = {"/".join(str(k.key) for k in path): leaf.shape
              for path, leaf in jax.tree_util.tree_flatten_with_path(abstract_params(plan.model))[0]}
    for path, shape in shapes.items():
        fix = f"use mesh axes {', '.join(sizes)} (or null), one per dimension of shape {shape}"
        if path not in plan.param_specs:
            raise InvalidPlanError(f"param_specs has no entry for parameter {path!r}", fix=fix)
        spec = tuple(plan.param_specs[path])
        where = f"param_specs[{json.dumps(path)}] = {spec}"
        if len(spec) != len(shape):
            raise InvalidPlanError(f"{where}: {len(spec)} entries for a {len(shape)}-dimensional parameter", fix=fix)
        used: list[str] = []
        for dim, size in zip(spec, shape):
            axes = () if dim is None else (dim,) if isinstance(dim, str) else tuple(dim)
            for axis in axes:
                if axis not in sizes:
                    raise InvalidPlanError(f"{where}: the mesh has no axis {axis!r}", fix=fix)
                if axis in used:
                    raise InvalidPlanError(f"{where}: axis {axis!r} splits two dimensions",
                                           fix="use each mesh axis at most once per parameter")
                used.append(axis)
            split = math.prod(sizes[a] for a in axes)
            if size % split:
                raise InvalidPlanError(f"{where}: a dimension of size {size} cannot be split {split} ways",
                                       fix="leave that dimension unsplit (null) or use axes whose sizes divide it")
    extra = sorted(set(plan.param_specs) - set(shapes))
    if extra:
        raise InvalidPlanError(f"param_specs names {extra[0]!r}, which {plan.model.name} does not have",
                               fix="regenerate the plan with plan ... --out")


def input_specs(plan: Plan) -> tuple[Any, ...]:
    """``PartitionSpec`` trees of ``(params, opt_state, batch)``: an intra-op plan's chosen
    ones (`validate.intraop_program`), else the layout's; of ``(frozen, adapters, opt_state, batch)``
    for a LoRA plan."""
    program = intra_op_program(plan)
    if program is not None:
        flat = [to_partition_spec(s) for s in program.input_shardings()]
        return jax.tree_util.tree_unflatten(jax.tree_util.tree_structure(program.abstract), flat)
    param_specs = partition_spec_tree(plan.model, plan.param_specs)
    data_axes = plan.axes_of("dp")
    if plan.train.is_inference:
        return _serving_specs(plan, param_specs, data_axes)
    if plan.train.is_lora:
        return (param_specs, *_lora_specs(plan, data_axes))
    moment_specs = param_specs
    if plan.layout.zero_stage >= 1:
        shape = {a.name: a.size for a in plan.mesh}
        moment_specs = partition_spec_tree(plan.model, zero_sharded_specs(plan.model, plan.param_specs, data_axes, shape))
    context_axes = plan.axes_of("cp")
    token_spec = PartitionSpec(data_axes or None, context_axes or None)
    opt_specs = {"m": moment_specs, "v": moment_specs, "step": PartitionSpec()}
    return param_specs, opt_specs, {"tokens": token_spec, "targets": token_spec}


def kv_cache_spec(plan: Plan) -> PartitionSpec:
    """How a serving step's K (and V) cache ``[layers, batch, tokens, kv_heads, head_dim]`` is split:
    by layer over the pipeline axes, by sequence over the data axes, by KV head as the plan's ``wk``."""
    kv_split = plan.param_specs["layers/attn/wk"][2]
    return PartitionSpec(plan.axes_of("pp") or None, plan.axes_of("dp") or None, None, kv_split, None)


def _serving_specs(plan: Plan, param_specs: Any, data_axes: tuple[str, ...]) -> tuple[Any, Any, Any]:
    """``PartitionSpec`` trees of a serving step's weights, KV cache and batch (prompts, or a token and its position)."""
    cache = kv_cache_spec(plan)
    batch = {"tokens": PartitionSpec(data_axes or None, None)}
    if plan.train.workload.value == "decode":
        batch["position"] = PartitionSpec()
    return param_specs, {"k": cache, "v": cache}, batch


def _lora_specs(plan: Plan, data_axes: tuple[str, ...]) -> tuple[Any, Any, Any]:
    """``PartitionSpec`` trees of a LoRA plan's adapters, their AdamW state and the batch."""
    model, lora = plan.model, plan.train.lora
    flat = adapter_specs(model, lora, plan.param_specs)
    moments = flat
    if plan.layout.zero_stage >= 1:
        moments = split_over_data(flat, adapter_shapes(model, lora), data_axes, {a.name: a.size for a in plan.mesh})

    def tree(specs: dict[str, tuple[Any, ...]]) -> Any:
        return adapter_tree(model, lora, {path: PartitionSpec(*spec) for path, spec in specs.items()})

    token_spec = PartitionSpec(data_axes or None, plan.axes_of("cp") or None)
    return tree(flat), {"m": tree(moments), "v": tree(moments), "step": PartitionSpec()}, {"tokens": token_spec, "targets": token_spec}


def abstract_inputs(plan: Plan, mesh: Mesh) -> tuple[Any, ...]:
    """The step's inputs (`input_specs`) as ``jax.ShapeDtypeStruct``s with the plan's shardings."""
    def sharded(tree: Any, spec_tree: Any) -> Any:
        return jax.tree.map(lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=NamedSharding(mesh, s)), tree, spec_tree)

    if plan.train.is_inference:
        from planner.programs.decode import abstract_decode_inputs
        from planner.programs.prefill import abstract_prefill_inputs

        serving_inputs = abstract_decode_inputs if plan.train.workload.value == "decode" else abstract_prefill_inputs
        inputs = serving_inputs(plan.model, plan.train, replicas=plan.layout.dp)
    else:
        inputs = abstract_train_inputs(plan.model, plan.train)
    return tuple(sharded(t, s) for t, s in zip(inputs, input_specs(plan)))


def initial_inputs(plan: Plan, mesh: Mesh, *, seed: int = 0) -> tuple[Any, Any, Any]:
    """``(params, opt_state, batch)`` with the plan's shardings: random weights and tokens
    from ``seed``, in the plan's dtypes. Each process builds the whole state on its host and
    hands its own devices their slices, so the state is the same whatever the process count
    (also under ``jax.distributed``)."""
    import numpy as np

    from planner.programs.lora import init_adapters, init_frozen
    from planner.programs.params import init_params
    from planner.programs.train_step import init_opt_state

    sequence_BxS = np.random.default_rng(seed).integers(0, plan.model.vocab_size, (plan.train.global_batch, plan.train.seq_len + 1),
                                                        dtype=np.int32)
    batch = {"tokens": sequence_BxS[:, :-1], "targets": sequence_BxS[:, 1:]}
    if plan.train.is_lora:
        adapters = init_adapters(plan.model, plan.train.lora, jax.random.key(seed + 1), dtype=np.dtype(plan.train.param_dtype.value))
        host = jax.device_get((init_frozen(plan.model, plan.train, jax.random.key(seed)), adapters, init_opt_state(adapters), batch))
    else:
        params = init_params(plan.model, jax.random.key(seed), dtype=np.dtype(plan.train.param_dtype.value))
        host = jax.device_get((params, init_opt_state(params), batch))
    shardings = jax.tree.map(lambda spec: NamedSharding(mesh, spec), input_specs(plan))
    return jax.tree.map(lambda x, s: jax.make_array_from_callback(x.shape, s, lambda index: x[index]), host, shardings)


def _region_mesh(mesh: Mesh) -> Any:
    """``mesh``, or inside a region manual over some of its axes (the pipeline's,
    `validate.gpipe`) that region's abstract mesh, whose axis types say which axes are
    manual: shardings and nested shard_maps there must name it (XLA aborted otherwise)."""
    context = jax.sharding.get_abstract_mesh()
    return context if context.axis_names else mesh


def activation_constraint(plan: Plan, mesh: Mesh) -> Callable[[str, jax.Array], jax.Array]:
    """``constrain(name, x)`` for the reference model: pins the activations the plan names to
    its specs (``with_sharding_constraint``), so XLA partitions them the plan's way rather
    than by its own propagation. K/V heads follow the query heads' spec when the tensor
    axes divide the KV heads, and stay whole otherwise, as the plan's ``wk`` does."""
    specs = {name: PartitionSpec(*spec) for name, spec in plan.activation_specs.items()}
    heads = plan.activation_specs.get("attention_heads_BxSxNxH")
    if heads is not None:
        kv_split = plan.param_specs["layers/attn/wk"][2] is not None
        specs["kv_heads_BxSxKxH"] = PartitionSpec(*(heads if kv_split else (heads[0], None, None, None)))
        # A materialized score matrix is split like the heads (over KV heads, or their query groups), whole over
        # both sequences: left free, XLA split the backward's over the sequence and moved it with all-to-alls.
        specs["scores_BxKxGxSxS"] = PartitionSpec(heads[0], heads[2] if kv_split else None, None if kv_split else heads[2], None, None)

    sizes = dict(zip(mesh.axis_names, mesh.devices.shape))

    def divides(dim: Any, n: int) -> bool:
        return dim is None or n % math.prod(sizes[a] for a in ((dim,) if isinstance(dim, str) else dim)) == 0

    def constrain(name: str, x: jax.Array) -> jax.Array:
        spec = specs.get(name)
        if spec is None:
            return x
        # A dimension its axes do not divide (GPT-2's 50257-token vocabulary) stays whole, as its weight does.
        spec = PartitionSpec(*(d if divides(d, n) else None for d, n in zip(spec, x.shape)))
        return jax.lax.with_sharding_constraint(x, NamedSharding(_region_mesh(mesh), spec))

    return constrain


def embedding_lookup(plan: Plan, mesh: Mesh) -> Callable[[jax.Array, jax.Array], jax.Array]:
    """Megatron's vocab-parallel embedding when the plan splits the table's vocabulary: each
    device looks up the tokens its vocabulary slice holds (zeros elsewhere) and a sum over the
    vocabulary axes completes the rows; a table ZeRO-3 also splits over the data axes is
    gathered whole over them first, as FSDP gathers any weight. Left to XLA, the gather of a
    vocabulary-sharded table became all-gathers of tokens, an all-reduce over every axis and
    an all-to-all of the gradient, and under ZeRO-3 exchanges of row slices over both axes."""
    vocab, _ = plan.param_specs["embed/tokens"]
    if vocab is None:
        return lambda table_VxD, tokens_BxS: jnp.take(table_VxD, tokens_BxS, axis=0)
    vocab_axes = (vocab,) if isinstance(vocab, str) else tuple(vocab)
    token_spec = input_specs(plan)[-1]["tokens"]

    def local(table_vxD: jax.Array, tokens_BxS: jax.Array) -> jax.Array:
        start = jax.lax.axis_index(vocab_axes) * table_vxD.shape[0]
        local_BxS = tokens_BxS - start
        inside_BxS = (local_BxS >= 0) & (local_BxS < table_vxD.shape[0])
        rows_BxSxD = jnp.take(table_vxD, jnp.where(inside_BxS, local_BxS, 0), axis=0)
        return jax.lax.psum(jnp.where(inside_BxS[..., None], rows_BxSxD, 0), vocab_axes)

    def lookup(table_VxD: jax.Array, tokens_BxS: jax.Array) -> jax.Array:
        return jax.shard_map(local, mesh=_region_mesh(mesh), in_specs=(PartitionSpec(vocab_axes, None), token_spec),
                             out_specs=PartitionSpec(*token_spec, None))(table_VxD, tokens_BxS)

    return lookup


def tensor_parallel_experts(plan: Plan, mesh: Mesh) -> Experts:
    """Megatron's MoE layer under tensor parallelism without expert parallelism: every device
    of the tensor axes dispatches all tokens and runs every expert on its slice of the
    experts' hidden dimension (``w_in``/``w_gate`` split by columns, ``w_out`` by rows), and a
    sum over the tensor axes completes the layer's output — one all-reduce of ``[tokens, D]``
    in the forward and, as the transpose of taking the whole input, one of its gradient in the
    backward, as a dense MLP has. Left to XLA, the dispatch buffers (``k · 1.25`` times the
    tokens) were all-reduced instead. On the CPU backend, which has no 16-bit arithmetic, the
    region computes in float32: XLA aborts on its 16-bit sums there, over the manual axes and
    over the others alike (``Invalid binary instruction opcode copy``, jax 0.10.2)."""
    tensor = set(plan.axes_of("tp"))
    region_dtype = jnp.float32 if mesh.devices.flat[0].platform == "cpu" else jnp.dtype(plan.train.compute_dtype.value)
    spec = plan.param_specs.get("layers/moe/w_in")
    split = spec[3] if spec is not None else None
    f_axes = tuple(a for a in ((split,) if isinstance(split, str) else split or ()) if a in tensor)
    if not f_axes:
        return lambda fn: fn
    columns, rows = PartitionSpec(None, None, f_axes), PartitionSpec(None, f_axes, None)

    def wrap(fn: Callable[..., jax.Array]) -> Callable[..., jax.Array]:
        def region(x_BxSxD: jax.Array, token_BxExC: jax.Array, weight_BxExC: jax.Array, w_in: jax.Array, w_gate: jax.Array | None,
                   w_out: jax.Array) -> jax.Array:
            def local(x_BxSxD: jax.Array, token_BxExC: jax.Array, weight_BxExC: jax.Array, *weights: Any) -> jax.Array:
                # Varying from the start, so the backward sums the gradient of the layer's input
                # ([tokens, D]) over the tensor axes, not that of the dispatched copies.
                x_BxSxD, weight_BxExC = jax.lax.pcast((x_BxSxD, weight_BxExC), f_axes, to="varying")
                return jax.lax.psum(fn(x_BxSxD, token_BxExC, weight_BxExC, *weights), f_axes)

            whole = PartitionSpec()
            in_specs = (whole, whole, whole, columns, columns if w_gate is not None else None, rows)
            y_BxSxD = jax.shard_map(local, mesh=mesh, in_specs=in_specs, out_specs=whole, axis_names=set(f_axes))(
                x_BxSxD.astype(region_dtype), token_BxExC, weight_BxExC.astype(region_dtype), w_in, w_gate, w_out)
            return y_BxSxD.astype(x_BxSxD.dtype)

        return region

    return wrap


def jitted_step(plan: Plan, mesh: Mesh) -> Callable[..., Any]:
    """`train_step` under ``jax.jit`` with the plan's input shardings kept on the outputs
    (a step is a fixed point of its layout) and the parameters and optimizer state donated,
    as a training loop runs it. An intra-op plan runs the program it chose, every equation
    pinned (`validate.intraop_program.constrained`)."""
    specs = input_specs(plan)
    named = jax.tree.map(lambda s: NamedSharding(mesh, s), specs)
    if plan.train.is_inference:
        from validate.serving import serving_program

        logits = NamedSharding(mesh, PartitionSpec(plan.axes_of("dp") or None, plan.activation_specs["logits_BxSxV"][2]))
        return jax.jit(serving_program(plan, mesh), in_shardings=named, out_shardings=(logits, named[1]), donate_argnums=(1,))
    program = intra_op_program(plan)
    step = constrained(program, mesh) if program is not None else train_step(plan, mesh)
    # What the step updates (the parameters, or a LoRA plan's adapters, and the optimizer state) is donated.
    updated = (1, 2) if plan.train.is_lora else (0, 1)
    return jax.jit(step, in_shardings=named, out_shardings=(*(named[i] for i in updated), NamedSharding(mesh, PartitionSpec())),
                   donate_argnums=updated)


def loss_and_grads(plan: Plan, mesh: Mesh) -> Callable[..., Any]:
    """``(params, batch) -> (mean loss, fp32 gradients)`` as the plan computes them: its
    attention kernel, recompute policy, micro-batches, activation constraints and vocab-parallel embedding,
    and for ``pp > 1`` the pipeline schedule of `validate.gpipe`."""
    lay = plan.layout
    if lay.pp > 1 and plan.train.is_lora:
        raise UnsupportedError("a LoRA plan with pipeline stages is not lowered yet", fix="plan it again (plan never emits one)")
    if lay.pp > 1:
        from validate.gpipe import pipeline_loss_and_grads

        return pipeline_loss_and_grads(plan, mesh, remat=REMAT_POLICY[lay.recompute])
    return make_loss_and_grads(plan.model, plan.train, remat=REMAT_POLICY[lay.recompute], micro_batches=lay.micro_batches(plan.train),
                               attention=lay.stack.attention.value,
                               hooks={"constrain": activation_constraint(plan, mesh), "lookup": embedding_lookup(plan, mesh),
                                      "experts": tensor_parallel_experts(plan, mesh), "keep_residuals": residual_storage(mesh)})


def residual_storage(mesh: Mesh) -> KeepResiduals:
    """How the layers keep their backward's residuals on ``mesh``'s backend: as raw 16-bit
    integers on the CPU, whose float normalization would widen them to fp32
    (`planner.programs.residuals`); as computed elsewhere."""
    return residuals_as_bits if mesh.devices.flat[0].platform == "cpu" else (lambda fn: fn)


def train_step(plan: Plan, mesh: Mesh) -> Callable[..., Any]:
    """The plan's training step ``(params, opt_state, batch) -> (params, opt_state, metrics)``.

    >>> from costmodel.inputs.layout import Layout
    >>> from planner.api import layout_plan
    >>> p = layout_plan("gpt2", Layout(micro_batch=2, recompute="full"), hardware="a100-80gb", global_batch=4, seq_len=32)
    >>> step = train_step(p, device_mesh(p))
    >>> out = jax.eval_shape(step, *abstract_inputs(p, device_mesh(p)))
    >>> out[2]["loss"].shape
    ()
    """
    lay, train = plan.layout, plan.train
    grads_of = loss_and_grads(plan, mesh)
    opt_specs = input_specs(plan)[-2]
    grad_shardings = jax.tree.map(lambda s: NamedSharding(mesh, s), opt_specs["m"])
    def step(params: Any, opt_state: Any, batch: Any, *frozen: Any) -> tuple[Any, Any, dict[str, jax.Array]]:
        loss, grads = grads_of(params, batch, *frozen)
        if lay.zero_stage >= 1:
            grads = jax.lax.with_sharding_constraint(grads, grad_shardings)
        with jax.named_scope("optimizer"):
            params, opt_state = adamw_update(params, grads, opt_state, train.optimizer)
        return params, opt_state, {"loss": loss}

    if train.is_lora:  # only the adapters train; the frozen weights come first
        return lambda frozen, adapters, opt_state, batch: step(adapters, opt_state, batch, frozen)
    return step
