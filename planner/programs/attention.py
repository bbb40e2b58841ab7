"""Causal attention without the score matrix: cuDNN's fused kernel on a GPU, else the
FlashAttention algorithm in plain JAX.

The sequence is cut into blocks; the loop visits only the (query block, key block) pairs on
or below the diagonal, so fully masked blocks cost nothing, and keeps a running maximum and
sum per query row (the log-sum-exp), so no ``S×S`` tensor exists. The backward
(FlashAttention-2) keeps only what the kernel keeps — q, k, v, the output and the
log-sum-exp — and recomputes each block's scores. Grouped-query attention reads each KV head
once for its ``G`` query heads, without copies. Every loop is a ``lax.scan`` over a static
list of block pairs, so the compiled module's loops have known trip counts (the validator
multiplies the FLOPs and collectives of a loop body by them).

Per block pair, FLOPs are ``2·B·K·G·bq·bk·H`` for each matmul: two in the forward (scores,
probabilities × values) and five in the backward (the scores again, dV, dP, dQ, dK).

>>> import jax, jax.numpy as jnp
>>> q = jax.random.normal(jax.random.key(0), (1, 10, 2, 3, 4))
>>> k, v = jax.random.normal(jax.random.key(1), (2, 1, 10, 2, 4))
>>> out = flash_attention(q, k, v, 4)
>>> bool(jnp.allclose(out, reference_attention(q, k, v), atol=1e-5))
True
"""

from __future__ import annotations

import math
from functools import partial

import jax
import jax.numpy as jnp
import numpy as np
from jax.ad_checkpoint import checkpoint_name

# Query and key rows per block: large enough that each block's matmuls are efficient, small
# enough that a block pair's fp32 scores (B·N·512² elements) stay a small temporary.
DEFAULT_BLOCK = 512
_MASKED = -1e30


def block_size(seq_len: int) -> int:
    """The block the kernel uses for ``seq_len`` tokens: `DEFAULT_BLOCK`, or the whole sequence when shorter."""
    return min(seq_len, DEFAULT_BLOCK)


def block_pairs(seq_len: int, block: int) -> tuple[np.ndarray, np.ndarray]:
    """(query block, key block) indices of the causal lower triangle, query-major.

    >>> block_pairs(10, 4)
    (array([0, 1, 1, 2, 2, 2]), array([0, 0, 1, 0, 1, 2]))
    """
    n = math.ceil(seq_len / block)
    q_P, k_P = np.tril_indices(n)
    return q_P, k_P


def reference_attention(q_BxSxKxGxH: jax.Array, k_BxSxKxH: jax.Array, v_BxSxKxH: jax.Array) -> jax.Array:
    """Causal attention with the whole score matrix, in fp32: what `flash_attention` must equal."""
    s = q_BxSxKxGxH.shape[1]
    scores_BxKxGxSxS = jnp.einsum("bskgh,btkh->bkgst", q_BxSxKxGxH, k_BxSxKxH).astype(jnp.float32) / math.sqrt(q_BxSxKxGxH.shape[-1])
    scores_BxKxGxSxS = jnp.where(jnp.tril(jnp.ones((s, s), bool)), scores_BxKxGxSxS, _MASKED)
    probs_BxKxGxSxS = jax.nn.softmax(scores_BxKxGxSxS, axis=-1).astype(v_BxSxKxH.dtype)
    return jnp.einsum("bkgst,btkh->bskgh", probs_BxKxGxSxS, v_BxSxKxH)


def _pad(x: jax.Array, seq_pad: int) -> jax.Array:
    """Zero rows appended to the sequence axis (1). Padded keys sit after every real query,
    so the causal mask hides them; padded queries are dropped."""
    return jnp.pad(x, [(0, 0), (0, seq_pad)] + [(0, 0)] * (x.ndim - 2)) if seq_pad else x


def _block(x: jax.Array, index: jax.Array, block: int) -> jax.Array:
    return jax.lax.dynamic_slice_in_dim(x, index * block, block, axis=1)


