"""Serving stacks: the host work the software serving a model adds to each step beside its kernels.

A serving step's kernels are costed by `costmodel.step.inference`; the stack decides who launches
them and how finely it splits a layer's small operations. A compiled step (a JAX executable, a
CUDA graph replayed by vLLM or TensorRT-LLM) has its kernels queued by the device-side runtime:
no host work per kernel beyond the launch floor each kernel is costed with. Beside a layer's
GEMMs and attention, its norms, rotary embedding, KV-cache write and MLP activation run as
``side_kernels_per_layer`` kernels, counted from the stack's code (or its profile) where known:
each costs the part's launch floor, which at a decode step's few tokens is most of its time (on
GPUs; a TPU runs its fusions back to back). An eager framework dispatches every operator from
Python, one after another: the host then spends ``ops × seconds per op`` per step, and a step
takes the longer of that and its kernels' time (the host runs ahead of the device until the
step's end, where generation reads the sampled token back). Each preset names where its facts come from.

>>> s = SERVING_STACKS["hf-eager"]
>>> s.host_ops(num_layers=40), round(s.host_step_s(num_layers=40) * 1e3, 1)
(2145, 45.0)
>>> SERVING_STACKS["vllm"].host_step_s(num_layers=40)
0.0
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, NonNegativeFloat, NonNegativeInt

from costmodel.inputs.stack import Attention


class ServingStack(BaseModel):
    """One serving framework's per-step host work."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str = Field(description="Preset name (--serving-stack).")
    host_ops_per_layer: NonNegativeInt = Field(0, description="Operators the host dispatches one by one per decoder layer and "
                                               "step (0: the step's kernels are launched from a compiled executable or a graph).")
    host_ops_per_step: NonNegativeInt = Field(0, description="Operators dispatched per step outside the layers (embedding, "
                                              "final norm, head, sampling, stopping checks).")
    host_s_per_op: NonNegativeFloat = Field(0.0, description="Host seconds per dispatched operator (Python, the framework's "
                                            "dispatcher and the kernel launch call).")
    side_kernels_per_layer: NonNegativeInt | None = Field(
        None, description="Kernels a decoder layer launches beside its GEMMs and attention (norms with the residual adds, "
        "rotary embedding, KV-cache write, MLP activation), counted from the stack's code; None: not counted (none costed).")
    grouped_query_side_kernels: NonNegativeInt = Field(
        0, description="Side kernels a layer of a grouped- or multi-query model launches beyond those: its decode "
        "attention's own preparation (TensorRT-LLM's XQA path: decoder info, then RoPE and the cache write).")
    cache_grown_by_concatenation: bool = Field(
        False, description="Each decode step appends the new token's keys and values by concatenating them to the layer's "
        "cache into a new tensor (transformers' DynamicCache.update, torch.cat): the step reads and rewrites every layer's "
        "whole cache beside attention's read. False: written in place into a preallocated or paged cache.")
    operators_unfused: bool = Field(
        False, description="Every operator of a layer is a kernel of its own that reads its inputs from HBM and writes its "
        "output back (eager PyTorch): the norms' fp32 steps, the rotary embedding's five passes, the activation and the "
        "residual adds each move their tensors (`costmodel.step.serving_kernels.unfused_operator_kernel`).")
    attention: Attention = Field(Attention.FLASH, description="flash: a fused kernel reads q, k and v once; materialized: "
                                 "the scores are written, scaled, masked, soft-maxed in fp32 and read back "
                                 "(`costmodel.step.serving_kernels.materialized_attention_kernels`).")
    kv_read_per_query_head: bool = Field(
        False, description="The decode attention kernel runs a thread block per query head, each reading its KV head's "
        "cache: a grouped-query cache is read from HBM once per query head it serves (TensorRT-LLM's masked multi-head "
        "attention before the XQA kernel). False: each KV head is read once for its whole group.")
    reserves_whole_request: bool = Field(
        False, description="The scheduler admits a request only when KV blocks for its prompt and its whole output are free "
        "beside every running request's, and never preempts (TensorRT-LLM's default GUARANTEED_NO_EVICT). False: blocks "
        "are taken as the context grows, the latest admitted request preempted when they run out (vLLM's).")
    kv_free_memory_fraction: float = Field(
        1.0, gt=0, le=1, description="Fraction of the memory left beside the weights, temporaries and runtime reserve that "
        "the KV cache takes (TensorRT-LLM's free_gpu_memory_fraction, 0.9 by default); 1: all of it.")
    weight_only_stream: dict[str, float] = Field(
        default_factory=dict, description="Fraction of a 16-bit GEMV's weight-streaming rate the stack's weight-only GEMV "
        "reaches, by stored dtype (int8, int4): its dequantizing kernel's quality, measured against the 16-bit one; absent: "
        "as fast.")
    int4_group_bytes: NonNegativeFloat = Field(0.0, description="Bytes each group of int4 weights stores beside them (its scale "
                                               "and zero), held and read with them (`InferenceConfig.weight_bytes`); 0: not counted.")
    source: str = Field(description="Where the facts come from (repository, file, commit), and what is fitted.")

    def side_kernel_count(self, *, grouped_query: bool) -> int | None:
        """Side kernels a decoder layer launches (None: not counted).

        >>> trt = get_serving_stack("tensorrt-llm")
        >>> trt.side_kernel_count(grouped_query=True), trt.side_kernel_count(grouped_query=False)
        (5, 3)
        """
        if self.side_kernels_per_layer is None:
            return None
        return self.side_kernels_per_layer + (self.grouped_query_side_kernels if grouped_query else 0)

    def host_ops(self, *, num_layers: int) -> int:
        """Operators the host dispatches one by one in one step of a model of ``num_layers``."""
        return num_layers * self.host_ops_per_layer + self.host_ops_per_step if self.host_ops_per_layer else 0

    def host_step_s(self, *, num_layers: int) -> float:
        """Host seconds one step takes to dispatch (0 for a compiled or graph-replayed step)."""
        return self.host_ops(num_layers=num_layers) * self.host_s_per_op


