"""``python -m benchmarks.gpu_truth.decode_layouts``: the decode step's layer loop and KV cache
layout, timed variant by variant on one device.

The H200 profile of 2026-11-28 put 57 % of a llama3-8b decode step (batch 1) in copy kernels
(``memcpy128``, ``wrapped_transpose``): 7 ms a token, about what copying the 16 GB of weights
once costs. This run asks which program shape removes them, timing one decode step of the same
model and sizes four ways:

- ``scan``: the reference program (`planner.programs.decode.decode_step`): a ``lax.scan`` over the
  stacked layers, each iteration slicing its layer's weights and cache out of the stacks;
- ``unrolled``: the same stacked inputs, the layers a Python loop (static slices);
- ``per-layer``: each layer's weights and cache its own arrays, cache ``[B, T, K, H]``;
- ``per-layer-bkth``: as ``per-layer`` with the cache ``[B, K, T, H]``, so the score and output
  products take it without a transpose.

Writes ``decode_layouts_<device>_<time>.csv`` (variant, batch, context, measured seconds). The
CPU check: ``--backend cpu --quick`` (toy sizes).
"""

from __future__ import annotations

import argparse
import csv
import math
import time
from datetime import datetime
from functools import partial
from pathlib import Path
from typing import Any

VARIANTS = ("scan", "unrolled", "per-layer", "per-layer-bkth")


def _attend_own_cache(x_BxD: Any, p: Any, k_cache: Any, v_cache: Any, position: Any, cfg: Any, dt: Any, bkth: bool) -> tuple[Any, Any, Any]:
    """One token's attention against one layer's own cache, ``[B, T, K, H]`` or (``bkth``) ``[B, K, T, H]``."""
    import jax
    import jax.numpy as jnp

    from planner.programs.decode import _rope_at

    b, group = x_BxD.shape[0], cfg.num_heads // cfg.num_kv_heads
    q_BxNxH = _rope_at(jnp.einsum("bd,dnh->bnh", x_BxD, p["wq"].astype(dt)), position, cfg.rope_theta)
    k_BxKxH = _rope_at(jnp.einsum("bd,dkh->bkh", x_BxD, p["wk"].astype(dt)), position, cfg.rope_theta)
    v_BxKxH = jnp.einsum("bd,dkh->bkh", x_BxD, p["wv"].astype(dt))
    zero = jnp.zeros((), jnp.int32)
    at, row, seq = ((zero, zero, position, zero), (slice(None), slice(None), None), "bkth") if bkth else \
        ((zero, position, zero, zero), (slice(None), None), "btkh")
    k_cache = jax.lax.dynamic_update_slice(k_cache, k_BxKxH[row].astype(k_cache.dtype), at)
    v_cache = jax.lax.dynamic_update_slice(v_cache, v_BxKxH[row].astype(v_cache.dtype), at)
    q_BxKxGxH = q_BxNxH.reshape(b, cfg.num_kv_heads, group, cfg.head_dim)
    scores_BxKxGxT = jnp.einsum(f"bkgh,{seq}->bkgt", q_BxKxGxH, k_cache.astype(dt)).astype(jnp.float32) / math.sqrt(cfg.head_dim)
    visible_T = jnp.arange(scores_BxKxGxT.shape[-1]) <= position
    probs_BxKxGxT = jax.nn.softmax(jnp.where(visible_T, scores_BxKxGxT, -jnp.inf), axis=-1).astype(dt)
    out_BxNxH = jnp.einsum(f"bkgt,{seq}->bkgh", probs_BxKxGxT, v_cache.astype(dt)).reshape(b, cfg.num_heads, cfg.head_dim)
    return jnp.einsum("bnh,nhd->bd", out_BxNxH, p["wo"].astype(dt)), k_cache, v_cache