def _scores(q_BxQxKxGxH: jax.Array, k_BxTxKxH: jax.Array, diagonal: jax.Array) -> jax.Array:
    """Scaled fp32 scores ``[B, K, G, Q, T]`` of one block pair, masked above the diagonal."""
    scale = 1 / math.sqrt(q_BxQxKxGxH.shape[-1])
    s_BxKxGxQxT = jnp.einsum("bqkgh,btkh->bkgqt", q_BxQxKxGxH, k_BxTxKxH, preferred_element_type=jnp.float32) * scale
    n = s_BxKxGxQxT.shape[-1]
    keep_QxT = jnp.tril(jnp.ones((n, n), bool)) | ~diagonal
    return jnp.where(keep_QxT, s_BxKxGxQxT, _MASKED)


def varying_like(refs: tuple[jax.Array, ...], carry: tuple[jax.Array, ...]) -> tuple[jax.Array, ...]:
    """``carry`` made varying over the manual mesh axes any of ``refs`` varies over (inside
    ``shard_map``, e.g. a pipeline stage), as ``scan`` needs its carry typed like what it accumulates."""
    axes = tuple(sorted(set().union(*(jax.typeof(r).manual_axis_type.varying for r in refs))))
    return tuple(jax.lax.pcast(c, axes, to="varying") for c in carry) if axes else carry


def _forward(q: jax.Array, k: jax.Array, v: jax.Array, block: int) -> tuple[jax.Array, jax.Array]:
    """Output ``[B, S, K, G, H]`` (q's dtype) and fp32 log-sum-exp ``[B, K, G, S]``, padded sequences."""
    b, s, kh, g, h = q.shape
    q_P, k_P = block_pairs(s, block)

    def step(carry: tuple[jax.Array, ...], pair: tuple[jax.Array, jax.Array]) -> tuple[tuple[jax.Array, ...], None]:
        o_BxSxKxGxH, m_BxKxGxS, l_BxKxGxS = carry
        qi, ki = pair
        s_BxKxGxQxT = _scores(_block(q, qi, block), _block(k, ki, block), qi == ki)
        m_old = jax.lax.dynamic_slice_in_dim(m_BxKxGxS, qi * block, block, axis=3)
        l_old = jax.lax.dynamic_slice_in_dim(l_BxKxGxS, qi * block, block, axis=3)
        m_new = jnp.maximum(m_old, s_BxKxGxQxT.max(-1))
        p_BxKxGxQxT = jnp.exp(s_BxKxGxQxT - m_new[..., None])
        rescale_BxKxGxQ = jnp.exp(m_old - m_new)
        l_new = l_old * rescale_BxKxGxQ + p_BxKxGxQxT.sum(-1)
        pv_BxQxKxGxH = jnp.einsum("bkgqt,btkh->bqkgh", p_BxKxGxQxT.astype(v.dtype), _block(v, ki, block),
                                  preferred_element_type=jnp.float32)
        o_old = _block(o_BxSxKxGxH, qi, block)
        o_new = o_old * jnp.moveaxis(rescale_BxKxGxQ, 3, 1)[..., None] + pv_BxQxKxGxH
        return (jax.lax.dynamic_update_slice_in_dim(o_BxSxKxGxH, o_new, qi * block, axis=1),
                jax.lax.dynamic_update_slice_in_dim(m_BxKxGxS, m_new, qi * block, axis=3),
                jax.lax.dynamic_update_slice_in_dim(l_BxKxGxS, l_new, qi * block, axis=3)), None

    init = varying_like((q, k, v), (jnp.zeros(q.shape, jnp.float32), jnp.full((b, kh, g, s), _MASKED, jnp.float32),
                                    jnp.zeros((b, kh, g, s), jnp.float32)))
    (o, m, row_sum_BxKxGxS), _ = jax.lax.scan(step, init, (jnp.asarray(q_P), jnp.asarray(k_P)))
    row_sum_BxSxKxG = jnp.moveaxis(row_sum_BxKxGxS, 3, 1)
    return (o / row_sum_BxSxKxG[..., None]).astype(q.dtype), m + jnp.log(row_sum_BxKxGxS)


