"""What an intra-op plan's program (`validate.intraop_program`) does, read off its chosen strategies.

Each pinned equation runs ``repeat`` times per micro-batch (its loop trip counts), the
gradient part once per micro-batch and the optimizer once per step. Per device:

- matmul FLOPs: a dot's FLOPs over the devices its loops are split on;
- partial sums: an op with a mesh axis on a summed loop completes its result by a
  reduce-scatter over the axes it scatters onto each result dimension (the collective's
  input counted, as `validate.hlo` counts it), then an all-reduce of that piece over the
  rest; the CPU backend all-reduces and slices instead (`_partial_sums`);
- reshards, where an operand is pinned otherwise than its producer left it, as XLA performs
  them (`_reshard`): all-gathers dimension by dimension, all-to-alls for axes that move,
  collective-permutes where devices must be reordered. A step input read otherwise than it
  comes is resharded whole, once, before the loops (`_hoisted`); the updated parameters and
  optimizer state go back to their input shardings;
- memory: `costmodel.oplevel.program_memory.MemoryModel` under the choice (arguments, peak temporaries,
  outputs less what the donated parameters and optimizer state alias), the M micro-batches'
  accumulated loss and gradients beside it when M > 1, and each hoisted reshard's result
  held across the loops.

Measured on the CPU backend (jax 0.10.2) on the planner's ILP plans for gpt2-medium (2x4)
and llama3-8b (4x2): every check within tolerance (`benchmarks.validate_suite`).
"""

from __future__ import annotations

import math
from collections import defaultdict
from typing import Any

import jax

from costmodel.oplevel.opgraph import OP_ATTR, USES_ATTR, OpNode, TensorSpec
from costmodel.oplevel.program_memory import MemoryModel, temporary_bytes
from costmodel.oplevel.strategies import Sharding, axis_dims, shard_factor
from validate.intraop_program import IntraOpProgram, cut_vars
from validate.program_runs import PredictedCollective


def _runs(program: IntraOpProgram) -> dict[int, int]:
    """Node → how many times its part runs per step: M for the gradient part, 1 for the optimizer."""
    split = program.gradient_part_end()
    return {node: program.micro_batches if path[0] < split else 1 for path, node in program.graph.graph["eqn_nodes"].items()}


def predicted_matmul_flops(program: IntraOpProgram) -> float:
    """Matmul FLOPs per device of one step."""
    sizes = program.sizes
    total = 0.0
    for node, runs in _runs(program).items():
        op: OpNode = program.graph.nodes[node][OP_ATTR]
        if op.primitive == "dot_general":
            strategy = program.strategy(node)
            split = math.prod(sizes[a] for a in {a for s in strategy.operands for axes in s for a in axes})
            total += op.flops * op.repeat * runs / split
    return total


def predicted_collectives(program: IntraOpProgram, mesh_order: tuple[str, ...], *, platform: str = "gpu") -> list[PredictedCollective]:
    """Every collective of one step, grouped by kind and mesh axes (see the module docstring)."""
    sizes = program.sizes
    total: dict[tuple[str, tuple[str, ...]], list[float]] = defaultdict(lambda: [0.0, 0])
    order = {a: i for i, a in enumerate(mesh_order)}

    def add(kind: str, axes: list[str], nbytes: float, calls: int) -> None:
        if axes and nbytes > 0:
            key = (kind, tuple(sorted(set(axes), key=order.__getitem__)))
            total[key][0] += nbytes * calls
            total[key][1] += calls

    graph = program.graph
    paths = {node: path for path, node in graph.graph["eqn_nodes"].items()}
    # XLA reshards a value once per sharding its readers in one computation want (the head's input
    # gathered for the forward and the weight gradient: one all-gather on GPT-2's padded vocabulary).
    resharded: set[tuple[Any, ...]] = set()
    for node, runs in _runs(program).items():
        op: OpNode = graph.nodes[node][OP_ATTR]
        strategy = program.strategy(node)
        calls = op.repeat * runs
        for kind, axes, nbytes in _partial_sums(op, strategy, sizes, platform):
            add(kind, axes, nbytes, calls)
        for src, _, data in graph.in_edges(node, data=True):
            source: OpNode = graph.nodes[src][OP_ATTR]
            for out_index, operand in data[USES_ATTR]:
                if not source.is_input:
                    have, want = program.strategy(src).results[out_index], strategy.operands[operand]
                    key = (src, out_index, _aligned(want, len(op.inputs[operand].shape)), paths[node][:-1])
                    if key in resharded:
                        continue
                    resharded.add(key)
                    for kind, axes, nbytes in _reshard(_moved_as(source, op.inputs[operand]), have, want, sizes):
                        add(kind, axes, nbytes, calls)
    for src, out_index, want in _hoisted(program):
        tensor, have = graph.nodes[src][OP_ATTR].outputs[out_index], program.strategy(src).results[out_index]
        for kind, axes, nbytes in _reshard(tensor, have, want, sizes):
            add(kind, axes, nbytes, 1)
    for (src, out_index), want in _output_shardings(program):
        have = program.strategy(src).results[out_index]
        for kind, axes, nbytes in _reshard(graph.nodes[src][OP_ATTR].outputs[out_index], have, want, sizes):
            add(kind, axes, nbytes, 1)
    return [PredictedCollective(kind=kind, axes=axes, bytes_per_call=b / max(calls, 1), calls=int(calls),
                                why="the intra-op plan's choice") for (kind, axes), (b, calls) in sorted(total.items())]