# Hugging Face transformers' eager Llama decoder layer at 0022728 (v4.39 development;
# src/transformers/models/llama/modeling_llama.py), one decode step, operators that launch a kernel:
# two RMSNorms of 8 each (to fp32, pow, mean, add eps, rsqrt, mul, to dtype, mul weight), q/k/v
# projections (3), the rotary embedding's forward (position cast, matmul, cat, cos, sin, two casts:
# 7), apply_rotary_pos_emb (q and k: mul, neg, cat, mul, add: 10), DynamicCache.update (two cats),
# scores matmul and scale (2), mask add (1), fp32 softmax and its cast back (2), values matmul (1),
# transpose().contiguous() (1), o_proj (1), two residual adds (2), the MLP (gate, act, up, mul,
# down: 5); repeat_kv copies nothing without grouped-query heads. 53 in all.
HF_EAGER_OPS_PER_LAYER = 53
# Outside the layers, about 25 a step (embedding, causal-mask update, final norm's 8, lm_head, logits
# cast and last-position slice, greedy argmax, the unfinished-sequences arithmetic, input and
# attention-mask concatenation, cache position, the stopping check): counted approximately from
# GenerationMixin._greedy_search of the same version.
HF_EAGER_OPS_PER_STEP = 25
# Fitted to the published eager generate() measurements of `benchmarks/data/inference_runs.csv`
# (`python -m benchmarks.serving_accuracy` fits it again leaving each source out and reports both).
HF_EAGER_S_PER_OP = 21e-6

# torch.compile's weight-only GEMVs at batch 1, as torchao measures them (pytorch/ao
# torchao/quantization/README.md, A100-80GB rows @317392d, H100 rows @92dd5f5; its GB/s counts every
# quantized byte, scales and zeros included): int8 weight-only (`F.linear(x, w.to(x.dtype)) * scales`,
# Inductor's generated GEMV) streams its weights at 0.797, 0.802 and 0.785 of the bf16 GEMV's rate
# (Llama-2-7B and Llama-3-8B on an A100, Llama-3.1-8B on an H100), int4 weight-only at group size 64
# (`torch.ops.aten._weight_int4pack_mm`, tinygemm: a bf16 scale and a bf16 zero a group) at 0.530,
# 0.532 and 0.535: the means (benchmarks/data/weight_only_kernels.csv), fitted on none of the serving rows.
TORCH_INT8_WEIGHT_ONLY_STREAM = 0.795
TORCH_INT4_WEIGHT_ONLY_STREAM = 0.532
TINYGEMM_GROUP_BYTES = 4.0

