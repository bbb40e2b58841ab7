"""The ILP on real JAX programs: Megatron tensor parallelism when memory is tight, data
parallelism when it is ample, and shardings that jax.jit compiles and runs."""

import json
import math
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import jax
import jax.numpy as jnp
import pytest
from jax.sharding import PartitionSpec as P

from costmodel.errors import InfeasibleError, InvalidConfigError
from costmodel.hardware.registry import load_hardware
from planner.intraop.shard import shard

D, F, N, H = 1024, 4096, 16, 64


def _gpt_layer_loss(params, x_BxSxD):
    """One GPT layer (attention by heads, GELU MLP) and a scalar loss."""
    q = jnp.einsum("bsd,dnh->bsnh", x_BxSxD, params["wq"])
    k = jnp.einsum("bsd,dnh->bsnh", x_BxSxD, params["wk"])
    v = jnp.einsum("bsd,dnh->bsnh", x_BxSxD, params["wv"])
    probs = jax.nn.softmax(jnp.einsum("bsnh,btnh->bnst", q, k) / math.sqrt(H), axis=-1)
    attn = jnp.einsum("bnst,btnh->bsnh", probs, v)
    x_BxSxD = x_BxSxD + jnp.einsum("bsnh,nhd->bsd", attn, params["wo"])
    hidden_BxSxF = jax.nn.gelu(jnp.einsum("bsd,df->bsf", x_BxSxD, params["w_in"]))
    y_BxSxD = x_BxSxD + jnp.einsum("bsf,fd->bsd", hidden_BxSxF, params["w_out"])
    return jnp.mean(y_BxSxD.astype(jnp.float32) ** 2)


def _abstract(batch, seq):
    shapes = {"wq": (D, N, H), "wk": (D, N, H), "wv": (D, N, H), "wo": (N, H, D), "w_in": (D, F), "w_out": (F, D)}
    params = {k: jax.ShapeDtypeStruct(s, jnp.bfloat16) for k, s in shapes.items()}
    return params, jax.ShapeDtypeStruct((batch, seq, D), jnp.bfloat16)


def _grad_step(params, x):
    return jax.grad(_gpt_layer_loss)(params, x)


def test_memory_tight_gpt_layer_recovers_megatron_tensor_parallelism():
    params, x = _abstract(batch=1, seq=512)
    weight_bytes = sum(math.prod(p.shape) * 2 for p in params.values())
    # Weights, their gradients (the outputs) and the temporaries must fit in 1.1 replicated copies: split them.
    result = shard(_grad_step, params, x, mesh="tensor=4", hardware="a100-80gb", memory_budget_bytes=1.1 * weight_bytes,
                   baselines=False)
    specs = result.in_specs[0]
    assert result.solution.status == "OPTIMAL"
    assert specs["w_in"] == P(None, "tensor")  # column-parallel first MLP matmul
    assert specs["w_out"] == P("tensor", None)  # row-parallel second
    for name in ("wq", "wk", "wv"):
        assert specs[name] == P(None, "tensor", None)  # attention by heads
    assert specs["wo"] == P("tensor", None, None)


def test_ample_memory_and_large_batch_gives_pure_data_parallelism():
    params, x = _abstract(batch=64, seq=512)
    result = shard(_grad_step, params, x, mesh="data=4", hardware="a100-80gb")
    assert result.solution.status == "OPTIMAL"
    assert result.in_specs[1] == P("data", None, None)
    assert all(spec == P(None, None) or spec == P(None, None, None) for spec in result.in_specs[0].values())


def test_budget_below_any_sharding_is_a_clear_infeasible_error():
    params, x = _abstract(batch=1, seq=128)
    with pytest.raises(InfeasibleError, match="least-memory sharding needs"):
        shard(_grad_step, params, x, mesh="tensor=4", hardware="a100-80gb", memory_budget_bytes=1e6)


def test_output_specs_follow_the_output_tree():
    x = jax.ShapeDtypeStruct((256, 1024), jnp.float32)
    result = shard(lambda x: {"y": jnp.tanh(x), "n": jnp.sum(x)}, x, mesh="data=4", hardware="a100-80gb")
    assert set(result.out_specs) == {"y", "n"}
    assert result.out_specs["n"] == P()


