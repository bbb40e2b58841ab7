"""Extract an `OpGraph` from any jittable function by tracing it to a jaxpr.

Tracing uses abstract inputs (``jax.ShapeDtypeStruct``), so nothing is allocated and any
model size works. Nested jaxprs are inlined: ``pjit``, ``checkpoint``, custom-derivative
calls and ``shard_map`` once; a ``scan`` body once with ``repeat`` multiplied by its
length, so a stack of identical layers costs one layer's worth of nodes. A scan's stacked
results (a layer loop's saved activations) are listed in ``g.graph["stacked"]``: (node,
output index) → how many slices of it the stack holds.

>>> import jax, jax.numpy as jnp
>>> from costmodel.oplevel.opgraph import ops, total_flops
>>> x = jax.ShapeDtypeStruct((4, 8), jnp.float32)
>>> w = jax.ShapeDtypeStruct((8, 16), jnp.float32)
>>> g = extract_graph(lambda x, w: jnp.tanh(x @ w), x, w)
>>> [op.primitive for op in ops(g)], total_flops(g)
(['dot_general', 'tanh'], 1088.0)
"""

from __future__ import annotations

from typing import Any, Callable

import jax
import networkx as nx
from jax.extend import core as jex_core

from costmodel.oplevel.opgraph import (
    DotDims,
    OpNode,
    TensorSpec,
    add_input,
    add_op,
    new_op_graph,
)
from planner.intraop.loops import loop_nest, scan_consts_and_carry
from planner.intraop.op_flops import op_flops

# Primitive parameters that hold a sub-program executed once per call.
_CALL_JAXPR_PARAMS = ("jaxpr", "call_jaxpr", "fun_jaxpr")

_Producer = tuple[int, int]


def extract_graph(fn: Callable[..., Any], *abstract_args: Any, name: str | None = None) -> nx.DiGraph:
    """Trace ``fn`` on abstract arguments and return its OpGraph.

    Graph inputs are labelled by their pytree path (``"[0]['layers']['attn']['wq']"``). The traced
    program stays with the graph (``g.graph["jaxpr"]``, ``g.graph["out_tree"]``), so it can be
    re-bound with the nodes' shardings (`planner.intraop.pinned`) without tracing again.

    Args:
      fn: any function ``jax.make_jaxpr`` accepts.
      *abstract_args: pytrees of ``jax.ShapeDtypeStruct`` (or arrays) to trace with.
      name: graph name; defaults to ``fn.__name__``.
    """
    closed, out_shape = jax.make_jaxpr(fn, return_shape=True)(*abstract_args)
    g = new_op_graph(name or getattr(fn, "__name__", "fn"))
    g.graph["jaxpr"], g.graph["out_tree"] = closed, jax.tree_util.tree_structure(out_shape)
    env: dict[Any, _Producer] = {}
    for i, var in enumerate(closed.jaxpr.constvars):
        env[var] = (add_input(g, _tensor(var.aval), label=f"const[{i}]"), 0)
    paths = [jax.tree_util.keystr(path) for path, _ in jax.tree_util.tree_flatten_with_path(abstract_args)[0]]
    for path, var in zip(paths, closed.jaxpr.invars, strict=True):
        env[var] = (add_input(g, _tensor(var.aval), label=path), 0)
    g.graph["eqn_nodes"], g.graph["stacked"] = {}, {}
    _walk(g, closed.jaxpr, env, repeat=1, scope="", path=())
    # One entry per output leaf; None for a constant (literal) output.
    g.graph["outputs"] = [None if isinstance(v, jex_core.Literal) else env.get(v) for v in closed.jaxpr.outvars]
    return g


def _walk(g: nx.DiGraph, jaxpr: Any, env: dict[Any, _Producer], *, repeat: int, scope: str, path: tuple[int, ...]) -> None:
    """Add the equations of ``jaxpr`` to ``g``; ``env`` maps its variables to producers.

    ``g.graph["eqn_nodes"]`` maps each leaf equation's path (its index in each enclosing
    jaxpr, outermost first) to its node, so a program can be rebuilt with a node's choice
    applied at its equation (`validate.intraop_program`)."""
    for index, eqn in enumerate(jaxpr.eqns):
        eqn_scope = _join(scope, str(eqn.source_info.name_stack))
        sub = _sub_jaxpr(eqn)
        if sub is not None:
            inner_repeat = repeat * (eqn.params["length"] if eqn.primitive.name == "scan" else 1)
            _inline(g, eqn, sub, env, repeat=inner_repeat, scope=eqn_scope, path=(*path, index))
            continue
        operands = [v for v in eqn.invars if hasattr(v.aval, "shape")]
        producers = [(*env[v], i) for i, v in enumerate(operands) if not isinstance(v, jex_core.Literal) and v in env]
        node = add_op(g, _op_node(eqn, repeat=repeat, scope=eqn_scope), producers)
        g.graph["eqn_nodes"][(*path, index)] = node
        for i, out in enumerate(eqn.outvars):
            env[out] = (node, i)