# vllm-project/vllm @0035bdf vllm/model_executor/models/llama.py, LlamaDecoderLayer.forward: input_layernorm
# and post_attention_layernorm (RMSNorm, the residual add fused in), rotary_emb, the attention
# backend's cache write (reshape_and_cache) beside its attention kernel, SiluAndMul: 5.
VLLM_SIDE_KERNELS_PER_LAYER = 5
# The reference decode program on an H200 (benchmarks/data/gpu, profile of 2026-11-28, llama3-8b,
# batch 1): per layer 4 reductions (two norms; the softmax's max and sum), 8 elementwise fusions
# (rotary q and k, residual adds, the activation, score scaling and mask, casts) and 2 cache writes,
# beside the scan's read of its layer's cache, which per-layer serving drops: 14.
JAX_SIDE_KERNELS_PER_LAYER = 14
# NVIDIA/TensorRT-LLM, a Llama decoder layer's generation step beside its GEMMs, attention and all-reduces, as its
# code and docs state them (2024 releases, engines built with the default plugins): two RMSNorms (TensorRT fuses
# each with its residual add: our reading, no profile read) and the SwiGLU kernel after the fused gate/up GEMM
# (tensorrt_llm/plugin/plugin.py @c20322f, use_fused_mlp: "followed by a separate SwiGLU kernel"): 3; the masked
# multi-head attention kernel applies RoPE and writes the cache itself (docs/source/advanced/gpt-attention.md
# @a7e572f). Where the XQA kernel runs a grouped-query model's attention, invokeBuildDecoderInfo and
# invokeQKVPreprocessing (RoPE and the KV-cache write) run before it (cpp/tensorrt_llm/kernels/
# decoderMaskedMultiheadAttention/decoderXQAImplPrecompiled.cpp, 2024): 2 more.
TRTLLM_SIDE_KERNELS_PER_LAYER = 3
TRTLLM_XQA_PREPARATION_KERNELS = 2
# TensorRT-LLM's KV cache takes 0.9 of the GPU memory free after the engine loads (KvCacheConfig
# free_gpu_memory_fraction's default; NVIDIA's MLPerf Inference v4.1 llama2-70b configs set the same,
# kvcache_free_gpu_mem_frac = 0.90: mlcommons/inference_results_v4.1 @a2f5d66 closed/NVIDIA/configs/llama2-70b/Server).
TRTLLM_KV_FREE_MEMORY_FRACTION = 0.9

