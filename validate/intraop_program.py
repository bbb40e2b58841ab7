"""An intra-op plan (``plan --planner ilp`` and the search planners) as the program it chose.

The intra-op planner shards every node of the stage's training-step graph, not only the
parameters: an op's operands, its results and the collectives that complete its partial
sums. Lowered with the parameters' specs alone, XLA propagates its own choice between them
(gathers and all-to-alls the plan never chose), and the Megatron rules of `validate.predict`
do not describe what it chose. So the validator rebuilds the graph's program, the training
step on one micro-batch per data-parallel replica that `planner.intraop.stage` traced, and
re-binds its jaxpr equation by equation (`constrained`, by `planner.intraop.pinned`): every leaf
equation's operands and results are pinned to the chosen strategy's shardings. With M
micro-batches the gradient part runs M times under a ``lax.scan`` that sums its results, and
the optimizer part once, as the reference program accumulates.

What the program then does follows from the choice (`validate.intraop_predict`).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from typing import Any, Callable

import jax
import jax.numpy as jnp
import networkx as nx
from jax.extend import core as jex_core
from jax.sharding import Mesh

from costmodel.hardware.machine import load_machine
from costmodel.oplevel.opgraph import OP_ATTR
from costmodel.oplevel.strategies import Sharding
from costmodel.oplevel.strategy_space import StrategySpace, build_space
from planner.intraop.extract import extract_graph
from planner.intraop.pinned import PinnedInterpreter, pinned_function
from planner.intraop.stage import param_specs_of, stage_step, train_step_memory_factor
from planner.plan_schema import Plan

_OPTIMIZER_SCOPE = "optimizer"



@dataclass(frozen=True)
class IntraOpProgram:
    """A plan's intra-op choice on the graph it was made on."""

    graph: nx.DiGraph
    space: StrategySpace
    choice: dict[int, int]
    abstract: tuple[Any, ...]
    micro_batches: int

    @property
    def closed_jaxpr(self) -> Any:
        """The traced step the graph was extracted from."""
        return self.graph.graph["jaxpr"]

    @property
    def sizes(self) -> dict[str, int]:
        """Mesh axis → size, of the axes the choice shards over."""
        return {name: group.n for name, group in self.space.groups.items()}

    def strategy(self, node: int) -> Any:
        """The chosen strategy of any graph node."""
        return self.space.chosen(node, self.choice)

    def input_shardings(self) -> list[Sharding]:
        """The chosen sharding of each flat input of the program, in order."""
        nodes = [n for n, d in self.graph.nodes(data=True) if d[OP_ATTR].is_input and not d[OP_ATTR].label.startswith("const")]
        by_label = {self.graph.nodes[n][OP_ATTR].label: n for n in nodes}
        paths = [jax.tree_util.keystr(p) for p, _ in jax.tree_util.tree_flatten_with_path(self.abstract)[0]]
        return [self.strategy(by_label[p]).results[0] if p in by_label else () for p in paths]

    def gradient_part_end(self) -> int:
        """Index of the first top-level equation of the optimizer (the part run once per step)."""
        for i, eqn in enumerate(self.closed_jaxpr.jaxpr.eqns):
            if str(eqn.source_info.name_stack).startswith(_OPTIMIZER_SCOPE):
                return i
        return len(self.closed_jaxpr.jaxpr.eqns)


def intra_op_program(plan: Plan) -> IntraOpProgram | None:
    """The plan's intra-op program (`build_intra_op_program`, once per plan), or None when the
    plan has no intra-op choice to lower: grid plans, and pipelines (lowered by `validate.gpipe`)."""
    if plan.solver is None or plan.solver.intra_op is None or plan.solver.intra_op.choice is None or plan.layout.pp > 1:
        return None
    return _cached_program(plan.model_dump_json())


@lru_cache(maxsize=4)
def _cached_program(plan_json: str) -> IntraOpProgram | None:
    return build_intra_op_program(Plan.model_validate_json(plan_json))