def _backward(q: jax.Array, k: jax.Array, v: jax.Array, o: jax.Array, lse_BxKxGxS: jax.Array, do: jax.Array,
              block: int) -> tuple[jax.Array, jax.Array, jax.Array]:
    """Gradients of q, k, v (their dtypes) by FlashAttention-2's recomputation, padded sequences."""
    s = q.shape[1]
    scale = 1 / math.sqrt(q.shape[-1])
    q_P, k_P = block_pairs(s, block)
    # D_i = rowsum(dO_i ∘ O_i): the softmax backward's correction per query row.
    delta_BxKxGxS = jnp.einsum("bskgh,bskgh->bkgs", do.astype(jnp.float32), o.astype(jnp.float32))

    def step(carry: tuple[jax.Array, ...], pair: tuple[jax.Array, jax.Array]) -> tuple[tuple[jax.Array, ...], None]:
        dq, dk, dv = carry
        qi, ki = pair
        q_i, k_j, v_j, do_i = _block(q, qi, block), _block(k, ki, block), _block(v, ki, block), _block(do, qi, block)
        lse_i = jax.lax.dynamic_slice_in_dim(lse_BxKxGxS, qi * block, block, axis=3)
        delta_i = jax.lax.dynamic_slice_in_dim(delta_BxKxGxS, qi * block, block, axis=3)
        p_BxKxGxQxT = jnp.exp(_scores(q_i, k_j, qi == ki) - lse_i[..., None])
        dv_j = jnp.einsum("bkgqt,bqkgh->btkh", p_BxKxGxQxT.astype(do.dtype), do_i, preferred_element_type=jnp.float32)
        dp_BxKxGxQxT = jnp.einsum("bqkgh,btkh->bkgqt", do_i, v_j, preferred_element_type=jnp.float32)
        ds_BxKxGxQxT = (p_BxKxGxQxT * (dp_BxKxGxQxT - delta_i[..., None]) * scale).astype(q.dtype)
        dq_i = jnp.einsum("bkgqt,btkh->bqkgh", ds_BxKxGxQxT, k_j, preferred_element_type=jnp.float32)
        dk_j = jnp.einsum("bkgqt,bqkgh->btkh", ds_BxKxGxQxT, q_i, preferred_element_type=jnp.float32)
        add = lambda acc, x, i: jax.lax.dynamic_update_slice_in_dim(acc, _block(acc, i, block) + x, i * block, axis=1)  # noqa: E731
        return (add(dq, dq_i, qi), add(dk, dk_j, ki), add(dv, dv_j, ki)), None

    init = varying_like((q, k, v, do), tuple(jnp.zeros(x.shape, jnp.float32) for x in (q, k, v)))
    (dq, dk, dv), _ = jax.lax.scan(step, init, (jnp.asarray(q_P), jnp.asarray(k_P)))
    return dq.astype(q.dtype), dk.astype(k.dtype), dv.astype(v.dtype)


@partial(jax.custom_vjp, nondiff_argnums=(3,))
def _padded_flash(q: jax.Array, k: jax.Array, v: jax.Array, block: int) -> jax.Array:
    return _forward(q, k, v, block)[0]


def _padded_flash_fwd(q: jax.Array, k: jax.Array, v: jax.Array, block: int) -> tuple[jax.Array, tuple[jax.Array, ...]]:
    o, lse = _forward(q, k, v, block)
    o, lse = checkpoint_name(o, "attn_out_proj_input"), checkpoint_name(lse, "softmax_logsumexp")
    return o, (checkpoint_name(q, "q"), checkpoint_name(k, "k"), checkpoint_name(v, "v"), o, lse)


def _padded_flash_bwd(block: int, residuals: tuple[jax.Array, ...], do: jax.Array) -> tuple[jax.Array, jax.Array, jax.Array]:
    return _backward(*residuals, do, block)


_padded_flash.defvjp(_padded_flash_fwd, _padded_flash_bwd)


def fused_kernel_usable(q_BxSxKxGxH: jax.Array, backend: str | None = None) -> bool:
    """Whether cuDNN's fused kernel runs this attention: on a GPU, 16-bit inputs, head size a
    multiple of 8 up to 128 (cuDNN's flash-attention limits).

    >>> fused_kernel_usable(jnp.zeros((1, 8, 2, 2, 64), jnp.bfloat16), backend="gpu")
    True
    >>> fused_kernel_usable(jnp.zeros((1, 8, 2, 2, 64), jnp.float32), backend="gpu")
    False
    """
    head = q_BxSxKxGxH.shape[-1]
    return ((backend or jax.default_backend()) == "gpu" and q_BxSxKxGxH.dtype in (jnp.bfloat16, jnp.float16)
            and head % 8 == 0 and head <= 128)