SERVING_STACKS: dict[str, ServingStack] = {s.name: s for s in (
    ServingStack(name="jax", side_kernels_per_layer=JAX_SIDE_KERNELS_PER_LAYER,
                 source="The reference decode and prefill programs (planner.programs), one jitted executable a step: "
                 "XLA launches its kernels from the device's stream; 14 side kernels a layer counted in its H200 profile "
                 "(JAX_SIDE_KERNELS_PER_LAYER)."),
    ServingStack(name="vllm", side_kernels_per_layer=VLLM_SIDE_KERNELS_PER_LAYER,
                 source="vllm-project/vllm @587909c vllm/worker/model_runner.py: decode batches of up to 256 sequences "
                        "(_BATCH_SIZES_TO_CAPTURE) run as captured CUDA graphs unless enforce_eager; @0035bdf "
                        "vllm/model_executor/models/llama.py: 5 side kernels a layer (VLLM_SIDE_KERNELS_PER_LAYER). Its "
                        "scheduler's per-step Python is not modelled."),
    ServingStack(name="torch-compile",
                 weight_only_stream={"int8": TORCH_INT8_WEIGHT_ONLY_STREAM, "int4": TORCH_INT4_WEIGHT_ONLY_STREAM},
                 int4_group_bytes=TINYGEMM_GROUP_BYTES,
                 source="pytorch-labs/gpt-fast generate.py (@0055c42): decode_one_token compiled with "
                        "torch.compile(mode='reduce-overhead', fullgraph=True), a CUDA graph replayed every step; how "
                        "Inductor fuses a layer's small operations is not counted. Weight-only GEMVs: int8 through Inductor "
                        "at 0.795 and int4 through tinygemm (bf16 scale and zero a group) at 0.532 of the bf16 GEMV's "
                        "streaming rate, fitted to pytorch/ao's quantization README tables (TORCH_INT8_WEIGHT_ONLY_STREAM)."),
    ServingStack(name="tensorrt-llm", side_kernels_per_layer=TRTLLM_SIDE_KERNELS_PER_LAYER,
                 grouped_query_side_kernels=TRTLLM_XQA_PREPARATION_KERNELS, reserves_whole_request=True,
                 kv_free_memory_fraction=TRTLLM_KV_FREE_MEMORY_FRACTION,
                 source="NVIDIA/TensorRT-LLM: a compiled engine its C++ runtime executes (no per-operator Python dispatch); "
                        "3 side kernels a layer read from its code, 5 where XQA runs a grouped-query model's attention "
                        "(TRTLLM_SIDE_KERNELS_PER_LAYER); its default capacity "
                        "scheduler, GUARANTEED_NO_EVICT, admits a request only with blocks for its whole output and never "
                        "pauses one (docs: performance/performance-tuning-guide/useful-runtime-flags, 'Capacity Scheduler "
                        "Policy'); its KV cache takes 0.9 of the free memory (TRTLLM_KV_FREE_MEMORY_FRACTION)."),
    ServingStack(name="tensorrt-llm-0.6", side_kernels_per_layer=TRTLLM_SIDE_KERNELS_PER_LAYER, kv_read_per_query_head=True,
                 reserves_whole_request=True, kv_free_memory_fraction=TRTLLM_KV_FREE_MEMORY_FRACTION,
                 source="NVIDIA/TensorRT-LLM v0.5 and v0.6 (the tables of docs/source/performance.md and "
                        "docs/source/blogs/H200launch.md): as tensorrt-llm, but decode attention runs the masked multi-head "
                        "attention kernel, a thread block per query head that applies RoPE and writes the cache itself (3 "
                        "side kernels a layer), so a grouped-query cache is read once per query head; the GQA kernel (XQA) "
                        "that reads each KV head once for its group came with v0.7a (docs/source/blogs/Falcon180B-H200.md "
                        "@3c44cb9, XQA-kernel.md @585c756: 2.4x Llama-70B throughput on one H200 at 128/2048)."),
    ServingStack(name="hf-eager", host_ops_per_layer=HF_EAGER_OPS_PER_LAYER, host_ops_per_step=HF_EAGER_OPS_PER_STEP,
                 host_s_per_op=HF_EAGER_S_PER_OP, cache_grown_by_concatenation=True, operators_unfused=True,
                 attention=Attention.MATERIALIZED,
                 source="huggingface/transformers @0022728 src/transformers/models/llama/modeling_llama.py, eager "
                        "attention, DynamicCache (src/transformers/cache_utils.py DynamicCache.update: torch.cat of the past keys "
                        "and values with the new token's, a new tensor each step): 53 operators per decoder layer "
                        "and about 25 per step, counted from the code (HF_EAGER_OPS_PER_LAYER); seconds per operator "
                        "fitted to published generate() latencies (HF_EAGER_S_PER_OP). Host-bound: its kernels' "
                        "launch floors are not counted beside the dispatch; each operator's HBM traffic is, and the eager "
                        "attention's score matrix."),
)}


def get_serving_stack(name: str) -> ServingStack:
    """The preset called ``name``; an unknown name is refused with the list.

    >>> get_serving_stack("vllm").host_ops(num_layers=32)
    0
    """
    if name not in SERVING_STACKS:
        raise ValueError(f"unknown serving stack {name!r}; choose one of {', '.join(SERVING_STACKS)}")
    return SERVING_STACKS[name]