def _step(variant: str, cfg: Any, dt: Any) -> Any:
    """``(params, cache, batch) -> (logits, cache)`` of one variant."""
    import jax

    from planner.programs.decode import _attend, _mlp, decode_embed, decode_step
    from planner.programs.transformer import _norm, head

    if variant == "scan":
        return partial(decode_step, cfg=cfg, compute_dtype=dt)

    def step(params: Any, cache: Any, batch: Any) -> tuple[Any, Any]:
        x_BxD, position = decode_embed(params, batch, cfg, compute_dtype=dt), batch["position"]
        if variant == "unrolled":
            k, v = cache["k"], cache["v"]
            for i in range(cfg.num_layers):
                p = jax.tree.map(lambda a, i=i: a[i], params["layers"])
                y_BxD, k, v = _attend(_norm(x_BxD, p["attn_norm"], cfg), p["attn"], k, v, i, position, cfg, dt, lambda _n, a: a)
                x_BxD = x_BxD + y_BxD
                x_BxD = x_BxD + _mlp(_norm(x_BxD, p["mlp_norm"], cfg), p["mlp"], cfg, dt)
            new_cache = {"k": k, "v": v}
        else:
            new_cache = {"k": [], "v": []}
            for p, k, v in zip(params["layers"], cache["k"], cache["v"]):
                y_BxD, k, v = _attend_own_cache(_norm(x_BxD, p["attn_norm"], cfg), p["attn"], k, v, position, cfg, dt,
                                                variant == "per-layer-bkth")
                x_BxD = x_BxD + y_BxD
                x_BxD = x_BxD + _mlp(_norm(x_BxD, p["mlp_norm"], cfg), p["mlp"], cfg, dt)
                new_cache["k"].append(k)
                new_cache["v"].append(v)
        return head(x_BxD[:, None], params, cfg)[:, 0], new_cache

    return step


def _inputs(variant: str, cfg: Any, train: Any) -> tuple[Any, Any, Any]:
    """Concrete inputs of a variant: the reference program's, restacked per layer where it asks."""
    import jax
    import jax.numpy as jnp

    from benchmarks.gpu_truth.serving import _concrete
    from planner.programs.decode import abstract_decode_inputs

    params, cache, batch = _concrete(abstract_decode_inputs(cfg, train))
    batch["position"] = jnp.asarray(train.seq_len - 1, jnp.int32)
    if variant.startswith("per-layer"):
        params = {**params, "layers": [jax.tree.map(lambda a, i=i: a[i], params["layers"]) for i in range(cfg.num_layers)]}
        per_layer = (lambda c: jnp.swapaxes(c, 1, 2)) if variant == "per-layer-bkth" else (lambda c: c)
        cache = {name: [per_layer(c[i]) for i in range(cfg.num_layers)] for name, c in cache.items()}
    return params, cache, batch


def measure(variant: str, cfg: Any, train: Any) -> float:
    """Median seconds of one decode step of ``variant``, chained on the cache it writes."""
    import jax
    import jax.numpy as jnp

    from benchmarks.gpu_truth.timing import median_chained_s

    step = jax.jit(_step(variant, cfg, jnp.dtype(train.compute_dtype.value)), donate_argnums=(1,))
    params, cache, batch = _inputs(variant, cfg, train)
    return median_chained_s(lambda c: step(params, c, batch)[1], cache)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", choices=("gpu", "cpu"), default="gpu")
    parser.add_argument("--quick", action="store_true", help="toy sizes (the CPU check)")
    parser.add_argument("--out-dir", type=Path, default=Path("benchmarks/data/gpu"))
    parser.add_argument("--time-budget-s", type=float, default=150.0)
    args = parser.parse_args(argv)

    from benchmarks.gpu_truth.sizes import sizes_for
    from benchmarks.gpu_truth.target import detect_target
    from costmodel.inputs.train_config import TrainConfig

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
    args.out_dir.mkdir(parents=True, exist_ok=True)
    device = target.device.lower().replace(" ", "-")
    path = args.out_dir / f"decode_layouts_{device}_{datetime.now():%Y-%m-%dT%H%M}.csv"
    with path.open("w", newline="") as out:
        writer = csv.DictWriter(out, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
