"""Micro-benchmarks of what the cost model assumes, each beside the cost model's own term.

- GEMMs: a layer's four linear GEMMs (qkv, attention output, MLP in, MLP out) of each model
  under tensor parallelism ``tp`` (column-parallel qkv and MLP in split their outputs,
  row-parallel attention output and MLP out their inputs), ``tokens`` rows, in the compute
  dtype and, where the part has a float8 peak, in fp8 (e4m3 operands, bf16 result). Predicted:
  the kernel of that name in `costmodel.step.kernels.layer_forward_kernels` (its FLOPs and
  bytes) through the roofline (`costmodel.step.roofline.kernel_time_s`) at the profile's peak
  and efficiencies.
- Attention, causal with GQA, forward and forward + backward: the reference program's
  blockwise kernel (`planner.programs.attention.flash_attention`) and the fused
  ``jax.nn.dot_product_attention`` (cuDNN on a GPU, XLA's on a CPU). Predicted: the layer's
  attention-core kernels (`costmodel.step.layer_costs.phase_time`, backward included): the
  fused flash kernel's term, or on a CPU for XLA's kernel the materialized scores'.
- HBM: ``x + 1`` over a large array (every byte read and written once), against the profile's
  HBM bandwidth and efficiency.
- Elementwise: the RMSNorm and SwiGLU activation XLA fuses into one kernel each, against the
  layer's ``attn_norm`` and ``mlp_activation`` kernels.
"""

from __future__ import annotations

from functools import partial
from typing import Any

from benchmarks.gpu_truth.sizes import Sizes
from benchmarks.gpu_truth.target import FP8, Target
from benchmarks.gpu_truth.timing import Case, median_call_s
from costmodel.hardware.machine import Machine
from costmodel.inputs.layout import Layout
from costmodel.inputs.model_config import ModelConfig
from costmodel.inputs.stack import Attention, get_stack, stack_with
from costmodel.inputs.train_config import Precision, TrainConfig
from costmodel.step.kernels import Kernel, KernelKind, layer_forward_kernels
from costmodel.step.layer_costs import phase_time
from costmodel.step.roofline import kernel_time_s

# (kernel name, column-parallel): column-parallel GEMMs split their output over tp, row-parallel their input.
LINEAR_GEMMS = (("qkv", True), ("attn_out", False), ("mlp_in", True), ("mlp_out", False))


def layer_kernel(model: ModelConfig, train: TrainConfig, layout: Layout, name: str) -> Kernel:
    """The cost model's forward kernel ``name`` of one layer."""
    return next(k for k in layer_forward_kernels(model, train, layout) if k.name == name)


def kernel_s(kernel: Kernel, machine: Machine) -> float:
    """Roofline seconds of ``kernel`` on ``machine`` (a linear GEMM at the linear layers' peak)."""
    peak = machine.linear_peak if kernel.linear else machine.peak_flops_per_s
    return kernel_time_s(kernel, peak_flops_per_s=peak, hbm_bytes_per_s=machine.hbm_bytes_per_s, efficiency=machine.efficiency)


