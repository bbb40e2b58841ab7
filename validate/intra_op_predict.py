"""What an intra-op plan's program (`validate.intra_op`) does, read off its chosen strategies.

Each pinned equation runs ``repeat`` times per micro-batch (its loop trip counts), the
gradient part once per micro-batch and the optimizer once per step. Per device:

- matmul FLOPs: a dot's FLOPs over the devices its loops are split on;
- partial sums: an op with a mesh axis on a summed loop completes its result by a
  reduce-scatter over the axes it scatters onto a result dimension (the collective's
  input counted, as `validate.hlo` counts it), then an all-reduce of that piece over the rest;
- reshards, where an operand is pinned otherwise than its producer left it: an all-gather over
  the axes it drops (its result counted), an all-to-all per axis that moves to another
  dimension, a collective-permute where the same axes split a dimension in another order;
- memory: `planner.memory.MemoryModel` under the choice (arguments, peak temporaries,
  outputs less what the donated parameters and optimizer state alias), the M micro-batches'
  accumulated loss and gradients beside it when M > 1.
"""

from __future__ import annotations

import math
from collections import defaultdict
from typing import Any

from costmodel.opgraph import OP_ATTR, USES_ATTR, OpNode, TensorSpec
from costmodel.strategies import Sharding, axis_dims, shard_factor
from planner.memory import MemoryModel, temporary_bytes
from validate.intra_op import IntraOpProgram, cut_vars
from validate.predict import PredictedCollective


def _runs(program: IntraOpProgram) -> dict[int, int]:
    """Node → executions per micro-batch loop iteration multiplier: M for the gradient part, 1 for the optimizer."""
    split = program.gradient_part_end()
    return {node: program.micro_batches if path[0] < split else 1 for path, node in program.graph.graph["eqn_nodes"].items()}


def predicted_matmul_flops(program: IntraOpProgram) -> float:
    """Matmul FLOPs per device of one step."""
    sizes = {name: g.n for name, g in program.space.groups.items()}
    total = 0.0
    for node, runs in _runs(program).items():
        op: OpNode = program.graph.nodes[node][OP_ATTR]
        if op.primitive == "dot_general":
            strategy = program.strategy(node)
            split = math.prod(sizes[a] for a in {a for s in strategy.operands for axes in s for a in axes})
            total += op.flops * op.repeat * runs / split
    return total


def predicted_collectives(program: IntraOpProgram, mesh_order: tuple[str, ...], *, platform: str = "gpu") -> list[PredictedCollective]:
    """Every collective of one step, grouped by kind and mesh axes. The CPU backend reduces
    whole and slices where a reduce-scatter was asked for (``FACTS.md``): all-reduces there."""
    sizes = {name: g.n for name, g in program.space.groups.items()}
    total: dict[tuple[str, tuple[str, ...]], list[float]] = defaultdict(lambda: [0.0, 0])
    order = {a: i for i, a in enumerate(mesh_order)}

    def add(kind: str, axes: list[str], nbytes: float, calls: int) -> None:
        if axes and nbytes > 0:
            key = (kind, tuple(sorted(set(axes), key=order.__getitem__)))
            total[key][0] += nbytes * calls
            total[key][1] += calls

    graph = program.graph
    for node, runs in _runs(program).items():
        op: OpNode = graph.nodes[node][OP_ATTR]
        strategy = program.strategy(node)
        calls = op.repeat * runs
        partial = _partial_axes(op, strategy.operands)
        scattered = [a for a in partial if any(a in axes for r in strategy.results for axes in r)]
        unscattered = sum(t.nbytes / shard_factor(tuple(tuple(a for a in axes if a not in scattered) for axes in r), sizes)
                          for t, r in zip(op.outputs, strategy.results))
        add("all-reduce" if platform == "cpu" else "reduce-scatter", scattered, unscattered, calls)
        add("all-reduce", [a for a in partial if a not in scattered], unscattered / math.prod(sizes[a] for a in scattered), calls)
        for src, _, data in graph.in_edges(node, data=True):
            for out_index, operand in data[USES_ATTR]:
                have = program.strategy(src).results[out_index]
                for kind, axes, nbytes in _reshard(op.inputs[operand], have, strategy.operands[operand], sizes):
                    add(kind, axes, nbytes, calls)
    return [PredictedCollective(kind=kind, axes=axes, bytes_per_call=b / max(calls, 1), calls=int(calls),
                                why="the intra-op plan's choice") for (kind, axes), (b, calls) in sorted(total.items())]


