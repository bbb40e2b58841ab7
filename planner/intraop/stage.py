"""The intra-op planner inside a layout: shard one pipeline stage's training step on its sub-mesh.

The layout search fixes the outer knobs (degrees, micro-batch, recompute). Here the
reference training step of one stage (its share of the layers, one micro-batch per
data-parallel replica) is sharded over the mesh axes that are not pipeline axes by the
CP-SAT ILP (or a search planner on the same space), free to use any axis for any tensor
dimension. Its parameter shardings replace the rule-based (Megatron) ones in the plan.

>>> from costmodel.inputs.layout import Layout
>>> from costmodel.hardware.machine import load_machine
>>> from costmodel.inputs.model_config import ModelConfig
>>> from costmodel.inputs.train_config import TrainConfig
>>> cfg = ModelConfig(name="m", hidden_size=256, num_layers=4, num_heads=4, ffn_size=1024, vocab_size=512)
>>> specs, info = intra_op_specs(cfg, TrainConfig(seq_len=128, global_batch=16), Layout(dp=2, tp=2, micro_batch=2),
...                              [("data", 2), ("tensor", 2)], load_machine("a100-80gb"))
>>> info.status, len(specs["layers/attn/wq"])
('OPTIMAL', 4)
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

import jax
import networkx as nx

from costmodel.errors import InfeasibleError
from costmodel.hardware.machine import Machine
from costmodel.inputs.layout import Layout, Recompute
from costmodel.inputs.model_config import ModelConfig
from costmodel.inputs.train_config import TrainConfig
from costmodel.oplevel.opgraph import OP_ATTR, OpNode
from costmodel.oplevel.strategy_space import StrategySpace, build_space, format_bytes, prune_dominated
from costmodel.step.estimate import StepEstimate
from costmodel.step.simulator import simulate
from planner.intraop.extract import extract_graph
from planner.intraop.ilp import solve_intra_op
from planner.intraop.pinned import to_partition_spec
from planner.plan_schema import IntraOpInfo, MeshAxis
from planner.programs.train_step import abstract_train_inputs, make_train_step
from search.strategy_search import SEARCH_PLANNERS

_REMAT = {Recompute.NONE: "none", Recompute.FULL: "full"}


def train_step_memory_factor(op: OpNode) -> float:
    """Bytes held per byte of an input of a ``(params, opt_state, batch)`` training step: a
    parameter also has its gradient (the optimizer moments are inputs of their own)."""
    return 2.0 if op.label.startswith("[0]") else 1.0


def intra_op_axes(mesh: Sequence[MeshAxis]) -> list[tuple[str, int]]:
    """(name, size) of the mesh axes an intra-op planner shards over: all but the pipeline axes."""
    return [(a.name, a.size) for a in mesh if a.parallelism != "pp" and a.size > 1]


def stage_model(cfg: ModelConfig, layout: Layout) -> ModelConfig:
    """``cfg`` cut to the layers of its largest pipeline stage."""
    return cfg.model_copy(update={"num_layers": max(layout.layers_on_stage(cfg.num_layers, s) for s in range(layout.pp))})


def stage_step(cfg: ModelConfig, train: TrainConfig, layout: Layout) -> tuple[Callable[..., Any], Any]:
    """The largest stage's training step on one micro-batch per data-parallel replica, and its abstract inputs."""
    stage = stage_model(cfg, layout)
    step = make_train_step(stage, train, remat=_REMAT.get(layout.recompute, "selective"))
    return step, abstract_train_inputs(stage, train, micro_batch=layout.micro_batch * layout.dp)


def stage_graph(cfg: ModelConfig, train: TrainConfig, layout: Layout) -> tuple[nx.DiGraph, Any]:
    """The graph and abstract inputs of `stage_step`."""
    step, abstract = stage_step(cfg, train, layout)
    return extract_graph(step, *abstract), abstract


def stage_space(cfg: ModelConfig, train: TrainConfig, layout: Layout, axes: list[tuple[str, int]],
                machine: Machine) -> tuple[nx.DiGraph, StrategySpace, Any]:
    """The graph, pruned strategy space and abstract inputs of the largest stage's training step."""
    graph, abstract = stage_graph(cfg, train, layout)
    space = prune_dominated(build_space(graph, machine.mesh_groups(axes), machine, memory_factor=train_step_memory_factor))
    return graph, space, abstract


