"""A `Plan` as a JAX program: its device mesh, its sharded abstract inputs, its train step.

Every check of the validator (compile-only, timed, multi-host) builds the program here, so
they all test the same thing: the reference training step (`planner.programs.train_step`)
with the plan's recompute policy and micro-batches (gradient accumulation), its inputs
carrying ``NamedSharding``s of the plan's ``PartitionSpec``s, the plan's activation specs
as sharding constraints and a vocab-parallel embedding. ZeRO: with stage ≥ 1 the Adam
moments are split over the data axes and the accumulated gradients constrained to that
split; stage 3 also splits the parameters (the plan's ``param_specs`` say how). Where ZeRO 1–2
gradients are formed per replica, the parameters are a compute-dtype copy and the fp32 master
is split with the moments (`costmodel.step.kernels.keeps_compute_copy`), so the updated copy is
gathered in the compute dtype. The jax stack's
gradients are reduced as ZeRO needs (`validate.data_parallel_region`); elsewhere (pipelines,
context or expert axes, ZeRO 3 or an MoE model beside tensor axes, LoRA) XLA all-reduces each
micro-batch's gradients inside the accumulation loop, where the partial sums appear;
`validate.predict` counts them there. Pipeline plans run the 1F1B schedule of
`validate.one_f_one_b` (plain or interleaved), or for schedule "gpipe" the GPipe one of `validate.gpipe`.

Each workload lowers by its entry in `WORKLOAD_PROGRAMS`. A LoRA plan takes ``(frozen, adapters, opt_state,
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
from dataclasses import dataclass
from functools import partial
from typing import Any, Callable

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from costmodel.errors import InvalidPlanError, UnsupportedError
from costmodel.inputs.layout import Recompute
from costmodel.step.kernels import keeps_compute_copy
from planner.intraop.pinned import to_partition_spec
from planner.plan_schema import Plan
from planner.programs.decode import abstract_decode_inputs
from planner.programs.fused_step import make_fused_train_step
from planner.programs.lora import adapter_shapes, adapter_specs, adapter_tree, init_adapters, init_frozen
from planner.programs.params import abstract_params, init_params
from planner.programs.prefill import abstract_prefill_inputs
from planner.programs.residuals import to_bits
from planner.programs.train_step import abstract_train_inputs, adamw_update, init_opt_state, make_loss_and_grads, with_master
from planner.shardings import entry_axes, partition_spec_tree, split_over_data, zero_sharded_specs
from validate.data_parallel_region import data_parallel_loss_and_grads, reduces_over_data, replica_loss_and_grads
from validate.gpipe import gpipe_loss_and_grads
from validate.intraop_program import constrained, intra_op_program
from validate.mesh_hooks import (
    REMAT_POLICY,
    activation_constraint,
    embedding_lookup,
    expert_region,
    kv_cache_spec,
    layer_kv_cache_spec,
    residual_storage,
    token_spec,
)
from validate.one_f_one_b import one_f_one_b_loss_and_grads, runs_one_f_one_b
from validate.serving import serves_stacked, serving_program
from validate.split_backward import runs_split_backward, split_backward_loss_and_grads


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
            axes = entry_axes(dim)
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
    return workload_program(plan).input_specs(plan, param_specs, plan.axes_of("dp"))


def _train_specs(plan: Plan, param_specs: Any, data_axes: tuple[str, ...]) -> tuple[Any, Any, Any]:
    """``PartitionSpec`` trees of a training step's parameters, AdamW state and batch."""
    moment_specs = param_specs
    if plan.layout.zero_stage >= 1:
        shape = {a.name: a.size for a in plan.mesh}
        moment_specs = partition_spec_tree(plan.model, zero_sharded_specs(plan.model, plan.param_specs, data_axes, shape,
                                                                     whole_layers=plan.train.optimizer_in_backward))
    tokens = token_spec(plan)
    opt_specs = {"m": moment_specs, "v": moment_specs, "step": PartitionSpec()}
    if _keeps_compute_copy(plan):  # the fp32 master split as the moments are
        opt_specs["master"] = moment_specs
    return param_specs, opt_specs, {"tokens": tokens, "targets": tokens}


