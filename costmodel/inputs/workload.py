"""The settings of the workloads (`costmodel.workloads`, one typed object each): LoRA's and serving's.

A workload is one of the three typed inputs (cluster, software stack, workload). Pretraining
and full fine-tuning run the same step (every weight trains, AdamW state for all of them), so
the cost model treats them alike. LoRA fine-tuning (Hu et al. 2021) freezes every base weight
and trains, beside each targeted matrix ``W`` (``d_in × d_out``), two small matrices
``A`` (``d_in × r``) and ``B`` (``r × d_out``): ``y = x·W + (x·A)·B · alpha / r``. Frozen
weights have no gradient, no optimizer state and no fp32 master copy, and may be stored
quantized (weight-only int8 or int4, or NF4 with block scales as QLoRA's bitsandbytes stores
them); the adapters train in fp32
with AdamW like any weight. Inference workloads (prefill: one forward over whole prompts;
decode: one token per sequence per step against a KV cache) hold weights only, no gradients
or optimizer state; `InferenceConfig` has their settings and `costmodel.step.inference` their costs.
`WorkloadKind` lists the ``--workload`` names.

>>> lora = LoraConfig(rank=16)
>>> m = ModelConfig(name="m", hidden_size=4096, num_layers=1, num_heads=32, num_kv_heads=8, ffn_size=14336, vocab_size=8)
>>> [(a.name, a.d_in, a.d_out, a.split) for a in adapted_matrices(m, lora)]
[('wq', 4096, 4096, 'column'), ('wk', 4096, 1024, 'column'), ('wv', 4096, 1024, 'column'), ('wo', 4096, 4096, 'row')]
>>> int(adapter_params_per_layer(m, lora))  # 16 · (8192 + 5120 + 5120 + 8192)
425984
>>> int(adapter_params_per_layer(m, LoraConfig(rank=8, targets="q,v")))  # Lit-GPT's default: 8 · (8192 + 5120)
106496
"""

from __future__ import annotations

from collections.abc import Iterable
from enum import StrEnum

from pydantic import BaseModel, ConfigDict, Field, NonNegativeFloat, PositiveFloat, PositiveInt, field_validator, model_validator

from costmodel.errors import InvalidConfigError, UnsupportedError
from costmodel.inputs.model_config import ModelConfig, Norm
from costmodel.inputs.serving_stack import ServingStack, get_serving_stack


class WorkloadKind(StrEnum):
    """Which step is planned (``--workload``)."""

    PRETRAIN = "pretrain"
    FINETUNE_FULL = "finetune-full"
    FINETUNE_LORA = "finetune-lora"
    PREFILL = "prefill"
    DECODE = "decode"


class LoraGroup(StrEnum):
    """The two groups of a layer's matrices, each a shorthand for its targets (``--lora-targets attn``)."""

    ATTN = "attn"
    MLP = "mlp"

    @property
    def targets(self) -> tuple[LoraTarget, ...]:
        """The matrices of the group, in the layer's order."""
        return tuple(t for t in LoraTarget if t.group is self)


class LoraTarget(StrEnum):
    """One matrix of a layer that may carry an adapter: the attention projections q, k, v, o,
    or the MLP's gate, up and down projections (a non-gated MLP has no gate)."""

    Q = "q"
    K = "k"
    V = "v"
    O = "o"  # noqa: E741 (the output projection's usual name)
    GATE = "gate"
    UP = "up"
    DOWN = "down"

    @property
    def group(self) -> LoraGroup:
        """attn for q, k, v, o; mlp for gate, up, down."""
        return LoraGroup.ATTN if self in (LoraTarget.Q, LoraTarget.K, LoraTarget.V, LoraTarget.O) else LoraGroup.MLP


_QKV = frozenset({LoraTarget.Q, LoraTarget.K, LoraTarget.V})


