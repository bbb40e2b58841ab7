"""Loop nests of JAX primitives: which loop indexes each operand and result dimension.

The planner shards loops, not tensors: a dot's batch, free and contracting dimensions, an
elementwise op's result dimensions, a reduction's kept and summed dimensions. This module
reads a primitive's parameters (which the JAX-free cost model never sees) and returns the
`LoopNest` the strategy space enumerates.

>>> from costmodel.oplevel.opgraph import TensorSpec
>>> t = lambda *s: TensorSpec(shape=s, dtype="float32")
>>> nest = loop_nest("reduce_sum", (t(4, 8),), (t(4),), {"axes": (1,)})
>>> nest.sizes, nest.reduced, nest.operands, nest.results
((4, 8), (False, True), ((0, 1),), ((0,),))
"""

from __future__ import annotations

import math
from typing import Any

from costmodel.oplevel.opgraph import LoopNest, TensorSpec

ELEMENTWISE = frozenset({
    "abs", "acos", "add", "add_any", "and", "asin", "atan", "atan2", "cbrt", "ceil", "clamp", "convert_element_type",
    "copy", "copy_p", "cos", "cosh", "div", "eq", "erf", "erf_inv", "erfc", "exp", "exp2", "expm1", "floor", "ge",
    "gt", "imag", "integer_pow", "is_finite", "le", "lgamma", "digamma", "log", "log1p", "logistic", "lt", "max",
    "min", "mul", "ne", "neg", "nextafter", "not", "or", "pow", "real", "reduce_precision", "rem", "round", "rsqrt",
    "select_n", "shift_left", "shift_right_arithmetic", "shift_right_logical", "sign", "sin", "sinh", "sqrt", "square",
    "sub", "tan", "tanh", "xor",
})
# Reductions whose partial results a collective completes (sum or max/min across shards).
SHARDABLE_REDUCTIONS = frozenset({"reduce_sum", "reduce_max", "reduce_min"})
# Parameters naming the dimension an op works along (it cannot be split there).
_AXIS_PARAMS = ("axis", "axes", "dimension", "dimensions")


def scan_consts_and_carry(params: dict[str, Any]) -> tuple[int, int]:
    """How many of a ``scan`` equation's operands are constants and how many its carry (xs follow).
    jax 0.10 names the counts (``num_consts``, ``num_carry``); 0.11 gives the flattened groups
    (``ft_in``: constants, carry, xs).

    >>> scan_consts_and_carry({"num_consts": 1, "num_carry": 2})
    (1, 2)
    """
    if "num_carry" in params:
        return params["num_consts"], params["num_carry"]
    consts, carry, _ = params["ft_in"].unpack()
    return len(consts), len(carry)


def loop_nest(primitive: str, inputs: tuple[TensorSpec, ...], outputs: tuple[TensorSpec, ...],
              params: dict[str, Any]) -> LoopNest | None:
    """The loop nest of one equation, or None when no dimension can be split.

    >>> from costmodel.oplevel.opgraph import TensorSpec
    >>> t = lambda *s: TensorSpec(shape=s, dtype="float32")
    >>> loop_nest("transpose", (t(2, 3),), (t(3, 2),), {"permutation": (1, 0)}).operands
    ((1, 0),)
    """
    if not outputs or any(o.size == 0 for o in outputs):
        return None
    if primitive == "dot_general":
        return _dot(inputs, params["dimension_numbers"])
    if primitive in SHARDABLE_REDUCTIONS:
        return _reduction(inputs[0], params["axes"])
    out = outputs[0].shape
    if primitive in ELEMENTWISE:
        # An operand broadcast along size-1 dimensions (x * rsqrt(var) with var B×S×1) follows the rest.
        operands = tuple(tuple(range(len(out))) if t.shape == out else _positional(t.shape, out, {}) for t in inputs)
    elif primitive == "broadcast_in_dim":
        dims = params["broadcast_dimensions"]
        operands = (tuple(d if s == out[d] else None for s, d in zip(inputs[0].shape, dims)),)
        operands += tuple((None,) * len(t.shape) for t in inputs[1:])
    elif primitive == "transpose":
        operands = (tuple(params["permutation"].index(i) for i in range(len(out))),)
    elif primitive in ("reshape", "squeeze", "expand_dims"):
        operands = (_reshape_map(inputs[0].shape, out),) + tuple((None,) * len(t.shape) for t in inputs[1:])
    else:
        operands = tuple(_positional(t.shape, out, params) for t in inputs)
    results = tuple(tuple(range(len(out))) if o.shape == out else _positional(o.shape, out, params) for o in outputs)
    return _nest(out, (False,) * len(out), operands, results)