_RUN_SCRIPT = textwrap.dedent("""
    import jax, jax.numpy as jnp
    from jax.sharding import AxisType, NamedSharding
    from costmodel.inputs.model_config import ModelConfig
    from costmodel.inputs.train_config import TrainConfig
    from planner.programs.params import init_params
    from planner.programs.train_step import abstract_train_inputs, init_opt_state, make_train_step
    from planner.intraop.shard import shard

    cfg = ModelConfig(name="tiny", hidden_size=128, num_layers=2, num_heads=4, ffn_size=512, vocab_size=256)
    train = TrainConfig(seq_len=64, global_batch=8)
    step = make_train_step(cfg, train)
    abstract = abstract_train_inputs(cfg, train)
    result = shard(step, *abstract, mesh="data=2,tensor=4", hardware="a100-80gb", memory_budget_bytes=3e6)
    mesh = jax.make_mesh((2, 4), ("data", "tensor"), axis_types=(AxisType.Auto,) * 2)
    named = lambda specs: jax.tree.map(lambda s: NamedSharding(mesh, s), specs)
    jitted = jax.jit(step, in_shardings=named(result.in_specs), out_shardings=named(result.out_specs))
    params = init_params(cfg, jax.random.key(0))
    tokens = jax.random.randint(jax.random.key(1), (8, 64), 0, 256)
    args = jax.device_put((params, init_opt_state(params), {"tokens": tokens, "targets": tokens}), named(result.in_specs))
    new_params, _, metrics = jitted(*args)
    _, _, pinned_metrics = result.jit(step, *abstract, mesh=mesh)(*args)  # every equation pinned to the choice
    sharded = [s for s in jax.tree.leaves(result.in_specs[0]) if any(a is not None for a in s)]
    print("status", result.solution.status, "sharded", len(sharded), "loss", float(metrics["loss"]),
          "pinned", float(pinned_metrics["loss"]))
""")


