"""FLOPs of one JAX primitive from its operand and result shapes.

Conventions (those of XLA's HLO cost analysis, so the two can be compared): a
multiply-add is 2 FLOPs; an elementwise op is 1 FLOP per result element, transcendental or
not; a reduction is 1 FLOP per input element; data movement (reshape, transpose, gather,
slicing, dtype conversion, broadcast) is free.

>>> from costmodel.oplevel.opgraph import TensorSpec
>>> a, b = TensorSpec(shape=(4, 8), dtype="float32"), TensorSpec(shape=(8, 16), dtype="float32")
>>> c = TensorSpec(shape=(4, 16), dtype="float32")
>>> op_flops("dot_general", (a, b), (c,), {"dimension_numbers": (([1], [0]), ([], []))})
1024
"""

from __future__ import annotations

import math
from typing import Any, Mapping

from costmodel.oplevel.opgraph import TensorSpec

_FREE = frozenset({
    "reshape", "broadcast_in_dim", "transpose", "convert_element_type", "squeeze", "expand_dims",
    "slice", "dynamic_slice", "dynamic_update_slice", "gather", "concatenate", "pad", "iota",
    "copy", "rev", "bitcast_convert_type", "stop_gradient", "select_and_gather_add",
    "device_put", "sharding_constraint", "pvary", "pcast", "split", "random_bits", "random_seed",
    "random_wrap", "random_unwrap", "threefry2x32", "argsort", "sort", "top_k",
    "optimization_barrier", "mesh_cast", "reshard",
})
_REDUCTIONS = frozenset({
    "reduce_sum", "reduce_max", "reduce_min", "reduce_prod", "reduce_and", "reduce_or",
    "argmax", "argmin", "cumsum", "cumprod", "cummax", "cummin", "cumlogsumexp", "reduce_precision",
})
_SCATTERS = frozenset({"scatter-add", "scatter_add", "scatter-mul", "scatter_mul", "scatter", "scatter-min", "scatter-max"})


def op_flops(
    primitive: str, inputs: tuple[TensorSpec, ...], outputs: tuple[TensorSpec, ...], params: Mapping[str, Any]
) -> int:
    """FLOPs of one execution of ``primitive`` (see the module docstring for conventions)."""
    if primitive == "dot_general":
        (lhs_contracting, _), _ = params["dimension_numbers"]
        contracted = math.prod(inputs[0].shape[d] for d in lhs_contracting)
        return 2 * outputs[0].size * contracted
    if primitive == "conv_general_dilated":
        rhs = inputs[1].shape
        out_features_axis = params["dimension_numbers"].rhs_spec[0]
        per_output = math.prod(rhs) // rhs[out_features_axis]
        return 2 * outputs[0].size * per_output // params.get("feature_group_count", 1)
    if primitive in _FREE or not outputs:
        return 0
    if primitive in _REDUCTIONS:
        return inputs[0].size if inputs else 0
    if primitive in _SCATTERS:
        return inputs[-1].size if primitive != "scatter" else 0
    return sum(t.size for t in outputs)