def _dot(inputs: tuple[TensorSpec, ...], dimension_numbers: Any) -> LoopNest:
    (lhs_c, rhs_c), (lhs_b, rhs_b) = dimension_numbers
    lhs, rhs = inputs[0].shape, inputs[1].shape
    lhs_free = [d for d in range(len(lhs)) if d not in lhs_c and d not in lhs_b]
    rhs_free = [d for d in range(len(rhs)) if d not in rhs_c and d not in rhs_b]
    # Loops: batch, lhs free, rhs free (the result's dimension order), then contracting.
    sizes = [lhs[d] for d in lhs_b] + [lhs[d] for d in lhs_free] + [rhs[d] for d in rhs_free] + [lhs[d] for d in lhs_c]
    lhs_loop: dict[int, int] = {}
    rhs_loop: dict[int, int] = {}
    for i, (a, b) in enumerate(zip(lhs_b, rhs_b)):
        lhs_loop[a], rhs_loop[b] = i, i
    for i, d in enumerate(lhs_free):
        lhs_loop[d] = len(lhs_b) + i
    for i, d in enumerate(rhs_free):
        rhs_loop[d] = len(lhs_b) + len(lhs_free) + i
    n_out = len(lhs_b) + len(lhs_free) + len(rhs_free)
    for i, (a, b) in enumerate(zip(lhs_c, rhs_c)):
        lhs_loop[a], rhs_loop[b] = n_out + i, n_out + i
    operands = (tuple(lhs_loop[d] for d in range(len(lhs))), tuple(rhs_loop[d] for d in range(len(rhs))))
    reduced = (False,) * n_out + (True,) * len(lhs_c)
    return _nest(tuple(sizes), reduced, operands, (tuple(range(n_out)),))


def _reduction(operand: TensorSpec, axes: tuple[int, ...]) -> LoopNest:
    kept = [d for d in range(len(operand.shape)) if d not in axes]
    reduced = tuple(d in axes for d in range(len(operand.shape)))
    return _nest(operand.shape, reduced, (tuple(range(len(operand.shape))),), (tuple(kept),))


def _reshape_map(src: tuple[int, ...], dst: tuple[int, ...]) -> tuple[int | None, ...]:
    """Map each source dimension to the destination dimension it becomes, by groups of equal product.

    Only the leading (major) dimension of a merged or split group keeps its sharding:
    blocks of the major dimension are blocks of the merged one.

    >>> _reshape_map((2, 3, 4), (2, 12))
    (0, 1, None)
    """
    mapping: list[int | None] = [None] * len(src)
    i = j = 0
    while i < len(src) and j < len(dst):
        if src[i] == 1:
            i += 1
            continue
        if dst[j] == 1:
            j += 1
            continue
        mapping[i] = j
        a, b, i0 = src[i], dst[j], i
        i, j = i + 1, j + 1
        while a != b and i <= len(src) and j <= len(dst):
            if a < b and i < len(src):
                a, i = a * src[i], i + 1
            elif b < a and j < len(dst):
                b, j = b * dst[j], j + 1
            else:
                break
        if a != b or math.prod(src[i0:i]) != math.prod(dst[mapping[i0]:j]):
            return tuple([None] * len(src))
    return tuple(mapping)


def _positional(shape: tuple[int, ...], out: tuple[int, ...], params: dict[str, Any]) -> tuple[int | None, ...]:
    """Same-rank tensors: dimension i follows result dimension i when sizes agree and the op does not work along it."""
    if len(shape) != len(out):
        return (None,) * len(shape)
    fixed: set[int] = set()
    for key in _AXIS_PARAMS:
        value = params.get(key)
        if isinstance(value, int):
            fixed.add(value)
        elif isinstance(value, (tuple, list)) and all(isinstance(v, int) for v in value):
            fixed.update(value)
    return tuple(d if s == out[d] and d not in fixed else None for d, s in enumerate(shape))


def _nest(sizes: tuple[int, ...], reduced: tuple[bool, ...], operands: tuple[tuple[int | None, ...], ...],
          results: tuple[tuple[int | None, ...], ...]) -> LoopNest | None:
    if not sizes or all(s <= 1 for s in sizes):
        return None
    return LoopNest(sizes=tuple(max(1, s) for s in sizes), reduced=reduced, operands=operands, results=results)