def stage_estimate(cfg: ModelConfig, train: TrainConfig, layout: Layout, machine: Machine) -> StepEstimate:
    """The simulator's prediction for the step `stage_graph` traces: the largest stage alone,
    one micro-batch per data-parallel replica. It is what an intra-op objective predicts.

    >>> from costmodel.hardware.machine import load_machine
    >>> cfg = ModelConfig(name="m", hidden_size=256, num_layers=4, num_heads=4, ffn_size=1024, vocab_size=512)
    >>> est = stage_estimate(cfg, TrainConfig(seq_len=128, global_batch=16), Layout(dp=2, pp=2, micro_batch=2),
    ...                      load_machine("a100-80gb"))
    >>> est.layout.pp, est.layout.micro_batches(TrainConfig(seq_len=128, global_batch=4))
    (1, 1)
    """
    one_stage = layout.model_copy(update={"pp": 1, "interleave": 1, "stage_layers": None})
    return simulate(stage_model(cfg, layout), train.model_copy(update={"global_batch": layout.micro_batch * layout.dp}),
                    one_stage, machine)


def solve_space(space: StrategySpace, *, planner: str, memory_budget_bytes: float, time_limit_s: float,
                seed: int = 0) -> tuple[dict[int, int], dict[str, Any]]:
    """Run ``planner`` (ilp or a search planner) on ``space``: the choice and IntraOpInfo fields."""
    if planner == "ilp":
        solution = solve_intra_op(space, memory_budget_bytes=memory_budget_bytes, time_limit_s=time_limit_s, seed=seed)
        return solution.choice, {"status": solution.status, "objective_s": solution.objective_s, "gap": solution.gap,
                                 "memory_bytes": solution.memory_bytes, "variables": solution.variables}
    run = SEARCH_PLANNERS[planner](space, memory_budget_bytes=memory_budget_bytes, time_limit_s=time_limit_s, seed=seed)
    if not run.feasible:
        raise InfeasibleError(f"the {planner} search found no sharding within {format_bytes(memory_budget_bytes)} per device "
                              f"before its time limit of {time_limit_s:g} s or its evaluation budget ran out",
                              fix="use --planner ilp, or raise --time-limit-s")
    return run.choice, {"status": "FEASIBLE", "objective_s": run.objective_s, "gap": None, "memory_bytes": run.memory_bytes,
                        "evaluations": run.evaluations}


def intra_op_specs(cfg: ModelConfig, train: TrainConfig, layout: Layout, axes: list[tuple[str, int]], machine: Machine,
                   *, planner: str = "ilp", time_limit_s: float = 20.0, seed: int = 0) -> tuple[dict[str, tuple[Any, ...]], IntraOpInfo]:
    """Parameter path → per-dimension mesh axes chosen by ``planner``, and what it reported.

    Raises InfeasibleError when no sharding of the reference step fits in HBM (the
    reference materializes attention scores, so long sequences may need recompute).
    """
    graph, space, abstract = stage_space(cfg, train, layout, axes, machine)
    choice, fields = solve_space(space, planner=planner, memory_budget_bytes=machine.memory_budget_bytes, time_limit_s=time_limit_s,
                                 seed=seed)
    info = IntraOpInfo(planner=planner, axes=tuple(name for name, _ in axes), ops=graph.number_of_nodes(),
                       free_nodes=len(space.strategies), choice={str(n): space.strategies[n][i].name for n, i in choice.items()},
                       **fields)
    return param_specs_of(graph, space, choice, abstract), info


def param_specs_of(graph: nx.DiGraph, space: StrategySpace, choice: dict[int, int], abstract: Any) -> dict[str, tuple[Any, ...]]:
    """Parameter path → per-dimension mesh axes (a ``PartitionSpec`` as a tuple) under ``choice``."""
    inputs = {d[OP_ATTR].label: n for n, d in graph.nodes(data=True) if d[OP_ATTR].is_input}
    specs = {}
    for path, leaf in jax.tree_util.tree_flatten_with_path(abstract[0])[0]:
        sharding = space.chosen(inputs["[0]" + jax.tree_util.keystr(path)], choice).results[0]
        spec = tuple(to_partition_spec(sharding))
        specs["/".join(str(p.key) for p in path)] = spec + (None,) * (len(leaf.shape) - len(spec))
    return specs
