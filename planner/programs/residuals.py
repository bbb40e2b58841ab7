"""Keep a function's backward residuals as raw 16-bit integers.

XLA:CPU has no 16-bit float arithmetic: its float normalization widens every bf16 and fp16
op to fp32, the dynamic-update-slice that stacks a layer loop's saved activations included,
so on that backend a scanned layer's residuals take twice their bytes. Stored as integers of
the same width (a bitcast: free on every backend, the values bit-identical) they keep the
size a GPU or TPU gives them, so a CPU compile measures the memory the plan's device would
hold. bf16 travels as uint16 and fp16 as int16, so the backward knows which one it holds.

>>> import jax, jax.numpy as jnp
>>> f = lambda x, w: jnp.tanh(x @ w)
>>> x, w = jnp.ones((4, 8), jnp.bfloat16), jnp.full((8, 8), 0.1, jnp.bfloat16)
>>> g = jax.grad(lambda w: residuals_as_bits(f)(x, w).astype(jnp.float32).sum())(w)
>>> bool((g == jax.grad(lambda w: f(x, w).astype(jnp.float32).sum())(w)).all())
True
"""

from __future__ import annotations

from typing import Any, Callable

import jax
import jax.numpy as jnp

_BITS = {jnp.dtype(jnp.bfloat16): jnp.uint16, jnp.dtype(jnp.float16): jnp.int16}
_FLOATS = {jnp.dtype(bits): float_ for float_, bits in _BITS.items()}


def to_bits(x: jax.Array) -> jax.Array:
    """``x`` as same-width integers if it is 16-bit floats (`from_bits` reads it back), else ``x``."""
    bits = _BITS.get(jnp.dtype(x.dtype))
    return x if bits is None else jax.lax.bitcast_convert_type(x, bits)


def from_bits(x: jax.Array) -> jax.Array:
    """The 16-bit floats `to_bits` stored as integers; any other array as it is."""
    float_ = _FLOATS.get(jnp.dtype(x.dtype))
    return x if float_ is None else jax.lax.bitcast_convert_type(x, float_)


def residuals_as_bits(fn: Callable[..., Any], *, scan_body: bool = False) -> Callable[..., Any]:
    """``fn`` with the same values and gradients, whose backward keeps its 16-bit float
    residuals (what ``jax.vjp`` of ``fn`` saves, under any ``jax.checkpoint`` policy inside)
    as same-width integers. ``fn``'s arguments must all be differentiable arrays, and it must
    not itself save 16-bit integers (they would be read back as floats).

    ``scan_body``: ``fn`` is a scan's body ``(carry, xs)``, and what it saves of ``xs`` as itself
    (a layer's stored weight) stays itself: the scan forwards such a residual to its stacked
    input, where a bitcast copy would be stacked beside it. The carry (the layer's input) is
    stacked either way, so as bits; so is everything where the weights reach ``fn`` otherwise (a
    pipeline's tick loop indexes them)."""

    @jax.custom_vjp
    def wrapped(*args: Any) -> Any:
        return fn(*args)

    def forward(*args: Any) -> tuple[Any, Any]:
        out, backward = jax.vjp(fn, *args)
        scanned = {id(a) for a in jax.tree.leaves(args[1:])} if scan_body else set()
        return out, jax.tree.map(lambda r: r if id(r) in scanned else to_bits(r), backward)

    def backward(saved: Any, cotangent: Any) -> Any:
        return jax.tree.map(from_bits, saved)(cotangent)

    wrapped.defvjp(forward, backward)
    return wrapped
