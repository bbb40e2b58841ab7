"""`SoftwareStack`: what the training framework does, as facts the simulator reads.

A layout says how work is split; a software stack says how the framework runs it: which
kernels are fused, which collectives overlap compute, how recompute re-runs a layer, how
ZeRO/FSDP gathers parameters and reduces gradients. Each preset in `STACKS` is a set of
such facts read from one framework's code at one time; its description cites the
repository, file and commit. A user names a preset (``--stack megatron-core``) and may
override single facts (``--tp-overlap none``) with `stack_with`.

>>> STACKS["megatron-core"].tp_overlap, STACKS["torchtitan"].fsdp_copy_out, STACKS["jax"].attention
(<TpOverlap.GEMM: 'gemm'>, True, <Attention.FLASH: 'flash'>)
>>> stack_with("torchtitan", fused_norm=True).fused_norm
True
"""

from __future__ import annotations

from enum import StrEnum
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from costmodel.errors import InvalidConfigError, unknown_name_error


class Attention(StrEnum):
    """Attention kernel: fused (never writes the S×S scores) or materialized scores."""

    FLASH = "flash"
    MATERIALIZED = "materialized"


class TpOverlap(StrEnum):
    """How far tensor-parallel collectives hide behind GEMMs.

    ``none``: every collective waits on the GEMMs around it. ``backward``: the column-parallel
    input gradient's reduction (and, with sequence parallelism, the input's re-gather) runs
    behind the weight-gradient GEMM (Megatron-LM's asynchronous TP). ``gemm``: every
    collective, forward and backward, is split into chunks pipelined with the GEMM that
    produces or consumes it (TransformerEngine's userbuffer overlap). ``collective-matmul``:
    XLA's windowed einsum, which decomposes an all-gather feeding a GEMM and a reduce-scatter
    of a GEMM's output into collective-permutes pipelined with partial GEMMs, where the
    program turns it on (a GPU: planner/programs/xla_options.py): there as ``gemm`` under
    sequence parallelism, whose collectives are exactly those; as ``none`` without it (an
    all-reduce is not decomposed) and elsewhere.
    """

    NONE = "none"
    BACKWARD = "backward"
    GEMM = "gemm"
    COLLECTIVE_MATMUL = "collective-matmul"

    def under(self, *, sequence_parallel: bool, windowed_einsum: bool) -> TpOverlap:
        """The overlap in effect with or without sequence parallelism, where XLA's windowed einsum is or is not on.

        >>> TpOverlap.COLLECTIVE_MATMUL.under(sequence_parallel=False, windowed_einsum=True)
        <TpOverlap.NONE: 'none'>
        """
        if self is TpOverlap.COLLECTIVE_MATMUL:
            return TpOverlap.GEMM if sequence_parallel and windowed_einsum else TpOverlap.NONE
        return self


class SelectiveRecompute(StrEnum):
    """What a framework's "selective" activation recompute re-runs (see `costmodel.inputs.layout.Recompute`)."""

    ATTENTION_CORE = "selective"
    PER_OP = "selective-op"
    PER_LAYER = "selective-layer"


# Marks a field that names or cites a preset rather than states a fact: it is not in `FACTS`,
# so it gets no `plan` flag and `plan`'s preset list does not compare it.
_NOT_A_FACT: dict[str, Any] = {"fact": False}