def parse_lora_targets(names: str | Iterable[str]) -> tuple[LoraTarget, ...]:
    """Target names (matrices, or the groups attn and mlp as shorthands), comma-separated text
    or a sequence, as matrices in the layer's order without repeats; an unknown name is a ``ValueError``.

    >>> parse_lora_targets("v, q")
    (<LoraTarget.Q: 'q'>, <LoraTarget.V: 'v'>)
    >>> [t.value for t in parse_lora_targets(["mlp", "o"])]
    ['o', 'gate', 'up', 'down']
    """
    items = [str(n).strip() for n in (names.split(",") if isinstance(names, str) else names)]
    groups, matrices = {g.value for g in LoraGroup}, {t.value for t in LoraTarget}
    bad = [n for n in items if n not in groups | matrices]
    if bad:
        raise ValueError(f"{bad[0]!r} is not a LoRA target; use q, k, v, o, gate, up, down or the groups attn, mlp (e.g. q,v)")
    chosen = {t for n in items for t in (LoraGroup(n).targets if n in groups else (LoraTarget(n),))}
    return tuple(t for t in LoraTarget if t in chosen)


# bitsandbytes' 4-bit storage (bitsandbytes-foundation/bitsandbytes @0.41.0, functional.py quantize_4bit):
# one fp32 absmax per block of 64 weights; double quantization (compress_statistics) stores those
# absmax as 8-bit codes (quantize_blockwise) with one fp32 absmax per 256 of them.
NF4_BLOCK_WEIGHTS = 64
NF4_DQ_BLOCK_SCALES = 256
_FP32_BYTES = 4.0


class FrozenDtype(StrEnum):
    """How the frozen base weight matrices are stored: 16-bit, weight-only int8/int4 (cast to
    the compute dtype on use), bitsandbytes' NF4 (QLoRA's 4-bit NormalFloat with its block
    scales; ``nf4-dq`` with the scales double-quantized), or fp8 e4m3 read by the fp8 GEMMs as
    stored (NeMo's ``fp8_params``, Transformer Engine's ``fp8_model_init``; only under the fp8
    recipe). int8/int4 count no scales (per-channel: under 0.1 % of the weights); NF4 counts
    bitsandbytes' (`bytes`); fp8 has one per tensor. A per-tensor constant (NF4's 16-entry code
    and double quantization's offset and 256-entry code) is left out.

    >>> FrozenDtype.NF4.bytes, round(FrozenDtype.NF4_DQ.bytes, 6)  # 0.5 + 4/64; 0.5 + 1/64 + 4/(64*256)
    (0.5625, 0.515869)
    """

    BF16 = "bf16"
    INT8 = "int8"
    INT4 = "int4"
    NF4 = "nf4"
    NF4_DQ = "nf4-dq"
    FP8 = "fp8"

    @property
    def bytes(self) -> float:
        """Bytes per stored weight, its share of the block scales included (int4 and NF4 pack two codes in a byte)."""
        if self is FrozenDtype.NF4:
            return 0.5 + _FP32_BYTES / NF4_BLOCK_WEIGHTS
        if self is FrozenDtype.NF4_DQ:
            return 0.5 + 1 / NF4_BLOCK_WEIGHTS + _FP32_BYTES / (NF4_BLOCK_WEIGHTS * NF4_DQ_BLOCK_SCALES)
        return {FrozenDtype.BF16: 2.0, FrozenDtype.INT8: 1.0, FrozenDtype.INT4: 0.5, FrozenDtype.FP8: 1.0}[self]

    @property
    def is_bitsandbytes(self) -> bool:
        """NF4 as bitsandbytes stores and multiplies it (``Linear4bit``, ``MatMul4Bit``)."""
        return self in (FrozenDtype.NF4, FrozenDtype.NF4_DQ)

    def require_lowerable(self) -> None:
        """Raise `UnsupportedError` (one line) for a storage the reference program cannot hold: NF4 has no JAX format.

        >>> FrozenDtype.INT4.require_lowerable()
        >>> try:
        ...     FrozenDtype.NF4.require_lowerable()
        ... except UnsupportedError as err:
        ...     print(str(err).split(":")[0])
        nf4 frozen weights (bitsandbytes NF4 with block scales) are not lowered
        """
        if self.is_bitsandbytes:
            raise UnsupportedError(f"{self.value} frozen weights (bitsandbytes NF4 with block scales) are not lowered: the "
                                   "reference program has no NF4 format, so the validator cannot check them",
                                   fix="plan and simulate them; validate the same plan with --frozen-dtype int4")

    @property
    def jax_name(self) -> str:
        """The numpy/JAX dtype name the reference program stores them in (`require_lowerable` first)."""
        self.require_lowerable()
        return {FrozenDtype.BF16: "bfloat16", FrozenDtype.INT8: "int8", FrozenDtype.INT4: "int4",
                FrozenDtype.FP8: "float8_e4m3fn"}[self]