def _keeps_compute_copy(plan: Plan) -> bool:
    """Whether the step holds a compute-dtype copy of the weights and the fp32 master in the optimizer state
    (`costmodel.step.kernels.keeps_compute_copy`: ZeRO 1–2 where the gradients are formed per replica)."""
    return keeps_compute_copy(plan.model, plan.train, plan.layout)


def _serving_specs(plan: Plan, param_specs: Any, data_axes: tuple[str, ...]) -> tuple[Any, Any, Any]:
    """``PartitionSpec`` trees of a serving step's weights, KV cache and batch (prompts, or a token
    and its position); the layers served per layer or stacked as `validate.serving.serves_stacked` says."""
    cache = kv_cache_spec(plan)
    batch = {"tokens": PartitionSpec(data_axes or None, None)}
    batch |= plan.train.workload.of_step(decode={"position": PartitionSpec()}, prefill={})
    if serves_stacked(plan):
        return param_specs, {"k": cache, "v": cache}, batch
    layers = plan.model.num_layers
    one_layer = jax.tree.map(lambda spec: PartitionSpec(*spec[1:]), param_specs["layers"])
    layer_cache = [layer_kv_cache_spec(plan)] * layers
    return {**param_specs, "layers": [one_layer] * layers}, {"k": layer_cache, "v": layer_cache}, batch


def _lora_specs(plan: Plan, param_specs: Any, data_axes: tuple[str, ...]) -> tuple[Any, Any, Any, Any]:
    """``PartitionSpec`` trees of a LoRA plan's frozen weights, adapters, their AdamW state and the batch."""
    model, lora = plan.model, plan.train.workload.lora
    flat = adapter_specs(model, lora, plan.param_specs)
    moments = flat
    if plan.layout.zero_stage >= 1:
        moments = split_over_data(flat, adapter_shapes(model, lora), data_axes, {a.name: a.size for a in plan.mesh})

    def tree(specs: dict[str, tuple[Any, ...]]) -> Any:
        return adapter_tree(model, lora, {path: PartitionSpec(*spec) for path, spec in specs.items()})

    tokens = token_spec(plan)
    return param_specs, tree(flat), {"m": tree(moments), "v": tree(moments), "step": PartitionSpec()}, {"tokens": tokens, "targets": tokens}


def abstract_inputs(plan: Plan, mesh: Mesh) -> tuple[Any, ...]:
    """The step's inputs (`input_specs`) as ``jax.ShapeDtypeStruct``s with the plan's shardings."""
    def sharded(tree: Any, spec_tree: Any) -> Any:
        return jax.tree.map(lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=NamedSharding(mesh, s)), tree, spec_tree)

    inputs = workload_program(plan).abstract_inputs(plan)
    if _state_as_bits(plan, mesh):
        inputs = (*jax.eval_shape(partial(jax.tree.map, to_bits), inputs[:2]), *inputs[2:])
    return tuple(sharded(t, s) for t, s in zip(inputs, input_specs(plan)))


def _state_as_bits(plan: Plan, mesh: Mesh) -> bool:
    """Whether the step takes and returns its 16-bit weights and moments as integers of their
    width: the step in backward on the CPU backend (`planner.programs.fused_step`: a loop that
    writes 16-bit floats there writes fp32)."""
    return plan.train.optimizer_in_backward and mesh.devices.flat[0].platform == "cpu"


def _abstract_train_inputs(plan: Plan) -> tuple[Any, ...]:
    return abstract_train_inputs(plan.model, plan.train, compute_copy=_keeps_compute_copy(plan))