def _hoisted(program: IntraOpProgram) -> set[tuple[int, int, Sharding]]:
    """(input node, output index, sharding) of each way a step input is read otherwise than it
    comes: the same in every loop trip, XLA reshards it whole, once, before the loops."""
    graph, out = program.graph, set()
    for node in program.graph.graph["eqn_nodes"].values():
        strategy = program.strategy(node)
        for src, _, data in graph.in_edges(node, data=True):
            if graph.nodes[src][OP_ATTR].is_input:
                for out_index, operand in data[USES_ATTR]:
                    have, want = program.strategy(src).results[out_index], strategy.operands[operand]
                    if _aligned(want, len(have)) != tuple(have):
                        out.add((src, out_index, _aligned(want, len(have))))
    return out


def _moved_as(source: OpNode, tensor: TensorSpec) -> TensorSpec:
    """What a reshard of ``tensor`` moves: the narrower input of a widening convert (XLA
    converts after moving the data)."""
    if source.primitive == "convert_element_type" and source.inputs and source.inputs[0].nbytes < tensor.nbytes:
        return TensorSpec(shape=tensor.shape, dtype=source.inputs[0].dtype)
    return tensor


def _partial_sums(op: OpNode, strategy: Any, sizes: dict[str, int], platform: str) -> list[tuple[str, list[str], float]]:
    """(kind, axes, bytes per device) completing an op's partial sums. The axes scattered
    onto one result dimension reduce-scatter together, dimension after dimension; the axes
    left reduce the scattered piece together. The CPU backend reduces, then slices
    (``FACTS.md``): one all-reduce of the whole result over every axis, or, scattering onto
    several dimensions, one per dimension."""
    partial = _partial_axes(op, strategy.operands)
    if not partial:
        return []
    by_dim: dict[int, list[str]] = defaultdict(list)
    for result in strategy.results[:1]:
        for dim, axes in enumerate(result):
            by_dim[dim] += [a for a in axes if a in partial]
    scattered = [a for axes in by_dim.values() for a in axes]
    whole = sum(t.nbytes / shard_factor(tuple(tuple(a for a in axes if a not in scattered) for axes in r), sizes)
                for t, r in zip(op.outputs, strategy.results))
    groups = [axes for axes in by_dim.values() if axes]
    if platform == "cpu" and len(groups) <= 1:
        return [("all-reduce", partial, whole)]
    out, piece = [], whole
    for dim in sorted(by_dim, reverse=True):
        if by_dim[dim]:
            out.append(("all-reduce", by_dim[dim], whole) if platform == "cpu" else ("reduce-scatter", by_dim[dim], piece))
            piece /= math.prod(sizes[a] for a in by_dim[dim])
    rest = [a for a in partial if a not in scattered]
    if rest:
        out.append(("all-reduce", rest, whole if platform == "cpu" else piece))
    return out


