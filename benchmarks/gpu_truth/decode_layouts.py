"""``python -m benchmarks.gpu_truth.decode_layouts``: the decode step's layer loop and KV cache
layout, timed variant by variant on one device.

The H200 profile of 2026-11-28 put 57 % of a llama3-8b decode step (batch 1) in copy kernels
(``memcpy128``, ``wrapped_transpose``): 7 ms a token, about what copying the 16 GB of weights
once costs. This run asks which program shape removes them, timing one decode step of the same
model and sizes four ways:

- ``scan``: `planner.programs.decode.decode_step` on stacked layers (as a pipeline stage takes
  them): a ``lax.scan``, each iteration slicing its layer's weights and cache out of the stacks;
- ``unrolled``: the same stacked inputs, the layers a Python loop (static slices);
- ``per-layer``: each layer's weights and cache its own arrays, the cache ``[B, T, K, H]``, so the
  score and output products transpose it;
- ``served``: the reference program as it serves (`decode_step` on per-layer weights and caches
  ``[B, K, T, H]``).

The CSV in benchmarks/data/gpu was measured at commit 0a9a0b1, before the program took the
``served`` shape (its ``per-layer-bkth`` row is that shape); its ``scan`` and ``unrolled`` rows
then had the cache ``[L, B, T, K, H]``. Writes ``decode_layouts_<device>_<time>.csv`` (variant,
batch, context, measured seconds). The CPU check: ``--backend cpu --quick`` (toy sizes).
"""

from __future__ import annotations

import math
import time
from functools import partial
from typing import Any

VARIANTS = ("scan", "unrolled", "per-layer", "served")


def _attend_btkh(x_BxD: Any, p: Any, k_BxTxKxH: Any, v_BxTxKxH: Any, position: Any, cfg: Any, dt: Any) -> tuple[Any, Any, Any]:
    """One token's attention against one layer's own cache laid out ``[B, T, K, H]``."""
    import jax
    import jax.numpy as jnp

    from planner.programs.decode import _rope_at

    b, group = x_BxD.shape[0], cfg.num_heads // cfg.num_kv_heads
    q_BxNxH = _rope_at(jnp.einsum("bd,dnh->bnh", x_BxD, p["wq"].astype(dt)), position, cfg.rope_theta)
    k_BxKxH = _rope_at(jnp.einsum("bd,dkh->bkh", x_BxD, p["wk"].astype(dt)), position, cfg.rope_theta)
    v_BxKxH = jnp.einsum("bd,dkh->bkh", x_BxD, p["wv"].astype(dt))
    zero = jnp.zeros((), jnp.int32)
    k_BxTxKxH = jax.lax.dynamic_update_slice(k_BxTxKxH, k_BxKxH[:, None].astype(k_BxTxKxH.dtype), (zero, position, zero, zero))
    v_BxTxKxH = jax.lax.dynamic_update_slice(v_BxTxKxH, v_BxKxH[:, None].astype(v_BxTxKxH.dtype), (zero, position, zero, zero))
    q_BxKxGxH = q_BxNxH.reshape(b, cfg.num_kv_heads, group, cfg.head_dim)
    scores_BxKxGxT = jnp.einsum("bkgh,btkh->bkgt", q_BxKxGxH, k_BxTxKxH.astype(dt)).astype(jnp.float32) / math.sqrt(cfg.head_dim)
    visible_T = jnp.arange(scores_BxKxGxT.shape[-1]) <= position
    probs_BxKxGxT = jax.nn.softmax(jnp.where(visible_T, scores_BxKxGxT, -jnp.inf), axis=-1).astype(dt)
    out_BxNxH = jnp.einsum("bkgt,btkh->bkgh", probs_BxKxGxT, v_BxTxKxH.astype(dt)).reshape(b, cfg.num_heads, cfg.head_dim)
    return jnp.einsum("bnh,nhd->bd", out_BxNxH, p["wo"].astype(dt)), k_BxTxKxH, v_BxTxKxH


