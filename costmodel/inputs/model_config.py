"""`ModelConfig`: the shape of a decoder-only transformer, independent of any framework.

The planner reads Hugging Face ``config.json`` files and presets into this type
(``planner.config``); the cost model, the planners and the reference JAX model all read
their dimensions from it, so each size has exactly one source.

Dimension letters used across the project (as nanodo does):
B batch, S sequence, D model width, N query heads, K key/value heads, H head width,
F MLP width, V vocabulary, E experts, L layers.

>>> cfg = ModelConfig(name="tiny", hidden_size=64, num_layers=2, num_heads=4,
...                   ffn_size=256, vocab_size=128)
>>> cfg.head_dim, cfg.num_kv_heads
(16, 4)
"""

from __future__ import annotations

import math
from enum import StrEnum
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, Strict, StrictBool, model_validator

from costmodel.errors import InvalidConfigError

# Strict types: a JSON boolean is not a size and "4096" is not a number (pydantic's lax mode
# would read them as 1 and 4096). The one coercion kept is int -> float, as JSON has one number
# type and hub configs write "rope_theta": 10000. No accelerator holds a dimension over 2**31,
# and the bound keeps every product of sizes a finite float.
MAX_DIM = 2**31
Dim = Annotated[int, Strict(), Field(gt=0, le=MAX_DIM)]
Count = Annotated[int, Strict(), Field(ge=0, le=MAX_DIM)]
PositiveReal = Annotated[float, Strict(), Field(gt=0, allow_inf_nan=False)]


class Norm(StrEnum):
    """Normalisation layer before attention and MLP (pre-norm)."""

    LAYERNORM = "layernorm"
    RMSNORM = "rmsnorm"


class MlpKind(StrEnum):
    """MLP activation; the gated kinds (SwiGLU, GeGLU) have three weight matrices."""

    GELU = "gelu"
    RELU = "relu"
    SWIGLU = "swiglu"
    GEGLU = "geglu"

    @property
    def gated(self) -> bool:
        return self in (MlpKind.SWIGLU, MlpKind.GEGLU)


class Positions(StrEnum):
    """How token positions enter the model."""

    LEARNED = "learned"
    ROPE = "rope"


