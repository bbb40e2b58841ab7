"""Which tensors of an OpGraph reach HBM once its elementwise ops are fused, as XLA fuses them.

The step simulator costs fused kernels (`costmodel.kernels`): a norm reads its input and
writes its output once, however many primitives compute it, and launches once. An
OpGraph has a node per primitive; costing each as a kernel of its own would count every
intermediate's HBM round trip and a launch per primitive. So the op-level cost model
groups fusible ops into fusions and charges each op only for the tensors its fusion reads
from or writes to HBM, and one launch per fusion.

A fusion is a connected set of fusible ops of one loop body and one pass (forward, or
backward with its recompute), none reading another's output through a kernel of its own
(a matmul, a gather) or a pass boundary. Ops are placed as late as their consumers allow
(producers sink into consumers, as XLA's producer-consumer fusion does) and ops of a
fusion share that place, which keeps the graph of fusions acyclic. Reshapes and other
pure renamings (`ALIASES`) move no data.

>>> from costmodel.opgraph import LoopNest, OpNode, TensorSpec, add_input, add_op, new_op_graph
>>> t = TensorSpec(shape=(64, 256), dtype="float32")
>>> g = new_op_graph("chain")
>>> x = add_input(g, t, label="x")
>>> y = add_op(g, OpNode(primitive="exp", inputs=(t,), outputs=(t,)), [(x, 0)])
>>> z = add_op(g, OpNode(primitive="tanh", inputs=(t,), outputs=(t,)), [(y, 0)])
>>> traffic = fused_traffic(g)
>>> traffic[y], traffic[z]  # one kernel: reads x, writes tanh's result, launched once
(HbmTraffic(reads=(True,), writes=(False,), launches=True), HbmTraffic(reads=(False,), writes=(True,), launches=False))
"""

from __future__ import annotations

from dataclasses import dataclass

import networkx as nx

from costmodel.opgraph import OP_ATTR, USES_ATTR, OpNode

# Ops that run as kernels of their own (library calls, data-dependent addressing): their
# operands and results always pass through HBM.
OWN_KERNEL = frozenset({
    "dot_general", "conv_general_dilated", "gather", "scatter", "scatter-add", "scatter_add", "sort", "cumsum",
    "cumprod", "cummax", "cumlogsumexp", "custom_call", "fft", "psum", "all_gather", "reduce_scatter", "all_to_all",
    "ppermute",
})
# Ops that only rename their operand's buffer: they move no data.
ALIASES = frozenset({"reshape", "squeeze", "expand_dims", "name", "stop_gradient", "optimization_barrier"})


@dataclass(frozen=True)
class HbmTraffic:
    """Which operands an op reads from HBM, which results it writes there, and whether it launches the kernel."""

    reads: tuple[bool, ...]
    writes: tuple[bool, ...]
    launches: bool

    @classmethod
    def unfused(cls, op: OpNode) -> HbmTraffic:
        """An op run as a kernel of its own: every operand read, every result written.

        >>> from costmodel.opgraph import TensorSpec
        >>> t = TensorSpec(shape=(4,), dtype="float32")
        >>> HbmTraffic.unfused(OpNode(primitive="add", inputs=(t, t), outputs=(t,))).reads
        (True, True)
        """
        return cls(reads=(True,) * len(op.inputs), writes=(True,) * len(op.outputs), launches=True)


def fused_traffic(g: nx.DiGraph) -> dict[int, HbmTraffic]:
    """Each op node's HBM traffic once ``g``'s fusible ops are fused (graph inputs are left out).

    A graph output (``g.graph["outputs"]``, or a result nothing reads) is written.
    """
    ops = {n: d[OP_ATTR] for n, d in g.nodes(data=True)}
    fusion = _fusions(g, ops)
    members: dict[int, list[int]] = {}
    for n in sorted(fusion):
        members.setdefault(fusion[n], []).append(n)
    outputs = {tuple(o) for o in g.graph.get("outputs", ()) if o is not None}
    traffic = {n: HbmTraffic.unfused(op) for n, op in ops.items() if not op.is_input and n not in fusion}
    for group in members.values():
        if all(ops[n].primitive in ALIASES for n in group):
            for n in group:
                traffic[n] = HbmTraffic(reads=(False,) * len(ops[n].inputs), writes=(False,) * len(ops[n].outputs), launches=False)
            continue
        read: set[tuple[int, int]] = set()
        launcher = next(n for n in group if ops[n].primitive not in ALIASES)
        for n in group:
            reads = [False] * len(ops[n].inputs)
            for src in g.predecessors(n):
                for out_index, operand in g.edges[src, n][USES_ATTR]:
                    if fusion.get(src) != fusion[n] and (src, out_index) not in read:
                        read.add((src, out_index))
                        reads[operand] = True
            writes = [(n, i) in outputs for i in range(len(ops[n].outputs))]
            for dst in g.successors(n):
                if fusion.get(dst) != fusion[n]:
                    for out_index, _ in g.edges[n, dst][USES_ATTR]:
                        writes[out_index] = True
            if not g.out_degree(n):
                writes = [True] * len(writes)
            traffic[n] = HbmTraffic(reads=tuple(reads), writes=tuple(writes), launches=n == launcher)
    return traffic


def _fusible(op: OpNode) -> bool:
    return not op.is_input and op.primitive not in OWN_KERNEL


def _boundary(u: OpNode, v: OpNode) -> bool:
    """Whether the tensor ``u`` passes ``v`` must be in HBM whatever is fused: a kernel of its
    own on either side, a pass boundary (a saved activation) or a loop boundary."""
    return not (_fusible(u) and _fusible(v)) or u.is_backward != v.is_backward or u.repeat != v.repeat


def _fusions(g: nx.DiGraph, ops: dict[int, OpNode]) -> dict[int, int]:
    """Fusible op → its fusion's id (its least member).

    Each node gets the latest place its consumers allow (a step before a consumer across a
    boundary); fusible neighbours not across a boundary with the same place are one fusion.
    Places never decrease along an edge and rise across every boundary, so a path leaving
    a fusion can never come back into it.
    """
    place: dict[int, int] = {}
    for n in reversed(list(nx.topological_sort(g))):
        place[n] = min((place[v] - _boundary(ops[n], ops[v]) for v in g.successors(n)), default=0)
    joined = nx.Graph()
    joined.add_nodes_from(n for n, op in ops.items() if _fusible(op))
    joined.add_edges_from((u, v) for u, v in g.edges if u in joined and v in joined
                          and not _boundary(ops[u], ops[v]) and place[u] == place[v])
    return {n: min(component) for component in nx.connected_components(joined) for n in component}
