"""``python -m benchmarks.gpu_truth.accumulate``: gradients summed over micro-batches two ways,
timed and weighed on one device.

The JAX program's ZeRO 0–1 step adds each layer's gradient into the fp32 sum inside the backward
(`planner.programs.accumulate`), where autodiff's layer scan stacks every layer's compute-dtype
gradient beside the sum first. On the CPU backend the saving is blurred by the fp32 copy XLA:CPU
makes of the weights (`validate.predict`); this run weighs it on the device that matters. Per
variant, a loop over the micro-batches (loss and summed gradients of a bf16 weight copy into an
fp32 sum, chained on the sum):

- ``autodiff``: `planner.programs.train_step.make_value_and_grad` per micro-batch, its gradients
  added after the backward;
- ``layer-by-layer``: `planner.programs.accumulate.make_accumulating_value_and_grad`.

Writes ``accumulate_<device>_<time>.csv``: variant, model, micro-batches, measured seconds, the
compiled temporary bytes, and the layers' compute-dtype gradient bytes the second should save. The
CPU check: ``--backend cpu --quick`` (toy sizes).
"""

from __future__ import annotations

import time
from typing import Any, Callable

VARIANTS = ("autodiff", "layer-by-layer")


def loop(variant: str, cfg: Any, train: Any, micro_batches: int) -> Callable[..., Any]:
    """``(params, batch, sums) -> sums``: ``micro_batches`` micro-batches' gradients added into ``sums``."""
    import jax

    from planner.programs.accumulate import make_accumulating_value_and_grad
    from planner.programs.train_step import make_value_and_grad, micro_batched

    if variant == "autodiff":
        grads_of = make_value_and_grad(cfg, train)

        def add(params: Any, sums: Any, mb: Any) -> Any:
            return jax.tree.map(lambda s, g: s + g.astype(s.dtype), sums, grads_of(params, mb, None)[1])
    else:
        accumulating = make_accumulating_value_and_grad(cfg, train)

        def add(params: Any, sums: Any, mb: Any) -> Any:
            return accumulating(params, mb, sums)[1]

    def run(params: Any, batch: Any, sums: Any) -> Any:
        return jax.lax.scan(lambda s, mb: (add(params, s, mb), None), sums, micro_batched(batch, micro_batches))[0]

    return run


def _inputs(cfg: Any, train: Any) -> tuple[Any, Any, Any]:
    """A bf16 weight copy, token 0 everywhere, and an fp32 sum of zeros."""
    import jax
    import jax.numpy as jnp

    from benchmarks.gpu_truth.serving import _concrete
    from planner.programs.params import abstract_params

    params = _concrete(abstract_params(cfg, dtype=jnp.dtype(train.compute_dtype.value)))
    batch = {k: jnp.zeros((train.global_batch, train.seq_len), jnp.int32) for k in ("tokens", "targets")}
    return params, batch, jax.tree.map(lambda p: jnp.zeros(p.shape, jnp.float32), params)


def measure(variant: str, cfg: Any, train: Any, micro_batches: int) -> tuple[float, float]:
    """(median seconds of one loop, compiled temporary bytes) of ``variant``."""
    import jax

    from benchmarks.gpu_truth.timing import median_chained_s

    step = jax.jit(loop(variant, cfg, train, micro_batches), donate_argnums=(2,))
    params, batch, sums = _inputs(cfg, train)
    temp = step.lower(params, batch, sums).compile().memory_analysis().temp_size_in_bytes
    return median_chained_s(lambda s: step(params, batch, s), sums), float(temp)


def main(argv: list[str] | None = None) -> None:
    from benchmarks.gpu_truth.report import write_variant_csv
    from benchmarks.gpu_truth.sizes import sizes_for
    from benchmarks.gpu_truth.target import detect_target, variant_run_parser
    from costmodel.inputs.layout import Layout
    from costmodel.inputs.train_config import TrainConfig
    from costmodel.step.data_parallel import layer_params_per_device

    args = variant_run_parser(__doc__.splitlines()[0]).parse_args(argv)
    target = detect_target(args.backend, quick=args.quick)
    sizes = sizes_for(quick=args.quick)
    micro_batches = 4
    rows, start = [], time.perf_counter()
    for cfg in sizes.step_models:
        train = TrainConfig(seq_len=sizes.step_seq_len, global_batch=micro_batches).with_precision(target.precision)
        saved = cfg.num_layers * layer_params_per_device(cfg, Layout()) * train.compute_dtype.bytes
        for variant in VARIANTS:
            if time.perf_counter() - start > args.time_budget_s:
                print(f"skipped {variant} {cfg.name}: the time budget ran out", flush=True)
                continue
            seconds, temp = measure(variant, cfg, train, micro_batches)
            rows.append({"variant": variant, "model": cfg.name, "micro_batches": micro_batches, "measured_s": seconds,
                         "temp_bytes": temp, "layers_gradient_bytes": saved, "device": target.device})
            print(f"{variant:>15} {cfg.name:<14} {seconds * 1e3:9.3f} ms  temp {temp / 2**30:7.3f} GiB", flush=True)
    path = write_variant_csv("accumulate", rows, target.device, args.out_dir)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