def _abstract_serving_inputs(plan: Plan) -> tuple[Any, ...]:
    serving_inputs = plan.train.workload.of_step(decode=abstract_decode_inputs, prefill=abstract_prefill_inputs)
    return serving_inputs(plan.model, plan.train, replicas=plan.layout.dp, stacked=serves_stacked(plan))


def initial_inputs(plan: Plan, mesh: Mesh, *, seed: int = 0) -> tuple[Any, Any, Any]:
    """``(params, opt_state, batch)`` with the plan's shardings: random weights and tokens
    from ``seed``, in the plan's dtypes. Each process builds the whole state on its host and
    hands its own devices their slices, so the state is the same whatever the process count
    (also under ``jax.distributed``)."""
    sequence_BxS = np.random.default_rng(seed).integers(0, plan.model.vocab_size, (plan.train.global_batch, plan.train.seq_len + 1),
                                                        dtype=np.int32)
    batch = {"tokens": sequence_BxS[:, :-1], "targets": sequence_BxS[:, 1:]}
    values = workload_program(plan).initial_values(plan, seed, batch)
    if _state_as_bits(plan, mesh):
        values = (*jax.tree.map(to_bits, values[:2]), *values[2:])
    host = jax.device_get(values)
    shardings = jax.tree.map(lambda spec: NamedSharding(mesh, spec), input_specs(plan))
    return jax.tree.map(lambda x, s: jax.make_array_from_callback(x.shape, s, lambda index: x[index]), host, shardings)


def _initial_train_values(plan: Plan, seed: int, batch: dict[str, Any]) -> tuple[Any, ...]:
    params = init_params(plan.model, jax.random.key(seed), dtype=np.dtype(plan.train.param_dtype.value))
    opt_state = init_opt_state(params, np.dtype(plan.train.optimizer_dtype.value))
    if not _keeps_compute_copy(plan):
        return params, opt_state, batch
    return jax.tree.map(lambda p: p.astype(plan.train.compute_dtype.value), params), with_master(opt_state, params), batch


def _initial_lora_values(plan: Plan, seed: int, batch: dict[str, Any]) -> tuple[Any, ...]:
    adapters = init_adapters(plan.model, plan.train.workload.lora, jax.random.key(seed + 1), dtype=np.dtype(plan.train.param_dtype.value))
    return init_frozen(plan.model, plan.train, jax.random.key(seed)), adapters, init_opt_state(adapters), batch


def _no_initial_serving_values(plan: Plan, seed: int, batch: dict[str, Any]) -> tuple[Any, ...]:
    raise UnsupportedError(f"a {plan.train.workload.kind} plan is checked compiled only: the validator runs no serving steps",
                           fix="run plan validate with --compile-only")


def jitted_step(plan: Plan, mesh: Mesh) -> Callable[..., Any]:
    """`train_step` under ``jax.jit`` with the plan's input shardings kept on the outputs
    (a step is a fixed point of its layout) and the parameters and optimizer state donated,
    as a training loop runs it. An intra-op plan runs the program it chose, every equation
    pinned (`validate.intraop_program.constrained`)."""
    named = jax.tree.map(lambda s: NamedSharding(mesh, s), input_specs(plan))
    return workload_program(plan).jit(plan, mesh, named)


def _jitted_serving_step(plan: Plan, mesh: Mesh, named: Any) -> Callable[..., Any]:
    logits = NamedSharding(mesh, PartitionSpec(plan.axes_of("dp") or None, plan.activation_specs["logits_BxSxV"][2]))
    return jax.jit(serving_program(plan, mesh), in_shardings=named, out_shardings=(logits, named[1]), donate_argnums=(1,))


def _jitted_train_step(plan: Plan, mesh: Mesh, named: Any, *, updated: tuple[int, int]) -> Callable[..., Any]:
    """What the step updates (the parameters, or a LoRA plan's adapters, and the optimizer state) is donated."""
    program = intra_op_program(plan)
    step = constrained(program, mesh) if program is not None else train_step(plan, mesh)
    return jax.jit(step, in_shardings=named, out_shardings=(*(named[i] for i in updated), NamedSharding(mesh, PartitionSpec())),
                   donate_argnums=updated)