class WeightKernel(StrEnum):
    """The GEMM kernel an int4 weight-only model runs (`costmodel.step.weight_kernels` costs each):
    ``fused`` dequantizes inside the GEMM and reads each weight once (Marlin, TensorRT-LLM's
    weight-only kernels, gpt-fast's tinygemm, this project's JAX program); ``autogptq-cuda-old``
    and ``exllama`` are the GPTQ kernels AutoGPTQ and Hugging Face optimum dispatch, which
    dequantize again for every input row below a row threshold and into a 16-bit copy above it."""

    FUSED = "fused"
    AUTOGPTQ_CUDA_OLD = "autogptq-cuda-old"
    EXLLAMA = "exllama"


class KvCacheDtype(StrEnum):
    """How the serving KV cache is stored (vLLM's ``--kv-cache-dtype``): ``auto`` keeps the
    compute dtype, ``fp8`` stores e4m3 with a per-tensor scale (TensorRT-LLM's
    ``--kv_cache_dtype fp8``), read back to the compute dtype inside the attention kernel."""

    AUTO = "auto"
    FP8 = "fp8"

    def bytes(self, compute_bytes: float) -> float:
        """Bytes per cached element when the model computes in ``compute_bytes``-byte floats.

        >>> KvCacheDtype.AUTO.bytes(2), KvCacheDtype.FP8.bytes(2)
        (2, 1)
        """
        return 1 if self is KvCacheDtype.FP8 else compute_bytes