class SoftwareStack(BaseModel):
    """The facts of one training framework that move step time (frozen).

    Each fact's description is also the help of its `plan` flag (``tp_overlap`` is ``--tp-overlap``).
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str = Field("custom", description="Preset name, or 'custom' once a fact is overridden.",
                      json_schema_extra=_NOT_A_FACT)
    citation: str = Field("", description="Where each fact was read: repository, file and commit.",
                          json_schema_extra=_NOT_A_FACT)
    attention: Attention = Field(
        Attention.FLASH, description="Attention kernel: flash, fused, never writes the S×S scores (FlashAttention, "
        "TE fused attention, the JAX program's blockwise attention); materialized, the S×S scores written out and read back.")
    dp_overlap: bool = Field(
        True, description="Data-parallel gradient reduction and ZeRO/FSDP parameter gathers overlap compute (bucketed "
        "reduction behind the backward, gathers prefetched behind the neighbouring layer); False: all of it on the "
        "critical path.")
    fused_elementwise: bool = Field(
        True, description="Activations, RoPE and residual adds run as fused kernels; False: one kernel per op (eager PyTorch), "
        "so a gated MLP also keeps its activation's output (silu keeps its input, the multiply both of its operands).")
    fused_norm: bool = Field(
        True, description="Each normalisation is one fused kernel; False: op by op (eager RMSNorm: fp32 upcast, pow, mean, "
        "rsqrt, two multiplies).")
    tp_overlap: TpOverlap = Field(
        TpOverlap.NONE, description="Which tensor-parallel collectives hide behind GEMMs: none; backward, the input "
        "gradient's reduction behind the weight-gradient GEMM (Megatron-LM's asynchronous TP); gemm, every collective "
        "pipelined in chunks with its GEMM (TransformerEngine's userbuffer overlap); collective-matmul, as gemm under "
        "sequence parallelism and as none without it (XLA's windowed einsum decomposes all-gathers and reduce-scatters "
        "beside GEMMs, not all-reduces).")
    dropout: bool = Field(
        True, description="Trains a LayerNorm (GPT-2/Megatron-style) model with its dropout: fused dropout kernels after "
        "the attention probabilities and each block's output. False: no dropout (this project's JAX program has none).")
    zero_over_context: bool = Field(
        True, description="ZeRO and FSDP shard over the data and context-parallel ranks together, every rank of a "
        "context group holding its own share (Megatron-Core's DDP and distributed optimizer over "
        "get_data_parallel_group(with_context_parallel=True), megatron/training/training.py; torchtitan's FSDP over "
        "the flattened dp_shard_cp mesh, docs/composability.md; DeepSpeed under EasyContext, whose ZeRO world is every "
        "rank). False: over the data ranks only (this project's JAX program splits over the data axes, "
        "planner/shardings.py). Either way the gradients are summed over both.")
    overlap_param_gather: bool = Field(
        True, description="With ZeRO 1-2, the all-gather of the updated parameters runs behind the next step's first "
        "forward (Megatron-Core's --overlap-param-gather, DeepSpeed's and FSDP's prefetch); False: it ends the step, "
        "exposed (a jitted JAX step returns its parameters whole).")
    fused_projections: bool = Field(
        True, description="Q, K and V are one GEMM, and so are the MLP's input and gate (Megatron-LM's linear_qkv and "
        "linear_fc1): under tensor parallelism backward all-reduces each block's input gradient once. False: one GEMM "
        "per weight matrix, whose partial input gradients XLA all-reduces one by one (this project's JAX program: "
        "`validate.predict`, checked against the compiled HLO).")
    batch_major: bool = Field(
        False, description="Activations [batch, seq, hidden] (DeepSpeed, PyTorch FSDP, torchtitan): a sequence-parallel "
        "gather or reduce-scatter over the inner sequence axis copies its buffer when micro_batch > 1. "
        "False: [seq, batch, hidden] or a compiler picks the layout.")
    reentrant_recompute: bool = Field(
        False, description="Recompute re-runs a layer's whole forward, last GEMM and collective included (reentrant "
        "checkpointing, Megatron-LM's CheckpointFunction); False: it stops at the last tensor backward needs (non-reentrant "
        "checkpointing, JAX remat).")
    fsdp_copy_out: bool = Field(
        False, description="With ZeRO-3, each gathered parameter is copied out of the all-gather buffer on the compute "
        "stream (PyTorch's per-parameter FSDP2); False: compute reads the gathered buffer.")
    fused_grad_accumulation: bool = Field(
        False, description="Weight-gradient GEMMs add into the accumulator themselves (Megatron-LM's "
        "gradient-accumulation fusion); False: each micro-batch's gradient is written, then added by an HBM-bound kernel.")
    reduce_every_micro_batch: bool = Field(
        False, description="With ZeRO-2, gradients are reduce-scattered after every micro-batch's backward, not only the "
        "last (DeepSpeed; ZeRO-3 always does). False: after the last only, so several micro-batches' gradients are summed "
        "whole, as under ZeRO 1 (Megatron's distributed optimizer: one whole gradient buffer).")
    overlap_p2p: bool = Field(
        False, description="In the interleaved pipeline schedule, each stage-to-stage send and receive is posted "
        "asynchronously and waited on only where the next chunk needs it, so it runs behind the micro-step beside it "
        "(Megatron-Core's overlap_p2p_comm); "
        "False: blocking send/recv pairs. The non-interleaved schedule always blocks.")
    per_chunk_grad_reduce: bool = Field(
        False, description="In the interleaved schedule, each model chunk's gradients are reduced as soon as its last "
        "micro-batch's backward is done, behind the backward the other chunks still have to run; the last chunk's after "
        "the schedule ends (Megatron-Core @f2e5db4 core/pipeline_parallel/schedules.py "
        "forward_backward_pipelining_with_interleaving: grad_sync_func per chunk, --delay-grad-reduce on by default). "
        "False: a stage's gradients are reduced behind its last micro-batch's backward only.")
    lockstep_pipeline: bool = Field(
        False, description="Pipeline stages step in lockstep as one SPMD program runs them, a hand-off taking a whole step "
        "of its loop (`costmodel.step.lockstep`): without interleaving each stage's backward split in two by its layers, one "
        "of three operations a slot, S micro-batches in flight and 1F1B's bubble, the head once a period of three slots on "
        "every device; interleaved, one chunk's forward and backward on every device per tick, 2v·S − 1 chunks of residuals "
        "kept and computing through the bubble ticks. False: stages alternate asynchronously and stage s keeps S − s "
        "(Megatron-LM's 1F1B).")
    fused_cross_entropy: bool = Field(
        True, description="The loss over the vocabulary runs as one fused softmax-cross-entropy (XLA, Inductor, PyTorch's "
        "log_softmax + nll); False: Megatron's vocab-parallel cross-entropy, op by op over an fp32 copy of the logits "
        "(cast, max, subtract, exp, sum, divide; backward a multiply and the cast back).")
    loss_buffers: Literal[2, 3, 4] = Field(
        2, description="fp32 logit-sized buffers one micro-batch's loss holds at its peak: 2 where the softmax "
        "cross-entropy is one kernel pair over the logits (the logits and their gradient: XLA, Megatron, Inductor); 3 for "
        "Hugging Face's causal-LM loss in eager PyTorch (transformers' LlamaForCausalLM and Qwen's modeling_qwen.py: the "
        "logits upcast to fp32 or autocast, shift_logits.contiguous(), CrossEntropyLoss keeping its log-softmax output for "
        "backward, whose gradient and input gradient then exist beside it); 4 where the training loop also keeps the "
        "model's output, the fp32 logits, alive through the backward (Answer.AI's fsdp_qlora train.py: output = None only "
        "after loss.backward()).")
    cross_entropy_chunks: int = Field(
        1, ge=1, description="The head's vocabulary projection and the loss run over this many pieces of each sequence, "
        "one after another, and the backward forms each piece's fp32 logits again: one piece's logits (and their "
        "gradient) exist at a time, for one more head GEMM and loss pass (this project's JAX program: "
        "planner/programs/train_step.py chunked_head_loss; the same bound as Liger-Kernel's fused linear cross-entropy, "
        "src/liger_kernel/ops/fused_linear_cross_entropy.py, and torchtune's CEWithChunkedOutputLoss, "
        "torchtune/modules/loss/ce_chunked_output_loss.py, 8 chunks). 1: every logit at once.")
    fp8_kept_casts: bool = Field(
        True, description="Under the fp8 recipe (--precision fp8) a linear layer keeps its input for backward as the fp8 "
        "cast it made, and each layer weight's fp8 cast and transpose stay resident between micro-batches (Transformer Engine @0004dbd "
        "transformer_engine/pytorch/module/linear.py; torchao Float8Linear keeps its fp8 input too); False: the 16-bit "
        "inputs are kept and every cast is redone where used (this project's JAX program, whose remat policy saves the "
        "inputs by name).")
    fp8_param_gather: bool = Field(
        False, description="Under the fp8 recipe (--precision fp8) the layers' weights are kept and all-gathered (ZeRO 1-3) "
        "as fp8 (Transformer Engine's fp8_model_init, Megatron-LM's --fp8-param-gather, torchao's "
        "enable_fsdp_float8_all_gather); False: as bf16, cast to fp8 after the gather.")
    eager_adapters: bool = Field(
        True, description="LoRA adapters' dropout, alpha/r scale and add run as kernels of their own (NeMo's "
        "ParallelLinearAdapter @b2eccd2, Hugging Face PEFT's LoRA layer); False: a compiler fuses them into the "
        "neighbouring kernels (XLA, Inductor).")
    fsdp_frozen_grads: bool = Field(
        False, description="With ZeRO-3 under LoRA, a layer's frozen weights share one FSDP flat parameter with its "
        "adapters and so get a gradient, in the dtype they are held in, and their weight-gradient GEMMs run (FSDP1 with "
        "use_orig_params=True: 'the gradient memory usage will be higher than expected (namely, equivalent to not "
        "freezing those parameters)', pytorch/pytorch torch/distributed/fsdp/fully_sharded_data_parallel.py; Lit-GPT); "
        "False: frozen weights have no gradient.")
    unsharded_grad_accumulation: bool = Field(
        False, description="With ZeRO 2-3 and several micro-batches, gradients are accumulated unsharded and "
        "reduce-scattered after the last micro-batch only (FSDP1's no_sync: 'FSDP will accumulate the full model "
        "gradients (instead of gradient shards) until the eventual sync', as Lit-GPT runs it); False: sharded after every "
        "micro-batch.")
    adapter_dropout_saved: bool = Field(
        False, description="Under LoRA with adapter dropout, each dropout keeps its output (A's input) and a one-byte mask "
        "for backward, apart from the tensor it read (an eager nn.Dropout: PyTorch native_dropout saves its bool mask; "
        "Lit-GPT @8641822 lit_gpt/lora.py F.linear(self.lora_dropout(x), self.lora_A)); False: A's input is counted as "
        "the matmul input itself (not checked against NeMo's or PEFT's code, which keep their presets' count).")
    fused_qkv_views: bool = Field(
        False, description="q, k and v are one fused linear layer whose output attention reads through views (Lit-GPT "
        "@8641822 lit_gpt/model.py CausalSelfAttention: qkv.view/permute/split, then reshape): with as many kv heads as "
        "query heads v stays a view, so the kernel's saved v keeps the whole fused output alive beside the roped copies "
        "of q and k; with grouped kv heads, k and v are expanded to every query head and copied. LoRA adapters on q, k, v "
        "share that layer's one dropout (lit_gpt/lora.py LoRAQKVLinear). False: separate q, k, v tensors, one dropout per "
        "adapter (Hugging Face PEFT on q_proj/v_proj).")
    bnb_4bit_saves_input: bool = Field(
        False, description="Under LoRA over NF4 frozen weights (--frozen-dtype nf4 / nf4-dq), every 4-bit linear keeps "
        "its input for backward although its weight is frozen: bitsandbytes 0.41.0-0.43.1 MatMul4Bit.forward saves "
        "ctx.tensors = (A, B) whenever any input needs a gradient (bitsandbytes/autograd/_functions.py; 0.43.2, #1270, "
        "saves (None, B); the version of Lit-GPT's runs); False: a frozen linear keeps no input (bitsandbytes >= 0.43.2, "
        "PyTorch's own linear).")
    selective_recompute: SelectiveRecompute = Field(
        SelectiveRecompute.ATTENTION_CORE, description="What this framework's 'selective' recompute (--recompute "
        "selective) re-runs: selective, the attention core (Megatron-LM, Korthikanti et al. 2022); selective-op, per op, "
        "keeping matmul and attention outputs but every second matmul's; selective-layer, every second layer whole "
        "(torchtitan's selective activation checkpointing).")
    fp32_weights: bool = Field(
        False, description="The trained weights are held in fp32 as the optimizer's master copy (no compute-dtype copy) "
        "and cast to the compute dtype by a kernel where each is used, every forward and every recomputed forward (with "
        "ZeRO-3 XLA casts the shard before gathering it); unless `manual_data_parallel`, their gradients are all-reduced "
        "where their partial sums appear, inside the accumulation loop (every micro-batch; a layer's in the compute "
        "dtype), and accumulated in fp32, with ZeRO >= 1 in the optimizer state's data split (this project's JAX "
        "program: `p.astype(dtype)`, planner/programs/train_step.py, validate/lowering.py). Not under ZeRO 1-2 where "
        "`manual_data_parallel` forms the gradients locally: there a compute-dtype copy beside the master split with the "
        "moments, gathered in the compute dtype (`costmodel.step.kernels.keeps_compute_copy`). False: compute-dtype weights "
        "beside the fp32 master in the optimizer state, written once per step by the update, gradients split only from "
        "ZeRO 2 (Megatron-LM's mixed-precision optimizer, DeepSpeed, FSDP's MixedPrecision).")
    manual_data_parallel: bool = Field(
        False, description="The step forms each data replica's gradients on its own devices, accumulating them locally "
        "in fp32 (under ZeRO 0-1 each layer's added as the backward forms it, so one layer's exists at a time: "
        "planner/programs/accumulate.py) and reducing them as the ZeRO stage needs: once per step after the micro-batch loop for ZeRO 0 "
        "(all-reduce) and 1 (reduce-scatter, the whole fp32 gradient held until then), after each micro-batch's backward "
        "for ZeRO 2 (reduce-scatter), per layer for ZeRO 3 (the transpose of the layer's compute-dtype gather); ZeRO 0-2 "
        "beside tensor axes too (dense models), ZeRO 3 where data parallelism is the only parallelism (this project's "
        "JAX program: validate/data_parallel_region.py). False: as `fp32_weights` and the other facts say.")
    moe_capacity_factor: float | None = Field(
        None, gt=0, description="MoE layers give each expert a buffer of this many times its even share of a sequence's "
        "routed tokens, computed and kept for backward whether filled or not (GShard / Switch Transformer capacity; this "
        "project's JAX program: 1.25, planner/programs/transformer.py); None: dropless, each expert runs the tokens routed "
        "to it (Megatron-Core @f2e5db4: --moe-expert-capacity-factor unset by default).")


_MEGATRON = "NVIDIA/Megatron-LM"
_TITAN = "pytorch/torchtitan"

FACTS: tuple[str, ...] = tuple(name for name, field in SoftwareStack.model_fields.items()
                               if field.json_schema_extra != _NOT_A_FACT)
"""`SoftwareStack`'s facts, in declaration order: every field but the preset's name and citation."""

STACKS: dict[str, SoftwareStack] = {s.name: s for s in (
    SoftwareStack(
        name="jax", tp_overlap=TpOverlap.COLLECTIVE_MATMUL, fp8_kept_casts=False, eager_adapters=False, lockstep_pipeline=True,
        fused_projections=False,
        fp32_weights=True, manual_data_parallel=True, dropout=False, overlap_param_gather=False, moe_capacity_factor=1.25,
        zero_over_context=False,
        citation="This project's reference program (planner/programs): jax.jit with XLA fusion, jax.checkpoint "
        "remat, cuDNN's fused attention on a GPU (jax.nn.dot_product_attention) and a blockwise flash-style kernel "
        "elsewhere, gradients summed in a scan over micro-batches, one matmul per weight "
        "matrix (wq, wk, wv; w_in, w_gate), pipelines as one lockstep SPMD loop (validate/split_backward.py; interleaved, "
        "validate/one_f_one_b.py); what "
        "`plan validate` lowers. Compiled on a GPU with XLA's collective matmul "
        "(planner/programs/xla_options.py: --xla_gpu_threshold_for_windowed_einsum_mib=0, "
        "--xla_gpu_multi_streamed_windowed_einsum=true, as NVIDIA JAX-Toolbox's rosetta/docs/GPU_performance.md and its "
        "collective-matmul test set them; not yet timed on more than one GPU here).",
    ),
    SoftwareStack(
        name="maxtext", tp_overlap=TpOverlap.GEMM, eager_adapters=False, fused_projections=False, fp32_weights=True,
        dropout=False,
        citation="AI-Hypercomputer/maxtext @e591f30: XLA GSPMD with the latency-hiding scheduler "
        "(docs/run_maxtext/run_maxtext_single_host_gpu.md, --xla_gpu_enable_latency_hiding_scheduler=true; "
        "benchmarks/xla_flags_library.py, --xla_tpu_enable_async_collective_fusion) and collective matmul "
        "(benchmarks/maxtext_trillium_model_configs.py: configs with and without it); jax.checkpoint remat policies; "
        "src/maxtext/configs/base.yml: weight_dtype float32 with dtype bfloat16 (fp32 weights cast per use), "
        "fused_qkv and fused_mlp false (one matmul per weight matrix), dropout_rate 0.0, capacity_factor -1 (dropless).",
    ),
    SoftwareStack(
        name="megatron-lm-2021", attention=Attention.MATERIALIZED, reentrant_recompute=True, fused_cross_entropy=False,
        citation=f"{_MEGATRON} @ec20274 (Aug 2021): megatron/mpu/random.py CheckpointFunction (reentrant "
        "torch.autograd.Function: re-runs the whole layer); megatron/arguments.py --masked-softmax-fusion, "
        "--bias-gelu-fusion, --bias-dropout-fusion (fused elementwise); [s, b, h] activations; no asynchronous TP "
        "or gradient-accumulation fusion yet; --DDP-impl local (default) reduces after the last backward; "
        "megatron/mpu/cross_entropy.py _VocabParallelCrossEntropy op by op on output.float() (megatron/model/gpt_model.py, "
        "--fp16-lm-cross-entropy off).",
    ),
    SoftwareStack(
        name="megatron-lm-2022", attention=Attention.MATERIALIZED, reentrant_recompute=True, tp_overlap=TpOverlap.BACKWARD,
        fused_grad_accumulation=True, fused_cross_entropy=False,
        citation=f"{_MEGATRON} @2755bcb (Jun 2022): megatron/arguments.py --no-async-tensor-model-parallel-allreduce "
        "and --no-gradient-accumulation-fusion (both on by default); megatron/mpu/layers.py "
        "LinearWithGradAccumulationAndAsyncCommunication; reentrant CheckpointFunction and op-by-op "
        "mpu/cross_entropy.py as in 2021.",
    ),
    SoftwareStack(
        name="megatron-core", reentrant_recompute=True, tp_overlap=TpOverlap.GEMM, fused_grad_accumulation=True,
        fused_cross_entropy=False, overlap_p2p=True, per_chunk_grad_reduce=True,
        citation=f"{_MEGATRON} @f2e5db4 (Jul 2024): megatron/core/model_parallel_config.py tp_comm_overlap "
        "(ag/rs split pipelined with the GEMM, bulk dgrad/wgrad) via TransformerEngine userbuffers "
        "(core/transformer/custom_layers/transformer_engine.py); training/arguments.py --overlap-grad-reduce, "
        "--overlap-param-gather (requires --use-distributed-optimizer), bf16 accumulates and all-reduces gradients in "
        "fp32; TE fused attention; core/tensor_parallel/random.py CheckpointFunction (reentrant); "
        "core/tensor_parallel/cross_entropy.py VocabParallelCrossEntropy op by op on logits.float() "
        "(--cross-entropy-loss-fusion off by default, not among the README runs' flags); training/arguments.py "
        "--no-overlap-p2p-communication (overlap on by default; validate_args turns it off without a virtual pipeline) "
        "and core/pipeline_parallel/schedules.py forward_backward_pipelining_with_interleaving (isend/irecv, waited "
        "before the chunk that needs them); core/pipeline_parallel/schedules.py grad_sync_func launched per model chunk "
        "after its last backward (training/training.py, --delay-grad-reduce default).",
    ),
    SoftwareStack(
        name="deepspeed", batch_major=True, reduce_every_micro_batch=True, fused_elementwise=False, fused_norm=False,
        citation="deepspeedai/DeepSpeed @aecfec7 (Jun 2024): runtime/engine.py allreduce_gradients ('ZeRO stage >= 2 "
        "communicates during non gradient accumulation boundaries as well'); runtime/zero/partitioned_param_coordinator.py "
        "fetches ZeRO-3 parameters per submodule in trace order with prefetch (stage3_prefetch_bucket_size) into "
        "buffers compute reads in place; overlap_comm; eager PyTorch kernels; activation checkpointing non-reentrant "
        "in the models it wraps (Hugging Face).",
    ),
    SoftwareStack(
        name="megatron-deepspeed", attention=Attention.MATERIALIZED, reentrant_recompute=True, reduce_every_micro_batch=True,
        fused_cross_entropy=False,
        citation="deepspeedai/Megatron-DeepSpeed (Megatron-LM 2021 fork): Megatron's fused kernels and reentrant "
        "CheckpointFunction and op-by-op vocab-parallel cross-entropy, [s, b, h] activations; ZeRO from DeepSpeed "
        "@aecfec7 runtime/engine.py (ZeRO-2 reduces every micro-batch); no asynchronous TP.",
    ),
    SoftwareStack(
        name="pytorch-fsdp1", batch_major=True, fused_elementwise=False, fused_norm=False,
        citation="pytorch/pytorch @v2.3.0 torch/distributed/fsdp/_flat_param.py: FlatParameter all-gathered into one flat "
        "buffer whose views compute reads (no copy-out); backward_prefetch=BACKWARD_PRE, limit_all_gathers; "
        "as Composer / llm-foundry wrap it: eager kernels, non-reentrant checkpoint_wrapper.",
    ),
    SoftwareStack(
        name="lit-gpt", batch_major=True, fused_elementwise=False, fused_norm=False, fsdp_frozen_grads=True,
        unsharded_grad_accumulation=True, bnb_4bit_saves_input=True, fused_qkv_views=True,
        adapter_dropout_saved=True,
        citation="Lightning-AI/litgpt @8641822 (Oct 2023) finetune/lora.py: eager PyTorch model (lit_gpt/model.py), "
        "on several GPUs Fabric's FSDPStrategy(auto_wrap_policy={Block}, activation_checkpointing_policy={Block}) "
        "wrapping each Block's frozen weights and LoRA adapters into one flat parameter (FSDP1, use_orig_params: the "
        "mixed requires_grad runs), and fabric.no_backward_sync(model, enabled=is_accumulating) on every micro-batch "
        "but the last of a step (Lightning Fabric _FSDPBackwardSyncControl: module.no_sync()); quantized runs on "
        "Fabric's BitsandbytesPrecision with bitsandbytes 0.41.1 (the resource table's), whose MatMul4Bit keeps its input.",
    ),
    SoftwareStack(
        name="torchtitan", batch_major=True, fused_elementwise=False, fused_norm=False, fsdp_copy_out=True,
        selective_recompute=SelectiveRecompute.PER_OP,
        citation=f"{_TITAN} @9dec370: torchtitan/parallelisms/parallelize_llama.py fully_shard (FSDP2, per-parameter: "
        "pytorch/pytorch @v2.5.0 torch/distributed/_composable/fsdp/_fsdp_collectives.py copies each parameter out of "
        "the all-gather output), ptd_checkpoint_wrapper (non-reentrant); train_configs/llama3_8b.toml compile=false, norm_type=rmsnorm, "
        "selective_ac_option='op'; DTensor [batch, seq, hidden] sequence parallelism; vanilla (not async) TP.",
    ),
    SoftwareStack(
        name="hf-trainer", batch_major=True, fused_elementwise=False, fused_norm=False, fused_cross_entropy=False, loss_buffers=3,
        reentrant_recompute=True, adapter_dropout_saved=True,
        citation="huggingface/transformers Trainer over an eager PyTorch model (@0022728 src/transformers/models/llama/"
        "modeling_llama.py LlamaForCausalLM.forward: logits.float(), logits[..., :-1, :].contiguous(), CrossEntropyLoss), "
        "gradient_checkpointing_enable() with torch.utils.checkpoint's reentrant default of that time; one process per GPU "
        "with DDP (no_sync while accumulating: one reduction per step) unless Accelerate hands it to FSDP or DeepSpeed, whose "
        "presets then apply with this loss (stack option hf_loss); PEFT's LoRA adapters run eager and keep their dropout's "
        "output (huggingface/peft src/peft/tuners/lora/layer.py Linear.forward, read through the code search, commit "
        "not pinned: lora_B(lora_A(dropout(x))) * scaling).",
    ),
    SoftwareStack(
        name="torchtune", batch_major=True, fused_elementwise=False, fused_norm=False, fsdp_copy_out=True,
        cross_entropy_chunks=8,
        citation="pytorch/torchtune @1bf50ae recipes/full_finetune_distributed.py (and the LoRA recipes): "
        "training.shard_model (FSDP2 fully_shard per layer, reshard_after_forward, cpu_offload optional), "
        "training.set_activation_checkpointing(auto_wrap_policy={TransformerSelfAttentionLayer}); "
        "@ce5433b torchtune/modules/loss/ce_chunked_output_loss.py CEWithChunkedOutputLoss(num_output_chunks=8): "
        "the output projection and loss in 8 pieces; eager PyTorch kernels (its optional compile not modelled).",
    ),
    SoftwareStack(
        name="torchtitan-compile", batch_major=True, fsdp_copy_out=True, eager_adapters=False,
        selective_recompute=SelectiveRecompute.PER_OP,
        citation=f"{_TITAN} @9dec370: as 'torchtitan' with compile=true (train_configs/*.toml, parallelize_llama.py "
        "torch.compile per TransformerBlock): Inductor fuses elementwise ops and norms; FSDP2 copy-out unchanged.",
    ),
)}

# Per-run deviations from a preset, as the published-runs CSV's `stack_options` names them.
STACK_OPTIONS: dict[str, dict[str, Any]] = {
    # torchtitan's Triton fused RMSNorm (norm_type="fused_rmsnorm", train_configs/llama_7b.toml @395a526).
    "fused_rmsnorm": {"fused_norm": True},
    # Hugging Face's causal-LM loss (`SoftwareStack.loss_buffers`) under another preset's sharding (Accelerate + FSDP or DeepSpeed).
    "hf_loss": {"loss_buffers": 3, "fused_cross_entropy": False},
    # The same loss where the loop keeps the model's output (its fp32 logits) through the backward (fsdp_qlora's train.py).
    "hf_loss_output_kept": {"loss_buffers": 4, "fused_cross_entropy": False},
}


def stack_with(stack: str | SoftwareStack, **overrides: Any) -> SoftwareStack:
    """A preset (by name) or a stack with single facts overridden; renamed 'custom' when any fact changes.
    Every override is a value, None included (`SoftwareStack.moe_capacity_factor` None: dropless):
    pass only the facts given.

    >>> stack_with("megatron-core", tp_overlap="none").name, stack_with("jax", attention="flash").name
    ('custom', 'jax')
    >>> stack_with("jax", moe_capacity_factor=None).moe_capacity_factor is None
    True
    """
    base = get_stack(stack) if isinstance(stack, str) else stack
    changed = {k: v for k, v in overrides.items() if k not in SoftwareStack.model_fields or v != getattr(base, k)}
    if not changed:
        return base
    try:
        return SoftwareStack.model_validate({**base.model_dump(), **changed, "name": "custom"})
    except ValidationError as err:
        raise InvalidConfigError(f"stack {base.name!r} with {changed}: {err.errors()[0]['msg']}",
                                 fix="see `plan simulate --help` for each fact's values") from None


def get_stack(name: str) -> SoftwareStack:
    """The preset called ``name``.

    >>> get_stack("deepspeed").reduce_every_micro_batch
    True
    """
    if name not in STACKS:
        raise unknown_name_error("software stack", name, list(STACKS))
    return STACKS[name]


def apply_options(stack: SoftwareStack, options: str) -> SoftwareStack:
    """``stack`` with the ';'-separated `STACK_OPTIONS` named in ``options`` applied.

    >>> apply_options(STACKS["torchtitan"], "fused_rmsnorm").fused_norm
    True
    """
    names = [o.strip() for o in options.split(";") if o.strip()]
    unknown = [n for n in names if n not in STACK_OPTIONS]
    if unknown:
        raise unknown_name_error("stack option", unknown[0], list(STACK_OPTIONS))
    update: dict[str, Any] = {}
    for n in names:
        update.update(STACK_OPTIONS[n])
    return stack_with(stack, **update)
