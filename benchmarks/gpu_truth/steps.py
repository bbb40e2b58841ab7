"""Full training steps of the reference JAX program on the one device, against the step simulator.

For each model the planner's layout search for one device (`search.layouts.grid_search` over the
space `planner.plan` searches: the ``jax`` stack, layouts the validator lowers) chooses a layout;
two it would not are run beside it: the same with another micro-batch, and with another
recompute policy. Each runs as `plan validate` lowers it (`validate.lowering.jitted_step`: the
plan's shardings, parameters and optimizer state donated) with the recipe's dtypes (bf16 compute
on a GPU; fp32 on the CPU, whose profile has no bf16 peak), warmed up, then timed step by step
(`benchmarks.gpu_truth.timing.median_chained_s`). Predicted: `costmodel.step.simulator.simulate`
of the same layout on the profile (what ``plan simulate`` prints). On the CPU the stack is the one
`validate.timed` predicts there: materialized attention, fused elementwise chains, no overlap of
the gradient reduction.
"""

from __future__ import annotations

from typing import Any, Callable

from benchmarks.gpu_truth.sizes import Sizes
from benchmarks.gpu_truth.target import Target
from benchmarks.gpu_truth.timing import Case, median_chained_s
from costmodel.hardware.machine import train_machine
from costmodel.inputs.layout import Layout, Recompute
from costmodel.inputs.model_config import ModelConfig
from costmodel.inputs.stack import Attention, SoftwareStack, get_stack, stack_with
from costmodel.inputs.train_config import TrainConfig
from costmodel.step.simulator import simulate
from planner.api import plan_of_layout
from planner.plan_schema import Plan, SolverInfo
from search.layouts import SearchSpace, grid_search

CHOICE = "planner's choice"


def step_stack(target: Target) -> SoftwareStack:
    """The stack the steps run and are predicted with (module docstring)."""
    if target.backend == "cpu":
        return stack_with(get_stack("jax"), attention=Attention.MATERIALIZED, fused_elementwise=True, dp_overlap=False)
    return get_stack("jax")


def step_layouts(model: ModelConfig, train: TrainConfig, target: Target) -> list[tuple[str, Layout]]:
    """(what it is, layout): the planner's choice for one device, then another micro-batch, then another recompute.

    >>> from benchmarks.gpu_truth.sizes import TOY
    >>> from benchmarks.gpu_truth.target import Target
    >>> from costmodel.hardware.registry import load_hardware
    >>> t = Target(backend="gpu", quick=True, device="x", driver="", jax_version="0", cluster=load_hardware("h100-sxm", devices_per_node=1))
    >>> [note for note, _ in step_layouts(TOY, TrainConfig(seq_len=64, global_batch=4), t)]
    ["planner's choice", 'micro-batch 2', 'recompute full']
    """
    machine = train_machine(target.cluster, train)
    space = SearchSpace(stack=Layout(stack=step_stack(target)), lowered_only=True)
    chosen = grid_search(model, train, machine, n_devices=1, space=space).best.layout
    fits = lambda lay: simulate(model, train, lay, machine).fits  # noqa: E731
    batches = [b for b in (chosen.micro_batch // 2, chosen.micro_batch * 2) if b >= 1 and train.global_batch % b == 0]
    batch = next((b for b in batches if fits(chosen.model_copy(update={"micro_batch": b}))), batches[0])
    policies = [r for r in (Recompute.FULL, Recompute.SELECTIVE, Recompute.NONE) if r is not chosen.recompute]
    policy = next((r for r in policies if fits(chosen.model_copy(update={"recompute": r}))), policies[0])
    return [(CHOICE, chosen), (f"micro-batch {batch}", chosen.model_copy(update={"micro_batch": batch})),
            (f"recompute {policy.value}", chosen.model_copy(update={"recompute": policy}))]


def _plan(model: ModelConfig, train: TrainConfig, layout: Layout, target: Target) -> Plan:
    estimate = simulate(model, train, layout, train_machine(target.cluster, train))
    return plan_of_layout(layout, estimate, model=model, train=train, cluster=target.cluster, mesh=None,
                          solver=SolverInfo(planner="grid", status="GIVEN", evaluated=1, pruned={}))


def prepared_step(plan: Plan) -> tuple[Callable[[Any], Any], tuple[Any, ...]]:
    """``(advance, state)``: the plan's jitted step chained on its own outputs, and its first inputs on the device."""
    import jax  # why: JAX is imported only once a case runs
    import jax.numpy as jnp
    import numpy as np
    from jax.sharding import NamedSharding

    from planner.programs.params import init_params
    from planner.programs.train_step import init_opt_state
    from validate.lowering import input_specs, jitted_step
    from validate.mesh_hooks import device_mesh

    mesh = device_mesh(plan)
    # Built on the device itself: `validate.lowering.initial_inputs` goes through the host, which
    # for a 2B-parameter model's fp32 weights and moments costs more than the timing.
    params = init_params(plan.model, jax.random.key(0), dtype=jnp.dtype(plan.train.param_dtype.value))
    tokens = jnp.asarray(np.random.default_rng(0).integers(0, plan.model.vocab_size, (plan.train.global_batch, plan.train.seq_len + 1),
                                                           dtype=np.int32))
    state = (params, init_opt_state(params), {"tokens": tokens[:, :-1], "targets": tokens[:, 1:]})
    state = jax.device_put(state, jax.tree.map(lambda spec: NamedSharding(mesh, spec), input_specs(plan)))
    step = jitted_step(plan, mesh)

    def advance(state: tuple[Any, ...]) -> tuple[Any, ...]:
        params, opt_state, batch = state
        params, opt_state, _ = step(params, opt_state, batch)
        return params, opt_state, batch

    return advance, state


def _measure(plan: Plan) -> float:
    return median_chained_s(*prepared_step(plan), warmup=2, repeats=5)


def planner_choices(target: Target, sizes: Sizes) -> list[tuple[str, Plan]]:
    """Each step model's name and the plan of the planner's choice for it (the first of `step_layouts`)."""
    choices = []
    for model in sizes.step_models:
        train = TrainConfig(seq_len=sizes.step_seq_len, global_batch=sizes.step_global_batch).with_precision(target.precision)
        choices.append((model.name, _plan(model, train, step_layouts(model, train, target)[0][1], target)))
    return choices


def step_cases(target: Target, sizes: Sizes) -> list[Case]:
    """Each step model's three layouts (planner's choice first), one case each."""
    cases = []
    for model in sizes.step_models:
        train = TrainConfig(seq_len=sizes.step_seq_len, global_batch=sizes.step_global_batch).with_precision(target.precision)
        try:
            planned = [(note, _plan(model, train, layout, target)) for note, layout in step_layouts(model, train, target)]
        except Exception as err:  # the search failing is this model's row, not the run's end
            cases.append(Case(kind="step", name=f"{model.name} {CHOICE}", shape="", dtype=train.compute_dtype.value,
                              predict=lambda err=err: _raise(err), measure=lambda err=err: _raise(err), group=model.name, note=CHOICE))
            continue
        for note, plan in planned:
            layout = plan.layout
            shape = f"b{train.global_batch} s{train.seq_len} mb{layout.micro_batch} recompute {layout.recompute.value}"
            cases.append(Case(kind="step", name=f"{model.name} {note}", shape=shape, dtype=train.compute_dtype.value,
                              predict=lambda plan=plan: plan.predicted.step_time_s, measure=lambda plan=plan: _measure(plan),
                              group=model.name, note=note))
    return cases


def _raise(err: Exception) -> float:
    raise err