def _library_attention(q_BxSxNxH: jax.Array, k_BxSxKxH: jax.Array, v_BxSxKxH: jax.Array, implementation: str | None) -> jax.Array:
    return jax.nn.dot_product_attention(q_BxSxNxH, k_BxSxKxH, v_BxSxKxH, is_causal=True, implementation=implementation)


@partial(jax.custom_vjp, nondiff_argnums=(3,))
def _fused(q_BxSxNxH: jax.Array, k_BxSxKxH: jax.Array, v_BxSxKxH: jax.Array, implementation: str | None) -> jax.Array:
    return _library_attention(q_BxSxNxH, k_BxSxKxH, v_BxSxKxH, implementation)


def _fused_fwd(q: jax.Array, k: jax.Array, v: jax.Array, implementation: str | None) -> tuple[jax.Array, object]:
    # The library kernel's own residuals carry no names, so a remat policy that saves by name
    # would run its forward again in the backward. Name them as the blockwise kernel's: the fp32
    # softmax statistics (log-sum-exp), the output; the inputs themselves are saved as q, k, v.
    o, pullback = jax.vjp(partial(_library_attention, implementation=implementation), q, k, v)
    leaves, tree = jax.tree.flatten(pullback)
    named = [leaf if any(leaf is x for x in (q, k, v)) else
             checkpoint_name(leaf, "softmax_logsumexp" if leaf.dtype == jnp.float32 else "attn_out_proj_input") for leaf in leaves]
    return checkpoint_name(o, "attn_out_proj_input"), jax.tree.unflatten(tree, named)


def _fused_bwd(implementation: str | None, pullback: object, do: jax.Array) -> tuple[jax.Array, jax.Array, jax.Array]:
    return pullback(do)


_fused.defvjp(_fused_fwd, _fused_bwd)


def fused_attention(q_BxSxKxGxH: jax.Array, k_BxSxKxH: jax.Array, v_BxSxKxH: jax.Array, implementation: str | None = "cudnn") -> jax.Array:
    """Causal grouped-query attention ``[B, S, K, G, H]`` by ``jax.nn.dot_product_attention``
    (cuDNN's fused flash kernel by default), its residuals named as `flash_attention`'s.

    >>> q = jax.random.normal(jax.random.key(0), (1, 10, 2, 3, 8))
    >>> k, v = jax.random.normal(jax.random.key(1), (2, 1, 10, 2, 8))
    >>> out = fused_attention(q, k, v, implementation="xla")
    >>> bool(jnp.allclose(out, reference_attention(q, k, v), atol=1e-5))
    True
    """
    b, s, kh, g, h = q_BxSxKxGxH.shape
    out_BxSxNxH = _fused(q_BxSxKxGxH.reshape(b, s, kh * g, h), k_BxSxKxH, v_BxSxKxH, implementation)
    return out_BxSxNxH.reshape(b, s, kh, g, h)


def flash_attention(q_BxSxKxGxH: jax.Array, k_BxSxKxH: jax.Array, v_BxSxKxH: jax.Array, block: int | None = None) -> jax.Array:
    """Causal grouped-query attention ``[B, S, K, G, H]`` (q's dtype) without the score matrix:
    cuDNN's fused kernel where `fused_kernel_usable` (a GPU), else the blockwise kernel in blocks
    of ``block`` rows (default `block_size`); a sequence the block does not divide is padded."""
    if block is None and fused_kernel_usable(q_BxSxKxGxH):
        return fused_attention(q_BxSxKxGxH, k_BxSxKxH, v_BxSxKxH)
    s = q_BxSxKxGxH.shape[1]
    block = block or block_size(s)
    pad = -s % block
    out = _padded_flash(_pad(q_BxSxKxGxH, pad), _pad(k_BxSxKxH, pad), _pad(v_BxSxKxH, pad), block)
    return out[:, :s]