class LoraConfig(BaseModel):
    """LoRA's settings: rank, which matrices get adapters, how the frozen weights are stored."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    rank: PositiveInt = Field(16, description="Adapter rank r (inner width of A and B).")
    targets: tuple[LoraTarget, ...] = Field(LoraGroup.ATTN.targets, description="Matrices with adapters: q, k, v, o, gate, up, "
                                            "down; attn (q, k, v, o) and mlp (gate, up, down) name their groups.")
    alpha: PositiveFloat = Field(32.0, description="Adapter scale numerator: the adapter's output is multiplied by alpha / rank.")
    frozen_dtype: FrozenDtype = Field(FrozenDtype.BF16, description="Storage of the frozen base weight matrices.")
    dropout: float = Field(0.0, ge=0.0, lt=1.0, description="Probability of the dropout on each adapter's input (NeMo's "
                           "adapter_dropout with dropout_position pre, Hugging Face PEFT's lora_dropout); 0: none.")
    fused_qkv: bool = Field(False, description="q, k and v share one adapter over the fused qkv projection (NeMo's "
                            "LoraKQVAdapter, PEFT on a fused qkv_proj): one A (hidden x r) and one B (r x (q + 2 kv)); "
                            "False: one adapter each.")

    @field_validator("targets", mode="before")
    @classmethod
    def _matrices(cls, targets: object) -> tuple[LoraTarget, ...]:
        parsed = parse_lora_targets(targets)
        if not parsed:
            raise ValueError("LoRA needs at least one target (q, k, v, o, gate, up, down, attn, mlp)")
        return parsed

    @model_validator(mode="after")
    def _fused_qkv_adapts_all_three(self) -> LoraConfig:
        if self.fused_qkv and not _QKV <= set(self.targets):
            raise ValueError(f"a fused qkv adapter adapts q, k and v together, but targets={self.target_label!r}")
        return self

    @property
    def target_label(self) -> str:
        """The targets as users write them: a whole group by its name (``attn``, ``mlp``), else its matrices.

        >>> LoraConfig(targets="q,k,v,o,up").target_label, LoraConfig(targets="q,v").target_label
        ('attn,up', 'q,v')
        """
        names = []
        for group in LoraGroup:
            chosen = [t for t in group.targets if t in self.targets]
            names += [group.value] if chosen == list(group.targets) else [t.value for t in chosen]
        return ",".join(names)


class InferenceConfig(BaseModel):
    """Serving settings of a prefill or decode workload; the batch (sequences each
    data-parallel replica serves together) and the context length (tokens each sequence's KV cache holds at the
    step predicted) are `TrainConfig.global_batch` and `TrainConfig.seq_len`."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    prompt_len: PositiveInt | None = Field(None, description="Prompt tokens prefilled per sequence (time to first token); "
                                                             "None: the whole context.")
    kv_block_size: PositiveInt = Field(16, description="Tokens per block of the paged KV-cache allocator (vLLM's default 16); "
                                                       "each sequence's cache is rounded up to whole blocks.")
    max_token_latency_ms: PositiveFloat | None = Field(None, description="Decode: the most milliseconds per output token a "
                                                                         "layout may take; None: no bound.")
    weight_dtype: FrozenDtype = Field(FrozenDtype.BF16, description="Storage of the layer weight matrices: bf16, int8 / "
                                      "int4 weight-only (cast to the compute dtype on use), or fp8 e4m3 with the linear "
                                      "layers' GEMMs in fp8 (W8A8: activations quantized per tensor), on parts with an fp8 peak.")
    kv_cache_dtype: KvCacheDtype = Field(KvCacheDtype.AUTO, description="Storage of the KV cache: auto (the compute dtype) "
                                         "or fp8 e4m3 (1 byte; dequantized to the compute dtype as attention reads it).")
    weight_kernel: WeightKernel = Field(WeightKernel.FUSED, description="The GEMM kernel int4 weights run: fused (dequantized "
                                        "inside the GEMM, each weight read once), autogptq-cuda-old or exllama (GPTQ's kernels "
                                        "as AutoGPTQ runs them: `costmodel.step.weight_kernels`).")
    weight_group_size: PositiveInt = Field(128, description="Weights per int4 quantization group, each with its own scale "
                                           "and zero (held and read with the weights where the serving stack states their "
                                           "layout: `weight_bytes`).")
    serving_stack: str = Field("jax", description="The software serving the model (`costmodel.inputs.serving_stack`): "
                               "jax, vllm, torch-compile, tensorrt-llm, tensorrt-llm-0.6 (compiled steps, no per-operator host work) or "
                               "hf-eager (Hugging Face generate(), every operator dispatched from Python).")
    host_s_per_op: NonNegativeFloat | None = Field(None, description="Host seconds per operator the serving stack dispatches "
                                                   "(e.g. measured on your host); None: the stack's own (fitted) value.")

    @field_validator("serving_stack")
    @classmethod
    def _known_stack(cls, name: str) -> str:
        get_serving_stack(name)
        return name

    @model_validator(mode="after")
    def _gptq_kernels_run_int4(self) -> InferenceConfig:
        if self.weight_kernel is not WeightKernel.FUSED and self.weight_dtype is not FrozenDtype.INT4:
            raise InvalidConfigError(f"--weight-kernel {self.weight_kernel.value} runs int4 weights, not {self.weight_dtype.value}",
                                     fix="add --frozen-dtype int4 or drop --weight-kernel")
        return self

    @property
    def stack(self) -> ServingStack:
        """The serving stack's preset, with ``host_s_per_op`` where given."""
        preset = get_serving_stack(self.serving_stack)
        return preset if self.host_s_per_op is None else preset.model_copy(update={"host_s_per_op": self.host_s_per_op})

    @property
    def weight_bytes(self) -> float:
        """Bytes a layer weight matrix's element occupies as stored: its dtype's, plus for int4 its share of
        the group's scale and zero where the serving stack states their layout (`ServingStack.int4_group_bytes`).

        >>> InferenceConfig(weight_dtype="int4", serving_stack="torch-compile", weight_group_size=32).weight_bytes
        0.625
        """
        group = self.stack.int4_group_bytes / self.weight_group_size if self.weight_dtype is FrozenDtype.INT4 else 0.0
        return self.weight_dtype.bytes + group


