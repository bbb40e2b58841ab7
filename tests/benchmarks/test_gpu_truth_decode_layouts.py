"""Tests `benchmarks/gpu_truth/decode_layouts.py`: every variant computes the same decode step, and the CPU run writes its CSV."""

import csv

import jax
import jax.numpy as jnp
import numpy as np

from benchmarks.gpu_truth.decode_layouts import VARIANTS, _inputs, _step, as_variant, main
from benchmarks.gpu_truth.sizes import sizes_for
from costmodel.inputs.train_config import TrainConfig


def test_every_variant_gives_the_same_logits_and_cache():
    """Random stacked weights and cache, cut as each variant takes them; fp32 throughout."""
    cfg = sizes_for(quick=True).decode_model
    train = TrainConfig(workload="decode", global_batch=2, seq_len=40)
    params, cache, batch = _inputs("scan", cfg, train)
    leaves, tree = jax.tree.flatten((params, cache))
    params, cache = jax.tree.unflatten(tree, [0.2 * jax.random.normal(jax.random.key(i), x.shape, jnp.float32)
                                              for i, x in enumerate(leaves)])
    batch["position"] = jnp.int32(17)
    outputs = {}
    for variant in VARIANTS:
        logits, written = jax.jit(_step(variant, cfg, jnp.float32))(*as_variant(variant, params, cache, cfg.num_layers), batch)
        stacked = np.stack(written["k"]) if isinstance(written["k"], list) else np.asarray(written["k"])
        outputs[variant] = (np.asarray(logits), stacked if variant != "per-layer" else np.swapaxes(stacked, 2, 3))
    for variant in VARIANTS[1:]:
        np.testing.assert_allclose(outputs[variant][0], outputs["scan"][0], rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(outputs[variant][1], outputs["scan"][1], rtol=1e-6, atol=1e-6)
    assert not np.allclose(outputs["scan"][1], np.asarray(cache["k"]))  # the step wrote its token's keys


def test_the_cpu_run_times_each_variant_and_writes_a_row_for_it(tmp_path):
    main(["--backend", "cpu", "--quick", "--out-dir", str(tmp_path)])
    (path,) = tmp_path.glob("decode_layouts_*.csv")
    rows = list(csv.DictReader(path.open()))
    assert [r["variant"] for r in rows] == list(VARIANTS) * 2
    assert all(float(r["measured_s"]) > 0 for r in rows)
