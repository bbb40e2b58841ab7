"""Tests `benchmarks/gpu_truth/accumulate.py`: both variants sum the same gradients, and the CPU run writes its CSV."""

import csv

import jax
import jax.numpy as jnp
import numpy as np

from benchmarks.gpu_truth.accumulate import VARIANTS, _inputs, loop, main
from benchmarks.gpu_truth.sizes import sizes_for
from costmodel.inputs.train_config import TrainConfig


def test_both_variants_sum_the_same_gradients():
    cfg = sizes_for(quick=True).step_models[0]
    train = TrainConfig(seq_len=32, global_batch=4)
    params, batch, sums = _inputs(cfg, train)
    params = jax.tree.map(lambda p: 0.1 * jax.random.normal(jax.random.key(p.size), p.shape, jnp.float32), params)
    batch = {k: jax.random.randint(jax.random.key(i), v.shape, 0, cfg.vocab_size) for i, (k, v) in enumerate(batch.items())}
    summed = {variant: jax.jit(loop(variant, cfg, train, 2))(params, batch, sums) for variant in VARIANTS}
    for got, want in zip(jax.tree.leaves(summed["layer-by-layer"]), jax.tree.leaves(summed["autodiff"])):
        np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-5, atol=1e-6)
    assert any(float(jnp.abs(s).max()) > 0 for s in jax.tree.leaves(summed["autodiff"]))


def test_the_cpu_run_writes_a_row_per_variant_and_model(tmp_path):
    main(["--backend", "cpu", "--quick", "--out-dir", str(tmp_path)])
    (path,) = tmp_path.glob("accumulate_*.csv")
    rows = list(csv.DictReader(path.open()))
    assert [r["variant"] for r in rows] == list(VARIANTS) * len(sizes_for(quick=True).step_models)
    assert all(float(r["measured_s"]) > 0 and float(r["temp_bytes"]) > 0 for r in rows)
