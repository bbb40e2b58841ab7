"""Tests `planner/programs/fp8_linear.py`: scaled fp8 projections and their fp8 backward."""

import jax
import jax.numpy as jnp
import numpy as np

from planner.programs.fp8_linear import fp8_linear


def test_fp8_projection_and_its_gradients_track_the_exact_ones():
    kx, kw = jax.random.split(jax.random.PRNGKey(0))
    x = jax.random.normal(kx, (4, 16, 64), jnp.float32).astype(jnp.bfloat16)
    w = (jax.random.normal(kw, (64, 32), jnp.float32) / 8).astype(jnp.bfloat16)

    def loss(f):
        return lambda x, w: (f("bsd,df->bsf", x, w, jnp.bfloat16).astype(jnp.float32) ** 2).sum()

    exact = lambda eq, x, w, dt: jnp.einsum(eq, x.astype(jnp.float32), w.astype(jnp.float32)).astype(dt)  # noqa: E731
    y8, y = fp8_linear("bsd,df->bsf", x, w, jnp.bfloat16), exact("bsd,df->bsf", x, w, jnp.bfloat16)
    assert y8.dtype == jnp.bfloat16 and float(jnp.abs(y8 - y).max()) < 0.1 * float(jnp.abs(y).max())
    for g8, g in zip(jax.grad(loss(fp8_linear), argnums=(0, 1))(x, w), jax.grad(loss(exact), argnums=(0, 1))(x, w)):
        rel = np.linalg.norm(np.asarray(g8 - g, np.float32)) / np.linalg.norm(np.asarray(g, np.float32))
        assert g8.dtype == jnp.bfloat16 and rel < 0.15  # e4m3 / e5m2 rounding, not a wrong formula


def test_the_compiled_gradient_holds_fp8_operands():
    x, w = jnp.ones((8, 64), jnp.bfloat16), jnp.ones((64, 32), jnp.bfloat16)
    hlo = jax.jit(jax.grad(lambda x, w: fp8_linear("bd,df->bf", x, w, jnp.bfloat16).astype(jnp.float32).sum(), argnums=(0, 1))
                  ).lower(x, w).as_text()
    assert "f8E4M3FN" in hlo and "f8E5M2" in hlo
