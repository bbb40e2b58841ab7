"""The rule-based (Megatron) layout of a program as a choice in its intra-op strategy space.

`planner.shardings` gives the parameters' shardings; Megatron-LM shards the activations
to match: the data axes split the batch, the tensor axes the heads, MLP width and
vocabulary where the parameters split them. To cost that layout with the op-level model,
`rule_based_space` pins every input to its rule-based spec, lets the data axes split only
the batch dimensions of what an op reads (traced from the batch inputs through the ops'
loop nests), and lets no op move a parameter's tensor axes. The least-time choice left
(the ILP on that space) is the layout's op-level time. Ops with no strategy of that kind
(a gather or scatter without a batch loop) keep all theirs.

>>> import jax, jax.numpy as jnp
>>> from costmodel.hardware.machine import load_machine
>>> from costmodel.oplevel.strategy_space import build_space
>>> from planner.intraop.extract import extract_graph
>>> f = lambda w, x: jnp.tanh(x @ w).sum()
>>> g = extract_graph(f, jax.ShapeDtypeStruct((64, 128), jnp.float32), jax.ShapeDtypeStruct((32, 64), jnp.float32))
>>> hw = load_machine("a100-80gb")
>>> space = build_space(g, hw.mesh_groups([("data", 2), ("tensor", 2)]), hw)
>>> megatron = rule_based_space(g, space, {"[0]": PartitionSpec(None, "tensor"), "[1]": PartitionSpec("data")},
...                             batch=("[1]",), data_axes=("data",), tensor_axes=("tensor",))
>>> [s.name for s in megatron.strategies[2]]  # the matmul: batch over data, the weight's columns over tensor
['[data,-]×[-,tensor] → [data,tensor]']
"""

from __future__ import annotations

from typing import Collection, Mapping

import networkx as nx
import numpy as np
from jax.sharding import PartitionSpec

from costmodel.oplevel.opgraph import OP_ATTR, USES_ATTR, OpNode
from costmodel.oplevel.strategies import Strategy, axis_dims
from costmodel.oplevel.strategy_space import StrategySpace, prune_dominated, restrict
from planner.intraop.shard import strategy_of_spec
from planner.shardings import entry_axes

BatchDims = dict[int, frozenset[int]]  # result index → its batch dimensions


def rule_based_space(graph: nx.DiGraph, space: StrategySpace, input_specs: Mapping[str, PartitionSpec], *,
                     batch: Collection[str], data_axes: Collection[str], tensor_axes: Collection[str]) -> StrategySpace:
    """``space`` (built on ``graph``) restricted to the rule-based layout, pruned.

    ``input_specs``: input label → its spec (axes ``space`` lacks, such as pipeline axes,
    are dropped); ``batch``: labels of the inputs whose leading dimension is the batch.
    Raises KeyError for a label ``graph`` lacks, ValueError for a spec no strategy has.
    """
    inputs = {d[OP_ATTR].label: n for n, d in graph.nodes(data=True) if d[OP_ATTR].is_input}
    pins = {}
    for label, spec in input_specs.items():
        kept = PartitionSpec(*(_known(e, space) for e in spec))
        index = strategy_of_spec(space, inputs[label], kept)
        if index is None:
            raise ValueError(f"no strategy of input {label} is sharded as {kept}")
        pins[inputs[label]] = index
    ops = {n: d[OP_ATTR] for n, d in graph.nodes(data=True)}
    dims = _batch_dims(graph, ops, {inputs[label] for label in batch})
    data, tensor = frozenset(data_axes) & set(space.groups), frozenset(tensor_axes) & set(space.groups)
    keep = {n: np.array([i]) for n, i in pins.items()}
    for n, options in space.strategies.items():
        if n in pins:
            continue
        reads_batch: dict[int, frozenset[int]] = {}
        reads_param: dict[int, tuple[tuple[str, ...], ...]] = {}
        for src in graph.predecessors(n):
            root = src if src in space.strategies else space.followers[src][0] if src in space.followers else None
            for out_index, operand in graph.edges[src, n][USES_ATTR]:
                if dims.get(src, {}).get(out_index):
                    reads_batch[operand] = dims[src][out_index]
                if root in pins and not dims.get(root):
                    reads_param[operand] = space.chosen(src, pins).results[out_index]
        allowed = [i for i, s in enumerate(options) if _megatron(s, ops[n], reads_batch, reads_param, data, tensor)]
        keep[n] = np.array(allowed or range(len(options)))
    return prune_dominated(restrict(space, keep))


def _known(entry: str | tuple[str, ...] | None, space: StrategySpace) -> str | tuple[str, ...] | None:
    names = tuple(a for a in entry_axes(entry) if a in space.groups)
    return None if not names else names[0] if len(names) == 1 else names


def _megatron(s: Strategy, op: OpNode, reads_batch: dict[int, frozenset[int]], reads_param: dict[int, tuple],
              data: frozenset[str], tensor: frozenset[str]) -> bool:
    """Whether ``s`` splits every batch operand's batch dimensions (only those) over all the
    data axes and keeps each parameter operand's tensor axes where the parameter has them."""
    for operand, batch_dims in reads_batch.items():
        placed = axis_dims(s.operands[operand], len(op.inputs[operand].shape))
        if {a for a, d in placed.items() if d in batch_dims} & data != data or any(
                a in data and d not in batch_dims for a, d in placed.items()):
            return False
    for operand, param in reads_param.items():
        rank = len(op.inputs[operand].shape)
        wanted = {a: d for a, d in axis_dims(param, rank).items() if a in tensor}
        if {a: d for a, d in axis_dims(s.operands[operand], rank).items() if a in tensor} != wanted:
            return False
    return True


def _batch_dims(graph: nx.DiGraph, ops: dict[int, OpNode], batch_inputs: set[int]) -> dict[int, BatchDims]:
    """Node → its results' batch dimensions: the leading dimension of the batch inputs, carried
    through each op's loop nest (an op without one keeps a batch dimension its result has
    at the same place, of the same size)."""
    out: dict[int, BatchDims] = {}
    for n in sorted(graph.nodes):
        op = ops[n]
        if op.is_input:
            out[n] = {0: frozenset({0})} if n in batch_inputs else {}
            continue
        reads = {operand: out[src][o] for src in graph.predecessors(n) for o, operand in graph.edges[src, n][USES_ATTR]
                 if out[src].get(o)}
        out[n] = {}
        for j, result in enumerate(op.outputs):
            # A batch dimension the op's loop nest tracks goes where its loop goes; one it does not
            # (no nest, or an operand of another rank: argmax, gather, scatter) stays at its place
            # in a result of the same size there.
            tracked = {(i, d): op.loops.operands[i][d] for i, ds in reads.items() for d in ds
                       if op.loops is not None and d < len(op.loops.operands[i]) and op.loops.operands[i][d] is not None}
            loops = set(tracked.values())
            found = frozenset(d for d, k in enumerate(op.loops.results[j]) if k is not None and k in loops) if op.loops else frozenset()
            found |= frozenset(d for i, ds in reads.items() for d in ds if (i, d) not in tracked
                               and d < len(result.shape) and result.shape[d] == op.inputs[i].shape[d])
            if found:
                out[n][j] = found
    return out