class AdaptedMatrix(BaseModel):
    """One weight matrix of a layer that carries an adapter."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    group: LoraGroup = Field(description="attn or mlp: the layer's parameter group that holds the matrix.")
    name: str = Field(description="The reference model's weight name (wq, wk, wv, wo, wqkv when fused, w_in, w_gate, w_out).")
    d_in: PositiveInt = Field(description="Input width of the matrix (A's rows).")
    d_out: PositiveInt = Field(description="Output width of the matrix (B's columns).")
    split: str = Field(description="How tensor parallelism splits the matrix: column (its output) or row (its input).")


# The reference model's weight name of each target (up is w_in, as in `planner.programs.transformer`).
WEIGHT_NAMES = {LoraTarget.Q: "wq", LoraTarget.K: "wk", LoraTarget.V: "wv", LoraTarget.O: "wo",
                LoraTarget.UP: "w_in", LoraTarget.GATE: "w_gate", LoraTarget.DOWN: "w_out"}


def adapted_matrices(model: ModelConfig, lora: LoraConfig) -> list[AdaptedMatrix]:
    """The matrices of one layer that get adapters, in the layer's order (q, k, v, o, up, gate,
    down); a gate target of a non-gated MLP adapts nothing (the MLP has no gate), and MLP
    targets of a mixture-of-experts model are refused (one adapter per expert is not modelled).

    >>> m = ModelConfig(name="m", hidden_size=64, num_layers=1, num_heads=4, ffn_size=256, vocab_size=8, mlp="gelu")
    >>> [a.name for a in adapted_matrices(m, LoraConfig(targets="q,v,mlp"))]
    ['wq', 'wv', 'w_in', 'w_out']
    """
    d, q, kv, f = model.hidden_size, model.num_heads * model.head_dim, model.num_kv_heads * model.head_dim, model.ffn_size
    shapes = {LoraTarget.Q: (d, q, "column"), LoraTarget.K: (d, kv, "column"), LoraTarget.V: (d, kv, "column"),
              LoraTarget.O: (q, d, "row"), LoraTarget.UP: (d, f, "column"), LoraTarget.GATE: (d, f, "column"),
              LoraTarget.DOWN: (f, d, "row")}
    if model.is_moe and any(t.group is LoraGroup.MLP for t in lora.targets):
        raise UnsupportedError(f"LoRA on the MLP of {model.name}, a mixture-of-experts model, is not modelled",
                               fix="use --lora-targets attn (or some of q,k,v,o)")
    order = [t for t in WEIGHT_NAMES if t in lora.targets and (t is not LoraTarget.GATE or model.mlp.gated)]
    if lora.fused_qkv:  # one adapter over the fused projection, where q stood
        order = [t for t in order if t not in (LoraTarget.K, LoraTarget.V)]
    out = []
    for t in order:
        d_in, d_out, split = (d, q + 2 * kv, "column") if lora.fused_qkv and t is LoraTarget.Q else shapes[t]
        name = "wqkv" if lora.fused_qkv and t is LoraTarget.Q else WEIGHT_NAMES[t]
        out.append(AdaptedMatrix(group=t.group, name=name, d_in=d_in, d_out=d_out, split=split))
    return out


def adapter_params_per_layer(model: ModelConfig, lora: LoraConfig, *, tp: int = 1) -> float:
    """Adapter parameters of one layer held by one device: ``r·(d_in + d_out)`` per adapted
    matrix, where tensor parallelism splits the half that meets the matrix's split dimension
    (B of a column-parallel matrix, A of a row-parallel one) and each device keeps the other whole."""
    r = lora.rank
    return sum(r * (a.d_in + a.d_out / tp) if a.split == "column" else r * (a.d_in / tp + a.d_out)
               for a in adapted_matrices(model, lora))


def norm_params_per_layer(model: ModelConfig) -> int:
    """Parameters of one layer's two norms (kept in the compute dtype, never quantized)."""
    return 2 * model.hidden_size * (2 if model.norm is Norm.LAYERNORM else 1)