def _step(variant: str, cfg: Any, dt: Any) -> Any:
    """``(params, cache, batch) -> (logits, cache)`` of one variant."""
    import jax

    from planner.programs.decode import _mlp, decode_embed, decode_layer, decode_step, loop_served_layers
    from planner.programs.transformer import _norm, head

    if variant in ("scan", "served"):
        return partial(decode_step, cfg=cfg, compute_dtype=dt)

    def step(params: Any, cache: Any, batch: Any) -> tuple[Any, Any]:
        x_BxD, position = decode_embed(params, batch, cfg, compute_dtype=dt), batch["position"]
        if variant == "unrolled":
            k, v = cache["k"], cache["v"]
            for i in range(cfg.num_layers):
                p = jax.tree.map(lambda a, i=i: a[i], params["layers"])
                x_BxD, k, v = decode_layer(x_BxD, p, k, v, position, cfg, compute_dtype=dt, layer=i)
            new_cache = {"k": k, "v": v}
        else:
            def layer(x_BxD: Any, p: Any, k: Any, v: Any) -> tuple[Any, Any, Any]:
                y_BxD, k, v = _attend_btkh(_norm(x_BxD, p["attn_norm"], cfg), p["attn"], k, v, position, cfg, dt)
                x_BxD = x_BxD + y_BxD
                return x_BxD + _mlp(_norm(x_BxD, p["mlp_norm"], cfg), p["mlp"], cfg, dt), k, v

            x_BxD, new_cache = loop_served_layers(layer, x_BxD, params["layers"], cache)
        return head(x_BxD[:, None], params, cfg)[:, 0], new_cache

    return step


def as_variant(variant: str, params: Any, cache: Any, num_layers: int) -> tuple[Any, Any]:
    """The reference program's stacked ``(params, cache)`` as ``variant`` takes them."""
    import jax.numpy as jnp

    from planner.programs.decode import per_layer

    if variant in ("scan", "unrolled"):
        return params, cache
    layout = (lambda c: jnp.swapaxes(c, 1, 2)) if variant == "per-layer" else (lambda c: c)  # [B, K, T, H] -> [B, T, K, H]
    return per_layer(params), {name: [layout(c[i]) for i in range(num_layers)] for name, c in cache.items()}


def _inputs(variant: str, cfg: Any, train: Any) -> tuple[Any, Any, Any]:
    """Concrete inputs of a variant: the reference program's stacked ones, restacked where it asks."""
    import jax.numpy as jnp

    from benchmarks.gpu_truth.serving import _concrete
    from planner.programs.decode import abstract_decode_inputs

    params, cache, batch = _concrete(abstract_decode_inputs(cfg, train, stacked=True))
    batch["position"] = jnp.asarray(train.seq_len - 1, jnp.int32)
    return (*as_variant(variant, params, cache, cfg.num_layers), batch)


def measure(variant: str, cfg: Any, train: Any) -> float:
    """Median seconds of one decode step of ``variant``, chained on the cache it writes."""
    import jax
    import jax.numpy as jnp

    from benchmarks.gpu_truth.timing import median_chained_s

    step = jax.jit(_step(variant, cfg, jnp.dtype(train.compute_dtype.value)), donate_argnums=(1,))
    params, cache, batch = _inputs(variant, cfg, train)
    return median_chained_s(lambda c: step(params, c, batch)[1], cache)


def main(argv: list[str] | None = None) -> None:
    from benchmarks.gpu_truth.report import write_variant_csv
    from benchmarks.gpu_truth.sizes import sizes_for
    from benchmarks.gpu_truth.target import detect_target, variant_run_parser
    from costmodel.inputs.train_config import TrainConfig

    args = variant_run_parser(__doc__.splitlines()[0]).parse_args(argv)
    target = detect_target(args.backend, quick=args.quick)
    sizes = sizes_for(quick=args.quick)
    cases = [sizes.decode_cases[0], sizes.decode_cases[-1]] if args.quick else [(1, 2048), (32, 8192), (64, 2048)]
    rows, start = [], time.perf_counter()
    for batch, context in cases:
        train = TrainConfig(workload="decode", global_batch=batch, seq_len=context).with_precision(target.precision)
        for variant in VARIANTS:
            if time.perf_counter() - start > args.time_budget_s:
                print(f"skipped {variant} b{batch} ctx{context}: the time budget ran out", flush=True)
                continue
            seconds = measure(variant, sizes.decode_model, train)
            rows.append({"variant": variant, "batch": batch, "context": context, "measured_s": seconds, "device": target.device})
            print(f"{variant:>15} b{batch:<3} ctx{context:<5} {seconds * 1e3:8.3f} ms", flush=True)
    path = write_variant_csv("decode_layouts", rows, target.device, args.out_dir)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