def _inline(g: nx.DiGraph, eqn: Any, sub: Any, env: dict[Any, _Producer], *, repeat: int, scope: str,
            path: tuple[int, ...]) -> None:
    inner = sub.jaxpr if hasattr(sub, "jaxpr") else sub
    inner_env: dict[Any, _Producer] = {}
    for i, var in enumerate(inner.constvars):
        inner_env[var] = (add_input(g, _tensor(var.aval), label=f"{scope}/const[{i}]"), 0)
    # Outer operands line up with the inner program's inputs (for scan: consts, carry, xs).
    for outer, var in zip(eqn.invars, inner.invars):
        if not isinstance(outer, jex_core.Literal) and outer in env:
            inner_env[var] = env[outer]
    _walk(g, inner, inner_env, repeat=repeat, scope=scope, path=path)
    stacked_from = scan_consts_and_carry(eqn.params)[1] if eqn.primitive.name == "scan" else len(inner.outvars)
    for position, (outer, var) in enumerate(zip(eqn.outvars, inner.outvars)):
        if not isinstance(var, jex_core.Literal) and var in inner_env:
            env[outer] = inner_env[var]
            if position >= stacked_from:
                # A scan's per-iteration results are stacked: one slice per trip stays live after it.
                g.graph["stacked"][inner_env[var]] = g.graph["stacked"].get(inner_env[var], 1) * eqn.params["length"]


def _sub_jaxpr(eqn: Any) -> Any | None:
    """The one sub-program of a call-like equation, or None for a leaf primitive."""
    if eqn.primitive.name == "cond":
        # Branches are alternatives: cost the most expensive, as a worst case.
        return max(eqn.params["branches"], key=_jaxpr_flops)
    if eqn.primitive.name == "while":
        return eqn.params["body_jaxpr"]
    for key in _CALL_JAXPR_PARAMS:
        if key in eqn.params:
            return eqn.params[key]
    return None


def _jaxpr_flops(closed: Any) -> float:
    inner = closed.jaxpr if hasattr(closed, "jaxpr") else closed
    return sum(op_flops(e.primitive.name, _ins(e), _outs(e), e.params) for e in inner.eqns)


def _op_node(eqn: Any, *, repeat: int, scope: str) -> OpNode:
    inputs, outputs = _ins(eqn), _outs(eqn)
    dot = None
    if eqn.primitive.name == "dot_general":
        (lc, rc), (lb, rb) = eqn.params["dimension_numbers"]
        dot = DotDims(lhs_contracting=tuple(lc), rhs_contracting=tuple(rc), lhs_batch=tuple(lb), rhs_batch=tuple(rb))
    return OpNode(
        primitive=eqn.primitive.name,
        inputs=inputs,
        outputs=outputs,
        flops=op_flops(eqn.primitive.name, inputs, outputs, eqn.params),
        bytes_read=sum(t.nbytes for t in inputs),
        bytes_written=sum(t.nbytes for t in outputs),
        repeat=repeat,
        scope=scope,
        dot=dot,
        loops=loop_nest(eqn.primitive.name, inputs, outputs, eqn.params),
    )


def _ins(eqn: Any) -> tuple[TensorSpec, ...]:
    return tuple(_tensor(v.aval) for v in eqn.invars if hasattr(v.aval, "shape"))


def _outs(eqn: Any) -> tuple[TensorSpec, ...]:
    return tuple(_tensor(v.aval) for v in eqn.outvars if hasattr(v.aval, "shape"))


def _tensor(aval: Any) -> TensorSpec:
    shape = tuple(int(d) for d in getattr(aval, "shape", ()))
    dtype = str(getattr(aval, "dtype", "float32"))
    return TensorSpec(shape=shape, dtype=dtype)


def _join(outer: str, inner: str) -> str:
    return "/".join(part for part in (outer, inner) if part)