def _output_shardings(program: IntraOpProgram) -> list[tuple[tuple[int, int], Sharding]]:
    """(producer, output index) of each updated parameter and optimizer leaf, with the sharding
    its input has: a step returns its state as it took it (``out_shardings``)."""
    inputs = program.input_shardings()
    outputs = program.graph.graph["outputs"]
    state = len(jax.tree_util.tree_leaves(program.abstract[:2]))
    return [(produced, inputs[i]) for i, produced in enumerate(outputs[:state]) if produced is not None]


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
    """(kind, axes, bytes per device) of the collectives that turn ``src`` into ``dst``
    (shardings trailing-aligned on ``tensor``): a collective-permute where the same axes split
    a dimension in another order, an all-to-all per axis that moves to another dimension, and
    an all-gather per dimension that loses axes, the last dimension first as XLA gathers,
    each counted at its result (after a collective-permute where the axes it drops are not
    the dimension's minor ones). A collective-permute where a dimension keeps its axes but
    gains others ahead of them: a free slice keeps the kept axes major."""
    rank = len(tensor.shape)
    src, dst = _aligned(src, rank), _aligned(dst, rank)
    src_dims, dst_dims = axis_dims(src, rank), axis_dims(dst, rank)
    out: list[tuple[str, list[str], float]] = []
    moved = [a for a, d in src_dims.items() if a in dst_dims and d != dst_dims[a]]
    piece = tensor.nbytes / math.prod(sizes[a] for a in src_dims)
    out += [("all-to-all", [a], piece) for a in moved]
    for s, d in zip(src, dst):
        # Axes kept on a dimension stay major: slicing more axes in ahead of them reorders devices.
        if s and set(s) <= set(d) and tuple(d[:len(s)]) != tuple(s):
            out.append(("collective-permute", list(d), tensor.nbytes / math.prod(sizes[a] for a in dst_dims)))
    for dim in reversed(range(rank)):
        dropped = [a for a in src[dim] if a not in dst_dims]
        if dropped and list(src[dim][len(src[dim]) - len(dropped):]) != dropped:
            # XLA gathers minor axes: it first reorders the devices so the dropped axes are.
            out.append(("collective-permute", list(src[dim]), piece))
        if dropped:
            piece *= math.prod(sizes[a] for a in dropped)
            out.append(("all-gather", dropped, piece))
    return out


def _aligned(sharding: Sharding, rank: int) -> Sharding:
    """``sharding`` on a rank-``rank`` tensor, trailing dimensions aligned: a stacked tensor's
    slice drops its leading dimensions, a stack of slices adds unsplit ones."""
    sharding = tuple(sharding)
    return sharding[len(sharding) - rank:] if len(sharding) >= rank else ((),) * (rank - len(sharding)) + sharding


def predicted_argument_bytes(program: IntraOpProgram) -> float:
    """Per-device bytes of the step's inputs at their chosen shardings, the batch whole (all M micro-batches)."""
    sizes = program.sizes
    total = 0.0
    for node, data in program.graph.nodes(data=True):
        op = data[OP_ATTR]
        if op.is_input and not op.label.startswith("const"):
            scale = program.micro_batches if op.label.startswith("[2]") else 1
            total += scale * op.outputs[0].nbytes / shard_factor(program.strategy(node).results[0], sizes)
    return total


def predicted_memory_bytes(program: IntraOpProgram, *, platform: str) -> float:
    """Per-device arguments + peak temporaries + outputs − aliased (see the module docstring)."""
    graph, sizes = program.graph, program.sizes
    donated = frozenset(n for n, d in graph.nodes(data=True) if d[OP_ATTR].is_input and d[OP_ATTR].label[:3] in ("[0]", "[1]"))
    memory = MemoryModel.of_graph(graph).of_choice(program.space, program.choice, donated=donated, backend=platform)
    total = memory.arguments_bytes + memory.peak_temporaries_bytes + memory.outputs_bytes - memory.aliased_bytes
    total += (program.micro_batches - 1) * _batch_bytes(program, sizes)
    # A hoisted reshard's result stays live across the loops that read it.
    total += sum(graph.nodes[src][OP_ATTR].outputs[k].nbytes / shard_factor(want, sizes) for src, k, want in _hoisted(program))
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
