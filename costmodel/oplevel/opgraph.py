"""`OpGraph`: the dataflow graph every planner and the cost model read.

A networkx ``DiGraph`` whose nodes are operations (one per JAX primitive) and graph
inputs, and whose edges are the tensors flowing between them. Node attribute
``OP_ATTR`` holds a frozen `OpNode`; edge attribute ``TENSOR_ATTR`` holds the `TensorSpec`
carried. An op inside a loop (a scanned layer) appears once with ``repeat`` equal to the
trip count, so the graph of an 80-layer model is the size of a one-layer model's.

>>> g = new_op_graph("demo")
>>> x = add_input(g, TensorSpec(shape=(4, 8), dtype="float32"), label="x")
>>> y = add_op(g, OpNode(primitive="exp", inputs=(TensorSpec(shape=(4, 8), dtype="float32"),),
...                      outputs=(TensorSpec(shape=(4, 8), dtype="float32"),), flops=32), [(x, 0)])
>>> total_flops(g)
32.0
"""

from __future__ import annotations

import math
from collections import Counter
from typing import Iterable

import networkx as nx
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    NonNegativeFloat,
    NonNegativeInt,
    PositiveInt,
)

OP_ATTR = "op"
TENSOR_ATTR = "tensor"
USES_ATTR = "uses"
INPUT_PRIMITIVE = "input"

_DTYPE_BYTES = {
    "float64": 8, "int64": 8, "uint64": 8, "complex64": 8,
    "float32": 4, "int32": 4, "uint32": 4,
    "bfloat16": 2, "float16": 2, "int16": 2, "uint16": 2,
    "int8": 1, "uint8": 1, "bool": 1, "float8_e4m3fn": 1, "float8_e5m2": 1,
}


def dtype_bytes(dtype: str) -> int:
    """Bytes per element of a dtype name (unknown names count as 4).

    >>> dtype_bytes("bfloat16")
    2
    """
    return _DTYPE_BYTES.get(dtype, 4)


class TensorSpec(BaseModel):
    """Shape and dtype of one array."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    shape: tuple[NonNegativeInt, ...] = Field(description="Array dimensions.")
    dtype: str = Field(description="Element type name, e.g. 'bfloat16'.")

    @property
    def size(self) -> int:
        return math.prod(self.shape)

    @property
    def nbytes(self) -> int:
        return self.size * dtype_bytes(self.dtype)


class DotDims(BaseModel):
    """Dimension numbers of a ``dot_general``: which operand axes contract and batch."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    lhs_contracting: tuple[int, ...] = Field(description="Contracted axes of the left operand.")
    rhs_contracting: tuple[int, ...] = Field(description="Contracted axes of the right operand.")
    lhs_batch: tuple[int, ...] = Field(description="Batch axes of the left operand.")
    rhs_batch: tuple[int, ...] = Field(description="Batch axes of the right operand.")


class LoopNest(BaseModel):
    """An op as a loop nest: every operand and result dimension is indexed by one loop, or by none.

    Sharding a loop on a mesh axis shards every dimension it indexes. A ``reduced`` loop
    indexes no result dimension: its iterations are summed (or max-ed), so sharding it
    leaves partial results that an all-reduce or reduce-scatter completes. A dimension
    indexed by no loop must stay whole (replicated).
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    sizes: tuple[PositiveInt, ...] = Field(description="Trip count of each loop.")
    reduced: tuple[bool, ...] = Field(description="Whether each loop is summed over (absent from the results).")
    operands: tuple[tuple[int | None, ...], ...] = Field(description="Per operand, the loop indexing each dimension.")
    results: tuple[tuple[int | None, ...], ...] = Field(description="Per result, the loop indexing each dimension.")


class OpNode(BaseModel):
    """One operation: what it computes, on what shapes, at what cost, how often."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    primitive: str = Field(description="JAX primitive name, or 'input' for a graph input.")
    inputs: tuple[TensorSpec, ...] = Field((), description="Operand tensors, in order.")
    outputs: tuple[TensorSpec, ...] = Field((), description="Result tensors, in order.")
    flops: NonNegativeFloat = Field(0.0, description="Floating-point operations of one execution.")
    bytes_read: NonNegativeInt = Field(0, description="Operand bytes read by one execution.")
    bytes_written: NonNegativeInt = Field(0, description="Result bytes written by one execution.")
    repeat: PositiveInt = Field(1, description="Executions per call (product of enclosing loop trip counts).")
    scope: str = Field("", description="Name scope path, e.g. 'transpose(jvp(layer))/attention'.")
    label: str = Field("", description="Input path (for inputs) or a short human-readable tag.")
    dot: DotDims | None = Field(None, description="Dimension numbers, for dot_general only.")
    loops: LoopNest | None = Field(None, description="How its dimensions relate, for sharding; None = unknown (replicate).")

    @property
    def is_input(self) -> bool:
        return self.primitive == INPUT_PRIMITIVE

    @property
    def is_backward(self) -> bool:
        """Part of a gradient: JAX names transposed (reverse-mode) scopes ``transpose(...)``."""
        return "transpose(" in self.scope


def new_op_graph(name: str) -> nx.DiGraph:
    """An empty OpGraph named ``name``; nodes are added in program order."""
    return nx.DiGraph(name=name)


def add_input(g: nx.DiGraph, tensor: TensorSpec, *, label: str) -> int:
    """Add a graph input (a parameter, optimizer state or batch leaf); returns its node id."""
    return add_op(g, OpNode(primitive=INPUT_PRIMITIVE, outputs=(tensor,), label=label), [])


def add_op(g: nx.DiGraph, op: OpNode, producers: Iterable[tuple[int, int] | tuple[int, int, int]]) -> int:
    """Add ``op`` fed by ``producers`` and return its id.

    A producer is (node id, output index) or (node id, output index, operand index), the
    last saying which of ``op.inputs`` it feeds (default: its place in ``producers``).
    Node ids are consecutive integers in program order, so iteration is deterministic.
    One edge joins a producer and ``op``: ``TENSOR_ATTR`` is the first tensor it carries,
    ``USES_ATTR`` every (output index, operand index) pair it carries.
    """
    node = g.number_of_nodes()
    g.add_node(node, **{OP_ATTR: op})
    for position, (src, out_index, *operand) in enumerate(producers):
        use = (out_index, operand[0] if operand else position)
        if g.has_edge(src, node):
            g.edges[src, node][USES_ATTR] += (use,)
        else:
            g.add_edge(src, node, **{TENSOR_ATTR: g.nodes[src][OP_ATTR].outputs[out_index], USES_ATTR: (use,)})
    return node


def ops(g: nx.DiGraph) -> Iterable[OpNode]:
    """Every OpNode that is not a graph input, in program order."""
    return (d[OP_ATTR] for _, d in sorted(g.nodes(data=True)) if not d[OP_ATTR].is_input)


def total_flops(g: nx.DiGraph) -> float:
    """FLOPs of one call of the graph, loop bodies counted ``repeat`` times."""
    return float(sum(op.flops * op.repeat for op in ops(g)))


def total_bytes_accessed(g: nx.DiGraph) -> float:
    """Bytes read plus written by one call (no fusion assumed), loops counted in full."""
    return float(sum((op.bytes_read + op.bytes_written) * op.repeat for op in ops(g)))


def primitive_counts(g: nx.DiGraph) -> Counter[str]:
    """How many graph nodes use each primitive (inputs excluded)."""
    return Counter(op.primitive for op in ops(g))