def build_intra_op_program(plan: Plan) -> IntraOpProgram | None:
    """The program of a plan with an intra-op choice, or None when its parameter specs were
    edited after the choice was made.

    The strategy space is rebuilt unpruned, so what it holds does not depend on the
    hardware's costs; the choice is looked up by strategy name."""
    info = plan.solver.intra_op
    sizes = {a.name: a.size for a in plan.mesh}
    machine = load_machine(plan.hardware, compute_dtype=plan.train.compute_dtype.value)
    step, abstract = stage_step(plan.model, plan.train, plan.layout)
    graph = extract_graph(step, *abstract)
    space = build_space(graph, machine.mesh_groups([(a, sizes[a]) for a in info.axes]), machine,
                        memory_factor=train_step_memory_factor)
    names = {int(n): name for n, name in info.choice.items()}
    if set(names) != set(space.strategies):
        return None
    index = {n: {s.name: i for i, s in enumerate(space.strategies[n])} for n in names}
    if any(names[n] not in index[n] for n in names):
        return None
    choice = {n: index[n][names[n]] for n in names}
    if param_specs_of(graph, space, choice, abstract) != _as_tuples(plan.param_specs):
        return None
    return IntraOpProgram(graph=graph, space=space, choice=choice, abstract=abstract, micro_batches=plan.layout.micro_batches(plan.train))


def _as_tuples(specs: dict[str, Any]) -> dict[str, tuple[Any, ...]]:
    return {k: tuple(tuple(d) if isinstance(d, list) else d for d in v) for k, v in specs.items()}


def constrained(program: IntraOpProgram, mesh: Mesh) -> Callable[..., Any]:
    """The plan's whole training step ``(params, opt_state, batch) -> outputs`` with every
    equation pinned to its chosen shardings (`planner.intraop.pinned.PinnedInterpreter`); the batch holds all M micro-batches."""
    if program.micro_batches == 1:
        return pinned_function(program.graph, program.strategy, mesh)
    run = PinnedInterpreter(program.graph.graph["eqn_nodes"], program.strategy, mesh).run
    closed = program.closed_jaxpr
    jaxpr, consts = closed.jaxpr, list(closed.consts)
    split = program.gradient_part_end()
    micro_batches = program.micro_batches

    def step(*args: Any) -> Any:
        flat = jax.tree_util.tree_leaves(args)
        n_batch = len(jax.tree_util.tree_leaves(args[2]))
        head, batch = flat[:-n_batch], flat[-n_batch:]
        cut = cut_vars(jaxpr, split)
        # Micro-batch index minor within each sequence block, as `make_loss_and_grads` cuts it.
        micro = [jnp.moveaxis(b.reshape(b.shape[0] // micro_batches, micro_batches, *b.shape[1:]), 1, 0) for b in batch]

        def accumulate(totals: list[Any], mb: list[Any]) -> tuple[list[Any], None]:
            env = run(jaxpr, consts, [*head, *mb], (), eqns=range(split))
            return [t + env[v].astype(t.dtype) for t, v in zip(totals, cut)], None

        zeros = [jnp.zeros(v.aval.shape, v.aval.dtype) for v in cut]
        totals, _ = jax.lax.scan(accumulate, zeros, micro)
        env = dict(zip(jaxpr.invars, flat))
        env.update((v, t / micro_batches) for v, t in zip(cut, totals))
        env = run(jaxpr, consts, flat, (), eqns=range(split, len(jaxpr.eqns)), env=env)
        outs = [v.val if isinstance(v, jex_core.Literal) else env[v] for v in jaxpr.outvars]
        return jax.tree_util.tree_unflatten(program.graph.graph["out_tree"], outs)

    return step


def cut_vars(jaxpr: Any, split: int) -> list[Any]:
    """Variables the gradient part (equations before ``split``) hands the rest: the loss and gradients."""
    defined = {v for eqn in jaxpr.eqns[:split] for v in eqn.outvars}
    used = [v for eqn in jaxpr.eqns[split:] for v in eqn.invars if not isinstance(v, jex_core.Literal)]
    used += [v for v in jaxpr.outvars if not isinstance(v, jex_core.Literal)]
    return list(dict.fromkeys(v for v in used if v in defined))