def gemm_dims(model: ModelConfig, name: str, tp: int) -> tuple[int, int]:
    """(k, n) of the weight of linear GEMM ``name`` on one of ``tp`` devices.

    >>> from planner.config import load_model
    >>> gemm_dims(load_model("llama3-8b"), "qkv", 2), gemm_dims(load_model("llama3-8b"), "mlp_out", 4)
    ((4096, 3072), (3584, 4096))
    """
    h, q, kv = model.hidden_size, model.num_heads * model.head_dim, model.num_kv_heads * model.head_dim
    gated = 2 if model.mlp.gated else 1
    k, n = {"qkv": (h, q + 2 * kv), "attn_out": (q, h), "mlp_in": (h, gated * model.ffn_size), "mlp_out": (model.ffn_size, h)}[name]
    column = dict(LINEAR_GEMMS)[name]
    return (k, n // tp) if column else (k // tp, n)


def _random(shape: tuple[int, ...], dtype: str, seed: int) -> Any:
    import jax  # why: JAX is imported only once a case runs
    import jax.numpy as jnp

    return jax.random.normal(jax.random.key(seed), shape, jnp.float32).astype(dtype)


def _gemm_case(target: Target, model: ModelConfig, name: str, tp: int, tokens: int, *, fp8: bool) -> Case:
    k, n = gemm_dims(model, name, tp)
    precision = Precision.FP8 if fp8 else target.precision
    train = TrainConfig(seq_len=tokens, global_batch=1).with_precision(precision)
    machine = target.machine()
    if fp8:
        machine = machine.model_copy(update={"linear_peak_flops_per_s": target.cluster.device.peak_for(FP8)})

    def measure() -> float:
        import jax
        import jax.numpy as jnp

        x, w = _random((tokens, k), FP8 if fp8 else target.dtype, 0), _random((k, n), FP8 if fp8 else target.dtype, 1)
        out = jnp.dtype(target.dtype)
        return median_call_s(jax.jit(lambda a, b: jnp.matmul(a, b, preferred_element_type=out)), x, w)

    return Case(kind="gemm", name=f"{model.name} {name} tp{tp}", shape=f"m{tokens} n{n} k{k}", dtype="fp8" if fp8 else target.dtype,
                predict=lambda: kernel_s(layer_kernel(model, train, Layout(tp=tp), name), machine), measure=measure)


def gemm_cases(target: Target, sizes: Sizes) -> list[Case]:
    """Every model's linear GEMMs at every tp, in the compute dtype, then fp8 where the part has a float8 peak."""
    cases = [_gemm_case(target, m, name, tp, sizes.gemm_tokens, fp8=False)
             for m in sizes.gemm_models for tp in sizes.gemm_tps for name, _ in LINEAR_GEMMS]
    if target.has_fp8:
        cases += [_gemm_case(target, m, name, tp, sizes.gemm_tokens, fp8=True)
                  for m in sizes.gemm_models for tp in sizes.fp8_tps for name, _ in LINEAR_GEMMS]
    return cases


def _attention_case(target: Target, model: ModelConfig, seq_len: int, batch: int, *, fused: bool, backward: bool) -> Case:
    materialized = fused and target.backend == "cpu"  # XLA's CPU kernel builds the score matrix
    stack = stack_with(get_stack("jax"), attention=Attention.MATERIALIZED if materialized else Attention.FLASH)
    train = TrainConfig(seq_len=seq_len, global_batch=batch).with_precision(target.precision)
    layout = Layout(micro_batch=batch, stack=stack)
    kv, group, d = model.num_kv_heads, model.num_heads // model.num_kv_heads, model.head_dim
    impl = target.attention_implementation if fused else "blockwise"

    def predict() -> float:
        core = [k for k in layer_forward_kernels(model, train, layout) if k.in_attention_core]
        machine = target.machine()
        return phase_time(core, machine).total_s + (phase_time(core, machine, backward=True).total_s if backward else 0.0)

    def measure() -> float:
        import jax

        from planner.programs.attention import block_size, flash_attention

        q = _random((batch, seq_len, kv, group, d), target.dtype, 0)
        k, v, do = (_random((batch, seq_len, kv, d), target.dtype, s) for s in (1, 2, 3))
        if fused:
            def attend(q: Any, k: Any, v: Any) -> Any:
                out = jax.nn.dot_product_attention(q.reshape(batch, seq_len, kv * group, d), k, v, is_causal=True,
                                                   implementation=target.attention_implementation)
                return out.reshape(q.shape)
        else:  # the block named, so that a GPU runs the blockwise kernel rather than cuDNN's
            attend = partial(flash_attention, block=block_size(seq_len))
        if not backward:
            return median_call_s(jax.jit(attend), q, k, v)
        do = _random(q.shape, target.dtype, 3)
        return median_call_s(jax.jit(lambda q, k, v, do: jax.vjp(attend, q, k, v)[1](do)), q, k, v, do)

    return Case(kind="attention", name=f"{impl} {'fwd+bwd' if backward else 'fwd'} s{seq_len}",
                shape=f"b{batch} s{seq_len} heads{model.num_heads}/{kv} d{d}", dtype=target.dtype, predict=predict, measure=measure)


def attention_cases(target: Target, sizes: Sizes) -> list[Case]:
    """Blockwise and fused attention, forward and forward + backward, at each length (``attention_tokens`` tokens each)."""
    return [_attention_case(target, sizes.attention_model, s, max(1, sizes.attention_tokens // s), fused=fused, backward=backward)
            for s in sizes.attention_lengths for fused in (False, True) for backward in (False, True)]


def hbm_cases(target: Target, sizes: Sizes) -> list[Case]:
    """``x + 1`` over each size: one read and one write of every byte."""
    def case(n_bytes: int) -> Case:
        elements = n_bytes // _itemsize(target.dtype)
        kernel = Kernel(name="stream", kind=KernelKind.MEMORY, flops=elements, bytes=2 * n_bytes)

        def measure() -> float:
            import jax

            return median_call_s(jax.jit(lambda x: x + 1), _random((elements,), target.dtype, 0))

        return Case(kind="hbm", name=f"x + 1, {n_bytes / 2**20:.0f} MiB", shape=f"n{elements}", dtype=target.dtype,
                    predict=lambda: kernel_s(kernel, target.machine()), measure=measure)

    return [case(n) for n in sizes.hbm_bytes]


def _itemsize(dtype: str) -> int:
    return {"bfloat16": 2, "float16": 2, "float32": 4}[dtype]


def elementwise_cases(target: Target, sizes: Sizes) -> list[Case]:
    """The fused RMSNorm (fp32 inside) and SwiGLU of one micro-batch's tokens, against the layer's kernels of those names."""
    model, tokens = sizes.elementwise_model, sizes.elementwise_tokens
    train = TrainConfig(seq_len=tokens, global_batch=1).with_precision(target.precision)

    def rms_norm(x: Any, w: Any) -> Any:
        import jax
        import jax.numpy as jnp

        x32 = x.astype(jnp.float32)
        return (x32 * jax.lax.rsqrt((x32 * x32).mean(-1, keepdims=True) + model.norm_eps) * w).astype(x.dtype)

    def swiglu(gate: Any, up: Any) -> Any:
        import jax

        return jax.nn.silu(gate) * up

    def case(name: str, fn: Any, shapes: tuple[tuple[int, ...], ...]) -> Case:
        def measure() -> float:
            import jax

            return median_call_s(jax.jit(fn), *(_random(s, target.dtype, i) for i, s in enumerate(shapes)))

        return Case(kind="elementwise", name=f"{name} {model.name}", shape=" ".join("x".join(map(str, s)) for s in shapes),
                    dtype=target.dtype, predict=lambda: kernel_s(layer_kernel(model, train, Layout(), name), target.machine()),
                    measure=measure)

    h, f = model.hidden_size, model.ffn_size
    return [case("attn_norm", rms_norm, ((tokens, h), (h,))), case("mlp_activation", swiglu, ((tokens, f), (tokens, f)))]

