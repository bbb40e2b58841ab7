"""``planner.intraop.shard(fn, *abstract_args, mesh=...)``: the intra-op ILP on any jittable function.

Traces ``fn`` to an OpGraph, costs every op's sharding strategies on the mesh with the
hardware profile's roofline and link model, solves the CP-SAT ILP, and returns
``PartitionSpec`` pytrees for the inputs and outputs, ready for
``jax.jit(fn, in_shardings=..., out_shardings=...)``.

Memory is the compiled program's: arguments + outputs + the temporaries live at the worst
program point (costmodel/oplevel/program_memory.py). The ILP keeps the arguments within budget and adds the
live set of each program point the solution overflows, re-solving until none does (lazy
constraints: the final choice satisfies every point). The hand-written baselines (plain
DP, FSDP, FSDP × TP, planner/intraop/baselines.py) are solved with their input specs pinned and
scored by the same model; the result is the best of them all, so it is never predicted
worse than any, and ``ShardResult.baselines`` says how each scored. To compile the choice and
compare it with the prediction, call ``validate.shard_check.check_shard(result, fn, *abstract_args, mesh=mesh)``.

>>> import jax, jax.numpy as jnp
>>> x = jax.ShapeDtypeStruct((256, 1024), jnp.bfloat16)
>>> w = jax.ShapeDtypeStruct((1024, 4096), jnp.bfloat16)
>>> result = shard(lambda x, w: jnp.tanh(x @ w), x, w, mesh="data=4", hardware="a100-80gb")
>>> result.solution.status, len(result.in_specs), result.chosen
('OPTIMAL', 2, 'planned')
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Sequence

import jax
import networkx as nx
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec
from pydantic import BaseModel, ConfigDict, Field

from costmodel.errors import InfeasibleError, InvalidConfigError
from costmodel.hardware.machine import load_machine
from costmodel.hardware.mesh import parse_mesh
from costmodel.oplevel.opgraph import OP_ATTR
from costmodel.oplevel.program_memory import MemoryBreakdown, MemoryModel
from costmodel.oplevel.strategies import Sharding, shard_factor
from costmodel.oplevel.strategy_space import StrategySpace, build_space, prune_dominated, restrict
from planner.intraop.baselines import baseline_specs
from planner.intraop.extract import extract_graph
from planner.intraop.ilp import IntraOpSolution, model_variables, solve_intra_op
from planner.intraop.pinned import auto_mesh, pinned_function, to_partition_spec

_LAZY_ROUNDS = 8
_MIN_SOLVE_S = 1.0


class LayoutScore(BaseModel):
    """How one candidate layout (the planner's or a baseline) scores under the cost model."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str = Field(description="'planned', or a baseline: 'dp', 'fsdp', 'fsdp_tp'.")
    step_time_s: float = Field(description="Predicted seconds of one call: compute, collectives, resharding.")
    memory: MemoryBreakdown = Field(description="Predicted bytes per device.")
    fits: bool = Field(description="Whether the predicted memory is within the budget.")
    status: str = Field(description="The ILP's status for the ops between the pinned inputs.")


@dataclass(frozen=True)
class ShardResult:
    """Input and output shardings of the chosen layout, what it is predicted to cost, and the alternatives."""

    in_specs: tuple[Any, ...]
    out_specs: Any
    solution: IntraOpSolution
    space: StrategySpace
    choice: Mapping[int, int]
    mesh_axes: tuple[tuple[str, int], ...]
    chosen: str = "planned"
    memory: MemoryBreakdown | None = None
    step_time_s: float = 0.0
    memory_budget_bytes: float = 0.0
    baselines: tuple[LayoutScore, ...] = ()
    candidate_specs: Mapping[str, tuple[Any, Any]] = field(default_factory=dict)
    backend: str = "gpu"
    compute_dtype: str = "bfloat16"

    @property
    def predicted_memory_bytes(self) -> float:
        """Arguments + outputs + peak temporaries − aliased, per device."""
        return self.memory.total_bytes if self.memory else self.solution.memory_bytes

    def pinned(self, fn: Callable[..., Any], *abstract_args: Any, mesh: Mesh) -> Callable[..., Any]:
        """``fn`` as the chosen layout runs it: every equation of its trace pinned to the chosen
        shardings (`planner.intraop.pinned`), so XLA implements the choice the prediction describes.
        With ``in_specs`` alone XLA propagates shardings between the inputs and outputs as it
        likes: on Hugging Face's Flax GPT-2 it replicated the logits, 12.6–16.0 GiB per device where
        the choice holds 8.7. Jit it with ``in_specs``/``out_specs`` (`jit` does)."""
        return pinned_function(extract_graph(fn, *abstract_args), lambda node: self.space.chosen(node, self.choice), mesh)

    def jit(self, fn: Callable[..., Any], *abstract_args: Any, mesh: Mesh, donate_argnums: Sequence[int] = ()) -> Any:
        """``jax.jit`` of `pinned` with the chosen input and output shardings. ``mesh`` may have Auto or
        Explicit axes (``jax.make_mesh``'s default); the program runs on its Auto twin (`planner.intraop.pinned.auto_mesh`),
        which takes arguments placed on either."""
        def named(tree: Any) -> Any:
            return jax.tree.map(lambda s: NamedSharding(auto_mesh(mesh), s), tree, is_leaf=lambda x: isinstance(x, PartitionSpec))

        return jax.jit(self.pinned(fn, *abstract_args, mesh=mesh), in_shardings=named(self.in_specs),
                       out_shardings=named(self.out_specs), donate_argnums=tuple(donate_argnums))


def shard(fn: Callable[..., Any], *abstract_args: Any, mesh: Mesh | str, hardware: str = "h100-sxm",
          memory_budget_bytes: float | None = None, time_limit_s: float = 20.0,
          fixed: Mapping[str, PartitionSpec] | None = None, batch_argnums: Sequence[int] | None = None,
          donate_argnums: Sequence[int] = (), backend: str | None = None, baselines: bool = True,
          compute_dtype: str | None = None) -> ShardResult:
    """Shard ``fn`` on ``mesh`` by solving the intra-op ILP on its graph.

    Args:
      fn: any function ``jax.jit`` accepts.
      *abstract_args: pytrees of ``jax.ShapeDtypeStruct`` (or arrays).
      mesh: a ``jax.sharding.Mesh`` or a spec such as ``"data=2,tensor=4"`` (axis names are kept).
      hardware: profile whose roofline and links cost the strategies.
      memory_budget_bytes: per-device limit; default the profile's HBM.
      fixed: input leaf path (``jax.tree_util.keystr`` over ``abstract_args``, e.g. ``"[2]"`` or
        ``"[0]['params']['wq']"``; a path prefix pins every leaf below it) → its spec; the rest is planned around it.
      batch_argnums: arguments holding the batch (tokens, masks, keys), split along their leading
        dimension by the baselines; default the last argument.
      donate_argnums: arguments ``jax.jit`` will donate: outputs may reuse their buffers.
      backend: "cpu" or "gpu": how temporaries are held (XLA's CPU backend widens bf16 to f32);
        default the platform of ``mesh``'s devices, "gpu" for a mesh spec string.
      baselines: also score plain DP, FSDP and FSDP × TP and return the best.
      compute_dtype: whose peak FLOP/s costs the matmuls ('float32', 'bfloat16', 'float16', ...);
        default `program_compute_dtype` of the traced program.
    """
    axes = _mesh_axes(mesh)
    backend = backend or (mesh.devices.flat[0].platform if isinstance(mesh, Mesh) else "gpu")
    graph = extract_graph(fn, *abstract_args)
    dtype = compute_dtype or program_compute_dtype(graph)
    machine = load_machine(hardware, compute_dtype=dtype)
    full = build_space(graph, machine.mesh_groups(list(axes)), machine)
    memory_model = MemoryModel.of_graph(graph)
    full = _with_memory(full, memory_model.row(full, None, backend=backend))
    budget = machine.memory_budget_bytes if memory_budget_bytes is None else memory_budget_bytes
    flat, tree = jax.tree_util.tree_flatten_with_path(abstract_args)
    paths = [jax.tree_util.keystr(path) for path, _ in flat]
    inputs = {d[OP_ATTR].label: n for n, d in graph.nodes(data=True) if d[OP_ATTR].is_input}
    donated = frozenset(inputs[p] for p in paths if _argnum(p) in set(donate_argnums))
    pins = _pins(full, inputs, paths, fixed or {})
    batch = tuple(batch_argnums) if batch_argnums is not None else (len(abstract_args) - 1,)
    layouts = baseline_specs(abstract_args, axes, batch_argnums=batch)
    candidates = {}
    for name, specs in layouts.items():
        leaf_specs = jax.tree.leaves(specs, is_leaf=lambda x: isinstance(x, PartitionSpec))
        pinned = {inputs[p]: strategy_of_spec(full, inputs[p], s) for p, s in zip(paths, leaf_specs)}
        if name == "dp":
            # XLA propagates shardings from the arguments: a batch the ILP leaves whole (slicing
            # it is free in the model) leaves every activation whole, so the batch is split as DP splits it.
            candidates["planned"] = {**{inputs[p]: i for p in paths if _argnum(p) in batch
                                        for i in [pinned.get(inputs[p])] if i is not None}, **pins}
        if baselines:
            candidates[name] = {**{n: i for n, i in pinned.items() if i is not None}, **pins}
    solve = _Solver(full, memory_model, budget=budget, backend=backend, donated=donated)
    scores, choices, failures = [], {}, []
    for index, (name, pinned) in enumerate(candidates.items()):
        limit = time_limit_s if name == "planned" else _baseline_limit_s(time_limit_s, solve.solve_time_s, len(candidates) - index)
        try:
            choice, score, solution = solve(name, pinned, time_limit_s=limit)
        except InfeasibleError as error:
            failures.append(error)
            if name == "planned":
                continue
            # A baseline that cannot fit is still reported, scored without the budget (fits=False).
            choice, score, solution = solve(name, pinned, time_limit_s=limit, budget=float("inf"))
        scores.append(score)
        choices[name] = (choice, solution)
    if failures and not any(s.fits for s in scores):
        raise failures[0]
    best = min(scores, key=lambda s: (not s.fits, s.step_time_s if s.fits else s.memory.total_bytes))
    specs = {s.name: _specs(graph, solve.space_of[s.name], choices[s.name][0], flat, tree, inputs, fn, abstract_args)
             for s in scores}
    choice, solution = choices[best.name]
    in_specs, out_specs = specs[best.name]
    return ShardResult(in_specs=in_specs, out_specs=out_specs, solution=solution, space=solve.space_of[best.name], choice=choice,
                       mesh_axes=axes, chosen=best.name, memory=best.memory, step_time_s=best.step_time_s,
                       memory_budget_bytes=budget, baselines=tuple(scores), candidate_specs=specs, backend=backend,
                       compute_dtype=dtype)


def _baseline_limit_s(time_limit_s: float, spent_s: float, n_left: int) -> float:
    """A baseline's CP-SAT limit: a quarter of ``time_limit_s``, or less when the solves so far
    (the planned layout's first) leave less of it to share; below a second, none (a big model
    takes longer to load, so the baseline is scored on the planned choice carried to its pins).

    >>> _baseline_limit_s(20.0, 5.0, 3), _baseline_limit_s(20.0, 15.5, 3), _baseline_limit_s(20.0, 18.0, 3)
    (5.0, 1.5, 0.0)
    """
    share_s = min(time_limit_s / 4, (time_limit_s - spent_s) / n_left)
    return share_s if share_s >= _MIN_SOLVE_S else 0.0


class _Solver:
    """Solves one candidate (pinned inputs) with lazy per-program-point memory rows."""

    def __init__(self, full: StrategySpace, memory_model: MemoryModel, *, budget: float, backend: str,
                 donated: frozenset[int]) -> None:
        self.full, self.memory_model, self.budget, self.backend, self.donated = full, memory_model, budget, backend, donated
        self.space_of: dict[str, StrategySpace] = {}
        # The first candidate's answer, the others' fallback: most ops shard alike whatever the inputs.
        self.first: tuple[StrategySpace, dict[int, int]] | None = None
        self.first_solution_s_per_variable = 0.0
        self.solve_time_s = 0.0

    def __call__(self, name: str, pinned: dict[int, int], *, time_limit_s: float,
                 budget: float | None = None) -> tuple[dict[int, int], LayoutScore, IntraOpSolution]:
        budget = self.budget if budget is None else budget
        space = prune_dominated(restrict(self.full, {n: np.array([i]) for n, i in pinned.items()}))
        # The ILP's own knapsack row holds the arguments; the live sets come as rows.
        space = _with_memory(space, self.memory_model.row(space, None, temporaries=False, backend=self.backend))
        self.space_of[name] = space
        rows: list[dict[int, np.ndarray]] = []
        carried = projected_choice(*self.first, space) if self.first else None
        # A search that cannot reach a first solution in time (the first candidate's pace says
        # so) would only load the model: score the first candidate's choice carried over instead.
        if time_limit_s < self.first_solution_s_per_variable * model_variables(space):
            time_limit_s = 0.0
        for _ in range(_LAZY_ROUNDS):
            solution = solve_intra_op(space, memory_budget_bytes=budget, time_limit_s=time_limit_s, memory_rows=rows,
                                      fallback_choice=carried)
            self.solve_time_s += solution.solve_time_s
            choice = _adopt_consumer_shardings(space, solution.choice, self.memory_model.input_nodes)
            memory = self.memory_model.of_choice(space, choice, donated=self.donated, backend=self.backend)
            # Out of time before any solution: more rows will not buy one in the same time.
            if memory.total_bytes <= budget or solution.fallback:
                break
            rows.append(self.memory_model.row(space, memory.peak_node, backend=self.backend))
        score = LayoutScore(name=name, step_time_s=space.total_time_s(choice), memory=memory,
                            fits=memory.total_bytes <= self.budget, status=solution.status)
        if self.first is None and not solution.fallback:
            self.first = (space, choice)
            self.first_solution_s_per_variable = solution.trace[0][0] / solution.variables if solution.trace else 0.0
        return choice, score, solution


def projected_choice(source: StrategySpace, choice: dict[int, int], target: StrategySpace) -> dict[int, int]:
    """``choice`` on ``source`` carried to ``target`` (the same graph, other pins or prunes): each
    free node keeps its strategy where ``target`` has it, else takes its least-memory one.

    >>> import jax, jax.numpy as jnp
    >>> from costmodel.hardware.machine import load_machine
    >>> g = extract_graph(lambda x: x * 2, jax.ShapeDtypeStruct((8, 4), jnp.float32))
    >>> space = build_space(g, load_machine("a100-80gb").mesh_groups([("data", 2)]), load_machine("a100-80gb"))
    >>> projected_choice(space, {0: 1}, space), projected_choice(space, {0: 1}, restrict(space, {0: np.array([0])}))
    ({0: 1}, {0: 0})
    """
    fallback = target.least_memory_choice()
    out = {}
    for n, strategies in target.strategies.items():
        wanted = source.chosen(n, choice) if n in source.strategies or n in source.followers else None
        out[n] = strategies.index(wanted) if wanted in strategies else fallback[n]
    return out


def _with_memory(space: StrategySpace, row: dict[int, np.ndarray]) -> StrategySpace:
    return StrategySpace(groups=space.groups, strategies=space.strategies, followers=space.followers,
                         node_time_s=space.node_time_s, node_memory_bytes=row, edges=space.edges, labels=space.labels)


def _adopt_consumer_shardings(space: StrategySpace, choice: dict[int, int], input_nodes: frozenset[int]) -> dict[int, int]:
    """Give each graph input the most-split sharding that costs nothing more.

    Slicing a replicated input is free in the cost model, so the ILP is indifferent between a
    replicated batch and a split one; the compiled program is not: XLA propagates shardings
    from the arguments, and a replicated batch leaves every activation whole.
    """
    incident: dict[int, list] = {}
    for e in space.edges:
        incident.setdefault(e.src, []).append(e)
        incident.setdefault(e.dst, []).append(e)
    sizes = {name: g.n for name, g in space.groups.items()}
    out = dict(choice)
    for n in sorted(input_nodes & set(space.strategies)):
        strategies = space.strategies[n]

        def cost(i: int) -> float:
            edges = sum(e.cost_s(i, out[e.dst]) if e.src == n else e.cost_s(out[e.src], i) for e in incident.get(n, []))
            return float(space.node_time_s[n][i]) + edges

        current = cost(out[n])
        pieces = [shard_factor(s.results[0], sizes) for s in strategies]
        better = [i for i in range(len(strategies)) if cost(i) <= current + 1e-12 and pieces[i] > pieces[out[n]]]
        if better:
            out[n] = max(better, key=lambda i: pieces[i])
    return out


def _pins(space: StrategySpace, inputs: dict[str, int], paths: list[str], fixed: Mapping[str, PartitionSpec]) -> dict[int, int]:
    pins = {}
    for key, spec in fixed.items():
        matched = [p for p in paths if p == key or p.startswith(key)]
        if not matched:
            raise InvalidConfigError(f"fixed names {key!r}, which is no input leaf path",
                                     fix=f"use a path as jax.tree_util.keystr gives it, e.g. {paths[0]!r}")
        for p in matched:
            index = strategy_of_spec(space, inputs[p], spec)
            if index is None:
                raise InvalidConfigError(f"fixed spec {spec} of {p} does not divide its shape on this mesh",
                                         fix="pin a spec whose axes divide the dimensions they split")
            pins[inputs[p]] = index
    return pins


def strategy_of_spec(space: StrategySpace, node: int, spec: PartitionSpec) -> int | None:
    """Index of the strategy of input ``node`` whose result is sharded as ``spec``, or None.

    >>> import jax, jax.numpy as jnp
    >>> from costmodel.hardware.machine import load_machine
    >>> g = extract_graph(lambda x: x * 2, jax.ShapeDtypeStruct((8, 4), jnp.float32))
    >>> space = build_space(g, load_machine("a100-80gb").mesh_groups([("data", 2)]), load_machine("a100-80gb"))
    >>> space.strategies[0][strategy_of_spec(space, 0, PartitionSpec("data"))].results
    ((('data',), ()),)
    """
    strategies = space.strategies[node]
    rank = len(strategies[0].results[0])
    wanted = _sharding(spec, rank)
    for i, s in enumerate(strategies):
        if s.results[0] == wanted:
            return i
    for i, s in enumerate(strategies):
        if tuple(sorted(a) for a in s.results[0]) == tuple(sorted(a) for a in wanted):
            return i
    return 0 if not any(wanted) else None


def _sharding(spec: PartitionSpec, rank: int) -> Sharding:
    entries = [() if e is None else (e,) if isinstance(e, str) else tuple(e) for e in spec]
    return tuple(entries + [()] * (rank - len(entries)))


def _specs(graph: Any, space: StrategySpace, choice: dict[int, int], flat: list, tree: Any, inputs: dict[str, int],
           fn: Callable[..., Any], abstract_args: tuple[Any, ...]) -> tuple[Any, Any]:
    in_leaves = [to_partition_spec(space.chosen(inputs[jax.tree_util.keystr(path)], choice).results[0]) for path, _ in flat]
    out_leaves = [PartitionSpec() if out is None else to_partition_spec(space.chosen(out[0], choice).results[out[1]])
                  for out in graph.graph["outputs"]]
    out_tree = jax.tree_util.tree_structure(jax.eval_shape(fn, *abstract_args))
    return jax.tree_util.tree_unflatten(tree, in_leaves), jax.tree_util.tree_unflatten(out_tree, out_leaves)


def _argnum(path: str) -> int:
    return int(path[1:path.index("]")])


def program_compute_dtype(graph: nx.DiGraph) -> str:
    """The operand dtype carrying most of the program's dot-product FLOPs (its matmul units'
    dtype); a program without dot products computes in its most common float dtype.

    >>> import jax, jax.numpy as jnp
    >>> x = jax.ShapeDtypeStruct((64, 64), jnp.float32)
    >>> program_compute_dtype(extract_graph(lambda x: (x.astype(jnp.float16) @ x.astype(jnp.float16)).sum(), x))
    'float16'
    >>> program_compute_dtype(extract_graph(lambda x: (x @ x).sum(), x))
    'float32'
    """
    ops = [d[OP_ATTR] for _, d in graph.nodes(data=True)]
    dot_flops: Counter[str] = Counter()
    for op in ops:
        if op.dot is not None:
            dot_flops[op.inputs[0].dtype] += op.flops * op.repeat
    if dot_flops:
        return dot_flops.most_common(1)[0][0]
    floats = Counter(t.dtype for op in ops for t in op.outputs if "float" in t.dtype)
    return floats.most_common(1)[0][0] if floats else "float32"


def _mesh_axes(mesh: Mesh | str) -> tuple[tuple[str, int], ...]:
    if isinstance(mesh, str):
        spec = parse_mesh(mesh)
        return tuple(zip(spec.axis_names, spec.axis_sizes))
    return tuple((str(name), int(size)) for name, size in mesh.shape.items())