def _partial_axes(op: OpNode, operands: tuple[Sharding, ...]) -> list[str]:
    """Mesh axes on summed loops: the op leaves partial sums over them."""
    nest = op.loops
    if op.is_input or nest is None:
        return []
    axes: list[str] = []
    for dims, sharding in zip(nest.operands, operands):
        for k, split in zip(dims, sharding):
            if k is not None and nest.reduced[k]:
                axes += [a for a in split if a not in axes]
    return axes


def _reshard(tensor: TensorSpec, src: Sharding, dst: Sharding, sizes: dict[str, int]) -> list[tuple[str, list[str], float]]:
    """(kind, axes, bytes per device) of the collectives that turn ``src`` into ``dst``, as
    `costmodel.strategies.reshard_s` costs them (shardings trailing-aligned on ``tensor``)."""
    rank = len(tensor.shape)
    src_dims, dst_dims = axis_dims(src, rank), axis_dims(dst, rank)
    piece = tensor.nbytes / math.prod(sizes[a] for a, d in dst_dims.items() if d is not None)
    gathered = [a for a, d in src_dims.items() if d != dst_dims.get(a) and (a not in dst_dims or d == -1)]
    moved = [a for a, d in src_dims.items() if a in dst_dims and d != dst_dims[a] and d != -1]
    out = [("all-gather", gathered, piece)] if gathered else []
    out += [("all-to-all", [a], piece) for a in moved]
    src_aligned, dst_aligned = src[len(src) - rank:], dst[len(dst) - rank:]
    if not gathered and not moved and any(set(s) == set(d) and s != d for s, d in zip(src_aligned, dst_aligned)):
        out.append(("collective-permute", [a for s, d in zip(src_aligned, dst_aligned) if s != d for a in s], piece))
    return out


def predicted_argument_bytes(program: IntraOpProgram) -> float:
    """Per-device bytes of the step's inputs at their chosen shardings, the batch whole (all M micro-batches)."""
    sizes = {name: g.n for name, g in program.space.groups.items()}
    total = 0.0
    for node, data in program.graph.nodes(data=True):
        op = data[OP_ATTR]
        if op.is_input and not op.label.startswith("const"):
            scale = program.micro_batches if op.label.startswith("[2]") else 1
            total += scale * op.outputs[0].nbytes / shard_factor(program.strategy(node).results[0], sizes)
    return total


def predicted_memory_bytes(program: IntraOpProgram, *, platform: str) -> float:
    """Per-device arguments + peak temporaries + outputs − aliased (see the module docstring)."""
    graph, sizes = program.graph, {name: g.n for name, g in program.space.groups.items()}
    donated = frozenset(n for n, d in graph.nodes(data=True) if d[OP_ATTR].is_input and d[OP_ATTR].label[:3] in ("[0]", "[1]"))
    memory = MemoryModel.of_graph(graph).of_choice(program.space, program.choice, donated=donated, backend=platform)
    total = memory.arguments_bytes + memory.peak_temporaries_bytes + memory.outputs_bytes - memory.aliased_bytes
    total += (program.micro_batches - 1) * _batch_bytes(program, sizes)
    if program.micro_batches > 1:
        total += sum(temporary_bytes(t, platform) / shard_factor(program.strategy(n).results[k], sizes)
                     for n, k, t in _cut_nodes(program))
    return total


def _batch_bytes(program: IntraOpProgram, sizes: dict[str, int]) -> float:
    return sum(d[OP_ATTR].outputs[0].nbytes / shard_factor(program.strategy(n).results[0], sizes)
               for n, d in program.graph.nodes(data=True) if d[OP_ATTR].is_input and d[OP_ATTR].label.startswith("[2]"))


def _cut_nodes(program: IntraOpProgram) -> list[tuple[int, int, TensorSpec]]:
    """(node, output index, tensor) of the values the gradient part hands the optimizer: the accumulators."""
    eqn_nodes = program.graph.graph["eqn_nodes"]

    def producer(jaxpr: Any, var: Any, prefix: tuple[int, ...]) -> tuple[int, int] | None:
        for i, eqn in enumerate(jaxpr.eqns):
            if var in eqn.outvars:
                k, path = eqn.outvars.index(var), (*prefix, i)
                if path in eqn_nodes:
                    return eqn_nodes[path], k
                sub = eqn.params.get("jaxpr", eqn.params.get("call_jaxpr"))
                inner = getattr(sub, "jaxpr", sub)
                return producer(inner, inner.outvars[k], path) if inner is not None else None
        return None

    jaxpr = program.closed_jaxpr.jaxpr
    found = [producer(jaxpr, var, ()) for var in cut_vars(jaxpr, program.gradient_part_end())]
    return [(n, k, program.graph.nodes[n][OP_ATTR].outputs[k]) for n, k in filter(None, found)]