def loss_and_grads(plan: Plan, mesh: Mesh) -> Callable[..., Any]:
    """``(params, batch) -> (mean loss, fp32 gradients)`` as the plan computes them: its
    attention kernel, recompute policy, micro-batches, activation constraints and vocab-parallel embedding,
    and for ``pp > 1`` the pipeline schedule of `validate.gpipe`."""
    lay = plan.layout
    if lay.pp > 1 and not plan.train.workload.pipeline_lowered:
        raise UnsupportedError(f"a {plan.train.workload.kind} plan with pipeline stages is not lowered yet",
                               fix="plan it again (plan never emits one)")
    if lay.pp > 1 and runs_split_backward(plan):
        return split_backward_loss_and_grads(plan, mesh, remat=REMAT_POLICY[lay.recompute])
    if lay.pp > 1 and runs_one_f_one_b(plan):
        return one_f_one_b_loss_and_grads(plan, mesh, remat=REMAT_POLICY[lay.recompute])
    if lay.pp > 1:
        return gpipe_loss_and_grads(plan, mesh, remat=REMAT_POLICY[lay.recompute])
    per_replica = reduces_over_data(plan) and lay.zero_stage < 3
    hooks = _forward_hooks(plan, mesh, scanned_weights=True, per_replica=per_replica)
    if reduces_over_data(plan):
        param_specs, opt_specs, _ = input_specs(plan)
        region = replica_loss_and_grads if per_replica else data_parallel_loss_and_grads
        return region(plan, mesh, param_specs, opt_specs["m"], remat=REMAT_POLICY[lay.recompute], hooks=hooks)
    return make_loss_and_grads(plan.model, plan.train, remat=REMAT_POLICY[lay.recompute], micro_batches=lay.micro_batches(plan.train),
                               attention=lay.stack.attention.value, hooks=hooks, loss_chunks=lay.stack.cross_entropy_chunks)


def _forward_hooks(plan: Plan, mesh: Mesh, *, scanned_weights: bool, per_replica: bool = False) -> dict[str, Any]:
    """`forward`'s hooks for ``plan`` on ``mesh``: its activation specs, vocab-parallel lookup, experts'
    region and residual storage (``scanned_weights``: the layers are a scan over their stored weights;
    ``per_replica``: the forward is vmapped over the data replicas, `validate.data_parallel_region`)."""
    return {"constrain": activation_constraint(plan, mesh, per_replica=per_replica),
            "lookup": embedding_lookup(plan, mesh, per_replica=per_replica), "experts": expert_region(plan, mesh),
            "keep_residuals": residual_storage(mesh, scanned_weights=scanned_weights)}


def train_step(plan: Plan, mesh: Mesh) -> Callable[..., Any]:
    """The plan's training step ``(params, opt_state, batch) -> (params, opt_state, metrics)``.

    >>> from costmodel.inputs.layout import Layout
    >>> from planner.api import layout_plan
    >>> p = layout_plan("gpt2", Layout(micro_batch=2, recompute="full"), hardware="a100-80gb", global_batch=4, seq_len=32)
    >>> from validate.mesh_hooks import device_mesh
    >>> step = train_step(p, device_mesh(p))
    >>> out = jax.eval_shape(step, *abstract_inputs(p, device_mesh(p)))
    >>> out[2]["loss"].shape
    ()
    """
    lay, train = plan.layout, plan.train
    if train.optimizer_in_backward:
        return fused_train_step(plan, mesh)
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

    return workload_program(plan).step_arguments(step)


