"""Linear layers in fp8 with per-tensor scales, as Transformer Engine's delayed-scaling recipe
runs them (HYBRID format: e4m3 inputs and weights in forward, e5m2 output gradients in backward).

Each operand is divided by a scale from its amax (current scaling here: TE's delayed scaling
takes the amax of earlier steps, which moves no different bytes), cast to fp8, multiplied in
fp8 with a bf16 result (``preferred_element_type``) and the product scaled back. The backward
pass quantizes the output gradient to e5m2 and runs both gradient GEMMs in fp8 from the fp8
input and weight the forward saved (what ``_Linear.forward`` keeps, `costmodel.step.activations`).

XLA:CPU has no fp8 GEMM: it converts the fp8 operands to fp32 inside the dot's fusion and
multiplies in fp32, so on the emulated mesh the module keeps fp8 tensors (the saved inputs)
but its dots are fp32 ones; FLOP counts are the same.

>>> import jax.numpy as jnp
>>> x, w = jnp.ones((2, 4), jnp.bfloat16), jnp.full((4, 3), 0.5, jnp.bfloat16)
>>> fp8_linear("bd,df->bf", x, w, jnp.bfloat16)[0].tolist()
[2.0, 2.0, 2.0]
"""

from __future__ import annotations

from functools import partial
from typing import Any

import jax
import jax.numpy as jnp

E4M3, E5M2 = jnp.float8_e4m3fn, jnp.float8_e5m2


def _quantize(t: jax.Array, dtype: Any) -> tuple[jax.Array, jax.Array]:
    """``t`` scaled so its amax meets ``dtype``'s largest value, cast to ``dtype``; and the scale."""
    amax = jnp.max(jnp.abs(t)).astype(jnp.float32)
    scale = jnp.finfo(dtype).max.astype(jnp.float32) / jnp.maximum(amax, jnp.finfo(jnp.float32).tiny)
    return (t.astype(jnp.float32) * scale).astype(dtype), scale


def _scaled_einsum(equation: str, a: jax.Array, b: jax.Array, scale: jax.Array) -> jax.Array:
    return jnp.einsum(equation, a, b, preferred_element_type=jnp.bfloat16) / scale.astype(jnp.bfloat16)


@partial(jax.custom_vjp, nondiff_argnums=(0, 3))
def fp8_linear(equation: str, x: jax.Array, w: jax.Array, dt: Any) -> jax.Array:
    """``jnp.einsum(equation, x, w)`` with both operands in fp8 (a two-operand equation whose
    every index appears in two of x, w and the output), the result in ``dt``."""
    return _forward(equation, x, w, dt)[0]


def _forward(equation: str, x: jax.Array, w: jax.Array, dt: Any) -> tuple[jax.Array, tuple[jax.Array, ...]]:
    x8, x_scale = _quantize(x, E4M3)
    w8, w_scale = _quantize(w, E4M3)
    return _scaled_einsum(equation, x8, w8, x_scale * w_scale).astype(dt), (x8, x_scale, w8, w_scale)


def _backward(equation: str, dt: Any, saved: tuple[jax.Array, ...], dy: jax.Array) -> tuple[jax.Array, jax.Array]:
    x8, x_scale, w8, w_scale = saved
    operands, out = equation.split("->")
    x_idx, w_idx = operands.split(",")
    dy8, dy_scale = _quantize(dy, E5M2)
    dx = _scaled_einsum(f"{out},{w_idx}->{x_idx}", dy8, w8, dy_scale * w_scale).astype(dt)
    dw = _scaled_einsum(f"{x_idx},{out}->{w_idx}", x8, dy8, dy_scale * x_scale).astype(dt)
    return dx, dw


fp8_linear.defvjp(_forward, _backward)