def test_exported_shardings_compile_and_run_a_training_step_on_8_devices():
    env = {**os.environ, "XLA_FLAGS": "--xla_force_host_platform_device_count=8", "JAX_PLATFORMS": "cpu"}
    root = str(Path(__file__).resolve().parents[3])
    done = subprocess.run([sys.executable, "-c", _RUN_SCRIPT], capture_output=True, text=True, env=env, cwd=root, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    words = done.stdout.split()
    assert words[words.index("status") + 1] in ("OPTIMAL", "FEASIBLE")
    assert int(words[words.index("sharded") + 1]) > 0  # the tight budget forced real sharding
    assert math.isfinite(float(words[words.index("loss") + 1]))
    # The pinned program may split a contraction where the propagated one does not: partial sums added in another order.
    assert float(words[words.index("pinned") + 1]) == pytest.approx(float(words[words.index("loss") + 1]), rel=1e-4)


_MESH_KINDS_SCRIPT = textwrap.dedent("""
    import jax, jax.numpy as jnp
    from jax.sharding import AxisType, Mesh, NamedSharding
    from planner.intraop.shard import shard
    from validate.shard_check import check_shard

    fn = lambda x, w: jnp.tanh(x @ w)
    x, w = jax.ShapeDtypeStruct((64, 256), jnp.float32), jax.ShapeDtypeStruct((256, 1024), jnp.float32)
    values = (jnp.linspace(-1, 1, 64 * 256).reshape(64, 256), jnp.linspace(-1, 1, 256 * 1024).reshape(256, 1024))
    expected = fn(*values)
    meshes = {"make_mesh": jax.make_mesh((4, 2), ("data", "tensor")),  # Explicit axes, jax's default
              "make_mesh_auto": jax.make_mesh((4, 2), ("data", "tensor"), axis_types=(AxisType.Auto,) * 2),
              "mixed": jax.make_mesh((4, 2), ("data", "tensor"), axis_types=(AxisType.Explicit, AxisType.Auto)),
              "Mesh": Mesh(jax.devices()[:8], ("data",))}
    for name, mesh in meshes.items():
        result = shard(fn, x, w, mesh=mesh, hardware="a100-80gb", memory_budget_bytes=1e6)  # tight: split the weight
        placed = jax.device_put(values, jax.tree.map(lambda s: NamedSharding(mesh, s), result.in_specs))
        runs = [result.jit(fn, x, w, mesh=mesh)(*values), result.jit(fn, x, w, mesh=mesh)(*placed)]
        with jax.set_mesh(mesh):
            runs.append(result.jit(fn, x, w, mesh=mesh)(*placed))
        check = check_shard(result, fn, x, w, mesh=mesh)
        # Partial sums added in another order than the unsharded program's.
        agree = all(out.sharding.spec == result.out_specs and jnp.allclose(out, expected, atol=1e-3) for out in runs)
        print(name, mesh.axis_types[0].name, any(a is not None for a in jax.tree.leaves(result.in_specs)), agree,
              check.compiled_matmul_flops * mesh.size == 2 * 64 * 256 * 1024)
""")


def test_the_result_runs_on_meshes_of_explicit_auto_and_mixed_axes_under_set_mesh_or_not():
    # jax.make_mesh gives Explicit axes by default (jax 0.10), on which with_sharding_constraint refuses to pin.
    env = {**os.environ, "XLA_FLAGS": "--xla_force_host_platform_device_count=8", "JAX_PLATFORMS": "cpu"}
    root = str(Path(__file__).resolve().parents[3])
    done = subprocess.run([sys.executable, "-c", _MESH_KINDS_SCRIPT], capture_output=True, text=True, env=env, cwd=root, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    rows = {line.split()[0]: line.split()[1:] for line in done.stdout.strip().splitlines()}
    assert rows["make_mesh"][0] == "Explicit" and rows["make_mesh_auto"][0] == "Auto"
    assert set(rows) == {"make_mesh", "make_mesh_auto", "mixed", "Mesh"}
    assert all(sharded == agree == flops == "True" for _, sharded, agree, flops in rows.values()), rows


_T4_FP32_SCRIPT = textwrap.dedent("""
    import json, math
    import jax, jax.numpy as jnp
    from jax.sharding import AxisType, NamedSharding
    from costmodel.hardware.registry import load_hardware
    from planner.intraop.shard import shard

    D, F, BLOCKS, B = 8192, 32768, 3, 16
    f32 = lambda *shape: jax.ShapeDtypeStruct(shape, jnp.float32)
    params = {f"block{i}": {"w_up": f32(D, F), "w_down": f32(F, D)} for i in range(BLOCKS)}

    def loss(params, x_BxD):
        for block in params.values():
            x_BxD = x_BxD + jax.nn.relu(x_BxD @ block["w_up"]) @ block["w_down"]
        return jnp.mean(x_BxD ** 2)

    def train_step(params, m, v, x_BxD):  # Adam, fp32 throughout
        grads = jax.grad(loss)(params, x_BxD)
        m = jax.tree.map(lambda m, g: 0.9 * m + 0.1 * g, m, grads)
        v = jax.tree.map(lambda v, g: 0.999 * v + 0.001 * g * g, v, grads)
        params = jax.tree.map(lambda p, m, v: p - 1e-3 * m / (jnp.sqrt(v) + 1e-8), params, m, v)
        return params, m, v

    args = (params, params, params, f32(B, D))
    result = shard(train_step, *args, mesh="data=2,model=4", hardware="t4")
    mesh = jax.make_mesh((2, 4), ("data", "model"), axis_types=(AxisType.Auto,) * 2)
    named = lambda specs: jax.tree.map(lambda s: NamedSharding(mesh, s), specs)
    compiled = jax.jit(train_step, in_shardings=named(result.in_specs), out_shardings=named(result.out_specs),
                       donate_argnums=(0, 1, 2)).lower(*args).compile()
    mem = compiled.memory_analysis()  # the SPMD program: every device runs this one
    peak = mem.argument_size_in_bytes + mem.output_size_in_bytes + mem.temp_size_in_bytes - mem.alias_size_in_bytes
    n_params = sum(math.prod(p.shape) for p in jax.tree.leaves(params))
    print(json.dumps({"dtype": result.compute_dtype, "status": result.solution.status, "n_params": n_params,
                      "device_peak_bytes": peak, "t4_hbm_bytes": load_hardware("t4").device.hbm_bytes,
                      "w_up": str(result.in_specs[0]["block0"]["w_up"])}))
""")


def test_fp32_adam_step_too_big_for_one_t4_is_sharded_to_fit_eight():
    env = {**os.environ, "XLA_FLAGS": "--xla_force_host_platform_device_count=8", "JAX_PLATFORMS": "cpu"}
    root = str(Path(__file__).resolve().parents[3])
    done = subprocess.run([sys.executable, "-c", _T4_FP32_SCRIPT], capture_output=True, text=True, env=env, cwd=root, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert out["dtype"] == "float32" and out["status"] in ("OPTIMAL", "FEASIBLE")
    assert 16 * out["n_params"] > 16e9  # fp32 weights + grads + two Adam moments: more than one T4 holds
    assert out["device_peak_bytes"] < 16e9 and out["device_peak_bytes"] < out["t4_hbm_bytes"], out


@pytest.mark.parametrize("dtype, expected", [(jnp.float32, "float32"), (jnp.float16, "float16"), (jnp.bfloat16, "bfloat16")])
def test_compute_dtype_comes_from_the_program_and_any_profile_with_its_peak_takes_it(dtype, expected):
    x, w = jax.ShapeDtypeStruct((256, 1024), dtype), jax.ShapeDtypeStruct((1024, 1024), dtype)
    for hardware in ("t4", "v100", "a100-80gb", "tpu-v5e"):
        has_peak = expected in load_hardware(hardware).device.peak_flops_per_s
        if not has_peak:
            with pytest.raises(InvalidConfigError, match=f"no {expected} peak"):
                shard(lambda x, w: jnp.tanh(x @ w), x, w, mesh="data=4", hardware=hardware)
            continue
        result = shard(lambda x, w: jnp.tanh(x @ w), x, w, mesh="data=4", hardware=hardware)
        assert result.compute_dtype == expected and result.solution.status == "OPTIMAL"


def test_explicit_compute_dtype_overrides_the_program():
    x = jax.ShapeDtypeStruct((256, 1024), jnp.float32)
    assert shard(lambda x: x @ x.T, x, mesh="data=4", hardware="t4", compute_dtype="float16").compute_dtype == "float16"
    with pytest.raises(InvalidConfigError, match="t4 has no bfloat16 peak"):
        shard(lambda x: x @ x.T, x, mesh="data=4", hardware="t4", compute_dtype="bfloat16")


def test_result_scores_the_baselines_and_is_never_predicted_worse():
    params, x = _abstract(batch=8, seq=128)
    result = shard(_grad_step, params, x, mesh="data=2,tensor=2", hardware="a100-80gb", time_limit_s=5)
    names = {b.name for b in result.baselines}
    assert {"planned", "dp", "fsdp", "fsdp_tp"} <= names
    assert all(result.step_time_s <= b.step_time_s + 1e-12 for b in result.baselines if b.fits)
    assert result.in_specs[1] == P(("data", "tensor"), None, None)  # the batch is split, not left whole
    assert result.predicted_memory_bytes == result.memory.total_bytes > result.memory.arguments_bytes


def test_a_pinned_leaf_keeps_its_spec_and_the_rest_is_planned_around_it():
    params, x = _abstract(batch=8, seq=128)
    result = shard(_grad_step, params, x, mesh="data=2,tensor=2", hardware="a100-80gb", time_limit_s=5,
                   fixed={"[1]": P("data"), "[0]['w_in']": P(None, "tensor")})
    assert result.in_specs[1] == P("data", None, None)
    assert result.in_specs[0]["w_in"] == P(None, "tensor")


def test_baselines_left_no_time_are_scored_on_the_planned_choice_carried_to_their_pins():
    params, x = _abstract(batch=8, seq=128)
    # The planned solve may use the whole second; under a second left per baseline, none searches.
    result = shard(_grad_step, params, x, mesh="data=2,tensor=2", hardware="a100-80gb", time_limit_s=1)
    baselines = [b for b in result.baselines if b.name != "planned"]
    assert len(baselines) == 3 and all(b.status == "FEASIBLE" for b in baselines)
    assert all(result.step_time_s <= b.step_time_s + 1e-12 for b in result.baselines if b.fits)