def fused_train_step(plan: Plan, mesh: Mesh) -> Callable[..., Any]:
    """The plan's training step with the optimizer step in backward (`planner.programs.fused_step`):
    the same hooks as `loss_and_grads`, each layer's weights pinned to the parameters' split and
    its moments and gradients to the optimizer state's (ZeRO). XLA's partitioner places the data-parallel
    reductions, inside the backward loop, and ZeRO's gathers of updated weights."""
    lay = plan.layout
    if lay.pp > 1 or lay.recompute is not Recompute.FULL or intra_op_program(plan) is not None:
        raise UnsupportedError("the optimizer step in backward is lowered unpipelined, with full recompute and the layout's "
                               "shardings only", fix="validate the plan planned with --pp 1 --recompute full")
    on_cpu = mesh.devices.flat[0].platform == "cpu"
    hooks = _forward_hooks(plan, mesh, scanned_weights=False)
    param_specs, opt_specs = input_specs(plan)[:2]

    def pinned_like(specs: Any) -> Callable[[str, Any], Any]:
        def pin(kind: str, tree: Any) -> Any:
            held = jax.tree.map(lambda s: PartitionSpec(*s[1:]), specs["layers"]) if kind == "layers" else {k: specs[k] for k in tree}
            return jax.lax.with_sharding_constraint(tree, jax.tree.map(lambda s: NamedSharding(mesh, s), held))
        return pin

    return make_fused_train_step(plan.model, plan.train, attention=lay.stack.attention.value, hooks=hooks,
                                 loss_chunks=lay.stack.cross_entropy_chunks, as_bits=on_cpu, shard_as_weights=pinned_like(param_specs),
                                 shard_as_moments=pinned_like(opt_specs["m"]))


def _frozen_first(step: Callable[..., Any]) -> Callable[..., Any]:
    """Only the adapters train; the frozen weights come first."""
    return lambda frozen, adapters, opt_state, batch: step(adapters, opt_state, batch, frozen)


@dataclass(frozen=True)
class WorkloadProgram:
    """How one workload's step is lowered: its inputs' ``PartitionSpec`` trees, its abstract and
    initial inputs, its jitted step, and how the training step takes its arguments."""

    input_specs: Callable[[Plan, Any, tuple[str, ...]], tuple[Any, ...]]
    abstract_inputs: Callable[[Plan], tuple[Any, ...]]
    initial_values: Callable[[Plan, int, dict[str, Any]], tuple[Any, ...]]
    jit: Callable[[Plan, Mesh, Any], Callable[..., Any]]
    step_arguments: Callable[[Callable[..., Any]], Callable[..., Any]] = lambda step: step


_TRAINING = WorkloadProgram(input_specs=_train_specs, abstract_inputs=_abstract_train_inputs, initial_values=_initial_train_values,
                            jit=partial(_jitted_train_step, updated=(0, 1)))
# The program each workload (`costmodel.workloads`, by its --workload name) lowers to.
WORKLOAD_PROGRAMS = {
    "pretrain": _TRAINING,
    "finetune-full": _TRAINING,
    "finetune-lora": WorkloadProgram(input_specs=_lora_specs, abstract_inputs=_abstract_train_inputs,
                                     initial_values=_initial_lora_values, jit=partial(_jitted_train_step, updated=(1, 2)),
                                     step_arguments=_frozen_first),
    "prefill": WorkloadProgram(input_specs=_serving_specs, abstract_inputs=_abstract_serving_inputs,
                               initial_values=_no_initial_serving_values, jit=_jitted_serving_step),
}
WORKLOAD_PROGRAMS["decode"] = WORKLOAD_PROGRAMS["prefill"]


def workload_program(plan: Plan) -> WorkloadProgram:
    """The lowering of ``plan``'s workload (`WORKLOAD_PROGRAMS`); one without a program is refused in one line."""
    kind = plan.train.workload.kind
    if kind not in WORKLOAD_PROGRAMS:
        raise UnsupportedError(f"the {kind} workload has no JAX program to lower", fix="plan and simulate it; it cannot be validated")
    return WORKLOAD_PROGRAMS[kind]