class RopeScaling(BaseModel):
    """A Hugging Face config's ``rope_scaling``: RoPE frequencies stretched to serve longer sequences
    than the model was trained on (linear, dynamic, yarn, llama3, ...); the cost is unchanged."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    kind: str = Field(description="``rope_type`` (or ``type``) as the config names it.")
    factor: PositiveReal | None = Field(None, description="How many times longer the positions it serves; None when the "
                                                          "config gives no single factor (longrope's per-frequency lists).")
    original_max_position_embeddings: Dim | None = Field(None, description="The trained length the factor stretches; "
                                                                           "None: max_position_embeddings.")


class ModelConfig(BaseModel):
    """Dimensions and architecture switches of a decoder-only transformer.

    Dense models have ``num_experts == 0``. A mixture-of-experts model replaces every
    layer's MLP by ``num_experts`` experts of width ``moe_ffn_size`` of which each token
    uses ``experts_per_token``, plus an optional always-on shared expert.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str = Field(description="Preset name or the file the config came from.")
    hidden_size: Dim = Field(description="Model width D.")
    num_layers: Dim = Field(description="Number of transformer layers L.")
    num_heads: Dim = Field(description="Query heads N.")
    num_kv_heads: Dim = Field(description="Key/value heads K (GQA); defaults to N.")
    head_dim: Dim = Field(description="Head width H; defaults to D / N.")
    ffn_size: Dim = Field(description="Dense MLP width F.")
    vocab_size: Dim = Field(description="Vocabulary size V: the tokens the tokenizer emits.")
    vocab_multiple: Dim = Field(
        128, description="The embedding table and the head hold the vocabulary rounded up to a multiple of this "
        "(`padded_vocab_size`), as Megatron-LM's --make-vocab-size-divisible-by 128 and nanoGPT's 50304 do; 1 = unpadded."
    )
    max_position_embeddings: Dim = Field(
        2048, description="Longest sequence the positions support (learned tables have this size)."
    )
    norm: Norm = Field(Norm.RMSNORM, description="Normalisation kind.")
    norm_eps: PositiveReal = Field(1e-5, description="Epsilon inside the normalisation.")
    mlp: MlpKind = Field(MlpKind.SWIGLU, description="MLP activation kind.")
    positions: Positions = Field(Positions.ROPE, description="Position encoding.")
    rope_theta: PositiveReal = Field(10000.0, description="RoPE base frequency.")
    tie_embeddings: StrictBool = Field(False, description="Output head shares the token embedding.")
    qkv_bias: StrictBool = Field(False, description="Query/key/value projections have biases.")
    out_bias: StrictBool = Field(False, description="Attention output projection has a bias.")
    mlp_bias: StrictBool = Field(False, description="MLP projections have biases.")
    num_experts: Count = Field(0, description="Routed experts E per layer; 0 = dense.")
    experts_per_token: Count = Field(0, description="Experts each token is routed to (top-k).")
    moe_ffn_size: Dim = Field(description="Width of one routed expert; defaults to F.")
    shared_expert_ffn_size: Count = Field(
        0, description="Width of an always-on shared expert (Qwen-MoE); 0 = none."
    )
    rope_scaling: RopeScaling | None = Field(None, description="RoPE scaling that serves sequences beyond max_position_embeddings.")
    sliding_window: Dim | None = Field(None, description="Sliding-window attention (Mistral): each query attends the last "
                                                         "this many keys; None = full causal attention.")

    @model_validator(mode="before")
    @classmethod
    def _fill_defaults(cls, data: Any) -> Any:
        """Derive K, H and the expert width when a config leaves them out."""
        if not isinstance(data, dict):
            return data
        data = dict(data)
        heads, width = data.get("num_heads"), data.get("hidden_size")
        if data.get("head_dim") is None and _positive_ints(heads, width):
            if width % heads:
                raise InvalidConfigError(
                    f"num_attention_heads={heads} does not divide hidden_size={width}",
                    fix="use a head count that divides hidden_size, or give head_dim explicitly",
                )
            data["head_dim"] = width // heads
        if data.get("num_kv_heads") is None:
            data["num_kv_heads"] = heads
        if data.get("moe_ffn_size") is None:
            data["moe_ffn_size"] = data.get("ffn_size")
        return data

    @model_validator(mode="after")
    def _kv_heads_divide_heads(self) -> ModelConfig:
        if self.num_heads % self.num_kv_heads:
            raise InvalidConfigError(
                f"num_key_value_heads={self.num_kv_heads} does not divide num_attention_heads={self.num_heads}",
                fix="use a key/value head count that divides the query head count",
            )
        return self

    @model_validator(mode="after")
    def _experts_consistent(self) -> ModelConfig:
        if self.num_experts and not 0 < self.experts_per_token <= self.num_experts:
            raise InvalidConfigError(
                f"experts_per_token={self.experts_per_token} must be in 1..num_experts={self.num_experts}",
                fix="set num_experts_per_tok to at most the number of experts",
            )
        if not self.num_experts and self.experts_per_token:
            raise InvalidConfigError(
                f"experts_per_token={self.experts_per_token} but num_experts=0",
                fix="set the number of experts or drop experts_per_token",
            )
        return self

    @property
    def max_seq_len(self) -> int:
        """The longest sequence the positions serve: ``max_position_embeddings``, or its ``rope_scaling``
        factor times the trained length where that is longer.

        >>> m = ModelConfig(name="m", hidden_size=64, num_layers=1, num_heads=4, ffn_size=8, vocab_size=9,
        ...                 max_position_embeddings=32768, rope_scaling={"kind": "yarn", "factor": 4.0})
        >>> m.max_seq_len
        131072
        """
        scaling = self.rope_scaling
        if self.positions is Positions.LEARNED or scaling is None or scaling.factor is None:
            return self.max_position_embeddings
        trained = scaling.original_max_position_embeddings or self.max_position_embeddings
        return max(self.max_position_embeddings, int(scaling.factor * trained))

    def causal_pairs(self, seq_len: float) -> float:
        """(query, key) pairs causal attention scores in one sequence: ``s²/2``, or, under a sliding
        window ``w`` shorter than the sequence, ``s·w − w²/2`` (each query meets at most ``w`` keys).

        >>> m = ModelConfig(name="m", hidden_size=64, num_layers=1, num_heads=4, ffn_size=8, vocab_size=9, sliding_window=4096)
        >>> m.causal_pairs(2048) == 2048**2 / 2, m.causal_pairs(32768) == 32768 * 4096 - 4096**2 / 2
        (True, True)
        """
        w = self.sliding_window
        if w is None or seq_len <= w:
            return seq_len * seq_len / 2
        return seq_len * w - w * w / 2

    @property
    def is_moe(self) -> bool:
        return self.num_experts > 0

    @property
    def padded_vocab_size(self) -> int:
        """Rows of the embedding table and columns of the head: V rounded up to ``vocab_multiple``.

        Megatron-LM pads GPT-2's 50257 tokens to a multiple of 128 (times the tensor-parallel
        size, `planner.cli.exports.megatron`) and nanoGPT to 50304, so that the table splits over
        tensor axes and the head's GEMM has aligned tiles. The padded rows are never a token or a
        target: the reference program masks their logits out of the softmax
        (`planner.programs.transformer.head`), so the loss is the unpadded one. Every array, FLOP
        and byte that depends on the vocabulary uses this size; only token IDs use ``vocab_size``.

        >>> ModelConfig(name="gpt2", hidden_size=64, num_layers=1, num_heads=4, ffn_size=8, vocab_size=50257).padded_vocab_size
        50304
        """
        return -(-self.vocab_size // self.vocab_multiple) * self.vocab_multiple

    @property
    def embedding_params(self) -> int:
        """Parameters of the token (and learned position) embeddings and an untied head, over the
        padded vocabulary (`padded_vocab_size`) that the table and the head hold."""
        d, v = self.hidden_size, self.padded_vocab_size
        n = v * d
        if self.positions is Positions.LEARNED:
            n += self.max_position_embeddings * d
        if not self.tie_embeddings:
            n += d * v
        return n

    def vocab_shards(self, tp: int) -> int:
        """How many ways tensor parallelism splits the vocabulary (table rows, head columns,
        logits): ``tp`` where it divides the padded vocabulary (`padded_vocab_size`), else 1 — the
        reference program keeps a vocabulary its tensor axes do not divide whole. Padded to 128,
        GPT-2's 50304 rows split over any power-of-two ``tp`` up to 128.

        >>> m = ModelConfig(name="m", hidden_size=64, num_layers=1, num_heads=4, ffn_size=8, vocab_size=50257)
        >>> m.vocab_shards(4), m.model_copy(update={"vocab_multiple": 1}).vocab_shards(4)
        (4, 1)
        """
        return tp if self.padded_vocab_size % tp == 0 else 1

    def vocab_per_shard(self, tp: int) -> float:
        """Padded vocabulary entries one tensor-parallel device holds: ``padded_vocab_size / vocab_shards(tp)``."""
        return self.padded_vocab_size / self.vocab_shards(tp)

    @property
    def params_per_layer(self) -> int:
        """Parameters of one transformer layer."""
        return self._attention_params() + self._mlp_params() + 2 * self._norm_params()

    @property
    def total_params(self) -> int:
        """All parameters: embeddings, layers and the final norm."""
        return self.embedding_params + self.num_layers * self.params_per_layer + self._norm_params()

    @property
    def active_params_per_layer(self) -> int:
        """Parameters one token touches per layer (top-k experts only)."""
        if not self.is_moe:
            return self.params_per_layer
        inactive = (self.num_experts - self.experts_per_token) * self._expert_params(self.moe_ffn_size)
        return self.params_per_layer - inactive

    @property
    def routed_expert_params_per_layer(self) -> int:
        """Parameters of one layer's routed experts (0 for a dense model); ep shards these."""
        return self.num_experts * self._expert_params(self.moe_ffn_size) if self.is_moe else 0

    def expert_slots(self, seq_len: int, capacity_factor: float | None) -> int:
        """Rows one sequence's routed experts compute, all experts together: each expert's
        capacity, ``ceil(capacity_factor · seq_len · k / E)`` slots whether filled or not, or,
        dropless (``capacity_factor`` None), the ``seq_len · k`` routed tokens.

        >>> m = ModelConfig(name="m", hidden_size=8, num_layers=1, num_heads=1, ffn_size=8, vocab_size=8,
        ...                 num_experts=8, experts_per_token=2)
        >>> m.expert_slots(4096, 1.25), m.expert_slots(4096, None)
        (10240, 8192)
        """
        routed = seq_len * self.experts_per_token
        if capacity_factor is None:
            return routed
        return self.num_experts * max(1, math.ceil(capacity_factor * routed / self.num_experts))

    def _norm_params(self) -> int:
        return self.hidden_size * (2 if self.norm is Norm.LAYERNORM else 1)

    def _attention_params(self) -> int:
        d, q_width, kv_width = self.hidden_size, self.num_heads * self.head_dim, self.num_kv_heads * self.head_dim
        n = d * (q_width + 2 * kv_width) + q_width * d
        if self.qkv_bias:
            n += q_width + 2 * kv_width
        if self.out_bias:
            n += d
        return n

    def _expert_params(self, ffn: int) -> int:
        d = self.hidden_size
        n_in = 2 if self.mlp.gated else 1
        n = (n_in + 1) * d * ffn
        if self.mlp_bias:
            n += n_in * ffn + d
        return n

    def _mlp_params(self) -> int:
        if not self.is_moe:
            return self._expert_params(self.ffn_size)
        n = self.num_experts * self._expert_params(self.moe_ffn_size) + self.hidden_size * self.num_experts
        if self.shared_expert_ffn_size:
            n += self._expert_params(self.shared_expert_ffn_size) + self.hidden_size
        return n


def _positive_ints(*values: Any) -> bool:
    return all(isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in values)
