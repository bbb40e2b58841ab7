"""``planner.shard(fn, *abstract_args, mesh=...)``: the intra-op ILP on any jittable function.

Traces ``fn`` to an OpGraph, costs every op's sharding strategies on the mesh with the
hardware profile's roofline and link model, solves the CP-SAT ILP, and returns
``PartitionSpec`` pytrees for the inputs and outputs, ready for
``jax.jit(fn, in_shardings=..., out_shardings=...)``.

>>> import jax, jax.numpy as jnp
>>> x = jax.ShapeDtypeStruct((256, 1024), jnp.bfloat16)
>>> w = jax.ShapeDtypeStruct((1024, 4096), jnp.bfloat16)
>>> result = shard(lambda x, w: jnp.tanh(x @ w), x, w, mesh="data=4", hardware="a100-80gb")
>>> result.solution.status, len(result.in_specs)
('OPTIMAL', 2)
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Any, Callable

import jax
import networkx as nx
from jax.sharding import Mesh, PartitionSpec

from costmodel.machine import load_machine
from costmodel.mesh import parse_mesh
from costmodel.opgraph import OP_ATTR, OpNode
from costmodel.strategies import Sharding
from costmodel.strategy_space import StrategySpace, build_space, prune_dominated
from planner.extract import extract_graph
from planner.ilp import IntraOpSolution, solve_intra_op


@dataclass(frozen=True)
class ShardResult:
    """Input and output shardings chosen by the ILP, with the solution and the space it came from."""

    in_specs: tuple[Any, ...]
    out_specs: Any
    solution: IntraOpSolution
    space: StrategySpace
    mesh_axes: tuple[tuple[str, int], ...]
    compute_dtype: str


def shard(fn: Callable[..., Any], *abstract_args: Any, mesh: Mesh | str, hardware: str = "h100-sxm",
          memory_budget_bytes: float | None = None, time_limit_s: float = 20.0,
          memory_factor: Callable[[str], float] = lambda label: 1.0, compute_dtype: str | None = None) -> ShardResult:
    """Shard ``fn`` on ``mesh`` by solving the intra-op ILP on its graph.

    Args:
      fn: any function ``jax.jit`` accepts.
      *abstract_args: pytrees of ``jax.ShapeDtypeStruct`` (or arrays).
      mesh: a ``jax.sharding.Mesh`` or a spec such as ``"data=2,tensor=4"`` (axis names are kept).
      hardware: profile whose roofline and links cost the strategies.
      memory_budget_bytes: per-device limit; default the profile's HBM.
      memory_factor: bytes held per byte of the input with this path label (e.g. 4 for a
        parameter with its gradient and two Adam moments when they are not inputs too).
      compute_dtype: whose peak FLOP/s costs the matmuls ('float32', 'bfloat16', 'float16', ...);
        default `program_compute_dtype` of the traced program.
    """
    axes = _mesh_axes(mesh)
    graph = extract_graph(fn, *abstract_args)
    dtype = compute_dtype or program_compute_dtype(graph)
    machine = load_machine(hardware, compute_dtype=dtype)
    space = prune_dominated(build_space(graph, machine.mesh_groups(list(axes)), machine,
                                        memory_factor=lambda op: _input_factor(op, memory_factor)))
    budget = machine.hbm_bytes if memory_budget_bytes is None else memory_budget_bytes
    solution = solve_intra_op(space, memory_budget_bytes=budget, time_limit_s=time_limit_s)
    inputs = {d[OP_ATTR].label: n for n, d in graph.nodes(data=True) if d[OP_ATTR].is_input}
    flat, tree = jax.tree_util.tree_flatten_with_path(abstract_args)
    in_leaves = [to_partition_spec(space.chosen(inputs[jax.tree_util.keystr(path)], solution.choice).results[0])
                 for path, _ in flat]
    out_leaves = [PartitionSpec() if out is None else to_partition_spec(space.chosen(out[0], solution.choice).results[out[1]])
                  for out in graph.graph["outputs"]]
    out_tree = jax.tree_util.tree_structure(jax.eval_shape(fn, *abstract_args))
    return ShardResult(in_specs=jax.tree_util.tree_unflatten(tree, in_leaves),
                       out_specs=jax.tree_util.tree_unflatten(out_tree, out_leaves),
                       solution=solution, space=space, mesh_axes=axes, compute_dtype=dtype)


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


def to_partition_spec(sharding: Sharding) -> PartitionSpec:
    """A per-dimension tuple of mesh axes as a ``PartitionSpec``.

    >>> to_partition_spec(((), ("data", "tensor"), ("pipe",)))
    P(None, ('data', 'tensor'), 'pipe')
    """
    return PartitionSpec(*[None if not axes else axes[0] if len(axes) == 1 else tuple(axes) for axes in sharding])


def _mesh_axes(mesh: Mesh | str) -> tuple[tuple[str, int], ...]:
    if isinstance(mesh, str):
        spec = parse_mesh(mesh)
        return tuple(zip(spec.axis_names, spec.axis_sizes))
    return tuple((str(name), int(size)) for name, size in mesh.shape.items())


def _input_factor(op: OpNode, memory_factor: Callable[[str], float]) -> float:
    return memory_factor(op.label) if op.is_input else 1.0
